"""The compose proxy's optional TLS listener with HTTP/2 (deploy/tls.conf), run by Debian's nginx as the
other proxy tests run it, with a certificate made here: zarr-python reads a mag over HTTPS, an HTTP/2
client gets HTTP/2 with the same bytes as the plain listener, and Neuroglancer in headless Chromium
draws a layer through it. Nothing is timed here: the benchmark measures what HTTP/2 gives a viewer.
"""

import base64
import datetime
import hashlib
import ipaddress
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from support.browser import Browser, chromium_path
from support.datasets import ORG, TOKEN, WrittenDataset, mag_name
from support.processes import free_port
from support.proxy import Proxy, address, start_proxy
from support.servers import Server
from support.viewer import wait_until_drawn

LAYER, MAG = "color_u8", (1, 1, 1)
ARRAY = f"/data/zarr/{ORG}/wk_dataset/{LAYER}/{mag_name(MAG)}"
V3_LAYER = f"/data/zarr3/{ORG}/wk_dataset/{LAYER}"
CHUNK = ARRAY + "/0.1.0.0"  # inside the bounding box (chunk 0 along x lies before it)
HEADERS = {"X-Auth-Token": TOKEN}
pytestmark = pytest.mark.nginx  # every test runs deploy/nginx.conf (with deploy/tls.conf) in front of a gateway


def make_certificate(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 as ``directory/tls.crt`` and its key as ``tls.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zarr-gateway test proxy")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / "tls.key").write_bytes(key_pem)
    return directory / "tls.crt"


def spki_hash(certificate: Path) -> str:
    """The base64 SHA-256 of the certificate's public key, as Chromium's trusted-key list takes it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    public = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def start_tls_proxy(gateway: Server, certificate: Path, directory: Path) -> tuple[Proxy, str]:
    """The proxy with PROXY_TLS=on in front of ``gateway``: (proxy, its https:// base URL)."""
    port = free_port()
    proxy = start_proxy(
        directory,
        [address(gateway)],
        PROXY_TLS="on",
        PROXY_TLS_LISTEN=f"127.0.0.1:{port}",
        PROXY_TLS_DIR=str(certificate.parent),
    )
    return proxy, f"https://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def tls_gateways(
    test_data: WrittenDataset, tokens_file: Path, server_factory: Callable[..., Server]
) -> dict[str, Server]:
    """A gateway with tokens, and one without: this Neuroglancer keeps no query string on the URLs it derives."""
    return {"tokens": server_factory(test_data.root, tokens_file=tokens_file), "open": server_factory(test_data.root)}


def _proxied(gateway: Server, certificate: Path, directory: Path) -> Iterator[tuple[Proxy, str]]:
    proxy, base = start_tls_proxy(gateway, certificate, directory)
    yield proxy, base
    proxy.stop()


@pytest.fixture(scope="module")
def tls_proxy(
    tls_gateways: dict[str, Server], certificate: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proxy, str]]:
    """In front of the gateway with tokens."""
    yield from _proxied(tls_gateways["tokens"], certificate, tmp_path_factory.mktemp("nginx-tls"))


@pytest.fixture(scope="module")
def open_tls_proxy(
    tls_gateways: dict[str, Server], certificate: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proxy, str]]:
    """In front of the gateway without tokens."""
    yield from _proxied(tls_gateways["open"], certificate, tmp_path_factory.mktemp("nginx-tls-open"))


