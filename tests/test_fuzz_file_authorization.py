"""Generated attempts to read another organization's files (issue 24, item 4: authorization follows the files).

A lab member who may write datasets into ``evil_org`` writes, for every example, a fresh dataset there (a
fresh name, so the catalog loads it anew) with one layer of a generated kind (WKW color, WKW segmentation,
Zarr v2, Zarr v3, each one uncompressed 32³ chunk) that aims at ``secret_org/secret_ds`` by a generated
mag ``path`` (``..`` chains, climbs above the root and back, absolute paths, ``file://``, ``./``, ``//``,
trailing slashes, percent-encoded and Unicode look-alikes of dots and slashes) or by a symlink at the
dataset, layer, mag, metadata file or chunk file, or through a directory of its own (relative or absolute
targets), planted before the first read or swapped in after it. Control examples aim the same spellings
and links at its own voxels or another ``evil_org`` dataset's, which the token may read.

A token granted only ``evil_org/*`` asks every route that reads the layer (Zarr v2 and v3 chunks and
metadata, the xarray tree, the precomputed tree, the preview, meshes, the proxy's ``/auth``) with the token
as header, query and path. Served chunks are uncompressed (``codec none``), so a leaked voxel shows as
itself: no body holds the secret pattern, no route that reads a layer aimed at the secret answers 200,
and a 200 chunk of a control is exactly the layer's own voxels.

One gateway for the module; 60 examples, each about a dozen requests (about 20 s on a loaded 2-core machine).
"""

import itertools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import pytest
import requests
import wkw
import zarr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.datasets import cube_layer, write_layers_properties
from support.servers import Server, assert_no_unexpected_errors

pytestmark = pytest.mark.slow  # hundreds of generated cases

EDGE = 32
SECRET, EVIL = "secret_org", "evil_org"
SECRET_VALUE, OWN_VALUE = 0xAB, 0x11
SECRET_PATTERN = bytes([SECRET_VALUE]) * 64  # no answer but a secret chunk holds 64 such bytes in a row
OWN_CHUNK = bytes([OWN_VALUE]) * EDGE**3
TOKEN = "evil-only-fuzz-token-0123456789"
NEIGHBOUR = "neighbour"  # an evil_org dataset of its own voxels, which links may point at (granted)
KINDS = {"wkw": "wkw", "seg": "wkw", "zarr2": "zarr", "zarr3": "zarr3"}  # layer name: dataFormat
CHUNK_FILES = {"wkw": "1/z0/y0/x0.wkw", "seg": "1/z0/y0/x0.wkw", "zarr2": "1/0.0.0.0", "zarr3": "1/c/0/0/0/0"}
METADATA_FILES = {"wkw": "1/header.wkw", "seg": "1/header.wkw", "zarr2": "1/.zarray", "zarr3": "1/zarr.json"}


def _layer_entry(kind: str, path: str | None) -> dict[str, Any]:
    entry = cube_layer(kind, KINDS[kind], EDGE, None if path is None else [{"mag": [1, 1, 1], "path": path}])
    return {**entry, "category": "segmentation", "largestSegmentId": 255} if kind == "seg" else entry


def _write_dataset(dataset: Path, value: int) -> None:
    """Every kind of layer, each one uncompressed chunk of ``value``, and the properties naming them."""
    voxels = np.full((EDGE,) * 3, value, dtype=np.uint8)
    for kind in ("wkw", "seg"):
        header = wkw.Header(np.uint8, block_len=EDGE, file_len=1)
        with wkw.Dataset.create(str(dataset / kind / "1"), header) as ds:
            ds.write((0, 0, 0), voxels)
    versions: tuple[tuple[str, Literal[2, 3]], ...] = (("zarr2", 2), ("zarr3", 3))
    for kind, version in versions:
        array = zarr.create_array(
            str(dataset / kind / "1"),
            shape=(1, EDGE, EDGE, EDGE),
            chunks=(1, EDGE, EDGE, EDGE),
            dtype="uint8",
            fill_value=0,
            zarr_format=version,
            compressors=None,
        )
        array[...] = voxels[None]
    write_layers_properties(dataset, [_layer_entry(kind, None) for kind in KINDS])


