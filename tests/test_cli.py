"""The command line as a user meets it: each mistake is answered with one line and exit status 1, no traceback.

Every test runs the real command (``python -m gateway``, from this checkout) in a subprocess.
"""

import json
import os
import pty
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from support.processes import free_port, stop_process, wait_until_answering
from support.servers import Server
from support.terminal import read_terminal

from gateway.sample import DATASET, ORGANIZATION
from gateway.startup import EXAMPLE_TOKEN

REPO = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COMMANDS = ("serve", "make-sample", "index-segments")
# A line that starts at the margin in a text log: the time as the access lines write it, then the level.
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: ")


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}


def gateway(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    """The one line a refused command prints: exit status 1, no traceback, each of ``words`` in it."""
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith("zarr-gateway: "), line
    assert "Traceback" not in done.stderr and "Errno" not in line, done.stderr
    for word in words:
        assert word in line, (word, line)
    return line


def test_version_names_the_package_version() -> None:
    done = gateway("--version")
    assert done.returncode == 0, done
    assert done.stdout.strip() == f"zarr-gateway {VERSION}"


@pytest.mark.parametrize("command", [(), *((name,) for name in COMMANDS)])
def test_help_is_plain_text(command: tuple[str, ...]) -> None:
    """No reStructuredText markup (double backticks) in what a terminal shows."""
    done = gateway(*command, "--help")
    assert done.returncode == 0, done
    assert "usage: zarr-gateway" in done.stdout
    assert "``" not in done.stdout, done.stdout


def test_make_sample_help_explains_its_argument() -> None:
    done = gateway("make-sample", "--help")
    assert re.search(r"DIRECTORY\s+the data root to write into", done.stdout), done.stdout
    assert "--overwrite" in done.stdout


def test_make_sample_does_not_overwrite_a_sample(sample_root: Path) -> None:
    properties = sample_root / ORGANIZATION / DATASET / "datasource-properties.json"
    before = properties.stat().st_mtime_ns
    line = refused(gateway("make-sample", str(sample_root)), str(sample_root / ORGANIZATION / DATASET), "--overwrite")
    assert "already exists" in line
    assert properties.stat().st_mtime_ns == before, "the sample was written again"


@pytest.mark.parametrize("target", ["/proc/nope", "/dev/null/sample"])
def test_make_sample_into_an_unwritable_place_says_so(target: str) -> None:
    refused(gateway("make-sample", target), target)


def test_make_sample_into_a_file_says_so(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    refused(gateway("make-sample", str(file)), str(file), "not a directory")


def test_index_segments_of_a_missing_root_says_root_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    line = refused(gateway("index-segments", str(missing), f"{ORGANIZATION}/{DATASET}", "segmentation"), str(missing))
    assert "not found" in line and "no servable dataset" not in line


def test_index_segments_of_a_missing_dataset_names_it(sample_root: Path) -> None:
    refused(gateway("index-segments", str(sample_root), "nobody/nothing", "segmentation"), "'nobody/nothing'")


def test_a_port_in_use_is_named_with_the_default_workers(tmp_path: Path) -> None:
    """The default two uvicorn workers used to say ``[Errno 98] Address already in use`` without the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = gateway("serve", "--root", str(tmp_path), "--port", str(port), timeout=60)
    refused(done, f"127.0.0.1:{port}", "in use")


@pytest.mark.parametrize(
    "example", sorted(str(path.relative_to(REPO)) for path in (REPO / "deploy").rglob("tokens.example.json"))
)
def test_the_example_token_is_refused(example: str, tmp_path: Path) -> None:
    """Every example tokens file holds the placeholder; a gateway given one as it is does not start."""
    tokens = json.loads((REPO / example).read_text())["tokens"]
    assert EXAMPLE_TOKEN in tokens, f"{example} has no placeholder token: update EXAMPLE_TOKEN"
    done = gateway("serve", "--root", str(tmp_path), "--tokens-file", str(REPO / example), timeout=60)
    refused(done, EXAMPLE_TOKEN, "replace it")


def test_a_real_token_beside_other_tokens_is_accepted(tmp_path: Path, server_factory: Callable[..., Server]) -> None:
    """The refusal is of the placeholder only: a file of other tokens serves."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {"a-long-random-token-of-this-lab": ["sample_org/*"]}}))
    server_factory(tmp_path, tokens_file=tokens)  # raises if it does not start


def _serve(root: Path, log: Path, *flags: str) -> tuple["subprocess.Popen[bytes]", str]:
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--root", str(root), "--port", str(port), *flags],
            cwd=REPO,
            env=environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_until_answering(f"{url}/readyz", process, 60, log.read_text, interval=0.1)
    return process, url


def test_text_logs_write_one_time_style(sample_root: Path, tmp_path: Path) -> None:
    """Start-up lines, uvicorn's lines and access lines all begin with the same UTC time stamp."""
    log = tmp_path / "gateway.log"
    process, url = _serve(sample_root, log, "--log-format", "text", "--workers", "1")
    try:
        assert requests.get(f"{url}/data/zarr/{ORGANIZATION}/{DATASET}/color/1/.zarray", timeout=10).ok
    finally:
        stop_process(process)
    lines = [line for line in log.read_text().splitlines() if line and not line.startswith(" ")]
    loggers = {line.split(" ")[2] for line in lines if TEXT_LINE.match(line)}
    assert {"gateway:", "gateway.access:", "uvicorn.error:"} <= loggers, lines
    assert [line for line in lines if not TEXT_LINE.match(line)] == []


def test_sigterm_leaves_no_leaked_semaphore_warning(sample_root: Path, tmp_path: Path) -> None:
    """Two workers (the default) that encoded Blosc chunks, stopped by SIGTERM: they leave nothing behind."""
    log = tmp_path / "gateway.log"
    process, url = _serve(sample_root, log)
    try:
        for x in range(8):  # new connections, spread over both workers; Blosc-encoded (not stored) chunks
            chunk = requests.get(f"{url}/data/zarr/{ORGANIZATION}/{DATASET}/color/1/0.{x % 4}.0.0", timeout=10)
            assert chunk.status_code == 200, chunk.text
    finally:
        stop_process(process, timeout=60)
    text = log.read_text()
    assert process.returncode == 0, text[-2000:]
    assert "leaked" not in text and "Traceback" not in text, text[-2000:]


def test_the_index_progress_bar_counts_what_it_reads(sample_root: Path, tmp_path: Path) -> None:
    """The bar counts blocks to the end; it used to count voxels with their margins, twice the summary's."""
    controller, terminal = pty.openpty()
    env = environment() | {"COLUMNS": "200", "TERM": "xterm"}
    command = ["index-segments", str(sample_root), f"{ORGANIZATION}/{DATASET}", "segmentation"]
    with subprocess.Popen(
        [sys.executable, "-m", "gateway", *command, "--segment-index-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=terminal,
    ) as process:
        os.close(terminal)
        shown = read_terminal(controller)
        summary = process.stdout.read().decode() if process.stdout else ""
    os.close(controller)
    assert process.returncode == 0, (shown, summary)
    assert "segments of" in summary and "M voxels/s" in summary, summary
    bar = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    counts = re.findall(r"([\d,]+)/([\d,]+) (\w+)", bar)
    assert counts, bar
    done, total, unit = counts[-1]
    assert unit == "blocks" and done == total, bar
    assert re.search(rf"\b{total.replace(',', '')} blocks: ", summary), ("the bar and the summary count alike", summary)
    assert "voxels" not in bar, bar
