"""Packaging that says what is optional: every direct import is declared, the core imports only the core
dependencies, and a feature whose extra is missing stops start-up with a message that names the extra.

The missing extras are made for real: the gateway runs in a subprocess whose imports of the blocked
packages fail, through a ``sitecustomize`` module on ``PYTHONPATH``.
"""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest
import requests
from support.datasets import ORG
from support.datasets import WrittenDataset as Data
from support.processes import free_port
from support.servers import Server

from gateway import extras

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The project's own modules: the packages, the benchmark (scripts/ on its path) and the test modules.
OWN_MODULES = {
    "gateway",
    "gateway_storage",
    "wkw_adapter",
    "deploy",
    "benchmark",
    *(path.stem for path in (REPO / "tests").iterdir()),
}
OPTIONAL = ("boto3", "botocore", "obstore", "granian", "rich", "starlette")  # what the core must run without

BLOCKER = """
import os
import sys

BLOCKED = set(os.environ["ZG_TEST_BLOCKED_IMPORTS"].split(","))


class BlockedImports:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, BlockedImports())
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> tuple[str, list[str]]:
    """A requirement's distribution name and the extras it asks for."""
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, requirement
    return _normal(match.group(1)), [extra.strip() for extra in (match.group(2) or "").split(",") if extra.strip()]


def declared(*extra_names: str) -> set[str]:
    """The distributions the core dependencies and the named extras declare, the project's own extras expanded."""
    names: set[str] = set()
    pending = [*PROJECT["dependencies"], *(r for e in extra_names for r in PROJECT["optional-dependencies"][e])]
    while pending:
        name, wanted = _requirement_name(pending.pop())
        if name == _normal(PROJECT["name"]):
            pending += [r for e in wanted for r in PROJECT["optional-dependencies"][e]]
        else:
            names.add(name)
    return names


