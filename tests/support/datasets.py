"""The main test dataset: its geometry, how it is written (by webknossos-libs, in WKW), what it must read as."""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from gateway_storage.geometry import Vec3, vec3
from gateway_storage.geometry import mag_name as mag_name  # the name every test builds URLs and paths with

ORG = "test_org"
TOKEN = "secret-token-for-tests"
OTHER_TOKEN = "token-for-another-org"
# One token sent more than once, in the query and in X-Auth-Token lines: each is refused (400) by the
# gateway and by every proxy in front of it, even once a grant for the real token is cached.
REPEATED_TOKENS = [
    pytest.param(f"?token={TOKEN}&token={TOKEN}", [], id="query-twice"),
    pytest.param(f"?token=decoy&token={TOKEN}", [], id="query-decoy"),
    pytest.param(f"?token={TOKEN}", [TOKEN], id="query-and-header"),
    pytest.param("", [TOKEN, TOKEN], id="lines-twice"),
    pytest.param("", ["decoy", TOKEN], id="lines-decoy"),
]


@dataclass(frozen=True)
class Spelling:
    """One way of sending TOKEN, or of trying to: the token path before a data path (``""`` for none), a
    query string and X-Auth-Token lines; and the answer the gateway and the shipped proxy give it.

    200 at the gateway means it read exactly TOKEN; 200 at the proxy means the proxy passed it on, its
    limits counting it under TOKEN; 400 means refused (by the proxy: before any limit counts it).
    """

    prefix: str
    query: str
    lines: tuple[str, ...]
    at_gateway: tuple[int, ...]  # more than one where HTTP servers differ (whether they strip blanks)
    at_proxy: int

    def uri(self, path: str) -> str:
        return f"{self.prefix}{path}{self.query}"

    def request(self, path: str, request_id: str = "") -> bytes:
        """A raw GET of ``path`` so spelt: no client library tidies it up."""
        lines = "".join(f"X-Auth-Token: {line}\r\n" for line in self.lines)
        marker = f"X-Request-Id: {request_id}\r\n" if request_id else ""
        return f"GET {self.uri(path)} HTTP/1.1\r\nHost: x\r\n{lines}{marker}Connection: close\r\n\r\n".encode()


