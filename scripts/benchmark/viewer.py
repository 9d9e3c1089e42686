"""What a viewer feels: Neuroglancer in headless Chromium on a fixed view of the benchmark's layer, timed
until every visible chunk has loaded, directly against the gateway, through the compose proxy over
HTTP/1.1, and through its TLS listener over HTTP/2.

The view shows the three cross-sections (and the 3D panel of the same slices) at a zoom where they
need a few hundred 32³ chunks. Each set-up opens the view in a fresh browser context (an empty HTTP
cache), ``ROUNDS`` times; the figure is the fastest. A browser opens at most six HTTP/1.1 connections
to one host, so over HTTP/1.1 the requests queue; over HTTP/2 they share one connection.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .config import DATA_ORIGIN, DATASET, ORG, READY, REFERENCE_SERVER, Mode, log
from .nginx import start_proxy
from .processes import Server, free_port, start_gateway
from .run import Run

ROUNDS = 2
CHUNK = re.compile(rb'"path": "[^"]*/color/[^/"]+/\d+\.\d+\.\d+\.\d+"')  # a v2 chunk key of the layer
READY_FOR = 1.0  # seconds viewer.isReady() must stay true: a gap between two batches is not the end
TIMEOUT = 180.0


def view_state(source: str, mode: Mode) -> dict[str, Any]:
    centre = [o + mode.data_edge / 2 for o in DATA_ORIGIN]
    return {
        "position": centre,  # in voxels of mag 1: the global dimensions are the layer's
        "crossSectionScale": 0.75,  # each ~600 px panel spans ~14 chunks of 32 voxels a side
        "projectionScale": 512,
        "layout": "4panel",
        "layers": [{"type": "image", "source": source, "name": "color"}],
        "showAxisLines": False,
        "showScaleBar": False,
        "showDefaultAnnotations": False,
    }


def make_certificate(directory: Path) -> str:
    """A self-signed certificate for 127.0.0.1 (tls.crt, tls.key); the base64 SHA-256 of its public key."""
    directory.mkdir(parents=True, exist_ok=True)
    key, certificate = str(directory / "tls.key"), str(directory / "tls.crt")
    request = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subject = ["-subj", "/CN=zarr-gateway bench", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*request, "-keyout", key, "-out", certificate, "-days", "1", *subject],
        check=True,
        capture_output=True,
    )
    public = subprocess.run(
        ["openssl", "x509", "-in", str(directory / "tls.crt"), "-pubkey", "-noout"], check=True, capture_output=True
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"], input=public, check=True, capture_output=True
    ).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def _time_view(page: Any, url: str, base: str, gateway: Server) -> dict[str, Any]:
    """Seconds from navigation until the view is ready and stays so; the chunks the gateway answered
    meanwhile (its access log: the web worker's requests do not reach the page's network events)."""
    logged = gateway.log_path.stat().st_size
    page.send("Network.enable")
    page.responses.clear()
    started = time.monotonic()
    page.navigate(url)
    page.wait_for("typeof window.viewer === 'object'", timeout=60)
    ready_since: float | None = None
    while time.monotonic() < started + TIMEOUT:
        if page.evaluate("viewer.isReady()"):
            ready_since = ready_since or time.monotonic()
            if time.monotonic() - ready_since >= READY_FOR:
                break
        else:
            ready_since = None
        time.sleep(0.05)
    else:
        raise RuntimeError(f"the view did not load within {TIMEOUT:.0f} s")
    assert ready_since is not None
    time.sleep(0.5)  # access lines are written once per event-loop turn
    with open(gateway.log_path, "rb") as lines:
        lines.seek(logged)
        chunks = sum(1 for line in lines if b'"gateway.access"' in line and CHUNK.search(line))
    return {
        "seconds": round(ready_since - started, 3),
        "chunks": chunks,
        "protocols": sorted({p for u, p in page.responses if u.startswith(base)}),  # of the page's own requests
    }


def viewer_times(run: Run) -> dict[str, Any]:
    """The three set-ups' times (fastest of ``ROUNDS``), or an error."""
    try:
        import neuroglancer
        from chromium_devtools import Browser, chromium_path
    except ImportError as exc:
        return {"error": f"not run: {exc}"}
    if chromium_path() is None:
        return {"error": "not run: no Chromium (scripts/install-system-packages)"}
    info: dict[str, Any] = {}
    with ExitStack() as stack:
        gateway = start_gateway("viewer", REFERENCE_SERVER, run.root, run.workers, run.logs, None)
        stack.callback(gateway.stop)
        gateway.wait_ready(READY, run.workers)
        spki = make_certificate(run.work / "tls")
        tls_port = free_port()
        proxy = start_proxy(gateway.port, run.work, run.logs, tls=(tls_port, run.work / "tls"))
        stack.callback(proxy.stop)
        proxy.wait_ready(READY, 1)
        port, token = free_port(), secrets.token_hex(8)
        neuroglancer.set_server_bind_address("127.0.0.1", port)
        viewer = neuroglancer.UnsynchronizedViewer(token=token)
        stack.callback(neuroglancer.stop)
        client = f"http://127.0.0.1:{port}/v/{token}/"
        browser = Browser(run.work / "chromium" / "profile", [f"--ignore-certificate-errors-spki-list={spki}"])
        stack.callback(browser.close)
        setups = {
            "direct": gateway.url,
            "proxy HTTP/1.1": proxy.url,
            "proxy HTTP/2 (TLS)": f"https://127.0.0.1:{tls_port}",
        }
        for name, base in setups.items():
            state = view_state(f"zarr2://{base}/data/zarr/{ORG}/{DATASET}/color/", run.mode)
            url = client + "#!" + quote(json.dumps(state), safe="")
            rounds = []
            for _ in range(ROUNDS):
                with browser.page() as page:
                    rounds.append(_time_view(page, url, base, gateway))
            best = min(rounds, key=lambda r: r["seconds"])
            info[name] = {**best, "rounds": [r["seconds"] for r in rounds]}
            log(f"viewer, {name}: {best['seconds']:.2f} s for {best['chunks']} chunks ({', '.join(best['protocols'])})")
        del viewer
    return info