def imports(paths: list[Path], module_level_only: bool = False) -> dict[str, set[str]]:
    """Third-party top-level modules imported by ``paths``, with the files that import them."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text())
        nodes = tree.body if module_level_only else list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN_MODULES:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def distributions(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """The installed distributions that provide each module."""
    providers = importlib.metadata.packages_distributions()
    found = {}
    for module, files in modules.items():
        assert module in providers, f"{module} (imported by {sorted(files)}) is provided by no installed distribution"
        found[module] = {_normal(name) for name in providers[module]}
    return found


def python_files(*directories: str) -> list[Path]:
    return [path for directory in directories for path in sorted((REPO / directory).rglob("*.py"))]


def _undeclared(modules: dict[str, set[str]], allowed: set[str]) -> list[str]:
    return [
        f"{module} ({', '.join(sorted(modules[module]))})"
        for module, names in distributions(modules).items()
        if not names & allowed
    ]


def test_the_core_imports_only_the_core_dependencies_at_module_level() -> None:
    core = declared()
    used = imports(python_files("gateway", "gateway_storage", "wkw_adapter"), module_level_only=True)
    assert not _undeclared(used, core), "module-level imports outside the core dependencies"
    assert not {_normal(name) for name in OPTIONAL} & core, "an optional package is a core dependency"


def test_every_direct_import_is_declared() -> None:
    gateway_extras = list(extras.EXTRAS)
    assert not _undeclared(
        imports(python_files("gateway", "gateway_storage", "wkw_adapter")), declared(*gateway_extras)
    )
    assert not _undeclared(imports(python_files("scripts")), declared("bench"))
    assert not _undeclared(imports(python_files("deploy")), declared("deploy-check") & declared("bench"))
    own_venv = REPO / "tests" / "ome_zarr_read.py"  # runs in the venv of scripts/ome-zarr-venv
    tests = [path for path in python_files("tests") if path != own_venv]
    assert not _undeclared(imports(tests), declared("test", "deploy-check", "bench"))


def test_each_extra_of_the_code_is_an_extra_of_the_package() -> None:
    for extra in extras.EXTRAS.values():
        providers = distributions({module: {"gateway/extras.py"} for module in extra.modules})
        for module, names in providers.items():
            assert names & (declared(extra.name) - declared()), f"{module} is not declared by the {extra.name} extra"


def test_the_dev_tools_are_pinned_at_the_installed_versions() -> None:
    """CI checks ruff's and mypy's output, which changes between versions: they are pinned exactly."""
    pins = dict(_pin(requirement) for requirement in PROJECT["optional-dependencies"]["dev"])
    assert set(pins) == {"ruff", "mypy"}
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, f"{name}: installed {importlib.metadata.version(name)}"


def _pin(requirement: str) -> tuple[str, str]:
    name, equals, version = requirement.partition("==")
    assert equals and re.fullmatch(r"[0-9][0-9.]*", version), f"{requirement} is not an exact pin"
    return _normal(name), version


# --- missing extras, for real ------------------------------------------------------------------


@pytest.fixture
def blocked(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """An environment whose Python cannot import the given packages."""
    site = tmp_path / "blocker"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)

    def environment(*packages: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ZARR_GATEWAY_", "AWS_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["ZG_TEST_BLOCKED_IMPORTS"] = ",".join(packages)
        check = subprocess.run([sys.executable, "-c", f"import {packages[0]}"], env=env, capture_output=True)
        assert check.returncode != 0, f"{packages[0]} is still importable: the blocker is not in effect"
        return env

    return environment


def _gateway(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_an_s3_root_without_the_s3_extra_is_refused_naming_it(blocked: Callable[..., dict[str, str]]) -> None:
    port = str(free_port())
    done = _gateway(blocked("boto3", "botocore"), "serve", "--root", "s3://bucket/prefix", "--port", port)
    assert done.returncode == 1, done
    assert "the data root s3://bucket/prefix needs the 's3' extra" in done.stderr, done.stderr
    assert "pip install 'zarr-gateway[s3]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("url", "extra"), [("gs://bucket/prefix", "gcs"), ("az://container/prefix", "azure"), ("https://host/x", "https")]
)
def test_a_store_root_without_its_extra_is_refused_naming_it(
    blocked: Callable[..., dict[str, str]], tmp_path: Path, url: str, extra: str
) -> None:
    """As a data root, and as a remote root beside a local one: start-up stops naming the store and the extra."""
    env = blocked("obstore")
    for flags in (["--root", url], ["--root", str(tmp_path), "--remote-roots", url]):
        done = _gateway(env, "serve", *flags, "--port", str(free_port()))
        assert done.returncode == 1, done
        what = "data root" if flags[1] == url else "remote root"
        assert f"the {what} {url} needs the {extra!r} extra" in done.stderr, done.stderr
        assert f"pip install 'zarr-gateway[{extra}]'" in done.stderr
        assert "Traceback" not in done.stderr


def test_granian_without_the_granian_extra_is_refused_naming_it(
    blocked: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    port = str(free_port())
    done = _gateway(blocked("granian"), "serve", "--root", str(tmp_path), "--server", "granian", "--port", port)
    assert done.returncode == 1, done
    assert "server=granian needs the 'granian' extra" in done.stderr, done.stderr
    assert "pip install 'zarr-gateway[granian]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_sample_maker_without_the_sample_extra_is_refused_naming_it(
    blocked: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    target = tmp_path / "sample"
    done = _gateway(blocked("rich"), "make-sample", str(target))
    assert done.returncode == 1, done
    assert "zarr-gateway make-sample needs the 'sample' extra" in done.stderr, done.stderr
    assert "pip install 'zarr-gateway[sample]'" in done.stderr
    assert not target.exists(), "nothing is written before the refusal"


@pytest.fixture
def blocked_gateway(
    blocked: Callable[..., dict[str, str]],
    test_data: Data,
    server_factory: Callable[..., Server],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., Server]:
    """A gateway over the test data whose Python cannot import the given packages."""

    def start(*packages: str) -> Server:
        env = blocked(*packages)
        for name in ("PYTHONPATH", "ZG_TEST_BLOCKED_IMPORTS"):
            monkeypatch.setenv(name, env[name])  # the test gateway's environment
        return server_factory(test_data.root)

    return start


def test_the_core_serves_a_local_root_without_any_extra(blocked_gateway: Callable[..., Server]) -> None:
    """uvicorn over a local root needs none of the optional packages, nor starlette."""
    server = blocked_gateway(*OPTIONAL)
    answer = requests.get(f"{server.url}/data/zarr3/{ORG}/wk_dataset/color_u8/1/zarr.json", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["node_type"] == "array"
    chunk = requests.get(f"{server.url}/data/zarr/{ORG}/wk_dataset/color_u8/1/0.1.1.0", timeout=10)
    assert chunk.status_code == 200 and chunk.content, chunk.text


def test_without_the_viewer_and_meshes_extras_pages_advertise_neither(blocked_gateway: Callable[..., Server]) -> None:
    """No own viewer: the links open the public https Neuroglancer and a plain-http page on a LAN host says why
    it cannot show the data; no mesh source in any link; ``/neuroglancer/`` names the missing extra."""
    server = blocked_gateway("neuroglancer", "zmesh", "DracoPy")
    assert "the viewer extra is not installed" in server.log()
    page = requests.get(f"{server.url}/data/zarr/{ORG}/wk_dataset/", headers={"Host": "gateway.lan:8080"}, timeout=30)
    assert page.status_code == 200, page.text
    links = re.findall(r'class="open-neuroglancer" href = "([^"]+)"', page.text)
    assert links and all(link.startswith("https://neuroglancer-demo.appspot.com/#!") for link in links), links
    assert "mixed content" in page.text and "zarr-gateway[viewer]" in page.text
    assert not any("meshes" in unquote(link) for link in links)
    viewer = requests.get(f"{server.url}/neuroglancer/", timeout=30)
    assert viewer.status_code == 404 and "viewer extra" in viewer.json()["error"]


def test_bootstrap_installs_every_extra_and_again_when_pyproject_changes(tmp_path: Path) -> None:
    """scripts/bootstrap, run in a copy of the checkout whose venv's pip only records what it is asked."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bootstrap").write_bytes((REPO / "scripts" / "bootstrap").read_bytes())
    (tmp_path / "scripts" / "bootstrap").chmod(0o755)
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    asked = tmp_path / "pip-calls"
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$*" >> {asked}\n')
    (bin_dir / "python").write_text("#!/bin/sh\n")
    for tool in ("pip", "python"):
        (bin_dir / tool).chmod(0o755)

    def bootstrap() -> list[str]:
        subprocess.run([str(tmp_path / "scripts" / "bootstrap")], check=True, capture_output=True, timeout=60)
        return asked.read_text().splitlines() if asked.exists() else []

    (install,) = bootstrap()
    assert bootstrap() == [install], "installed again although nothing changed"
    match = re.fullmatch(r"install -q -e \.\[([\w,-]+)\]", install)
    assert match, install
    installed = set(match.group(1).split(","))
    every = set(PROJECT["optional-dependencies"])
    assert declared(*installed) == declared(*every), "bootstrap leaves out an extra the suite needs"
    with open(tmp_path / "pyproject.toml", "a") as pyproject:
        pyproject.write("\n# a change\n")
    assert bootstrap() == [install, install], "not installed again after pyproject.toml changed"
