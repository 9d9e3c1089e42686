"""Catalog work never stalls a worker (issue 24, item 2).

A lab member writes a dataset whose properties file asks for as much work as the gateway allows (the
most layers a dataset may have, one of them broken), one that asks for more (more layers, more mags,
more bytes: refused with the reason before any of it is validated or opened), and one whose properties
are not JSON. While these are requested and listed, the gateway's event loop must keep running within 100 ms
(its own lag probe, in /metrics) and ``/healthz``, polled from another process, keep answering in a small
fraction of the time those loads take: loads, listings and the pages of every dataset run in threads of
their own bound, off the event loop, and the loaded catalog is kept out of the collector's full collections.
And a dataset whose load found problems is not loaded again until something that load looked at changes.
"""

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import wkw
from support.datasets import cube_layer, write_layers_properties
from support.metrics import Samples, histogram_delta, scrape, value
from support.polling import Poller
from support.servers import Server

from gateway.sources import catalog as catalog_module
from gateway.sources.catalog import Catalog
from gateway.sources.dataset import BrokenDataset, Dataset
from gateway.sources.loader import MAX_LAYERS, MAX_MAGS, MAX_PROPERTIES_BYTES
from gateway.sources.registry import SourceFormats
from gateway_storage import LocalStore

pytestmark = pytest.mark.serial  # /healthz latency and the event loop's lag while the bombs load: measured alone

ORG = "bombs"
EDGE = 32
# The promise, measured where it is kept: the gateway's event loop (its lag probe, in /metrics) runs a
# timer due within 100 ms. The probe samples every LAG_INTERVAL_SECONDS (20 ms), and what still holds the loop
# now and then is outside any request's control: a full collection of the cycle collector (it holds the
# interpreter in whichever thread allocates; gateway/heap.py keeps the loaded catalog out of it) and, on a
# busy 2-core machine, the other processes' turns for the cores. So 95% of the samples must be within 100 ms,
# and the slowest within two seconds (a load average of 12 here once saw 1.2 s).
LOOP_LAG_BOUND = 0.1
LOOP_LAG_SHARE = 0.95
LOOP_LAG_MAX_SECONDS = 2.0
# /healthz as a client in a process of its own sees it: the loop's wait plus its own and the server's turns for
# the two cores, which the test's requests keep busy (a load on the event loop stalls it for seconds).
HEALTHZ_P95_SECONDS = 0.25
HEALTHZ_MAX_SECONDS = 2.0
POLL_SECONDS = 0.02
HEAVY = ("heavy", "heavy1", "heavy2", "heavy3")


def _layer(name: str, path: str) -> dict[str, Any]:
    return cube_layer(name, "wkw", EDGE, [{"mag": [1, 1, 1], "path": path}])


def _write_mag(directory: Path) -> None:
    with wkw.Dataset.create(str(directory), wkw.Header(np.uint8, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), np.full((EDGE,) * 3, 7, dtype=np.uint8))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalog-load")
    _write_mag(root / ORG / "heavy" / "shared" / "1")
    # the most layers allowed, every one opening a mag, and the last one broken (its mag is not there); a
    # few such datasets, so that loading them on the event loop would stall it for seconds
    layers = [_layer(f"layer{i}", "shared/1") for i in range(MAX_LAYERS - 1)] + [_layer("broken", "missing/1")]
    for name in HEAVY:
        write_layers_properties(root / ORG / name, layers)
        if name != "heavy":
            (root / ORG / name / "shared").symlink_to(root / ORG / "heavy" / "shared", target_is_directory=True)
    write_layers_properties(
        root / ORG / "too_many_layers", [_layer(f"layer{i}", "shared/1") for i in range(MAX_LAYERS + 1)]
    )
    many_mags = _layer("color", "shared/1")
    many_mags["mags"] = [{"mag": [i + 1] * 3} for i in range(MAX_MAGS + 1)]
    write_layers_properties(root / ORG / "too_many_mags", [many_mags])
    # 20,000 layers with one broken, as seen in the issue (4.5 MB): more bytes than a properties file may have
    write_layers_properties(
        root / ORG / "huge", [_layer(f"layer{i}", "shared/1") for i in range(19_999)] + [_layer("b", "x")]
    )
    assert (root / ORG / "huge" / "datasource-properties.json").stat().st_size > MAX_PROPERTIES_BYTES
    (root / ORG / "not_json").mkdir()
    (root / ORG / "not_json" / "datasource-properties.json").write_text("{" * 1000)
    for index in range(200):  # many datasets in one organization: a listing does not load them
        write_layers_properties(root / "many" / f"ds{index:03}", [_layer("color", "../../bombs/heavy/shared/1")])
    return root


@pytest.fixture(scope="module")
def served(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root)


