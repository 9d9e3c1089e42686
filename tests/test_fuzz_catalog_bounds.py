"""Generated ``datasource-properties.json`` documents near and past the catalog's bounds (issue 24, item 2).

For every example Hypothesis writes a dataset (in an organization of its own, so that each is loaded
fresh and listed alone) whose properties hold a generated number of layers (none, a few, or around
``MAX_LAYERS``), mags (around ``MAX_MAGS`` in all), nesting (around ``MAX_DEPTH``), size (padded to around
``MAX_PROPERTIES_BYTES``, or a sparse 512 MiB tail of NULs), cut short, or with broken entries (layers that
are not objects, lack fields, repeat a name, name an unknown format, a negative or huge bounding box,
mags of the wrong shape). The good layers read one small WKW mag of a shared dataset.

Every request for the dataset, its organization and the trees (Zarr v2 and v3, xarray, precomputed; the
dataset's metadata, listings and a layer's array) is answered 200 or an error with a JSON reason (never a
dropped connection, never the internal-error catch-all, no traceback in the log); a document past a bound
is refused with the reason that names the bound, one within every bound and without broken entries is
served; and ``/healthz``, polled throughout, keeps answering (no stall of seconds: the latency bound itself
is measured by ``tests/test_catalog_load.py``, alone on the machine).

What requests build from metadata and side files (issue 40, item 1): a generated segment list (a labels file
of a few names, or 8 MiB under its byte cap), the consolidated documents of a dataset of up to ``MAX_LAYERS``
layers and the listings of 40,000 organizations, through a gateway of a 12 MiB ``chunk_memory_bytes``: each is
costed before it is made, refused (413, the reason naming the setting) past the whole budget and served within
it, with the worker's peak memory within the budget and ``/healthz`` answering.

Two gateways; 40 examples of properties files (about 30 s on a loaded 2-core machine), 8 of what requests
build (about 60 s).
"""

import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import wkw
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.datasets import cube_layer
from support.measure import PeakRss, bytes_read
from support.polling import Poller
from support.servers import Server, assert_no_unexpected_errors

from gateway.http.pages.dataset import LAYER_CARD_BYTES
from gateway.meshes.index import MAX_INDEX_BYTES
from gateway.meshes.segments import (
    LABELS_HELD_PER_BYTE,
    LISTED_SEGMENT_BYTES,
    MAX_LABELS,
    MAX_LABELS_BYTES,
    PAGE_INDEX_BYTES,
)
from gateway.sources.documents import MAX_DEPTH
from gateway.sources.loader import MAX_LAYERS, MAX_MAGS, MAX_PROPERTIES_BYTES
from gateway.zarr.trees import DOCUMENT_ARRAY_BYTES, DOCUMENT_BYTES

pytestmark = pytest.mark.slow  # hundreds of generated cases

EDGE = 32
SHARED = ("shared", "template")  # the dataset whose one mag the good layers read
MAG_PATH = "../../shared/template/color/1"
BIG = 512 << 20
HEALTHZ_STALL_SECONDS = 5.0  # a load on the event loop stalls /healthz for many seconds; answered beside it, ms


@dataclass(frozen=True)
class Document:
    """A generated properties file and what the gateway must make of it."""

    text: bytes
    sparse_to: int | None  # the file extended by a hole of NULs to this size
    refused: tuple[str, ...]  # words of the reason a refusal must give; empty: it may be served
    clean: bool  # within every bound and nothing broken: it must be served
    layers: int  # how many layers it lists


def _good_layer(index: int, mags: int) -> dict[str, Any]:
    """A layer reading the shared mag, and ``mags - 1`` more mags whose directories are not there."""
    entries = [{"mag": [1, 1, 1], "path": MAG_PATH}]
    for x, y, z in itertools.islice(itertools.product(range(17), range(16), range(16)), 1, mags):
        entries.append({"mag": [2**x, 2**y, 2**z]})
    return cube_layer(f"layer{index}", "wkw", EDGE, entries)