_ENCODED = TOKEN.replace("-", "%2D", 1)  # TOKEN with one character percent-encoded, as a URL may carry it
# Every spelling of TOKEN that the gateway reads, or refuses, and what the proxy does with it, by name.
TOKEN_SPELLINGS = {
    "header": Spelling("", "", (TOKEN,), (200,), 200),
    "query": Spelling("", f"?token={TOKEN}", (), (200,), 200),
    "path": Spelling(f"/t/{TOKEN}", "", (), (200,), 200),
    "empty-header-and-query": Spelling("", f"?token={TOKEN}", ("",), (200,), 200),
    "empty-query-and-header": Spelling("", "?token=&x=1", (TOKEN,), (200,), 200),
    "empty-query-and-path": Spelling(f"/t/{TOKEN}", "?token=", (), (200,), 200),
    # percent-encoded: the gateway decodes it, the proxy cannot and refuses it (send such a token as the header)
    "encoded-query": Spelling("", f"?token={_ENCODED}", (), (200,), 400),
    "encoded-query-lower-hex": Spelling("", f"?token={_ENCODED.lower()}", (), (200,), 400),
    "encoded-path": Spelling(f"/t/{_ENCODED}", "", (), (200,), 400),
    # a header value is the token exactly: no list syntax, no commas, no blanks around it
    "comma-after": Spelling("", "", (f"{TOKEN},",), (400,), 400),
    "comma-before": Spelling("", "", (f",{TOKEN}",), (400,), 400),
    "blank-comma": Spelling("", "", (f"{TOKEN} ,",), (400,), 400),
    "comma-blank": Spelling("", "", (f"{TOKEN}, ",), (400,), 400),
    "list-twice": Spelling("", "", (f"{TOKEN},{TOKEN}",), (400,), 400),
    "list-decoy": Spelling("", "", (f"decoy, {TOKEN}",), (400,), 400),
    "list-blanks": Spelling("", "", (f"{TOKEN} \t, ,",), (400,), 400),
    "lines-twice": Spelling("", "", (TOKEN, TOKEN), (400,), 400),
    "lines-and-empty": Spelling("", "", (TOKEN, ""), (400,), 400),
    "empty-and-line": Spelling("", "", ("", TOKEN), (400,), 400),
    # blanks around a header value: servers drop those before the value (RFC 9110's optional whitespace), some
    # keep those after it (and the gateway refuses them); nginx drops the spaces, so the proxy passes exactly the
    # token on, and keeps the tabs, which it refuses
    "blank-before": Spelling("", "", (f" {TOKEN}",), (200, 400), 200),
    "blank-after": Spelling("", "", (f"{TOKEN} ",), (200, 400), 200),
    "tabs-around": Spelling("", "", (f"\t{TOKEN}\t",), (200, 400), 400),
    # the token parameter has one spelling: "token", lower case, unencoded, once
    "query-upper": Spelling("", f"?TOKEN={TOKEN}", (), (400,), 400),
    "query-capital": Spelling("", f"?Token={TOKEN}", (), (400,), 400),
    "query-encoded-name": Spelling("", f"?%74oken={TOKEN}", (), (400,), 400),
    "query-encoded-upper-name": Spelling("", f"?%54OKEN={TOKEN}", (), (400,), 400),
    "query-misspelt-empty": Spelling("", f"?toKen=&token={TOKEN}", (), (400,), 400),
    "query-twice": Spelling("", f"?token={TOKEN}&token={TOKEN}", (), (400,), 400),
    "query-empty-and-token": Spelling("", f"?token=&token={TOKEN}", (), (400,), 400),
    "query-bare-and-token": Spelling("", f"?token&token={TOKEN}", (), (400,), 400),
    # two carriers, even of one token, or a decoy beside it
    "path-and-upper-query": Spelling(f"/t/{TOKEN}", "?TOKEN=random", (), (400,), 400),
    "path-and-query": Spelling(f"/t/{TOKEN}", f"?token={TOKEN}", (), (400,), 400),
    "path-and-header": Spelling(f"/t/{TOKEN}", "", (TOKEN,), (400,), 400),
    "query-and-header": Spelling("", f"?token={TOKEN}", (TOKEN,), (400,), 400),
}

# Spellings of a token path that the routes do not read as one (they answer 404 or 400), but a person, a
# proxy or a client library might: the token after them shows in no log line and in no answer.
TOKEN_PATH_SPELLINGS = [
    "//t/{token}",
    "///t/{token}",
    "/./t/{token}",
    "/x/../t/{token}",
    "/data/../t/{token}",
    "/%2e/t/{token}",
    "/%74/{token}",
    "/%54/{token}",
    "/T/{token}",
    "/t//{token}",
    "/t/./{token}",
    "/t%2F{token}",
    "/t%2f%2f{token}",
    "/.%2Ft/{token}",
    "/data/zarr/../../t/{token}",
    "/t/{token}/t/{token}",
]

DATASET_NAME = "wk_dataset"
TOP_LEFT: Vec3 = (37, 21, 5)
SIZE: Vec3 = (150, 120, 70)
MAGS: tuple[Vec3, ...] = ((1, 1, 1), (2, 2, 1), (4, 4, 2))
# name, dtype, channels, compressed, category
LAYERS: list[tuple[str, str, int, bool, Literal["color", "segmentation"]]] = [
    ("color_u8", "uint8", 1, True, "color"),
    ("color_u16", "uint16", 1, False, "color"),
    ("rgb", "uint8", 3, True, "color"),
    ("segmentation", "uint32", 1, True, "segmentation"),
    ("color_f32", "float32", 1, False, "color"),
]


