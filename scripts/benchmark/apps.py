"""The Python servers the benchmark runs itself: three floors and two peers, on uvicorn or Granian.

The floors answer a path with the bytes the gateway served for it (read into a dict at start-up)
and a ``Range: bytes=a-b`` with that slice: the Starlette floor is what a minimal framework app
costs, the bare floor what the ASGI server alone costs, and the RSGI floor what Granian costs through
its native interface (RSGI), which skips the ASGI message dictionaries.

The peers serve the same voxels as a dask array whose chunks are read from the WKW mag: xpublish
(xarray, its zarr plugin) and Tiled (its Zarr v2 route). Tiled runs from a venv of its own
(scripts/tiled-venv) as ``python -m benchmark.apps tiled ...``: nothing else of the benchmark is imported there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

from gateway_storage import LocalStore
from wkw_adapter import WkwFileCache, WkwMag

from .config import BLOCK, SCRIPTS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _stored_bytes() -> dict[str, bytes]:
    """Every file under BENCH_FLOOR_ROOT by its URL path."""
    root = Path(os.environ["BENCH_FLOOR_ROOT"])
    return {"/" + p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _byte_range(body: bytes, spec: str) -> tuple[bytes, str]:
    """The slice ``bytes=first-last`` of ``body`` and its Content-Range (the benchmark sends only this form)."""
    first, last = spec.removeprefix("bytes=").split("-")
    start, end = int(first), int(last) + 1
    return body[start:end], f"bytes {start}-{end - 1}/{len(body)}"


def floor_app() -> Any:
    """The Python floor: a minimal Starlette app returning stored bytes from a dict (ranges too)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    data = _stored_bytes()

    async def serve(request: Request) -> Response:
        body = data.get(request.scope["path"])
        if body is None:
            return Response(status_code=404)
        spec = request.headers.get("range")
        if spec is None:
            return Response(body, media_type="application/octet-stream")
        part, content_range = _byte_range(body, spec)
        headers = {"Content-Range": content_range}
        return Response(part, status_code=206, headers=headers, media_type="application/octet-stream")

    return Starlette(routes=[Route("/{path:path}", serve)])


def bare_app() -> ASGIApp:
    """The bare floor: a plain ASGI callable, no framework, returning stored bytes from a dict."""
    data = _stored_bytes()
    octet = (b"content-type", b"application/octet-stream")

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = data.get(scope["path"])
        status = 200
        headers = [octet]
        if body is None:
            status, body = 404, b""
        else:
            spec = next((v for k, v in scope["headers"] if k == b"range"), None)
            if spec is not None:
                body, content_range = _byte_range(body, spec.decode("latin-1"))
                status = 206
                headers.append((b"content-range", content_range.encode()))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def rsgi_app() -> Callable[[Any, Any], Awaitable[None]]:
    """The RSGI floor: a plain callable of Granian's native interface returning stored bytes from a dict."""
    data = _stored_bytes()
    octet = ("content-type", "application/octet-stream")

    async def app(scope: Any, protocol: Any) -> None:
        body = data.get(scope.path)
        if body is None:
            protocol.response_empty(404, [])
            return
        spec = scope.headers.get("range")
        if spec is None:
            protocol.response_bytes(200, [octet], body)
            return
        part, content_range = _byte_range(body, spec)
        protocol.response_bytes(206, [octet, ("content-range", content_range)], part)

    return app


def _wkw_dask_array() -> Any:
    """The voxels of BENCH_PEER_SHAPE from BENCH_PEER_ORIGIN of the WKW mag BENCH_PEER_MAG, as a ``[c, x, y, z]``
    dask array in chunks of BENCH_PEER_EDGE voxels, each read from the mag when it is computed."""
    import dask.array as da

    mag = WkwMag(os.environ["BENCH_PEER_MAG"], WkwFileCache(LocalStore()))
    origin = json.loads(os.environ["BENCH_PEER_ORIGIN"])
    shape = json.loads(os.environ["BENCH_PEER_SHAPE"])
    edge = int(os.environ.get("BENCH_PEER_EDGE", BLOCK))

    def read(block_info: dict[Any, Any] | None = None) -> np.ndarray:
        assert block_info is not None
        location = block_info[None]["array-location"][1:]
        offset = tuple(o + lo for o, (lo, _) in zip(origin, location))
        return np.ascontiguousarray(mag.read_region(offset, tuple(hi - lo for lo, hi in location)))

    chunks = ((1,), *(((edge,) * (s // edge)) for s in shape))
    return da.map_blocks(read, dtype=np.uint8, chunks=chunks, meta=np.empty((0, 0, 0, 0), np.uint8))


def xpublish_app() -> Any:
    """xpublish with its zarr plugin over the WKW mag's dask array."""
    import xarray as xr
    from xpublish.rest import SingleDatasetRest

    dataset = xr.Dataset({"color": (("c", "x", "y", "z"), _wkw_dask_array())})
    return SingleDatasetRest(dataset).app


def tiled_app() -> Any:
    """Tiled serving the WKW mag's dask array as the array ``color``, open to anonymous readers."""
    from tiled.adapters.array import ArrayAdapter
    from tiled.adapters.mapping import MapAdapter
    from tiled.config import Authentication
    from tiled.server.app import build_app

    tree = MapAdapter({"color": ArrayAdapter.from_array(_wkw_dask_array())})
    return build_app(tree, Authentication(allow_anonymous_access=True), {})


APPS = {"floor": floor_app, "bare": bare_app, "rsgi": rsgi_app, "xpublish": xpublish_app, "tiled": tiled_app}
RSGI_APPS = {"rsgi"}  # served through Granian's RSGI interface; every other app is ASGI


def serve_main(argv: list[str]) -> None:
    """``python -m benchmark.apps KIND --server uvicorn|granian --port P --workers N``."""
    parser = argparse.ArgumentParser(prog="python -m benchmark.apps")
    parser.add_argument("kind", choices=list(APPS))
    parser.add_argument("--server", choices=["uvicorn", "granian"], default="uvicorn")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    target = f"benchmark.apps:{args.kind}_app"
    if args.server == "granian":
        from granian.constants import HTTPModes, Interfaces
        from granian.log import LogLevels
        from granian.server import Server

        Server(
            target,
            address="127.0.0.1",
            port=args.port,
            interface=Interfaces.RSGI if args.kind in RSGI_APPS else Interfaces.ASGI,
            workers=args.workers,
            http=HTTPModes.http1,
            websockets=False,
            factory=True,
            log_level=LogLevels.warning,
            working_dir=SCRIPTS,
        ).serve()
        return
    if args.kind in RSGI_APPS:
        parser.error(f"{args.kind} is an RSGI app: it runs on granian only")
    import uvicorn

    uvicorn.run(
        target,
        factory=True,
        app_dir=str(SCRIPTS),
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":  # Tiled's venv runs this module alone
    serve_main(sys.argv[1:])
