"""The benchmark's short mode runs to the end, prints its table and writes its results.

Not a timed test: it checks that the benchmark (``scripts/bench --short``, which installs the project
and then runs ``python -m benchmark`` from scripts/) completes (wrk, nginx, Granian and xpublish must
be installed; a missing one fails the run rather than skipping a case), reports every case and puts
its table into a README between the bench markers. The interpreter running the tests runs it; Tiled
runs from a venv of its own (scripts/tiled-venv, made on first use), the HTTP/2 rows need h2load.
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from benchmark.config import (  # noqa: E402
    CASES,
    HTTP_SERVERS,
    KEYSETS,
    MAPPED_CASES,
    MAPPED_KEYSETS,
    PEER_COMPARED,
    ZIPF_CASES,
    ZIPF_KEYSETS,
)
from benchmark.report import README_END, README_START  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEADER = "| case | chunks | req/s | MB/s | p50 ms | p99 ms | x nginx | x floor | x bare | server CPU µs/req |"


def _table_rows(markdown: str, header: str = "| case |", skip: int = 0) -> list[list[str]]:
    """The rows of the first Markdown table (after ``skip`` others) whose header starts so, as cells."""
    rows = []
    in_table = False
    for line in markdown.splitlines():
        if line.startswith(header) and not in_table and skip:
            skip -= 1
            continue
        if line.startswith(header):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            if line.startswith("|---"):
                continue
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.timeout(900)
def test_short_mode_completes_and_reports_every_case(tmp_path: Path) -> None:
    out = tmp_path / "out"
    readme = tmp_path / "README.md"
    readme.write_text(f"# before\n\n{README_START}\nold table\n{README_END}\n\nafter\n")
    pythonpath = os.pathsep.join([str(SCRIPTS), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, "-m", "benchmark", "--short", "--out", str(out), "--readme", str(readme)],
        capture_output=True,
        text=True,
        timeout=880,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )
    assert done.returncode == 0, f"bench failed ({done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"

    markdown = (out / "results.md").read_text()
    rows = _table_rows(markdown)
    expected = [(case.name, KEYSETS[case.keyset].label) for case in CASES]
    assert [(row[0], row[1]) for row in rows] == expected
    for row in rows:
        assert not row[2].startswith("failed"), row
        assert float(row[2].replace(",", "")) > 0, row  # requests/s
        assert row[7] != "—" and row[8] != "—", f"every row has its ratio to both floors: {row}"
    # The viewer's workload: every Zipf row, cold and warm by each route, with its ratio to cold direct.
    zipf_rows = _table_rows(markdown, skip=1)
    assert [(row[0], row[1]) for row in zipf_rows] == [(c.name, ZIPF_KEYSETS[c.keyset].label) for c in ZIPF_CASES]
    for row in zipf_rows:
        assert not row[2].startswith("failed"), row
        assert float(row[2].replace(",", "")) > 0 and row[6] != "—", row
    # A mapped layer against its labels on the same keys: every row, with its ratio to the labels' row.
    mapped_rows = _table_rows(markdown, skip=2)
    expected_mapped = [(c.name, MAPPED_KEYSETS[c.keyset].label) for c in MAPPED_CASES]
    assert [(row[0], row[1]) for row in mapped_rows] == expected_mapped
    for row in mapped_rows:
        assert not row[2].startswith("failed"), row
        assert float(row[2].replace(",", "")) > 0 and row[6] != "—", row
    assert "| u32 labels 64³: agglomerates, made each time ≥ 0.5 x labels |" in markdown
    # The peers on the same keys: the gateway's ratio to xpublish and to Tiled on each row they serve.
    peer_rows = _table_rows(markdown, header="| chunks | gateway row |")
    assert [row[1] for row in peer_rows] == list(PEER_COMPARED.values())
    for row in peer_rows:
        assert "—" not in row, row
    assert "webKnossos' own published benchmark: about 811 requests/s and 149 MB/s per core" in markdown
    assert "first load" in markdown and "s reload" in markdown
    assert "| target | measured | met |" in markdown
    assert "| Zipf 32³, warm, through the proxy ≥ 2.0 x the gateway direct, cold |" in markdown
    for http in HTTP_SERVERS:
        assert f"pass-through u8 LZ4HC ≥ 1.0 x floor ({http}) |" in markdown
    assert "through the proxy ≥ 0.8 x direct" in markdown
    assert "tensorstore, whole mag" in markdown
    assert "Peak RSS per gateway worker" in markdown
    assert "- /healthz, asked every 20 ms on a connection of its own during " in markdown
    assert "| /healthz p99 < 50 ms during the 64³ load over small files |" in markdown
    assert markdown.startswith("Machine: ")

    # The table goes to standard output and into the README between the markers, the rest untouched.
    assert HEADER in done.stdout
    for name, label in expected:
        assert f"| {name} | {label} |" in done.stdout
    assert readme.read_text() == f"# before\n\n{README_START}\n{markdown}{README_END}\n\nafter\n"

    assert (out / "results.png").read_bytes().startswith(PNG_SIGNATURE)
    document = json.loads((out / "results.json").read_text())
    servers = {result["server"] for result in document["results"]}
    assert {f"gateway:main@{http}" for http in HTTP_SERVERS} <= servers
    assert {"proxy:auth@uvicorn", "bare@uvicorn", "bare@granian", "floor@granian", "rsgi@granian"} <= servers
    assert {"tiled@uvicorn", "xpublish@uvicorn", "proxy-h2:zipf32@uvicorn", "gateway:zipf64@uvicorn"} <= servers
    healthz = document["extras"]["healthz"]
    assert healthz["files"] >= 512 and healthz["probes"] > 0 and not healthz["probe_failures"], healthz
    assert healthz["p50_ms"] <= healthz["p99_ms"] <= healthz["max_ms"], healthz


def test_a_failed_case_names_the_log_lines_that_are_not_2xx_answers(capsys: pytest.CaptureFixture[str]) -> None:
    """A case with failed requests quotes the end of its server's log without the answered requests: the
    failures' lines, in either log format (rendered here by the gateway's own access log), the last four."""
    from benchmark.measure import unusual_lines

    from gateway.logs import AccessLog

    logger = logging.getLogger("gateway.access")
    level = logger.level
    logger.setLevel(logging.INFO)  # the level the gateway runs it at; below it, no access line is written
    try:
        for log_format in ("json", "text"):
            access = AccessLog()
            access.log_format = log_format
            for status in (200, 503, 206, 500, 204, 404, 200, 416):
                access.write("id", "GET", f"/data/zarr/org/ds/color/1/0.0.{status}", status, 12, 1.0)
            access.flush()
            tail = "a line the tail cut\n" + capsys.readouterr().err + "ERROR gateway: storage fault: x0.wkw\n"
            kept = unusual_lines(tail)
            assert [("0.0.500" in kept[0]), ("0.0.404" in kept[1]), ("0.0.416" in kept[2])] == [True] * 3, kept
            assert kept[3] == "ERROR gateway: storage fault: x0.wkw", kept
            assert len(kept) == 4 and len(unusual_lines(tail, most=9)) == 5, kept
    finally:
        logger.setLevel(level)
