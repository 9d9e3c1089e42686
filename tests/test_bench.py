"""The benchmark's short mode runs to the end, prints its table and writes its results.

Not a timed test: it checks that ``scripts/bench --short`` completes (wrk, nginx and xpublish must
be installed; a missing one fails the run rather than skipping a case) and reports every case.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench", module)
    spec.loader.exec_module(module)
    return module


def _table_rows(markdown: str) -> list[list[str]]:
    """The rows of the first Markdown table (the results), as cells."""
    rows = []
    in_table = False
    for line in markdown.splitlines():
        if line.startswith("| case |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            if line.startswith("|---"):
                continue
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.timeout(420)
def test_short_mode_completes_and_reports_every_case(tmp_path: Path) -> None:
    bench = _bench_module()
    out = tmp_path / "out"
    done = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--short", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, f"bench failed ({done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"

    markdown = (out / "results.md").read_text()
    rows = _table_rows(markdown)
    expected = [(case.name, bench.KEYSETS[case.keyset].label) for case in bench.CASES]
    assert [(row[0], row[1]) for row in rows] == expected
    for row in rows:
        assert not row[2].startswith("failed"), row
        assert float(row[2].replace(",", "")) > 0, row  # requests/s
    assert "| target | measured | met |" in markdown
    assert "tensorstore, whole mag" in markdown
    assert "Peak RSS per gateway worker" in markdown
    assert markdown.startswith("Machine: ")

    # The table goes to standard output as well.
    assert "| case | chunks | req/s | MB/s | p50 ms | p99 ms | x nginx | x floor |" in done.stdout
    for name, label in expected:
        assert f"| {name} | {label} |" in done.stdout

    assert (out / "results.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (out / "results.json").exists()