@dataclass(frozen=True)
class Planted:
    root: Path
    template: Path  # a dataset of evil_org's own voxels, copied for each example
    tokens: Path

    @property
    def secret(self) -> Path:
        return self.root / SECRET / "secret_ds"


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    base = tmp_path_factory.mktemp("fuzz-file-authorization")
    where = Planted(base / "root", base / "template", base / "tokens.json")
    where.tokens.write_text(json.dumps({"tokens": {TOKEN: [f"{EVIL}/*"]}}))
    _write_dataset(where.secret, SECRET_VALUE)
    _write_dataset(where.template, OWN_VALUE)
    shutil.copytree(where.template, where.root / EVIL / NEIGHBOUR, symlinks=True)
    return where


@pytest.fixture(scope="module")
def served(planted: Planted, server_factory: Callable[..., Server]) -> Server:
    return server_factory(planted.root, tokens_file=planted.tokens, codec="none")


# --- what an example plants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    kind: str  # the layer's name and kind
    secret: bool  # whether it aims at secret_org's files (else at voxels the token may read)
    path: str | None  # the mag path its properties give (a template with {root}, {dataset}, {kind})
    link: str | None  # where a symlink is planted: dataset, layer, mag, metadata, file, alias
    absolute_link: bool  # the symlink's target written absolute (else relative to the link)
    swap: bool  # the link is planted after a first read of the layer's own files


SEPARATORS = st.sampled_from(["/", "/", "/", "//", "/./"])
LOOKALIKES = st.sampled_from(["%2e%2e", "%2E%2E", "\u2024\u2024", "\uff0e\uff0e", "..\\", "...", ". ."])
SLASH_LOOKALIKES = st.sampled_from(["%2f", "%2F", "\u2215", "\uff0f", "\\"])


@st.composite
def spelled(draw: st.DrawFn, parts: list[str], lookalike: bool) -> str:
    """``parts`` joined by generated separators, one ``..`` or slash perhaps spelt as a look-alike."""
    parts = list(parts)
    if lookalike and parts:
        position = draw(st.integers(0, len(parts) - 1))
        if parts[position] == ".." and draw(st.booleans()):
            parts[position] = draw(LOOKALIKES)
        else:
            parts[position] = parts[position] + draw(SLASH_LOOKALIKES)
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text += draw(SEPARATORS) + part
    return text + draw(st.sampled_from(["", "", "/", "//"]))


@st.composite
def mag_paths(draw: st.DrawFn, secret: bool) -> str:
    """A mag path, relative (climbing by ``..``, perhaps above the root and back down) or absolute."""
    target = (
        [SECRET, "secret_ds", "{kind}", "1"]
        if secret
        else [EVIL, draw(st.sampled_from(["{dataset}", NEIGHBOUR])), "{kind}", "1"]
    )
    lookalike = draw(st.integers(0, 4)) == 0
    form = draw(st.sampled_from(["climb", "climb", "above_root", "through_own", "absolute", "file_url", "own"]))
    if form == "own" and not secret:
        return "./" * draw(st.integers(0, 1)) + draw(spelled(["{kind}", "1"], lookalike))
    if form == "absolute" or form == "file_url":
        prefix = "file://" if form == "file_url" else ""
        return prefix + "{root}" + draw(SEPARATORS) + draw(spelled(target, lookalike))
    climb = ["..", ".."]
    if form == "above_root":
        climb = ["..", "..", "..", "{root_name}"]
    elif form == "through_own":
        climb = ["..", "{dataset}", "..", ".."]
    lead = draw(st.sampled_from(["", "./", ".//"]))
    return lead + draw(spelled(climb + target, lookalike))


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    kind = draw(st.sampled_from(list(KINDS)))
    secret = draw(st.integers(0, 3)) > 0  # most examples aim at the secret; the rest are controls
    if draw(st.booleans()):
        return Plan(kind, secret, draw(mag_paths(secret)), None, False, False)
    levels = ["dataset", "layer", "mag", "metadata", "file", "alias"] if secret else ["layer", "mag", "file"]
    link = draw(st.sampled_from(levels))
    # a metadata file is read when the layer is loaded: swapped after that, it is never read again
    swap = link not in ("alias", "metadata") and draw(st.booleans())
    return Plan(kind, secret, None, link, draw(st.booleans()), swap)