def test_tls_listener_is_off_by_default(
    test_data: WrittenDataset, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """The shipped defaults include no TLS listener: nothing but the plain port is rendered into the server."""
    gateway = server_factory(test_data.root)
    proxy = start_proxy(tmp_path / "nginx", [address(gateway)])
    try:
        assert httpx.get(proxy.url + "/healthz", timeout=30).status_code == 200
        rendered = (tmp_path / "nginx" / "conf.d" / "default.conf").read_text()
        assert "include conf.d/tls/off*.conf;" in rendered
        assert not list((tmp_path / "nginx" / "conf.d" / "tls").glob("off*.conf"))
    finally:
        proxy.stop()


def test_http2_client_gets_the_plain_listener_s_bytes(tls_proxy: tuple[Proxy, str], certificate: Path) -> None:
    proxy, base = tls_proxy
    context = ssl.create_default_context(cafile=str(certificate))
    with httpx.Client(http2=True, verify=context, headers=HEADERS, timeout=60) as client:
        metadata = client.get(base + ARRAY + "/.zarray")
        assert metadata.status_code == 200, metadata.text
        assert metadata.http_version == "HTTP/2"
        chunk = client.get(base + CHUNK)
        assert chunk.http_version == "HTTP/2"
        assert chunk.headers["access-control-allow-origin"] == "*"
        unauthorized = client.get(base + CHUNK, headers={"X-Auth-Token": "wrong"})
        assert unauthorized.status_code == 401  # the same token check as the plain listener
    plain = httpx.get(proxy.url + CHUNK, headers=HEADERS, timeout=60)
    assert chunk.status_code == plain.status_code == 200
    assert chunk.content == plain.content and len(chunk.content) > 0
    assert chunk.headers["etag"] == plain.headers["etag"]


def test_an_http2_request_nginx_cannot_read_is_a_json_400(tls_proxy: tuple[Proxy, str], certificate: Path) -> None:
    """An encoded NUL in the path, over HTTP/2 as over HTTP/1.1 (tests/test_deploy.py): the proxy's JSON 400, never
    nginx's 500 of a request without a URI sent to a named error location."""
    _, base = tls_proxy
    context = ssl.create_default_context(cafile=str(certificate))
    with httpx.Client(http2=True, verify=context, headers=HEADERS, timeout=60) as client:
        refused = client.get(base + ARRAY + "/%00/0.1.0.0")
        assert refused.http_version == "HTTP/2"
        assert refused.status_code == 400 and refused.headers["content-type"] == "application/json", refused.text
        assert refused.json()["status"] == 400 and refused.json()["error"]
        assert client.get(base + CHUNK).status_code == 200


def test_zarr_python_reads_a_mag_over_https(
    tls_proxy: tuple[Proxy, str], certificate: Path, test_data: WrittenDataset
) -> None:
    import aiohttp
    import zarr

    _, base = tls_proxy
    context = ssl.create_default_context(cafile=str(certificate))

    async def get_client(**kwargs: Any) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), **kwargs)

    options = {"headers": HEADERS, "get_client": get_client}
    array = zarr.open_array(base + ARRAY, mode="r", zarr_format=2, storage_options=options)
    assert np.array_equal(np.asarray(array[:]), test_data.expected(LAYER, MAG))


@pytest.mark.browser
def test_neuroglancer_draws_a_layer_through_the_http2_listener(
    open_tls_proxy: tuple[Proxy, str], certificate: Path, neuroglancer_url: str, tmp_path: Path
) -> None:
    if chromium_path() is None:
        pytest.fail("this test drives a real browser: run scripts/install-system-packages")
    proxy, base = open_tls_proxy
    before = len(proxy.access_log())
    # Chromium trusts exactly this certificate's key.
    browser = Browser(tmp_path / "profile", [f"--ignore-certificate-errors-spki-list={spki_hash(certificate)}"])
    try:
        source = f"zarr3://{base}{V3_LAYER}/"
        state = {"layers": [{"type": "image", "source": source, "name": LAYER}], "layout": "xy"}
        with browser.page() as page:
            page.send("Network.enable")
            page.navigate(neuroglancer_url + "#!" + quote(json.dumps(state), safe=""))
            page.wait_for("typeof window.viewer === 'object'", timeout=60)
            final = wait_until_drawn(page)
            responses = [(url, protocol) for url, protocol in page.responses if url.startswith(base)]
    finally:
        browser.close()
    sources = [s for layer in final["layers"] for s in layer["sources"]]
    assert sources and all(s["state"] == "loaded" for s in sources), final
    chunks = [line for line in proxy.access_log()[before:] if line["path"].startswith(f"{V3_LAYER}/{mag_name(MAG)}/c/")]
    assert any(line["status"] == "200" for line in chunks), proxy.access_log()[before:][-10:]
    assert responses, "the page saw no response from the proxy"
    assert {protocol for _, protocol in responses} == {"h2"}, responses[:10]
