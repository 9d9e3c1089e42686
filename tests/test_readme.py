"""The README as a new user meets it: exactly two set-up commands (the second what CI runs), a quick start that
serves a ``binaryData`` directory, an install line before every client snippet, links that lead somewhere, no
benchmark tables (they live in docs/benchmarks.md), a LICENSE that says what pyproject.toml says, and every
Python snippet running as written against a real gateway serving the sample."""

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from support.servers import Server

pytestmark = pytest.mark.slow  # every README snippet, one in a venv of its own

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SAMPLE_URL = "http://127.0.0.1:8000"


def section(title: str) -> str:
    """The text of the README's section headed ``title`` (any level), up to the next heading of its level or higher."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", README, re.M)
    assert match, f"the README has no section {title!r}"
    level = len(match.group(1))
    rest = README[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def blocks(text: str, language: str) -> list[tuple[str, str]]:
    """Each fenced block of ``language`` in ``text``, with the prose between it and the block before it."""
    found = []
    position = 0
    for match in re.finditer(r"^```(\w*)\n(.*?)^```\n", text, re.M | re.S):
        if match.group(1) == language:
            found.append((text[position : match.start()], match.group(2)))
        position = match.end()
    return found


def heading_anchors() -> set[str]:
    """The anchors GitHub gives the README's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", README, re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def test_exactly_two_set_up_commands_and_ci_runs_the_second() -> None:
    (sh,) = [code for _, code in blocks(section("Development"), "sh")]
    commands = [line.split("#")[0].strip() for line in sh.splitlines() if line.split("#")[0].strip()]
    assert commands == ["scripts/serve-sample", "scripts/test"], commands
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\b", ci, re.M), "CI runs the README's test command"


def test_the_quick_start_serves_a_binary_data_directory_and_names_the_landing_page() -> None:
    quick = section("Quick start")
    assert "zarr-gateway serve --root /path/to/binaryData" in quick
    assert f"{SAMPLE_URL}/" in quick and "landing page" in quick
    assert README.index("## Quick start") < README.index("## Reading data") < README.index("## Deploy")


def test_every_client_snippet_follows_its_install_line() -> None:
    snippets = blocks(README, "python")
    assert len(snippets) >= 6, "zarr, tensorstore, webknossos, xarray, CloudVolume and napari snippets"
    for prose, code in snippets:
        last_paragraph = prose.strip().split("\n\n")[-1]
        assert "pip install " in last_paragraph, f"no install line just before:\n{code}"
    zarr_line = next(prose for prose, code in snippets if code.startswith("import zarr\n"))
    assert re.search(r"pip install 'zarr>=3' fsspec aiohttp requests", zarr_line), "zarr alone cannot open http://"


def test_links_lead_to_files_and_headings_that_exist() -> None:
    anchors = heading_anchors()
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (REPO / path).exists(), f"the README links to {target}, which is not in the repository"
        elif anchor:
            assert anchor in anchors, f"the README links to #{anchor}, which is no heading"
    for document in ("docs/development.md", "docs/benchmarks.md", "docs/architecture.md", "docs/security.md"):
        assert f"]({document})" in README, f"the README does not link {document}"


def test_no_benchmark_tables_before_deploy() -> None:
    """The benchmark's tables live in docs/benchmarks.md; Deploy keeps only the sizing figures drawn from them."""
    before_deploy = README[: README.index("## Deploy")]
    rows = [line for line in before_deploy.splitlines() if line.startswith("|") and "req/s" in line]
    assert not rows, f"benchmark rows belong in docs/benchmarks.md: {rows[:3]}"
    assert "req/s" in (REPO / "docs" / "benchmarks.md").read_text()


def test_the_license_file_says_what_pyproject_says() -> None:
    license_text = (REPO / "LICENSE").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and license_text.startswith("MIT License\n")
    assert "Permission is hereby granted, free of charge" in license_text
    assert "[LICENSE](LICENSE)" in README


@pytest.fixture(scope="module")
def sample_gateway(sample_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(sample_root)


@pytest.fixture(scope="module")
def ome_zarr_python() -> str:
    """ome-zarr's own venv (its fsspec[s3] pins clash with the project's), made on first use by the project's script."""
    result = subprocess.run([str(REPO / "scripts" / "ome-zarr-venv")], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"scripts/ome-zarr-venv could not install ome-zarr (it needs the package index):\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "code", [code for _, code in blocks(README, "python")], ids=lambda code: code.split("\n", 1)[0].split()[1]
)
def test_each_python_snippet_runs_as_written(
    code: str, sample_gateway: Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Run in a fresh interpreter with only the sample's address changed to the test gateway's (napari's
    reader, ome-zarr, in its own venv)."""
    assert SAMPLE_URL in code
    script = code.replace(SAMPLE_URL, sample_gateway.url)
    python = (
        request.getfixturevalue("ome_zarr_python")
        if "import ome_zarr" in code or "from ome_zarr" in code
        else sys.executable
    )
    done = subprocess.run(
        [python, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- the snippet:\n{code}"
    assert done.stdout.strip(), "every snippet prints what it read"