# --- planting ---------------------------------------------------------------------------------------------


def _symlink(link: Path, target: Path, absolute: bool) -> None:
    """``link`` replaced by a symlink to ``target`` (absolute, or relative to the link's directory)."""
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target if absolute else Path(os.path.relpath(target, link.parent)), target.is_dir())


def _plant_link(planted: Planted, dataset: Path, plan: Plan) -> None:
    source = planted.secret if plan.secret else planted.root / EVIL / NEIGHBOUR
    assert plan.link is not None
    if plan.link == "dataset":
        _symlink(dataset, source, plan.absolute_link)
    elif plan.link == "layer":
        _symlink(dataset / plan.kind, source / plan.kind, plan.absolute_link)
    elif plan.link == "mag":
        _symlink(dataset / plan.kind / "1", source / plan.kind / "1", plan.absolute_link)
    elif plan.link == "metadata":
        _symlink(
            dataset / plan.kind / METADATA_FILES[plan.kind],
            source / plan.kind / METADATA_FILES[plan.kind],
            plan.absolute_link,
        )
    elif plan.link == "file":
        _symlink(
            dataset / plan.kind / CHUNK_FILES[plan.kind],
            source / plan.kind / CHUNK_FILES[plan.kind],
            plan.absolute_link,
        )
    else:  # a directory of the dataset's own that leads into the other organization; the mag path goes through it
        _symlink(dataset / "alias", source.parent, plan.absolute_link)


def _plant(planted: Planted, name: str, plan: Plan) -> None:
    dataset = planted.root / EVIL / name
    shutil.copytree(planted.template, dataset, symlinks=True)
    if plan.path is not None:
        path = plan.path.format(root=planted.root, root_name=planted.root.name, dataset=name, kind=plan.kind)
        write_layers_properties(dataset, [_layer_entry(plan.kind, path)])
    elif plan.link == "alias":
        write_layers_properties(dataset, [_layer_entry(plan.kind, f"alias/secret_ds/{plan.kind}/1")])
    else:
        write_layers_properties(dataset, [_layer_entry(plan.kind, None)])
    if plan.link is not None and not plan.swap:
        _plant_link(planted, dataset, plan)


# --- the routes and the answers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    voxels: bool  # it reads the layer's voxels (a chunk, a preview, a mesh)
    chunk: bool  # its 200 body is the layer's one chunk, uncompressed


def routes(name: str, kind: str) -> list[Route]:
    o, d = EVIL, name
    found = [
        Route("v2 chunk", f"/data/zarr/{o}/{d}/{kind}/1/0.0.0.0", True, True),
        Route("v2 .zarray", f"/data/zarr/{o}/{d}/{kind}/1/.zarray", False, False),
        Route("v3 chunk", f"/data/zarr3/{o}/{d}/{kind}/1/c/0/0/0/0", True, True),
        Route("v3 zarr.json", f"/data/zarr3/{o}/{d}/{kind}/1/zarr.json", False, False),
        Route("xarray chunk", f"/data/xarray/{o}/{d}/1/{kind}/c/0/0/0", True, True),
        Route("precomputed chunk", f"/data/precomputed_raw/{o}/{d}/{kind}/1/0-32_0-32_0-32", True, True),
        Route("precomputed info", f"/data/precomputed/{o}/{d}/{kind}/info", False, False),
        Route("preview", f"/preview/{o}/{d}/{kind}.png", True, False),
    ]
    if kind == "seg":
        found += [
            Route("legacy mesh", f"/data/meshes/{o}/{d}/{kind}/legacy/{OWN_VALUE}:0:0_0_0", True, False),
            Route("multires manifest", f"/data/meshes/{o}/{d}/{kind}/multires/{OWN_VALUE}.index", True, False),
        ]
    return found