BROKEN_LAYERS: list[Callable[[dict[str, Any]], Any]] = [
    lambda layer: "not a layer",
    lambda layer: None,
    lambda layer: [layer],
    lambda layer: {key: value for key, value in layer.items() if key != "name"},
    lambda layer: {key: value for key, value in layer.items() if key != "boundingBox"},
    lambda layer: {**layer, "name": "layer0"},  # a name another layer has
    lambda layer: {**layer, "name": "../x"},
    lambda layer: {**layer, "dataFormat": "tiff"},
    lambda layer: {**layer, "elementClass": "uint7"},
    lambda layer: {**layer, "boundingBox": {"topLeft": [-1, 0, 0], "width": 1, "height": 1, "depth": 1}},
    lambda layer: {**layer, "boundingBox": {"topLeft": [0, 0, 0], "width": 2**62, "height": 1, "depth": 1}},
    lambda layer: {**layer, "mags": "1-1-1"},
    lambda layer: {**layer, "mags": [{"mag": [0, 1, 1]}]},
    lambda layer: {**layer, "mags": [{"mag": [3, 1]}]},
    lambda layer: {**layer, "mags": [{"mag": [1, 1, 1], "path": 7}]},
    lambda layer: {**layer, "mags": [{"mag": [1, 1, 1], "path": "/nowhere/at/all"}]},
    lambda layer: {**layer, "mags": [], "wkwResolutions": [{"resolution": 1, "cubeLength": 1024}]},
    # mag paths no file can have: UNNAMEABLE_PATHS, below (they break the whole dataset today)
]
UNNAMEABLE_PATHS = {"nul": "color\u0000/1", "surrogate": "\ud800/1", "too long": "x" * 5000}


def _nested(depth: int) -> Any:
    """A value of arrays and objects nesting ``depth - 1`` deep: under a key of the document, ``depth`` in all."""
    value: Any = 1
    for level in range(depth - 1):
        value = [value] if level % 2 else {"k": value}
    return value


