"""Before any load: the gateways, the bytes they serve for every key set, and checks that all agree.

nginx and the floors serve exactly the bytes the gateway served for the same keys (fetched once
here), and every served chunk that is checked decodes to the voxels of the WKW data.
"""

from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gateway_storage import LocalStore
from wkw_adapter import WkwFileCache, WkwMag

from .config import (
    BLOCK,
    CASES,
    DATA_CUBE,
    DATA_ORIGIN,
    DATASET,
    MAPPED_CONFIGS,
    MAPPED_EDGES,
    ORG,
    READY,
    SEGMENTATION,
    TOKEN,
    V2,
    V3,
    config_token,
    log,
)
from .dataset import agglomerate_of
from .keys import Request, chunk_index, write_paths
from .processes import Client, Server, start_gateway, stop_all
from .run import Run

GatewayKey = tuple[str, str]  # (configuration, HTTP server)


def token_headers(token: str | None) -> dict[str, str] | None:
    return {"X-Auth-Token": token} if token else None


def decode_blosc(body: bytes, dtype: np.dtype[Any], edge: int) -> np.ndarray:
    import numcodecs

    raw = numcodecs.Blosc().decode(body)
    return np.frombuffer(raw, dtype=dtype).reshape((1, edge, edge, edge), order="F")


