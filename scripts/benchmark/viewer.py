"""What a viewer feels: Neuroglancer in headless Chromium on a fixed view of the benchmark's layer, timed
until every visible chunk has loaded, directly against the gateway, through the compose proxy over
HTTP/1.1, and through its TLS listener over HTTP/2.

The view shows the three cross-sections (and the 3D panel of the same slices) at a zoom where they
need a few hundred 32³ chunks. Each set-up has a gateway (and proxy) of its own, started for it with
empty caches: the first load opens the view in a fresh browser context (an empty HTTP cache); the
reload opens it again in the same context, after a blank page, every cache warm (the browser
revalidates what it holds). A browser opens at most six HTTP/1.1 connections to one host, so over
HTTP/1.1 the requests queue; over HTTP/2 they share one connection.
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
from .processes import Server, free_port, start_gateway, stop_all
from .run import Run

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
    page.navigate("about:blank")
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


def _setups(run: Run, stack: ExitStack) -> dict[str, tuple[str, Server]]:
    """Each set-up's base URL and its own gateway, all started at once (a proxy in front where it has one)."""
    spki_dir = run.work / "tls"
    servers: dict[str, tuple[str, Server]] = {}
    proxies: list[Server] = []
    started: list[Server] = []
    stack.callback(stop_all, started)
    for name in ("direct", "proxy HTTP/1.1", "proxy HTTP/2 (TLS)"):
        gateway = start_gateway("viewer", REFERENCE_SERVER, run.root, run.workers, run.logs, None)
        started.append(gateway)
        if name == "direct":
            servers[name] = (gateway.url, gateway)
            continue
        tls_port = free_port() if "TLS" in name else None
        proxy = start_proxy(gateway.port, run.logs, tls=(tls_port, spki_dir) if tls_port else None)
        started.append(proxy)
        proxies.append(proxy)
        servers[name] = (f"https://127.0.0.1:{tls_port}" if tls_port else proxy.url, gateway)
    for _, gateway in servers.values():
        gateway.wait_ready(READY, run.workers)
    for proxy in proxies:
        proxy.wait_ready(READY, 1)
    return servers


def viewer_times(run: Run) -> dict[str, Any]:
    """Each set-up's first load and reload, or an error."""
    try:
        import neuroglancer
        from chromium_devtools import Browser, chromium_path
    except ImportError as exc:
        return {"error": f"not run: {exc}"}
    if chromium_path() is None:
        return {"error": "not run: no Chromium (scripts/install-system-packages)"}
    info: dict[str, Any] = {}
    with ExitStack() as stack:
        spki = make_certificate(run.work / "tls")
        setups = _setups(run, stack)
        port, token = free_port(), secrets.token_hex(8)
        neuroglancer.set_server_bind_address("127.0.0.1", port)
        viewer = neuroglancer.UnsynchronizedViewer(token=token)
        stack.callback(neuroglancer.stop)
        client = f"http://127.0.0.1:{port}/v/{token}/"
        browser = Browser(run.work / "chromium" / "profile", [f"--ignore-certificate-errors-spki-list={spki}"])
        stack.callback(browser.close)
        for name, (base, gateway) in setups.items():
            state = view_state(f"zarr2://{base}/data/zarr/{ORG}/{DATASET}/color/", run.mode)
            url = client + "#!" + quote(json.dumps(state), safe="")
            with browser.page() as page:
                info[name] = {
                    "first": _time_view(page, url, base, gateway),
                    "reload": _time_view(page, url, base, gateway),
                }
            first, reload = info[name]["first"], info[name]["reload"]
            log(
                f"viewer, {name}: first load {first['seconds']:.2f} s for {first['chunks']} chunks, reload "
                f"{reload['seconds']:.2f} s ({', '.join(first['protocols'])})"
            )
        del viewer
    return info
