"""Neuroglancer in headless Chromium: the viewer's state as its page reports it, and the gateway's access log.

Shared by the viewer tests (``test_viewers``, ``test_mesh_viewer``); the ``browser`` and
``neuroglancer_url`` fixtures that they use are in ``conftest.py``.
"""

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .browser import BrowserError, Page
from .servers import Server

METADATA_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json"})
LOAD_TIMEOUT = 120  # seconds for a view to load on a busy 2-core machine; not an assertion on speed
# What the viewer says about its layers: per layer, per data source, "loading" | "loaded" | "error".
LAYER_STATES_JS = """(() => {
  const layers = viewer.layerManager.managedLayers.map(managed => ({
    name: managed.name,
    sources: managed.layer === null ? [] : managed.layer.dataSources.map(source => {
      const state = source.loadState;
      if (state === undefined) return {url: source.spec.url, state: "loading", error: null};
      if (state.error !== undefined) return {url: source.spec.url, state: "error", error: String(state.error.message)};
      return {url: source.spec.url, state: "loaded", error: null};
    }),
  }));
  return {layers, ready: viewer.isReady()};
})()"""
PANEL_RECT_JS = """(() => {
  const r = document.querySelector(".neuroglancer-rendered-data-panel").getBoundingClientRect();
  return [Math.ceil(r.left), Math.ceil(r.top), Math.floor(r.right), Math.floor(r.bottom)];
})()"""


@dataclass
class AccessLine:
    method: str
    path: str
    status: int

    @property
    def is_chunk(self) -> bool:
        """A chunk or shard of a mag: /data/{tree}/{org}/{dataset}/{layer}/{mag}/{key...}."""
        parts = self.path.split("/")
        return len(parts) > 7 and parts[-1] != "" and parts[-1] not in METADATA_NAMES  # "" is a listing


def access_lines(server: Server, since: int) -> list[AccessLine]:
    lines = []
    for text in server.log()[since:].splitlines():
        if '"gateway.access"' in text:
            record = json.loads(text)
            lines.append(AccessLine(record["method"], record["path"], record["status"]))
    return lines


def png_pixels(png: bytes | Path) -> np.ndarray:
    data = png.read_bytes() if isinstance(png, Path) else png
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def wait_until_drawn(page: Page, timeout: float = LOAD_TIMEOUT) -> dict[str, Any]:
    """Wait until every data source has settled and, if all loaded, the display has drawn every chunk.

    Neuroglancer fetches chunks in a web worker; ``viewer.isReady()`` turns true once every visible
    chunk is on the GPU. Three ready polls in a row guard against a gap between two batches.
    """
    deadline = time.monotonic() + timeout
    ready_polls = 0
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = page.evaluate(LAYER_STATES_JS)
        sources = [s for layer in state["layers"] for s in layer["sources"]]
        settled = bool(sources) and all(s["state"] != "loading" for s in sources)
        failed = any(s["state"] == "error" for s in sources)
        ready_polls = ready_polls + 1 if settled and (failed or state["ready"]) else 0
        if ready_polls >= 3:
            return state
        time.sleep(1)
    raise BrowserError(f"view not drawn after {timeout} s: {state}; console: {page.console[-20:]}")


def open_and_draw(page: Page, url: str) -> list[dict[str, Any]]:
    """Open a Neuroglancer address and wait until its view is drawn: every data source of every layer."""
    page.navigate(url)
    page.wait_for("typeof window.viewer === 'object'", timeout=60)
    return [source for layer in wait_until_drawn(page)["layers"] for source in layer["sources"]]


def settled_screenshot(page: Page, path: Path, attempts: int = 20) -> Path:
    """A screenshot after a forced redraw that the next forced redraw leaves unchanged (the frame is final)."""
    previous = b""
    for _ in range(attempts):
        page.evaluate("viewer.display.draw(), true")
        current = page.capture()
        if current == previous:
            path.write_bytes(current)
            return path
        previous = current
        time.sleep(0.5)
    raise BrowserError(f"the view kept changing over {attempts} screenshots")


def assert_chunks_answered(access: list[AccessLine]) -> None:
    """Chunks were requested and answered 200/206; a 304 only revalidates a chunk answered 200/206 before.

    (Neuroglancer may fetch a chunk twice in one view; ``Cache-Control: no-cache`` makes the second a
    conditional request.)
    """
    chunks = [line for line in access if line.is_chunk]
    assert chunks, f"no chunk was requested; access log: {access}"
    answered: set[str] = set()
    for line in chunks:
        if line.status in (200, 206):
            answered.add(line.path)
        else:
            assert line.status == 304 and line.path in answered, line


def state_sources(state: dict[str, Any]) -> list[str]:
    """Every source URL of a Neuroglancer state's layers (a layer's source is one URL or a list of them)."""
    return [
        source
        for layer in state["layers"]
        for source in (layer["source"] if isinstance(layer["source"], list) else [layer["source"]])
    ]


def mesh_view(
    source: str, voxel_nm: tuple[float, float, float], centre: list[float], scale: float, segments: list[int]
) -> dict[str, Any]:
    """A 3-D view of a mesh source's ``segments`` alone (white, opaque), orthographic, looking down z from
    ``centre``, the panel ``scale`` voxels high."""
    return {
        "dimensions": {axis: [size * 1e-9, "m"] for axis, size in zip("xyz", voxel_nm)},
        "position": centre,
        "projectionScale": scale,
        "layout": {"type": "3d", "orthographicProjection": True},
        "showAxisLines": False,
        "showScaleBar": False,
        "showDefaultAnnotations": False,
        "showSlices": False,
        "layers": [
            {
                "type": "segmentation",
                "name": "segmentation",
                "source": source,
                "segments": [str(s) for s in segments],
                "segmentColors": {str(s): "#ffffff" for s in segments},
                "objectAlpha": 1,
            }
        ],
    }