def _assert_healthy(poller: Poller) -> None:
    latencies = sorted(poller.latencies)
    assert not poller.failures, poller.failures[:5]
    assert len(latencies) >= 20, f"only {len(latencies)} /healthz answers were measured"
    p95 = latencies[int(len(latencies) * 0.95)]
    summary = f"/healthz, {len(latencies)} answers: median {statistics.median(latencies) * 1000:.1f} ms, "
    summary += f"p95 {p95 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms"
    print(summary)
    assert p95 < HEALTHZ_P95_SECONDS, summary
    assert latencies[-1] < HEALTHZ_MAX_SECONDS, summary


def _loop_lag(before: Samples, after: Samples) -> tuple[str, bool]:
    """A summary of the loop's lag between two scrapes, and whether it kept within the bounds. The longest is
    the worker's since it started (the module's server is new, and this is its first test)."""
    buckets = histogram_delta(before, after, "zarr_gateway_event_loop_lag_seconds")
    samples = buckets[-1][1]
    median = next(bound for bound, count in buckets if count >= samples / 2)
    p95 = next(bound for bound, count in buckets if count >= samples * 0.95)
    within = max(count for bound, count in buckets if bound <= LOOP_LAG_BOUND)
    longest = value(after, "zarr_gateway_event_loop_lag_max_seconds")
    summary = f"event loop lag, {samples:.0f} samples: median <= {median * 1000:g} ms, p95 <= {p95 * 1000:g} ms, "
    summary += f"{within / samples:.1%} within {LOOP_LAG_BOUND * 1000:g} ms, longest {longest * 1000:.1f} ms"
    kept = samples >= 100 and within >= samples * LOOP_LAG_SHARE and longest < LOOP_LAG_MAX_SECONDS
    return summary, kept


def test_healthz_answers_while_bombs_are_requested_and_listed(served: Server) -> None:
    """The first test of the module: the datasets are loaded (the listing loads them all) while the event loop's
    lag is sampled by the gateway and /healthz is polled from another process."""
    before = scrape(served)
    with Poller(served.url + "/healthz", POLL_SECONDS) as poller:
        _send_the_bombs(served)
    summary, kept = _loop_lag(before, scrape(served))
    print(summary)
    _assert_healthy(poller)
    assert kept, summary


def _send_the_bombs(served: Server) -> None:
    started = time.perf_counter()
    while time.perf_counter() - started < 5.0:  # past a reload interval, so the broken layer is looked at again
        paths = ["/data/zarr/", f"/data/zarr/{ORG}/", "/data/zarr3/many/"]
        for path in [*paths, *(f"/data/zarr/{ORG}/{name}/.zgroup" for name in HEAVY)]:
            assert requests.get(served.url + path, timeout=60).status_code == 200, path
        for name in ("too_many_layers", "too_many_mags", "huge", "not_json"):
            assert requests.get(f"{served.url}/data/zarr/{ORG}/{name}/.zgroup", timeout=60).status_code == 409
        chunk = requests.get(f"{served.url}/data/zarr/{ORG}/heavy/layer7/1/0.0.0.0", timeout=60)
        assert chunk.status_code == 200, chunk.text


@pytest.mark.parametrize(
    ("dataset", "words"),
    [
        ("too_many_layers", (f"{MAX_LAYERS + 1} layers", f"more than the {MAX_LAYERS}")),
        ("too_many_mags", (f"{MAX_MAGS + 1} mags", f"more than the {MAX_MAGS}")),
        ("huge", ("bytes", f"more than the {MAX_PROPERTIES_BYTES}")),
    ],
)
def test_a_load_past_the_bounds_is_refused_with_the_reason(
    served: Server, dataset: str, words: tuple[str, ...]
) -> None:
    answer = requests.get(f"{served.url}/data/zarr/{ORG}/{dataset}/.zattrs", timeout=60)
    assert answer.status_code == 409, answer.text
    message = answer.json()["error"]
    assert "cannot be served" in message and all(word in message for word in words), message
    listing = requests.get(f"{served.url}/data/zarr/{ORG}/", timeout=60)
    assert dataset in listing.text and words[0] in listing.text


def test_the_heavy_dataset_serves_its_layers_and_names_its_broken_one(served: Server) -> None:
    listing = requests.get(f"{served.url}/data/zarr/{ORG}/heavy/", timeout=60)
    assert listing.status_code == 200 and "layer998" in listing.text and "broken" in listing.text
    assert "directory not found" in listing.text