def _check_chunks(run: Run, layer: str, requests: list[Request], bodies: list[bytes], edge: int) -> None:
    """Decode a sample of served chunks and compare them with the adapter's own read of the WKW mag."""
    mag = WkwMag(str(run.root / ORG / DATASET / layer / "1"), WkwFileCache(LocalStore()))
    for (path, _), body in list(zip(requests, bodies))[:: max(1, len(requests) // 12)]:
        x, y, z = chunk_index(path)
        expected = mag.read_region((x * edge, y * edge, z * edge), (edge, edge, edge))
        if not np.array_equal(decode_blosc(body, expected.dtype, edge), expected):
            raise RuntimeError(f"the gateway's chunk {path} does not hold the voxels of the WKW data")


def _check_mapped(run: Run, gateways: dict[GatewayKey, Server], sequences: dict[str, list[Request]]) -> None:
    """A sample of the mapped rows' chunks, from every gateway that serves them, against the labels read by the
    adapter with the agglomerate file's entries applied (and the labels' own chunks against the labels)."""
    mag = WkwMag(str(run.root / ORG / DATASET / SEGMENTATION / "1"), WkwFileCache(LocalStore()))
    for keyset, edge in MAPPED_EDGES.items():
        for config in MAPPED_CONFIGS[keyset]:
            client = gateways[(config, "uvicorn")].client
            for prefix in ("seg", "map"):
                requests = sequences[f"{prefix}-{edge}"]
                for path, _ in requests[:: max(1, len(requests) // 6)]:
                    x, y, z = chunk_index(path)
                    labels = mag.read_region((x * edge, y * edge, z * edge), (edge, edge, edge))
                    # the agglomerates the file declares fit the labels' uint32: so does the mapped layer
                    expected = agglomerate_of(labels).astype(labels.dtype) if prefix == "map" else labels
                    if not np.array_equal(decode_blosc(client.get_ok(path), expected.dtype, edge), expected):
                        raise RuntimeError(f"the {config} gateway's {path} does not hold the voxels it should")


def _fetch_to_static(run: Run, client: Client, keyset: str, requests: list[Request]) -> list[bytes]:
    """Fetch each chunk once and write exactly those bytes under the key set's static root."""
    static = run.static(keyset)
    if static.exists():
        shutil.rmtree(static)
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda r: client.get_ok(r[0]), requests))
    for (path, _), body in zip(requests, bodies):
        target = static / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    return bodies


def _shard_requests(run: Run, client: Client, u8_sequence: list[Request]) -> list[Request]:
    """The u8 32³ keys as tensorstore reads them from the sharded tree: byte ranges of one shard.

    Also writes the whole virtual shard (fetched in pieces) as the static file of this key set.
    """
    meta = json.loads(client.get_ok(f"{V3}/color/1/zarr.json"))
    shard_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
    inner = meta["codecs"][0]["configuration"]["chunk_shape"]
    per_side = [s // c for s, c in zip(shard_shape[1:], inner[1:])]
    count = math.prod(per_side)
    shard_path = f"{V3}/color/1/c/0/{DATA_CUBE[0]}/{DATA_CUBE[1]}/{DATA_CUBE[2]}"
    status, _, headers = client.get(shard_path, {"Range": "bytes=0-0"})
    if status != 206:
        raise RuntimeError(f"GET {shard_path} with a range: HTTP {status}")
    size = int(headers["content-range"].rsplit("/", 1)[1])
    index_bytes = 16 * count + 4
    index = np.frombuffer(client.get_ok(shard_path, {"Range": f"bytes=-{index_bytes}"})[:-4], dtype="<u8").reshape(
        -1, 2
    )
    target = run.static("shard") / shard_path.lstrip("/")
    if target.parent.exists():
        shutil.rmtree(run.static("shard"))
    target.parent.mkdir(parents=True)
    piece = 8 << 20  # small pieces: the gateway builds each range in memory
    with open(target, "wb") as f:
        for start in range(0, size, piece):
            end = min(start + piece, size) - 1
            f.write(client.get_ok(shard_path, {"Range": f"bytes={start}-{end}"}))
    if target.stat().st_size != size:
        raise RuntimeError(f"the shard {shard_path} has {target.stat().st_size} bytes, expected {size}")
    requests = []
    base = [o // BLOCK for o in DATA_ORIGIN]
    for path, _ in u8_sequence:
        x, y, z = (v - b for v, b in zip(chunk_index(path), base))
        offset, nbytes = (int(v) for v in index[(x * per_side[1] + y) * per_side[2] + z])
        requests.append((shard_path, f"{offset}-{offset + nbytes - 1}"))
    with open(target, "rb") as f:  # the ranges hold the same voxels as the plain chunks
        for (path, _), (_, span) in list(zip(u8_sequence, requests))[:: max(1, len(requests) // 8)]:
            first, last = (int(v) for v in span.split("-"))
            f.seek(first)
            body = f.read(last - first + 1)
            if body != client.get_ok(shard_path, {"Range": f"bytes={span}"}):
                raise RuntimeError(f"range {span} of {shard_path} differs between a full read and a range read")
            plain = decode_blosc(client.get_ok(path), np.dtype(np.uint8), BLOCK)
            if not np.array_equal(decode_blosc(body, np.dtype(np.uint8), BLOCK), plain):
                raise RuntimeError(f"range {span} of {shard_path} does not hold the voxels of {path}")
    return requests


def check_static(server: Server, static: Path, sample: list[Request], token: str | None = None) -> None:
    """A server must answer with exactly the bytes the gateway served (the reference fetch)."""
    for path, span in sample:
        headers = {"Range": f"bytes={span}"} if span else {}
        headers.update(token_headers(token) or {})
        body = server.client.get_ok(path, headers)
        expected = (static / path.lstrip("/")).read_bytes()
        if span:
            first, last = (int(v) for v in span.split("-"))
            expected = expected[first : last + 1]
        if body != expected:
            raise RuntimeError(f"{server.name} answers {path} {span} with other bytes than the gateway")


def _check_zstd(run: Run, gw: Server, requests: list[Request]) -> None:
    import numcodecs

    zarray = json.loads(gw.client.get_ok(f"{V2}/color/1/.zarray"))
    if (zarray["compressor"] or {}).get("id") != "zstd":
        raise RuntimeError(f"the re-encode gateway declares {zarray['compressor']}, not zstd")
    static = run.static("u8-32")
    for path, _ in requests[:: max(1, len(requests) // 8)]:
        raw = numcodecs.Zstd().decode(gw.client.get_ok(path))
        plain = decode_blosc((static / path.lstrip("/")).read_bytes(), np.dtype(np.uint8), BLOCK)
        if bytes(raw) != plain.tobytes(order="F"):
            raise RuntimeError(f"the zstd chunk {path} differs from the pass-through chunk")


def _check_peer(
    name: str, static: Path, sequence: list[Request], requests: list[Request], edge: int, body_of: Any
) -> None:
    """A sample of a peer's chunks (``body_of(path)``: the decoded voxels) holds the gateway's voxels."""
    for (path, _), (peer_path, _) in list(zip(sequence, requests))[:: max(1, len(requests) // 6)]:
        got = np.frombuffer(body_of(peer_path), np.uint8).reshape((1, edge, edge, edge))
        expected = decode_blosc((static / path.lstrip("/")).read_bytes(), np.dtype(np.uint8), edge)
        if not np.array_equal(got, expected):
            raise RuntimeError(f"{name}'s {peer_path} does not hold the voxels of the gateway's {path}")


def check_xpublish(
    run: Run, xp: Server, static: Path, sequence: list[Request], requests: list[Request], edge: int
) -> None:
    """xpublish's chunks must hold the same voxels as the gateway's (decoded with its own codecs)."""
    import numcodecs

    meta = json.loads(xp.client.get_ok("/zarr/color/zarr.json"))
    codecs = meta.get("codecs", [])
    compressors = [c for c in codecs if c["name"] not in ("bytes", "transpose")]
    run.extras["xpublish_codecs"] = codecs
    if compressors and compressors[0]["name"] != "zstd":
        return  # another codec: leave the comparison to zarr clients
    decode = numcodecs.Zstd().decode if compressors else bytes
    _check_peer("xpublish", static, sequence, requests, edge, lambda p: bytes(decode(xp.client.get_ok(p))))


def check_tiled(
    run: Run, tiled: Server, static: Path, sequence: list[Request], requests: list[Request], edge: int
) -> None:
    """Tiled's chunks (its .zarray's compressor, C order) must hold the same voxels as the gateway's."""
    import numcodecs

    zarray = json.loads(tiled.client.get_ok("/zarr/v2/color/.zarray"))
    run.extras["tiled_zarray"] = zarray
    codec = numcodecs.get_codec(zarray["compressor"]) if zarray["compressor"] else None
    if zarray["order"] != "C" or zarray["chunks"] != [1, edge, edge, edge]:
        raise RuntimeError(f"Tiled declares {zarray}, not C-ordered chunks of {edge}³")

    def voxels(path: str) -> bytes:
        body = tiled.client.get_ok(path)
        return bytes(codec.decode(body)) if codec else body

    _check_peer("Tiled", static, sequence, requests, edge, voxels)


def gateway_keys() -> list[GatewayKey]:
    """Every (configuration, HTTP server) a case needs, in the order of the cases."""
    return list(dict.fromkeys((c.config, c.http) for c in CASES if c.kind in ("gateway", "proxy")))


def start_gateways(run: Run) -> dict[GatewayKey, Server]:
    """Every gateway the cases need, started together, each ready on all its workers."""
    run.tokens_file.write_text(json.dumps({"tokens": {TOKEN: [f"{ORG}/*"]}}))
    gateways: dict[GatewayKey, Server] = {}
    try:
        for config, http in gateway_keys():
            gateways[(config, http)] = start_gateway(config, http, run.root, run.workers, run.logs, run.tokens_file)
        for (config, _), server in gateways.items():
            server.wait_ready(READY, run.workers, token_headers(config_token(config)))
    except Exception:
        stop_all(gateways.values())
        raise
    return gateways


def prepare_key_sets(run: Run, gateways: dict[GatewayKey, Server], sequences: dict[str, list[Request]]) -> None:
    """Fetch from the reference gateways the bytes nginx and the floors will serve; check every gateway."""
    main = gateways[("main", "uvicorn")]
    log(f"fetching the chunks of every key set from the gateways ({main.url} ...)")
    bodies = _fetch_to_static(run, main.client, "u8-32", sequences["u8-32"])
    _check_chunks(run, "color", sequences["u8-32"], bodies, 32)
    run.extras["u8_mean_kib"] = float(np.mean([len(b) for b in bodies]) / 1024)
    bodies = _fetch_to_static(run, main.client, "u16-32", sequences["u16-32"])
    _check_chunks(run, "color16", sequences["u16-32"], bodies, 32)
    sequences["shard"] = _shard_requests(run, main.client, sequences["u8-32"])
    write_paths(run.paths("shard"), sequences["shard"])
    for (config, _), server in gateways.items():
        if config == "zstd":
            _check_zstd(run, server, sequences["u8-32"])
    for config, keyset, edge in (("edge64", "u8-64", 64), ("edge128", "u8-128", 128)):
        bodies = _fetch_to_static(run, gateways[(config, "uvicorn")].client, keyset, sequences[keyset])
        _check_chunks(run, "color", sequences[keyset], bodies, edge)
    _check_mapped(run, gateways, sequences)
    # Every other gateway serves the same bytes as the reference one for the same keys.
    same_bytes = {
        "main": ("u8-32", "u16-32", "shard"),
        "auth": ("u8-32",),
        "edge64": ("u8-64",),
        "edge128": ("u8-128",),
    }
    for (config, _), server in gateways.items():
        for keyset in same_bytes.get(config, []):
            sample = sequences[keyset][:: max(1, len(sequences[keyset]) // 5)]
            check_static(server, run.static(keyset), sample, config_token(config))
