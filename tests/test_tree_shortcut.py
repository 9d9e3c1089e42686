"""The trees' shortcut past Starlette's router (``edge.TreeRequests``) answers every request exactly as the
Starlette routes of the same endpoint do: status, headers and body, for data, documents, listings, ranges,
conditional requests, tokens in every carrier and every refusal. Both applications are built by the
composition root from the same settings and called in-process with the same ASGI scope."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.asgi import call
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset

from gateway.http.app import create_app
from gateway.http.edge import Edge
from gateway.settings import Settings

DS = f"{ORG}/wk_dataset"
AUTH = [(b"x-auth-token", TOKEN.encode())]
REQUESTS: list[tuple[str, str, list[tuple[bytes, bytes]]]] = [
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", AUTH),
    ("HEAD", f"/data/zarr/{DS}/color_u8/1/0.2.1.1", AUTH),
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", [*AUTH, (b"range", b"bytes=3-40")]),
    ("GET", f"/data/zarr/{DS}/color_u16/2-2-1/0.1.1.0", AUTH),
    ("GET", f"/data/zarr/{DS}/color_u8/1/.zarray", AUTH),
    ("GET", f"/data/zarr/{DS}/.zgroup", AUTH),
    ("GET", f"/data/zarr/{DS}/", AUTH),
    ("GET", f"/data/zarr/{ORG}/", AUTH),
    ("GET", "/data/zarr/", AUTH),
    ("GET", f"/data/zarr3/{DS}/segmentation/1/zarr.json", AUTH),
    ("GET", f"/data/zarr3/{DS}/segmentation/1/c/0/1/1/0", AUTH),
    ("GET", f"/data/zarr3_experimental/{DS}/rgb/1/zarr.json", AUTH),
    ("GET", f"/data/xarray/{DS}/1/color_u8/.zarray", AUTH),
    ("GET", f"/t/{TOKEN}/data/zarr/{DS}/color_u8/1/0.1.1.0", []),
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", []),  # no token: 401
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", [(b"x-auth-token", OTHER_TOKEN.encode())]),  # 403
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.999.0.0", AUTH),  # outside the array
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.x.0.0", AUTH),  # not a key
    ("GET", f"/data/zarr/{DS}/no_layer/1/.zarray", AUTH),
    ("GET", f"/data/zarr/{ORG}/no_dataset/.zgroup", AUTH),
    ("GET", f"/data/zarr/{DS}/color_u8/1/..%2f..%2f.zarray", AUTH),
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", [*AUTH, (b"range", b"bytes=999999-")]),  # 416
    ("GET", f"/data/zarr/{DS}/color_u8/1/0.1.1.0", [*AUTH, (b"x-auth-token", TOKEN.encode())]),  # two: 400
]


@pytest.fixture(scope="module")
def apps(test_data: WrittenDataset, tokens_file: Path) -> tuple[Edge, Edge]:
    settings = Settings(root=str(test_data.root), tokens_file=str(tokens_file), settle_seconds=0)
    edge = create_app(settings)
    return edge, edge.through_starlette()


@pytest.mark.parametrize(("method", "path", "headers"), REQUESTS, ids=[f"{m} {p}" for m, p, _ in REQUESTS])
def test_the_shortcut_answers_as_the_starlette_route_does(
    apps: tuple[Edge, Edge], method: str, path: str, headers: list[tuple[bytes, bytes]]
) -> None:
    shortcut, routed = apps

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await call(shortcut, method, path, headers), await call(routed, method, path, headers)

    fast, slow = asyncio.run(both())
    assert fast == slow


def test_the_requests_cover_answers_and_refusals(apps: tuple[Edge, Edge]) -> None:
    """The table above reaches data, partial content, and each kind of refusal (else the comparison proves little)."""
    shortcut, _ = apps

    async def statuses() -> set[int]:
        return {(await call(shortcut, m, p, h))["status"] for m, p, h in REQUESTS}

    assert {200, 206, 400, 401, 403, 404, 416} <= asyncio.run(statuses())