# --- not loaded again until something the load looked at changes (in process, on a real store) ---------


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Revalidation and the look at datasets with problems every 50 ms, so the test need not wait seconds."""
    monkeypatch.setattr(catalog_module, "REVALIDATE_SECONDS", 0.05)
    monkeypatch.setattr(catalog_module, "RELOAD_PROBLEMS_SECONDS", 0.05)


def _catalog(root: Path) -> Catalog:
    store = LocalStore(str(root))
    return Catalog(store, SourceFormats(store, 1 << 20))


def test_a_broken_layer_is_not_loaded_again_until_its_files_change(tmp_path: Path, quick: None) -> None:
    dataset = tmp_path / ORG / "late"
    _write_mag(dataset / "color" / "1")
    write_layers_properties(dataset, [_layer("color", "color/1"), _layer("late", "late/1")])
    catalog = _catalog(tmp_path)
    first = catalog.dataset(ORG, "late")
    assert isinstance(first, Dataset) and first.layers["late"].problems and not first.layers["color"].problems
    for _ in range(4):
        time.sleep(0.1)
        assert catalog.dataset(ORG, "late") is first  # looked at again, found unchanged: not loaded again
    _write_mag(dataset / "late" / "1")  # the mag appears (an upload finished, a volume was mounted)
    time.sleep(0.1)
    second = catalog.dataset(ORG, "late")
    assert isinstance(second, Dataset) and second is not first and not second.layers["late"].problems


def test_a_header_rewritten_in_place_is_noticed(tmp_path: Path, quick: None) -> None:
    """A mag whose header cannot be read is loaded again once that file changes, though no directory does."""
    dataset = tmp_path / ORG / "header"
    _write_mag(dataset / "color" / "1")
    header = dataset / "color" / "1" / "header.wkw"
    good = header.read_bytes()
    with open(header, "r+b") as file:  # rewritten in place: the directory's mtime stays as it was
        file.write(b"\0" * 8)
    write_layers_properties(dataset, [_layer("color", "color/1")])
    catalog = _catalog(tmp_path)
    first = catalog.dataset(ORG, "header")
    assert isinstance(first, Dataset) and first.layers["color"].problems
    time.sleep(0.1)
    assert catalog.dataset(ORG, "header") is first
    with open(header, "r+b") as file:
        file.write(good)
    time.sleep(0.1)
    second = catalog.dataset(ORG, "header")
    assert isinstance(second, Dataset) and not second.layers["color"].problems


def test_broken_properties_are_not_loaded_again_until_the_file_changes(tmp_path: Path, quick: None) -> None:
    dataset = tmp_path / ORG / "bad"
    _write_mag(dataset / "color" / "1")
    dataset.joinpath("datasource-properties.json").write_text("{")
    catalog = _catalog(tmp_path)
    first = catalog.dataset(ORG, "bad")
    assert isinstance(first, BrokenDataset) and "not readable JSON" in first.reason
    time.sleep(0.1)
    assert catalog.dataset(ORG, "bad") is first
    write_layers_properties(dataset, [_layer("color", "color/1")])
    time.sleep(0.1)
    assert isinstance(catalog.dataset(ORG, "bad"), Dataset)


def test_names_are_listed_without_loading_a_dataset(tmp_path: Path) -> None:
    for name in ("one", "two"):
        write_layers_properties(tmp_path / ORG / name, [_layer("color", "color/1")])
    (tmp_path / ORG / "no_properties").mkdir()
    catalog = _catalog(tmp_path)
    assert catalog.dataset_names(ORG) == ["one", "two"]
    assert catalog.fresh(ORG, "one") is None  # nothing was loaded


def test_a_dataset_that_still_holds_is_had_without_a_load(tmp_path: Path, quick: None) -> None:
    """``unchanged`` (what a request runs in a chunk thread while the catalog threads may be busy loading)
    answers from the last load after one stat, and leaves everything else to a load: a dataset never
    loaded, one whose properties changed, one whose problems are due to be looked at."""
    dataset = tmp_path / ORG / "held"
    _write_mag(dataset / "color" / "1")
    write_layers_properties(dataset, [_layer("color", "color/1")])
    catalog = _catalog(tmp_path)
    assert catalog.unchanged(ORG, "held") is None  # never loaded: it does not load
    first = catalog.dataset(ORG, "held")
    assert isinstance(first, Dataset)
    time.sleep(0.1)  # past REVALIDATE_SECONDS: a stat decides
    assert catalog.unchanged(ORG, "held") is first
    write_layers_properties(dataset, [_layer("color", "color/1"), _layer("late", "late/1")])
    time.sleep(0.1)
    assert catalog.unchanged(ORG, "held") is None
    second = catalog.dataset(ORG, "held")
    assert isinstance(second, Dataset) and second.layers["late"].problems
    time.sleep(0.1)  # its problems are due to be looked at: a load decides
    assert catalog.unchanged(ORG, "held") is None
