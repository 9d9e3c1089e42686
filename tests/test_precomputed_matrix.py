"""The precomputed tree exact on every layout (issue 42): a generated matrix of layers, every source format (WKW
raw/LZ4/LZ4HC by ``wkw``, Zarr v2/v3 by zarr-python, N5 and precomputed by tensorstore), every data type of the
format, bounding boxes on and off the source's chunks and the 8³ blocks of compressed_segmentation, one and three
channels, read by CloudVolume through gateways of chunk edge 32, 64 and 128, in ``raw`` and in
``compressed_segmentation``, whole and in cutouts across chunk and volume edges, at every mip, voxel for voxel
against the writer's truth. A block-aligned WKW segmentation (box at the origin, as webKnossos writes it) of
uint32 and uint64, uncompressed and LZ4, is always among the cases: its chunks are whole blocks of the source,
handed out read-only, which compressed_segmentation once refused with a 500 for every chunk.
"""

import html
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import requests
from support.cloudvolume_reads import assert_reads_exactly
from support.precomputed_matrix import (
    AXES,
    CSEG_TYPES,
    DATASET,
    MAGS,
    ORG,
    SOURCE_CHUNK,
    UNUSABLE_TYPES,
    Case,
    LayerSpec,
    Truth,
    layer_of,
    pairs_of,
    pairwise_cases,
    valid,
    write_dataset,
)
from support.servers import Server, assert_no_unexpected_errors, assert_reason

from gateway.precomputed.encodings import COMPRESSED_SEGMENTATION, RAW

pytestmark = pytest.mark.slow  # CloudVolume reading some sixty layers at two mips through three gateways

# The layouts webKnossos writes most: a segmentation at the origin in whole WKW blocks, in both encodings, read
# through chunks of the block's edge (so that each chunk is one block of the source, handed out as it decodes).
BLOCK_ALIGNED = [
    {
        "source": source,
        "dtype": dtype,
        "edge": SOURCE_CHUNK,
        "alignment": alignment,
        "channels": 1,
        "category": "segmentation",
        "encoding": encoding,
    }
    for source, alignment in (("wkw_raw", "chunks"), ("wkw_lz4", "origin"))
    for dtype in CSEG_TYPES
    for encoding in ("raw", "compressed_segmentation")
]
CASES = pairwise_cases(AXES, BLOCK_ALIGNED)
UNUSABLE = [LayerSpec("wkw_raw", dtype, "origin", 1, "color") for dtype in UNUSABLE_TYPES]


def case_id(case: Case) -> str:
    encoding = "cseg" if case["encoding"] == "compressed_segmentation" else "raw"
    return f"{layer_of(case).name}-e{case['edge']}-{encoding}"


def tree_of(case: Case) -> str:
    """``precomputed_raw`` for a segmentation the main tree would compress but the case reads raw."""
    spec = layer_of(case)
    compressible = spec.category == "segmentation" and spec.dtype in CSEG_TYPES
    return "precomputed_raw" if compressible and case["encoding"] == "raw" else "precomputed"


@pytest.fixture(scope="module")
def matrix_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    root = tmp_path_factory.mktemp("precomputed_matrix")
    layers = list(dict.fromkeys(layer_of(case) for case in CASES)) + UNUSABLE
    return root, write_dataset(root / ORG / DATASET, layers, 42)


@pytest.fixture(scope="module")
def gateways(matrix_root: tuple[Path, Truth], server_factory: Callable[..., Server]) -> Iterator[dict[int, Server]]:
    """One gateway per chunk edge, started when a case first needs it."""
    started: dict[int, Server] = {}

    class Lazy(dict[int, Server]):
        def __missing__(self, edge: int) -> Server:
            started[edge] = server_factory(matrix_root[0], chunk_edge=edge)
            self[edge] = started[edge]
            return started[edge]

    yield Lazy()
    for server in started.values():
        assert_no_unexpected_errors(server)


def test_the_cases_cover_every_pair_of_axis_values() -> None:
    """The covering design holds: every value of every axis appears, every pair of values that a valid case of
    the full product holds is in some chosen case, no chosen case is invalid, and the block-aligned WKW
    segmentations are there in both encodings."""
    for axis, values in AXES.items():
        assert {case[axis] for case in CASES} == set(values), axis
    product = (dict(zip(AXES, values)) for values in itertools.product(*AXES.values()))
    possible = set().union(*(pairs_of(case) for case in product if valid(case)))
    chosen = set().union(*(pairs_of(case) for case in CASES))
    assert possible - chosen == set()
    assert ("encoding", "compressed_segmentation", "source", "precomputed") in possible  # the pairs are real
    assert ("category", "segmentation", "channels", 3) not in possible
    assert all(valid(case) for case in CASES)
    assert all(case in CASES for case in BLOCK_ALIGNED)
    assert len(CASES) < 80  # far below the product's thousands


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cloudvolume_reads_every_layout_exactly(
    case: Case, matrix_root: tuple[Path, Truth], gateways: dict[int, Server]
) -> None:
    spec, edge = layer_of(case), case["edge"]
    url = f"{gateways[edge].url}/data/{tree_of(case)}/{ORG}/{DATASET}/{spec.name}"
    info = requests.get(f"{url}/info", timeout=30).json()
    expected = COMPRESSED_SEGMENTATION if case["encoding"] == "compressed_segmentation" else RAW
    assert [scale["encoding"] for scale in info["scales"]] == [expected.name] * len(MAGS), info
    assert [scale["chunk_sizes"] for scale in info["scales"]] == [[[edge] * 3]] * len(MAGS), info
    assert (info["data_type"], info["num_channels"]) == (spec.dtype, spec.channels), info
    for mip, mag in enumerate(MAGS):
        lo, hi = spec.box(mag)
        truth = matrix_root[1][(spec.name, mag)]
        assert_reads_exactly(url, mip, truth, lo, hi, case_id(case), chunk=edge)


@pytest.mark.parametrize("spec", UNUSABLE, ids=lambda s: s.dtype)
def test_int64_and_float64_layers_are_listed_as_unusable(spec: LayerSpec, gateways: dict[int, Server]) -> None:
    server = gateways[AXES["edge"][0]]
    base = f"/data/precomputed/{ORG}/{DATASET}"
    reason = f"its data type {spec.dtype} is none of the precomputed format's"
    listing = requests.get(f"{server.url}{base}/", timeout=30)
    assert listing.status_code == 200
    line = html.unescape(next(line for line in listing.text.splitlines() if f"<li>{spec.name} " in line))
    assert f"unavailable: {reason}" in line, line
    for tree in ("precomputed", "precomputed_raw"):
        answer = requests.get(f"{server.url}/data/{tree}/{ORG}/{DATASET}/{spec.name}/info", timeout=30)
        assert_reason(answer, 404, reason)


@pytest.mark.parametrize("dtype", CSEG_TYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_compressed_segmentation_encodes_a_read_only_view(dtype: str, order: Literal["C", "F"]) -> None:
    """A read may hand out a decoded block read-only and in either order: what the encoder makes of it decodes
    to the voxels."""
    import compressed_segmentation

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2**40 if dtype == "uint64" else 2**31, size=(1, 24, 16, 8))
    voxels: np.ndarray[Any, Any] = labels.astype(dtype, order=order)
    voxels.flags.writeable = False
    body = COMPRESSED_SEGMENTATION.encode(voxels)
    decoded = compressed_segmentation.decompress(body, (24, 16, 8, 1), dtype, (8, 8, 8), order="F")
    np.testing.assert_array_equal(np.moveaxis(decoded, -1, 0), voxels)