def _ask(session: requests.Session, server: Server, path: str, carrier: str) -> requests.Response:
    if carrier == "query":
        return session.get(f"{server.url}{path}?token={TOKEN}", timeout=60)
    if carrier == "path":
        return session.get(f"{server.url}/t/{TOKEN}{path}", timeout=60)
    return session.get(server.url + path, headers={"X-Auth-Token": TOKEN}, timeout=60)


def _check(answer: requests.Response, route: Route, plan: Plan, aimed: bool) -> None:
    """``aimed``: the layer now aims at the secret (its link planted, if it has one)."""
    where = (route.name, route.path, plan, answer.status_code, answer.content[:300])
    assert SECRET_PATTERN not in answer.content, ("secret voxels were served", where)
    if answer.status_code >= 400:
        assert answer.headers["Content-Type"].startswith("application/json"), where
        error = answer.json()["error"]
        assert isinstance(error, str) and error and "internal error" not in error, where
        return
    assert answer.status_code == 200, where
    # Every route that reads the voxels of a layer aimed at the secret refuses. So does the layer's metadata,
    # when the properties or a link planted before the first read aim the layer there (metadata read before
    # a swap was the layer's own; a linked chunk file leaves the layer's own metadata in place).
    assert not (aimed and route.voxels), ("the voxels of a layer aimed at secret_org were served", where)
    aimed_from_the_start = aimed and not plan.swap and plan.link != "file"
    assert not aimed_from_the_start, ("a layer aimed at secret_org was described", where)
    if route.chunk:
        assert answer.content == OWN_CHUNK, ("a 200 chunk that is not the layer's own voxels", where)


def _read_all(
    session: requests.Session, server: Server, name: str, plan: Plan, carrier: str, aimed: bool
) -> dict[str, int]:
    statuses = {}
    for route in routes(name, plan.kind):
        answer = _ask(session, server, route.path, carrier)
        _check(answer, route, plan, aimed)
        statuses[route.name] = answer.status_code
    original = routes(name, plan.kind)[0].path
    auth = session.get(
        server.url + "/auth", headers={"X-Auth-Token": TOKEN, "X-Original-URI": quote(original)}, timeout=60
    )
    assert auth.status_code in (202, 204, 403), (auth.status_code, auth.text[:300])
    # the proxy's subrequest refuses as forbidden exactly what the route refuses as forbidden
    assert (auth.status_code == 403) == (statuses["v2 chunk"] == 403), (plan, statuses, auth.status_code)
    return statuses


_examples = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=plans(), carrier=st.sampled_from(["header", "query", "path"]))
def test_no_generated_path_or_link_serves_another_organization_s_voxels(
    planted: Planted, served: Server, plan: Plan, carrier: str
) -> None:
    name = f"fz{next(_examples)}"
    _plant(planted, name, plan)
    with requests.Session() as session:
        if plan.swap:  # the layer's own chunk is read (the dataset loaded, its files opened), then swapped
            first = _ask(session, served, routes(name, plan.kind)[0].path, carrier)
            assert first.status_code == 200 and first.content == OWN_CHUNK, (plan, first.status_code, first.text[:300])
            _plant_link(planted, planted.root / EVIL / name, plan)
        statuses = _read_all(session, served, name, plan, carrier, aimed=plan.secret)
    how = f"path {plan.path}" if plan.path is not None else f"link {plan.link}{' swapped' if plan.swap else ''}"
    event(f"{'secret' if plan.secret else 'own'} {how.split('{')[0] if plan.path else how}: v2 {statuses['v2 chunk']}")


def test_the_controls_are_served(planted: Planted, served: Server) -> None:
    """The generated examples reach the routes: a plain layer of each kind, and one linked to a granted
    neighbour, answer 200 with their own voxels on every chunk route."""
    for index, kind in enumerate(KINDS):
        for link in (None, "mag"):
            plan = Plan(kind, False, None, link, False, False)
            name = f"control{index}{link or ''}"
            _plant(planted, name, plan)
            with requests.Session() as session:
                for route in routes(name, kind):
                    answer = _ask(session, served, route.path, "header")
                    assert answer.status_code == 200, (route, plan, answer.status_code, answer.text[:300])
                    _check(answer, route, plan, aimed=False)
    assert_no_unexpected_errors(served)
