"""Packaging that says what is optional: every direct import is declared, the core imports only the core
dependencies, and a feature whose extra is missing stops start-up with a message that names the extra.

The missing extras are made for real: the gateway runs in a subprocess whose imports of the blocked
packages fail, through a ``sitecustomize`` module on ``PYTHONPATH``.
"""

import ast
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from support.datasets import ORG
from support.datasets import WrittenDataset as Data
from support.mesh_reads import read_a_mesh_fragment
from support.processes import free_port, stop_process, wait_until, wait_until_answering
from support.servers import Server

from gateway import extras

pytestmark = pytest.mark.slow  # imports checked in fresh interpreters

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The project's own modules: the packages, the benchmark (scripts/ on its path) and the test modules.
OWN_MODULES = {
    "gateway",
    "gateway_storage",
    "wkw_adapter",
    "deploy",
    "benchmark",
    *(path.stem for path in (REPO / "scripts").glob("*.py")),  # chromium_devtools, shared with the tests
    *(path.stem for path in (REPO / "tests").iterdir()),
}
OPTIONAL = ("boto3", "botocore", "obstore", "granian", "rich")  # what the core must run without

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
    benchmark = imports(python_files("scripts"))
    benchmark.pop("tiled", None)  # imported by Tiled's row only, which runs in the venv of scripts/tiled-venv
    for name in ("igneous", "taskqueue"):  # bench-meshes --igneous: igneous's side runs in a venv of its own
        benchmark.pop(name, None)
    assert not _undeclared(benchmark, declared("bench"))
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


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("s3://bucket/prefix", "s3"),
        ("gs://bucket/prefix", "gcs"),
        ("az://container/prefix", "azure"),
        ("https://host/x", "https"),
    ],
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
    """uvicorn over a local root needs none of the optional packages."""
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
    assert not any("meshes" in urllib.parse.unquote(link) for link in links)
    viewer = requests.get(f"{server.url}/neuroglancer/", timeout=30)
    assert viewer.status_code == 404 and "viewer extra" in viewer.json()["error"]
    for source in ("multires/info", "legacy/info", "multires/segment_properties/info"):
        answer = requests.get(f"{server.url}/data/meshes/{ORG}/wk_dataset/segmentation/{source}", timeout=30)
        assert answer.status_code == 501 and "zarr-gateway[meshes]" in answer.json()["error"], (source, answer.text)
    info = requests.get(f"{server.url}/data/precomputed/{ORG}/wk_dataset/segmentation/info", timeout=30)
    assert info.status_code == 200, info.text
    assert "mesh" not in info.json() and "segment_properties" not in info.json(), info.json()


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


def test_all_names_every_runtime_extra() -> None:
    """``pip install 'zarr-gateway[all]'`` (what the image installs) turns on every feature the code knows."""
    (requirement,) = PROJECT["optional-dependencies"]["all"]
    name, named = _requirement_name(requirement)
    assert name == _normal(PROJECT["name"])
    assert sorted(named) == sorted(extras.EXTRAS), "the 'all' extra and gateway/extras.py name different extras"


def test_startup_logs_each_feature_that_is_off(blocked: Callable[..., dict[str, str]], tmp_path: Path) -> None:
    """One line per missing extra, naming what is off and the extra; an installed extra gets no line."""
    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--root", str(tmp_path), "--port", str(port), "--workers", "1"],
            env=blocked("zmesh", "granian"),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/", process, 60, log.read_text)
    finally:
        stop_process(process)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    off = [record.get("message", "") for record in records if record.get("message", "").startswith("feature off")]
    assert len(off) == 2, off
    meshes, granian = sorted(off, key=lambda line: "granian" in line)
    assert extras.MESHES.provides in meshes and "pip install 'zarr-gateway[meshes]'" in meshes, meshes
    assert "'zmesh'" in meshes, meshes
    assert extras.GRANIAN.provides in granian and "pip install 'zarr-gateway[granian]'" in granian, granian