def bbox_at_mag(mag: Vec3) -> tuple[Vec3, Vec3]:
    """The mag-``mag`` voxels of the bounding box, worked out here rather than by the code under test."""
    lo = vec3(t // m for t, m in zip(TOP_LEFT, mag))
    hi = vec3(-(-(t + s) // m) for t, s, m in zip(TOP_LEFT, SIZE, mag))
    return lo, hi


def random_voxels(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Random voxels of ``dtype``, never 0 for integers (so a voxel read as zeros is always a mistake)."""
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(1, min(info.max, 2**31), size=shape, dtype=dtype)


def write_webknossos_dataset(path: Path) -> None:
    """The main test dataset, written by webknossos-libs in WKW format (files of 4^3 blocks of 32^3)."""
    from webknossos import BoundingBox, Dataset, SegmentationLayer

    rng = np.random.default_rng(42)
    dataset = Dataset(path, voxel_size=(11.24, 11.24, 28.0))
    for name, dtype, channels, compressed, category in LAYERS:
        kwargs: dict[str, Any] = {"largest_segment_id": 0} if category == "segmentation" else {}
        layer = dataset.add_layer(name, category, dtype=dtype, num_channels=channels, data_format="wkw", **kwargs)
        layer.bounding_box = BoundingBox(TOP_LEFT, SIZE)
        for mag in MAGS:
            view = layer.add_mag(mag, chunk_shape=32, shard_shape=128, compress=compressed)
            lo, hi = bbox_at_mag(mag)
            shape = tuple(h - low for low, h in zip(lo, hi))
            data = random_voxels(dtype, (channels, *shape), rng)
            view.write(data if channels > 1 else data[0], absolute_offset=tuple(v * m for v, m in zip(lo, mag)))
        if isinstance(layer, SegmentationLayer):
            layer.largest_segment_id = 2**31 - 1


@dataclass(frozen=True)
class WrittenDataset:
    """A data root holding the main test dataset as ``ORG/dataset``."""

    root: Path
    dataset: str

    def mag_dir(self, layer: str, mag: tuple[int, int, int]) -> Path:
        return self.root / ORG / self.dataset / layer / mag_name(mag)

    def expected(self, layer: str, mag: tuple[int, int, int]) -> np.ndarray[Any, Any]:
        """What the gateway must serve: the wkw package's read of [0, shape), zero outside the bbox."""
        import wkw

        lo, hi = bbox_at_mag(mag)
        with wkw.Dataset.open(str(self.mag_dir(layer, mag))) as ds:
            data: np.ndarray[Any, Any] = ds.read((0, 0, 0), hi)
        out = np.zeros_like(data)
        sel = (slice(None), *(slice(a, b) for a, b in zip(lo, hi)))
        out[sel] = data[sel]
        return out


def write_test_root(root: Path) -> WrittenDataset:
    """The session's data root: the main dataset, a copy in another organization, and a broken dataset."""
    write_webknossos_dataset(root / ORG / DATASET_NAME)
    (root / "other_org").mkdir()
    shutil.copytree(root / ORG / DATASET_NAME, root / "other_org" / "theirs")
    broken = root / ORG / "broken_dataset"
    broken.mkdir()
    (broken / "datasource-properties.json").write_text(json.dumps({"id": {"name": "x"}, "dataLayers": "nope"}))
    return WrittenDataset(root, DATASET_NAME)


def v2_chunk_paths(dataset_path: str, layers: tuple[str, ...]) -> list[str]:
    """The v2 keys of a 5 x 4 x 3 block of chunks (x from 1) at mag 1 of each layer: many distinct chunks."""
    return [
        f"{dataset_path}/{layer}/1/0.{x}.{y}.{z}"
        for layer in layers
        for x in range(1, 6)
        for y in range(4)
        for z in range(3)
    ]


def cube_layer(name: str, data_format: str, edge: int, mags: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A uint8 color layer of ``datasource-properties.json`` over the cube ``[0, edge)³``; mag 1 unless ``mags``."""
    return {
        "name": name,
        "category": "color",
        "boundingBox": {"topLeft": [0, 0, 0], "width": edge, "height": edge, "depth": edge},
        "elementClass": "uint8",
        "dataFormat": data_format,
        "mags": [{"mag": [1, 1, 1]}] if mags is None else mags,
    }


def write_layers_properties(directory: Path, layers: list[dict[str, Any]]) -> None:
    """``directory``'s ``datasource-properties.json`` naming these layers (the directory made if need be)."""
    directory.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": directory.name, "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": layers}
    (directory / "datasource-properties.json").write_text(json.dumps(document))