@st.composite
def documents(draw: st.DrawFn) -> Document:
    layer_count = draw(
        st.one_of(
            st.integers(0, 4),
            st.integers(0, 4),
            st.sampled_from([MAX_LAYERS - 1, MAX_LAYERS, MAX_LAYERS + 1, 3 * MAX_LAYERS]),
        )
    )
    total_mags = draw(st.sampled_from(["one each", "one each", "near", "past"]))
    if total_mags == "one each" or layer_count == 0:
        per_layer = [1] * layer_count
    else:
        total = draw(st.sampled_from([MAX_MAGS - 1, MAX_MAGS])) if total_mags == "near" else MAX_MAGS + 1
        total = max(total, layer_count)
        per_layer = [total // layer_count + (1 if i < total % layer_count else 0) for i in range(layer_count)]
    layers: list[Any] = [_good_layer(i, n) for i, n in enumerate(per_layer)]
    mags = sum(len(layer["mags"]) for layer in layers)
    fault = draw(st.sampled_from(["none"] * 4 + ["broken layers", "missing key", "cut", "too deep", "too large"]))
    broken = 0
    if fault == "broken layers" and layers:
        for position in draw(st.sets(st.integers(0, len(layers) - 1), min_size=1, max_size=2)):
            layers[position] = draw(st.sampled_from(BROKEN_LAYERS))(layers[position])
            broken += 1
    deep = [MAX_DEPTH + 1, 4 * MAX_DEPTH] if fault == "too deep" else [0, 0, MAX_DEPTH]  # MAX_DEPTH: just within
    depth = draw(st.sampled_from(deep))
    document: dict[str, Any] = {"id": {"name": "ds", "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": layers}
    if depth:
        document["notes"] = _nested(depth)  # beside the rest, and as deep as the document then is
    if fault == "missing key":
        del document[draw(st.sampled_from(["id", "scale", "dataLayers"]))]
        broken += 1
    text = json.dumps(document).encode()
    cut = fault == "cut"
    if cut:
        text = text[: draw(st.integers(1, len(text) - 1))]
    sizes = ["just over", "sparse"] if fault == "too large" else ["as is", "as is", "just under"]
    size = draw(st.sampled_from(sizes))
    sparse_to = None
    if size in ("just under", "just over"):  # padded with blanks (still JSON) to the bound, or one byte past it
        text += b" " * (MAX_PROPERTIES_BYTES - len(text) + (1 if size == "just over" else 0))
    elif size == "sparse":
        sparse_to = BIG
    file_size = sparse_to or len(text)
    if file_size > MAX_PROPERTIES_BYTES:
        refused: tuple[str, ...] = ("too large", f"more than the {MAX_PROPERTIES_BYTES}")
    elif cut:
        refused = ("not readable JSON",)
    elif depth > MAX_DEPTH:
        refused = ("nests deeper", str(MAX_DEPTH))
    elif layer_count > MAX_LAYERS and "dataLayers" in document:
        refused = (f"{layer_count} layers", f"more than the {MAX_LAYERS}")
    elif mags > MAX_MAGS and "dataLayers" in document and not broken:
        refused = (f"{mags} mags", f"more than the {MAX_MAGS}")
    else:
        refused = ()
    clean = not refused and not broken
    return Document(text, sparse_to, refused, clean, layer_count)


# --- the gateway and /healthz -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-catalog-bounds")
    shared = root.joinpath(*SHARED)
    with wkw.Dataset.create(str(shared / "color" / "1"), wkw.Header(np.uint8, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), np.full((EDGE,) * 3, 7, dtype=np.uint8))
    properties = {"id": {"name": SHARED[1], "team": ""}, "scale": [1.0, 1.0, 1.0]}
    properties["dataLayers"] = [cube_layer("color", "wkw", EDGE)]
    (shared / "datasource-properties.json").write_text(json.dumps(properties))
    return root


@pytest.fixture(scope="module")
def served(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root)


def _assert_answering(poller: Poller) -> None:
    assert not poller.failures, poller.failures[:5]
    slowest = max(poller.latencies, default=0.0)
    assert slowest < HEALTHZ_STALL_SECONDS, f"/healthz took {slowest:.2f} s"


@pytest.fixture(scope="module")
def health(served: Server) -> Iterator[Poller]:
    with Poller(served.url + "/healthz", 0.05) as poller:
        yield poller
    _assert_answering(poller)
    assert poller.latencies, "/healthz was never asked"


_organizations = itertools.count()


def _assert_answer(answer: requests.Response, what: str) -> None:
    where = (what, answer.status_code, answer.text[:300])
    assert answer.status_code == 200 or 400 <= answer.status_code < 600, where
    if answer.status_code >= 400:
        assert answer.headers["Content-Type"].startswith("application/json"), where
        error = answer.json()["error"]
        assert isinstance(error, str) and error and "internal error" not in error, where
        assert "could not be loaded" not in error, ("a fault the load did not foresee", where)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(document=documents())
def test_every_generated_properties_file_is_served_or_refused_with_its_reason(
    root: Path, served: Server, health: Poller, document: Document
) -> None:
    started = time.perf_counter()
    organization = f"o{next(_organizations)}"
    dataset = root / organization / "ds"
    dataset.mkdir(parents=True)
    properties = dataset / "datasource-properties.json"
    properties.write_bytes(document.text)
    if document.sparse_to is not None:
        os.truncate(properties, document.sparse_to)
    paths = {
        "group": f"/data/zarr/{organization}/ds/.zgroup",
        "attributes": f"/data/zarr/{organization}/ds/.zattrs",
        "v3 group": f"/data/zarr3/{organization}/ds/zarr.json",
        "xarray": f"/data/xarray/{organization}/ds/zarr.json",
        "organization": f"/data/zarr/{organization}/",
        "precomputed": f"/data/precomputed/{organization}/ds/",
        "array": f"/data/zarr/{organization}/ds/layer0/1/.zarray",
        "chunk": f"/data/zarr/{organization}/ds/layer0/1/0.0.0.0",
    }
    paths["listing"] = f"/data/zarr/{organization}/ds/"
    with requests.Session() as session:
        answers = {name: session.get(served.url + path, timeout=60) for name, path in paths.items()}
        answers["tree"] = session.get(served.url + "/data/zarr/", timeout=60)
    event(f"{'refused: ' + document.refused[0] if document.refused else 'clean' if document.clean else 'broken'}")
    for name, answer in answers.items():
        _assert_answer(answer, name)
    group = answers["group"]
    if document.refused:
        assert group.status_code == 409, (document.refused, group.status_code, group.text[:300])
        message = group.json()["error"]
        assert all(word in message for word in document.refused), (document.refused, message)
        assert answers["organization"].status_code == 200 and document.refused[0] in answers["organization"].text
    elif document.clean:
        assert group.status_code == 200, group.text[:300]
        if document.layers:
            assert answers["chunk"].status_code == 200 and answers["chunk"].content, answers["chunk"].text[:300]
    else:  # broken entries: refused with a reason, or served with each broken layer named
        assert group.status_code in (200, 409), group.text[:300]
    for listing in ("organization", "tree"):
        assert answers[listing].status_code == 200, answers[listing].text[:300]
    _assert_answering(health)
    assert_no_unexpected_errors(served)
    event(
        f"took {'over 2 s' if time.perf_counter() - started > 2 else 'under 2 s'}",
    )
    if time.perf_counter() - started > 2:
        event(f"slow: {document.layers} layers, {len(document.text)} bytes, {document.refused}")


# --- found by the examples above ---------------------------------------------------------------------------


def _write(root: Path, organization: str, name: str, layers: list[dict[str, Any]]) -> None:
    dataset = root / organization / name
    dataset.mkdir(parents=True)
    document = {"id": {"name": name, "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": layers}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


@pytest.mark.parametrize("kind", list(UNNAMEABLE_PATHS))
def test_a_mag_path_no_file_can_have_is_that_mag_s_problem(root: Path, served: Server, kind: str) -> None:
    organization = f"unnameable{list(UNNAMEABLE_PATHS).index(kind)}"
    good = _good_layer(0, 1)
    bad = {**_good_layer(1, 1), "mags": [{"mag": [1, 1, 1], "path": UNNAMEABLE_PATHS[kind]}]}
    _write(root, organization, "ds", [good, bad])
    answer = requests.get(f"{served.url}/data/zarr/{organization}/ds/layer0/1/0.0.0.0", timeout=60)
    assert answer.status_code == 200, answer.text[:300]  # its neighbour is served
    listing = requests.get(f"{served.url}/data/zarr/{organization}/ds/", timeout=60)
    assert listing.status_code == 200 and "layer1" in listing.text and "could not be loaded" not in listing.text
    assert "Traceback" not in served.log()


def _page_bytes(root: Path, served: Server, layers: int) -> int:
    organization = f"page{layers}"
    _write(root, organization, "ds", [_good_layer(i, 1) for i in range(layers)])
    answer = requests.get(f"{served.url}/data/zarr/{organization}/ds/", timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    return len(answer.content)


def test_a_dataset_page_grows_with_its_layers_not_their_square(root: Path, served: Server) -> None:
    few, many = _page_bytes(root, served, 25), _page_bytes(root, served, 100)
    assert many < 6 * few, f"25 layers: {few} bytes, 100 layers: {many} bytes (4 times the layers)"


# --- derived files a page view reads: labels and indexes near and past their bounds (issue 40, item 2) -------

LABELS = ["none", "named", "long name under the byte bound", "past the entries", "past the bytes", "not JSON"]
INDEXES = ["none", "sparse, past what a page reads", "sparse, the largest index there may be", "not an index"]
NAME = "segment-one"  # the label every labels file within its bounds gives segment 1
PAGE_READ_BYTES = 1 << 20  # what a page view may read once its derived files were looked at once
DERIVED_RSS = 96 << 20  # parsing any planted file whole would add hundreds of MiB


def _plant_labels(path: Path, kind: str) -> None:
    if kind == "none":
        return
    if kind == "not JSON":
        path.write_bytes(b"{" * 1000)
        return
    if kind == "past the bytes":
        path.write_text(json.dumps({"1": NAME}))
        os.truncate(path, MAX_LABELS_BYTES + 1)  # a sparse tail: refused on its size, never read
        return
    labels = {"1": NAME}
    if kind == "long name under the byte bound":
        labels["999999"] = "x" * (MAX_LABELS_BYTES - 100)
    elif kind == "past the entries":  # short entries: well under the byte bound
        labels |= {str(i): "" for i in range(2, MAX_LABELS + 2)}
    path.write_text(json.dumps(labels))


def _plant_index(path: Path, kind: str) -> None:
    if kind == "not an index":
        path.write_bytes(os.urandom(1 << 16))
    elif kind != "none":
        with open(path, "wb") as file:  # all NULs, however large: nothing a page may read whole
            file.truncate(PAGE_INDEX_BYTES + 1 if kind.startswith("sparse, past") else MAX_INDEX_BYTES)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(labels=st.sampled_from(LABELS), index=st.sampled_from(INDEXES))
def test_derived_files_a_page_reads_are_bounded_before_parsing_and_their_failures_remembered(
    root: Path, served: Server, health: Poller, labels: str, index: str
) -> None:
    """A segmentation layer with a generated labels file and index file beside it: three views of its dataset
    page and its segment properties in the mesh and precomputed trees are each answered (200 or a JSON
    reason), the worker grows by tens of MiB at most, a page view after the first reads almost nothing (what it
    found, or failed to, is remembered until a file changes), labels within their bounds are listed and others
    ignored, and ``/healthz`` keeps answering."""
    organization = f"derived{next(_organizations)}"
    dataset = root / organization / "ds"
    layer = {**cube_layer("seg", "wkw", EDGE), "category": "segmentation", "elementClass": "uint32"}
    _write(root, organization, "ds", [{**layer, "largestSegmentId": 2}])
    with wkw.Dataset.create(str(dataset / "seg" / "1"), wkw.Header(np.uint32, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), (np.arange(EDGE**3, dtype=np.uint32).reshape((EDGE,) * 3) % 3))
    _plant_labels(dataset / "seg.segment-labels.json", labels)
    _plant_index(dataset / "seg.segment-index.npz", index)
    event(f"labels: {labels}; index: {index}")
    page = f"{served.url}/data/zarr/{organization}/ds/"
    properties = [
        f"{served.url}/data/meshes/{organization}/ds/seg/multires/segment_properties/info",
        f"{served.url}/data/precomputed/{organization}/ds/seg/segment_properties/info",
    ]
    with requests.Session() as session, PeakRss(served) as peak:
        first = session.get(page, timeout=120)
        before = bytes_read(served)
        again = [session.get(page, timeout=120) for _ in range(2)]
        read_again = bytes_read(served) - before
        answers = [session.get(url, timeout=120) for url in properties]
    for answer in [first, *again, *answers]:
        _assert_answer(answer, answer.url)
    assert first.status_code == 200 and all(a.status_code == 200 for a in again), first.text[:300]
    assert read_again < PAGE_READ_BYTES, f"two more page views read {read_again} bytes ({labels}, {index})"
    assert peak.growth < DERIVED_RSS, f"the worker grew by {peak.growth >> 20} MiB ({labels}, {index})"
    for answer in answers:
        if index != "none":  # a damaged index is a storage fault with the reason, found without reading it whole
            assert answer.status_code == 500 and "segment index" in answer.json()["error"], answer.text[:300]
            continue
        assert answer.status_code == 200, (answer.url, answer.text[:300])  # a layer this small is scanned
        listed = NAME in answer.text
        assert listed == (labels in ("named", "long name under the byte bound")), (labels, answer.text[:300])
    _assert_answering(health)
    assert_no_unexpected_errors(served)


# --- what requests build from metadata and side files, charged to the one memory budget (issue 40, item 1) ------

BUDGETED = 12 << 20  # chunk_memory_bytes of the gateway below: a few MiB per request fit, tens do not
BUDGETED_RSS = BUDGETED + (48 << 20)  # the budget, and what a worker's allocator keeps of earlier examples
MANY_ORGANIZATIONS = 40_000  # a listing of them holds about 16 MiB while it is made: past the whole budget
SHAPES = ["segment list", "document", "page index"]
# an index file beside a segmentation (an archive of one array of this many ids), which its dataset page reads
INDEX_IDS = st.sampled_from([1000, 2_000_000])
# a labels file of (entries, name length), parsed for a segment list: a few KiB, or 8 MiB (72 MiB parsed)
LABEL_FILES = st.sampled_from([(10, 8), (20_000, 8), (MAX_LABELS, 24)])
# a dataset of this many layers, whose consolidated metadata documents describe every one (16 KiB each)
LAYER_COUNTS = st.sampled_from([1, 100, MAX_LAYERS])


@pytest.fixture(scope="module")
def budgeted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-catalog-budget")
    for n in range(MANY_ORGANIZATIONS):
        (root / f"empty{n}").mkdir()
    return root


@pytest.fixture(scope="module")
def budgeted(budgeted_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(budgeted_root, chunk_memory_bytes=BUDGETED)


def _labelled_segmentation(root: Path, organization: str, entries: int, name_length: int) -> int:
    """A small segmentation of many segments (scanned on demand) and a labels file; the labels file's size."""
    dataset = root / organization / "ds"
    layer = {**cube_layer("seg", "wkw", EDGE), "category": "segmentation", "elementClass": "uint32"}
    _write(root, organization, "ds", [{**layer, "largestSegmentId": EDGE**3}])
    with wkw.Dataset.create(str(dataset / "seg" / "1"), wkw.Header(np.uint32, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), np.arange(1, EDGE**3 + 1, dtype=np.uint32).reshape((EDGE,) * 3))
    labels = dataset / "seg.segment-labels.json"
    labels.write_text(json.dumps({str(i): f"{i:0{name_length}d}" for i in range(1, entries + 1)}))
    return labels.stat().st_size


def _shared_mag(root: Path) -> str:
    """The one WKW mag every layer of a many-layer dataset reads, relative to such a dataset."""
    shared = root.joinpath(*SHARED)
    if not shared.exists():
        header = wkw.Header(np.uint8, block_len=EDGE, file_len=1)
        with wkw.Dataset.create(str(shared / "color" / "1"), header) as ds:
            ds.write((0, 0, 0), np.full((EDGE,) * 3, 7, dtype=np.uint8))
    return MAG_PATH


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from(SHAPES), data=st.data())
def test_what_a_request_builds_from_metadata_and_side_files_is_charged_to_the_budget(
    budgeted_root: Path, budgeted: Server, shape: str, data: st.DataObject
) -> None:
    """A generated segment list (a labels file of a few names, or 8 MiB under its byte cap), a dataset of 1 to
    ``MAX_LAYERS`` layers (its consolidated documents in every tree, and its page), a dataset page whose
    segmentation has an index file of 8 KB or 16 MB (read for its largest segments) and a listing of 40,000
    organizations, through a gateway of a 12 MiB budget: each is costed before it is made, a 413 naming
    ``chunk_memory_bytes`` where its cost is past the whole budget (which it was not, before: the lists were
    charged nothing), served where it fits, the worker grows by no more than the budget allows, and ``/healthz``
    keeps answering."""
    organization = f"budgeted{next(_organizations)}"
    urls: dict[str, bool] = {}  # url: whether its cost is past the whole budget
    if shape == "segment list":
        entries, name_length = data.draw(LABEL_FILES, label="labels")
        labels_bytes = _labelled_segmentation(budgeted_root, organization, entries, name_length)
        scan = EDGE**3 * 4 + EDGE**3 * LISTED_SEGMENT_BYTES  # the labels scanned, a segment each listed
        assert labels_bytes <= MAX_LABELS_BYTES  # under its byte cap: read and parsed
        past = scan + labels_bytes * (LABELS_HELD_PER_BYTE + 1) > BUDGETED
        base = f"{budgeted.url}/data/{{}}/{organization}/ds/seg/"
        urls |= {base.format(tree) + path: past for tree, path in SEGMENT_LISTS.items()}
    elif shape == "page index":
        _labelled_segmentation(budgeted_root, organization, 1, 8)
        index = budgeted_root / organization / "ds" / "seg.segment-index.npz"
        np.savez(index, ids=np.arange(data.draw(INDEX_IDS, label="ids"), dtype=np.uint64))
        past = 2 * index.stat().st_size > BUDGETED  # the file read whole, and its array unpacked
        urls[f"{budgeted.url}/data/zarr/{organization}/ds/"] = past
    else:
        mag, count = _shared_mag(budgeted_root), data.draw(LAYER_COUNTS, label="layers")
        layers = [cube_layer(f"l{i}", "wkw", EDGE, [{"mag": [1, 1, 1], "path": mag}]) for i in range(count)]
        _write(budgeted_root, organization, "ds", layers)
        past = DOCUMENT_BYTES + count * DOCUMENT_ARRAY_BYTES > BUDGETED
        urls |= {f"{budgeted.url}/data/{path.format(organization)}": past for path in CONSOLIDATED}
        urls[f"{budgeted.url}/data/zarr/{organization}/ds/"] = count * LAYER_CARD_BYTES > BUDGETED  # its page
    urls |= {f"{budgeted.url}{path}": True for path in ROOT_LISTINGS}  # 40,000 organizations
    event(f"{shape}: {'past the budget' if past else 'fits'}")
    with Poller(budgeted.url + "/healthz", 0.05) as health, requests.Session() as session, PeakRss(budgeted) as peak:
        answers = {url: session.get(url, timeout=120) for url in urls}
    for url, answer in answers.items():
        _assert_answer(answer, url)
        if urls[url]:
            assert answer.status_code == 413, (url, answer.status_code, answer.text[:300])
            assert "chunk_memory_bytes" in answer.json()["error"], (url, answer.text[:300])
        else:
            assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
    assert peak.growth < BUDGETED_RSS, f"{shape} {sorted(urls)[0]}: the worker grew by {peak.growth >> 20} MiB"
    _assert_answering(health)
    assert_no_unexpected_errors(budgeted)


SEGMENT_LISTS = {"meshes": "multires/segment_properties/info", "precomputed": "segment_properties/info"}
CONSOLIDATED = ["zarr/{}/ds/.zmetadata", "zarr3/{}/ds/zarr.json", "xarray/{}/ds/zarr.json"]
ROOT_LISTINGS = ["/data/zarr/", "/data/precomputed/", "/"]