def test_index_segments_without_the_meshes_extra_is_refused_naming_it(
    blocked: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """It used to die with a raw ``ModuleNotFoundError: rich``."""
    done = _gateway(blocked("rich"), "index-segments", str(tmp_path), "sample_org/sample_dataset", "segmentation")
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        "zarr-gateway: zarr-gateway index-segments needs the 'meshes' extra, which is not installed "
        "(No module named 'rich' (blocked by the test)): pip install 'zarr-gateway[meshes]'"
    ], done.stderr


# --- the slim install: a fresh venv with the extras serve-sample installs (sample, meshes, viewer, precomputed) ---

SLIM_EXTRAS = "sample,meshes,viewer,precomputed"
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "gateway", "gateway_storage", "wkw_adapter")


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with ``zarr-gateway[sample,meshes,viewer,precomputed]`` from the package index, and nothing of the tests.

    Installed from a copy of the package's files, as the image is, so that no build output lands in the checkout.
    """
    where = tmp_path_factory.mktemp("slim")
    source = where / "source"
    source.mkdir()
    for name in PACKAGE_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", f"{source}[{SLIM_EXTRAS}]"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv


def _slim(venv: Path, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The installed command, run outside the checkout (so the installed package is the one imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZARR_GATEWAY_", "PYTHON"))}
    return subprocess.run(
        [str(venv / "bin" / "zarr-gateway"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.install
def test_the_slim_install_has_none_of_the_test_tools(slim_venv: Path) -> None:
    for module in ("wkw", "webknossos", "zarr", "boto3", "granian"):
        found = subprocess.run([str(slim_venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True)
        assert found.returncode != 0, f"{module} is installed in the slim venv"
    # compressed-segmentation (the precomputed extra) names pytest among its own requirements: pytest is there
    # only for that reason, never for one of ours
    python = str(slim_venv / "bin" / "python")
    ask = "import importlib.metadata as m; print(sorted({d.metadata['Name'].lower().replace('_', '-') "
    ask += "for d in m.distributions() for r in d.requires or [] "
    ask += "if r.split(';')[0].strip().lower() == 'pytest' and 'extra' not in r}))"
    wanting = subprocess.run([python, "-c", ask], capture_output=True, text=True, check=True).stdout.strip()
    assert wanting in ("[]", "['compressed-segmentation']"), wanting


@pytest.mark.install
def test_the_slim_install_makes_indexes_and_serves_the_sample_with_meshes(slim_venv: Path, tmp_path: Path) -> None:
    """make-sample, index-segments and serve, with a mesh fragment read through the served gateway."""
    root = tmp_path / "data"
    made = _slim(slim_venv, "make-sample", str(root), cwd=tmp_path)
    assert made.returncode == 0, made
    assert (root / "sample_org/sample_dataset/segmentation.segment-index.npz").is_file(), made.stdout
    again = _slim(
        slim_venv,
        "index-segments",
        str(root),
        "sample_org/sample_dataset",
        "segmentation",
        "--segment-index-dir",
        str(tmp_path / "index"),
        cwd=tmp_path,
    )
    assert again.returncode == 0 and "segments of sample_org/sample_dataset/segmentation" in again.stdout, again
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZARR_GATEWAY_", "PYTHON"))}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(slim_venv / "bin" / "zarr-gateway"), "serve", "--root", str(root), "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/readyz", process, 60, log.read_text, interval=0.1)
        assert read_a_mesh_fragment(f"http://127.0.0.1:{port}")
        page = requests.get(f"http://127.0.0.1:{port}/data/zarr3/sample_org/sample_dataset/", timeout=30)
        assert page.status_code == 200 and "open-neuroglancer" in page.text, page.text[:500]
    finally:
        stop_process(process)
    said = [json.loads(line).get("message", "") for line in log.read_text().splitlines() if line.startswith("{")]
    off = [message for message in said if message.startswith("feature off")]
    assert not [line for line in off if any(f"'{name}'" in line for name in SLIM_EXTRAS.split(","))], off
    assert any("'granian' not installed" in line for line in off), off


@pytest.mark.install
def test_the_slim_install_names_an_extra_it_lacks_in_one_line(slim_venv: Path, tmp_path: Path) -> None:
    for flags, extra in ((["--server", "granian"], "granian"), (["--root", "s3://bucket/prefix"], "s3")):
        args = ["serve", "--root", str(tmp_path), "--port", str(free_port()), *flags]
        done = _slim(slim_venv, *args, cwd=tmp_path, timeout=120)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pip install 'zarr-gateway[{extra}]'" in lines[0], done.stderr
        assert "Traceback" not in done.stderr


def serve_sample_copy(tmp_path: Path, sample_root: Path) -> tuple[Path, dict[str, str]]:
    """scripts/serve-sample in a copy of the checkout whose pip only records what it is asked (in ``pip-calls``)
    and whose installed package is this checkout's; the script and its environment."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "serve-sample"
    script.write_bytes((REPO / "scripts" / "serve-sample").read_bytes())
    script.chmod(0o755)
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    shutil.copytree(sample_root, tmp_path / "sample-data")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    asked = tmp_path / "pip-calls"
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$*" >> {asked}\necho "many lines of pip output"\n')
    (bin_dir / "python").symlink_to(sys.executable)
    # The installed command is this checkout's gateway.
    (bin_dir / "zarr-gateway").write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m gateway "$@"\n')
    for tool in ("pip", "zarr-gateway"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    return script, {**env, "PYTHONPATH": str(REPO)}


def test_serve_sample_installs_the_slim_extras_and_prints_the_links(tmp_path: Path, sample_root: Path) -> None:
    """scripts/serve-sample installs the sample, meshes, viewer and precomputed extras quietly, serves the sample,
    prints the page and viewer links, and stops on SIGTERM with the gateway."""
    script, env = serve_sample_copy(tmp_path, sample_root)
    asked = tmp_path / "pip-calls"
    port = free_port()
    log = tmp_path / "serve-sample.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(script), "--port", str(port), "--workers", "1"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    page = f"http://127.0.0.1:{port}/data/zarr3/sample_org/sample_dataset/"
    try:
        printed = wait_until(lambda: "open it in Neuroglancer: " in log.read_text(), timeout=120, interval=0.2)
        assert printed, log.read_text()
        assert process.poll() is None, log.read_text()
        assert requests.get(page, timeout=10).status_code == 200
    finally:
        stop_process(process, timeout=60)
    text = log.read_text()
    # the gateway's own status: uvicorn ends by SIGTERM after its graceful shutdown, as the signal asked
    assert process.returncode in (0, 128 + signal.SIGTERM), text[-2000:]
    assert "Finished server process" in text, text[-2000:]
    assert asked.read_text().splitlines() == [f"install --disable-pip-version-check -q -e .[{SLIM_EXTRAS}]"]
    assert "many lines of pip output" not in text, "pip's output is shown"
    assert f"the sample's dataset page: {page}" in text
    (link,) = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("open it in Neuroglancer: ")]
    assert link.startswith(f"http://127.0.0.1:{port}/neuroglancer/"), "a link a person can open, not a bare path"
    assert urllib.parse.quote(f"http://127.0.0.1:{port}/data/zarr3/sample_org/sample_dataset/color/", safe="") in link
    with pytest.raises(requests.ConnectionError):
        requests.get(page, timeout=5)


def test_serve_sample_on_a_busy_port_says_so_before_printing_any_link(tmp_path: Path, sample_root: Path) -> None:
    """Another server on the port answers the very page whose links serve-sample prints: it must stop first,
    with the gateway's one line naming the address, and print no link that leads to the other server."""
    script, env = serve_sample_copy(tmp_path, sample_root)
    page = b'<a class="open-neuroglancer" href = "/elsewhere/">x</a>'

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Other) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        port = other.server_address[1]
        done = subprocess.run(
            [str(script), "--port", str(port), "--workers", "1"], env=env, capture_output=True, text=True, timeout=120
        )
        other.shutdown()
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert f"cannot listen on 127.0.0.1:{port}" in said and "choose another with --port" in said, said
    assert "open it in Neuroglancer" not in said and "dataset page" not in said, said
