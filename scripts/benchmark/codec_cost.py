"""The codec's cost for re-encoded chunks: ``python -m benchmark.codec_cost [--root DATA] [--out FILE]``.

A micro-benchmark over the benchmark's own 64^3 and 128^3 chunks (read from its WKW dataset, written
in short mode if none is given): numcodecs' Blosc (c-blosc 1) at several compression levels and
block sizes, blosc2 with its own threads, the gateway's encoder (gateway/zarr/blosc.py), and
whether each one's chunks decode with c-blosc 1 (what numcodecs, zarr-python and tensorstore use).
Then the thread-pool hand-off: a 128^3 chunk made in an anyio worker thread while others are made
beside it, timed from the call to the thread's start, through the work, to the caller's resumption,
at the interpreter's default switch interval and at a short one.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .config import DATA_ORIGIN, DATASET, ORG, SHORT

Encoder = Callable[[np.ndarray], bytes]


def _chunks(root: Path, edge: int, count: int) -> list[np.ndarray]:
    """``count`` chunks of ``edge``^3 voxels of the u8 layer, Fortran-ordered and flat (what encoders get)."""
    from gateway_storage import LocalStore
    from wkw_adapter import WkwFileCache, WkwMag

    mag = WkwMag(str(root / ORG / DATASET / "color" / "1"), WkwFileCache(LocalStore()))
    chunks = []
    for i in range(count):  # within the populated 256^3 of even the short mode's dataset
        offset = (
            DATA_ORIGIN[0] + edge * (i % 2),
            DATA_ORIGIN[1] + edge * (i // 2 % 2),
            DATA_ORIGIN[2] + edge * (i // 4),
        )
        region = mag.read_region(offset, (edge, edge, edge))
        chunks.append(np.asfortranarray(region).reshape(-1, order="F"))
    return chunks


def _time(encoder: Encoder, chunks: list[np.ndarray], repeat: int) -> float:
    """Median µs of one encode, over ``repeat`` passes of the chunks."""
    encoder(chunks[0])
    samples = []
    for _ in range(repeat):
        for chunk in chunks:
            started = time.perf_counter()
            encoder(chunk)
            samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def _c_blosc1_decodes(encoder: Encoder, chunk: np.ndarray) -> bool:
    import numcodecs

    try:
        return bytes(numcodecs.Blosc().decode(encoder(chunk))) == chunk.tobytes()
    except Exception:
        return False


def _encoders() -> dict[str, Encoder]:
    import blosc2
    import numcodecs

    from gateway.zarr.blosc import encode_blosc_lz4

    numcodecs.blosc.use_threads = False  # as the gateway runs it: a context per call, no global lock
    encoders: dict[str, Encoder] = {}
    for clevel in (1, 5, 9):
        codec = numcodecs.Blosc("lz4", clevel, numcodecs.Blosc.NOSHUFFLE)
        encoders[f"numcodecs Blosc lz4 clevel {clevel}"] = codec.encode
    for blocksize in (1 << 16, 1 << 18, 1 << 20):
        codec = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.NOSHUFFLE, blocksize)
        encoders[f"numcodecs Blosc lz4 clevel 5 blocksize {blocksize >> 10} KiB"] = codec.encode
    for threads in (1, 2):
        for clevel in (1, 5):

            def blosc2_encode(chunk: np.ndarray, threads: int = threads, clevel: int = clevel) -> bytes:
                blosc2.set_nthreads(threads)
                out: bytes = blosc2.compress(
                    chunk, typesize=1, clevel=clevel, filter=blosc2.Filter.NOFILTER, codec=blosc2.Codec.LZ4
                )
                return out

            encoders[f"blosc2 lz4 clevel {clevel}, {threads} thread(s)"] = blosc2_encode
    encoders["gateway encoder (gateway/zarr/blosc.py)"] = lambda chunk: encode_blosc_lz4(chunk, 5)
    encoders["copy only (the floor: bytes of the chunk)"] = lambda chunk: chunk.tobytes()
    return encoders


def measure_encoders(root: Path, repeat: int) -> list[dict[str, Any]]:
    rows = []
    encoders = _encoders()
    for edge, count in ((64, 8), (128, 2)):
        chunks = _chunks(root, edge, count)
        for name, encoder in encoders.items():
            sizes = [len(encoder(c)) for c in chunks]
            rows.append(
                {
                    "edge": edge,
                    "encoder": name,
                    "us": round(_time(encoder, chunks, repeat), 1),
                    "ratio": round(sum(sizes) / sum(c.nbytes for c in chunks), 4),
                    "c_blosc1_decodes": _c_blosc1_decodes(encoder, chunks[0]) if "copy" not in name else None,
                }
            )
            print(f"{edge}³ {name}: {rows[-1]['us']} µs, ratio {rows[-1]['ratio']}", file=sys.stderr)
    return rows


def concurrent_throughput(root: Path, seconds: float) -> list[dict[str, Any]]:
    """128^3 encodes per second with T Python threads at once (the worker's pool) and blosc2's own threads."""
    import blosc2
    import numcodecs

    from gateway.zarr.blosc import encode_blosc_lz4

    chunk = _chunks(root, 128, 1)[0]
    rows = []
    numcodecs_lz4 = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.NOSHUFFLE)
    variants: dict[str, Encoder] = {
        "numcodecs Blosc lz4 clevel 5": numcodecs_lz4.encode,
        "gateway encoder": lambda c: encode_blosc_lz4(c, 5),
    }
    for threads in (1, 2, 4):
        variants[f"blosc2 lz4 clevel 5, {threads} own thread(s)"] = functools.partial(_blosc2, blosc2, threads=threads)
    for name, encoder in variants.items():
        for pool in (1, 4):
            done = _encodes_in(encoder, chunk, pool, seconds)
            rows.append({"encoder": name, "pool_threads": pool, "chunks_per_s": round(done / seconds)})
            print(f"128³ {name}, {pool} pool thread(s): {rows[-1]['chunks_per_s']} chunks/s", file=sys.stderr)
    return rows


def _encodes_in(encoder: Encoder, chunk: np.ndarray, pool: int, seconds: float) -> int:
    """Encodes of ``chunk`` done by ``pool`` threads at once in ``seconds``."""
    deadline = time.monotonic() + seconds

    def work() -> int:
        done = 0
        while time.monotonic() < deadline:
            encoder(chunk)
            done += 1
        return done

    with ThreadPoolExecutor(pool) as executor:
        return sum(executor.map(lambda _: work(), range(pool)))


def _blosc2(blosc2: Any, chunk: np.ndarray, threads: int) -> bytes:
    blosc2.set_nthreads(threads)
    out: bytes = blosc2.compress(chunk, typesize=1, clevel=5, filter=blosc2.Filter.NOFILTER, codec=blosc2.Codec.LZ4)
    return out


def hand_off(root: Path, requests: int, in_flight: int, threads: int) -> list[dict[str, Any]]:
    """A 128^3 chunk made in an anyio worker thread, ``in_flight`` at once on ``threads`` threads (the
    gateway's chunk threads): where a request's time goes, at two switch intervals."""
    from gateway.zarr.blosc import encode_blosc_lz4
    from gateway_storage import LocalStore
    from wkw_adapter import WkwFileCache, WkwMag

    mag = WkwMag(str(root / ORG / DATASET / "color" / "1"), WkwFileCache(LocalStore()))
    edge = 128

    def make(i: int) -> tuple[float, float]:
        started = time.perf_counter()
        offset = (DATA_ORIGIN[0] + edge * (i % 2), DATA_ORIGIN[1], DATA_ORIGIN[2])
        region = np.asfortranarray(mag.read_region(offset, (edge, edge, edge))).reshape(-1, order="F")
        encode_blosc_lz4(region, 5)
        return started, time.perf_counter()

    rows = []
    default_interval = sys.getswitchinterval()
    for interval in (default_interval, 0.0005):
        sys.setswitchinterval(interval)
        waits, works, returns, elapsed = _run_clients(make, requests, in_flight, threads)
        rows.append(
            {
                "switch_interval_ms": interval * 1000,
                "in_flight": in_flight,
                "threads": threads,
                "chunks_per_s": round(requests / elapsed, 1),
                "wait_for_a_thread_ms": round(statistics.median(waits) * 1000, 2),
                "in_the_thread_ms": round(statistics.median(works) * 1000, 2),
                "back_to_the_loop_ms": round(statistics.median(returns) * 1000, 3),
            }
        )
        print(f"hand-off: {rows[-1]}", file=sys.stderr)
    sys.setswitchinterval(default_interval)
    return rows


def _run_clients(
    make: Callable[[int], tuple[float, float]], requests: int, in_flight: int, threads: int
) -> tuple[list[float], list[float], list[float], float]:
    """``requests`` calls of ``make`` in anyio worker threads, ``in_flight`` at once: per call, the wait for a
    thread, the time in it and the time back to the caller; and the seconds all took."""
    import anyio
    import anyio.to_thread

    waits: list[float] = []
    works: list[float] = []
    returns: list[float] = []

    async def main() -> None:
        limiter = anyio.CapacityLimiter(threads)
        counter = iter(range(requests))

        async def client() -> None:
            for i in counter:
                called = time.perf_counter()
                started, ended = await anyio.to_thread.run_sync(make, i, limiter=limiter)
                resumed = time.perf_counter()
                waits.append(started - called)
                works.append(ended - started)
                returns.append(resumed - ended)

        async with anyio.create_task_group() as group:
            for _ in range(in_flight):
                group.start_soon(client)

    began = time.perf_counter()
    asyncio.run(main())
    return waits, works, returns, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.codec_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="the benchmark's data directory (default: write a short one)")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--repeat", type=int, default=20, help="passes over the chunks per encoder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root
        if root is None:
            from .dataset import build_dataset

            root = Path(scratch) / "data"
            build_dataset(root, SHORT)
        figures = {
            "encoders": measure_encoders(root, args.repeat),
            "concurrent": concurrent_throughput(root, 2.0),
            "hand_off": hand_off(root, 96, 16, 4),
        }
    text = json.dumps(figures, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
