"""A static HTTPS file server for tests, with a certificate made here, that reads the way object stores answer.

It serves a directory with what a store client relies on: ``Range`` reads, a strong ``ETag`` per version
of a file (and ``412`` for an ``If-Match`` that names another), ``HEAD``, and a WebDAV ``PROPFIND`` of
depth 1 so a client can list a directory (servers without it answer ``405``: see ``listing``). Like
``support.s3.CountingProxy`` it can be told to fail (``"error"``: answer 500; ``"close"``: drop the
connection) and can be stopped and started again on the same port.
"""

import datetime
import email.utils
import ipaddress
import os
import socket
import ssl
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit
from xml.sax.saxutils import escape

from .processes import free_port


@dataclass(frozen=True)
class Certificate:
    """A test certificate authority and a server certificate it signed for 127.0.0.1 and localhost, as PEM files.

    Clients trust ``authority`` (rustls, under obstore, refuses a self-signed certificate used as the server's).
    """

    authority: Path
    cert: Path
    key: Path


def make_certificate(directory: Path) -> Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, issuer: x509.Name | None, public: object) -> x509.CertificateBuilder:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(public)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    authority_key = ec.generate_private_key(ec.SECP256R1())
    authority = (
        build("zarr-gateway test CA", None, authority_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(authority_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        build("127.0.0.1", authority.subject, key.public_key())
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = Certificate(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    paths.authority.write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    paths.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _etag(stat: os.stat_result) -> str:
    """Modification time and size, as nginx makes it: a copy that keeps its mtime keeps its ETag."""
    return f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'


class _QuietServer(ThreadingHTTPServer):
    """Keeps its open connections, so that stopping it also drops the ones a client holds open."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self.connections_lock:
            open_now = list(self.connections)
        for connection in open_now:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class FileServer:
    """HTTPS over ``root`` on a loopback port; ``mode`` is ``"forward"``, ``"error"`` or ``"close"``."""

    def __init__(
        self, root: Path, certificate: Certificate, listing: bool = True, required: dict[str, str] | None = None
    ) -> None:
        self.root = root
        self.required = required or {}  # headers every request must carry, or it is answered 401
        self.certificate = certificate
        self.listing = listing
        self.port = free_port()
        self.mode = "forward"
        self.requests: list[tuple[str, str, str | None]] = []
        # Called with the file's path after each HEAD is answered, until it returns True (then cleared):
        # to replace a file between the moment a reader learned its version and its read.
        self.after_head: Callable[[Path], bool] | None = None
        self._lock = threading.Lock()
        self._server: _QuietServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def take(self) -> list[tuple[str, str, str | None]]:
        """The (method, path, Range) of every request since the last call."""
        with self._lock:
            taken, self.requests = self.requests, []
        return taken

    def start(self) -> None:
        files = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall between them

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _file(self) -> Path | None:
                relative = unquote(urlsplit(self.path).path).lstrip("/")
                path = (files.root / relative).resolve()
                return path if path == files.root.resolve() or files.root.resolve() in path.parents else None

            def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _fault(self) -> bool:
                with files._lock:
                    files.requests.append((self.command, self.path, self.headers.get("Range")))
                if any(self.headers.get(name) != value for name, value in files.required.items()):
                    self._reply(401, b"unauthorized", {"WWW-Authenticate": "Bearer"})
                    return True
                if files.mode == "close":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return True
                if files.mode == "error":
                    self._reply(500, b"injected")
                    return True
                return False

            def do_GET(self) -> None:
                if self._fault():
                    return
                path = self._file()
                if path is None or not path.is_file():
                    self._reply(404, b"not found")
                    return
                with open(path, "rb") as handle:
                    stat = os.fstat(handle.fileno())
                    data = handle.read()
                etag = _etag(stat)
                headers = {
                    "ETag": etag,
                    "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
                    "Accept-Ranges": "bytes",
                }
                wanted = self.headers.get("If-Match")
                if wanted is not None and wanted.strip() != "*" and etag not in [w.strip() for w in wanted.split(",")]:
                    self._reply(412, b"precondition failed", headers)
                    return
                asked = self.headers.get("Range")
                if asked and asked.startswith("bytes="):
                    first, _, last = asked.removeprefix("bytes=").partition("-")
                    start = int(first) if first else len(data) - int(last)
                    end = min(int(last), len(data) - 1) if first and last else len(data) - 1
                    if start >= len(data) or start > end:
                        self._reply(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
                        return
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    self._reply(206, data[start : end + 1], headers)
                    return
                hook = files.after_head
                if self.command == "HEAD" and hook is not None and hook(path):
                    files.after_head = None  # replaced before the answer, which still names the old version
                self._reply(200, data, headers)

            do_HEAD = do_GET

            def do_PROPFIND(self) -> None:
                if self._fault():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if not files.listing:
                    self._reply(405, b"method not allowed", {"Allow": "GET, HEAD"})
                    return
                path = self._file()
                if path is None or not path.is_dir():
                    self._reply(404, b"not found")
                    return
                base = "/" + path.relative_to(files.root.resolve()).as_posix().strip(".").strip("/")
                entries = [(path, True)] + [(child, child.is_dir()) for child in sorted(path.iterdir())]
                responses = []
                for entry, is_directory in entries:
                    relative = entry.relative_to(files.root.resolve()).as_posix()
                    href = "/" + quote("" if relative == "." else relative) + ("/" if is_directory else "")
                    stat = entry.stat()
                    properties = (
                        "<D:resourcetype><D:collection/></D:resourcetype>"
                        if is_directory
                        else f"<D:resourcetype/><D:getcontentlength>{stat.st_size}</D:getcontentlength>"
                        f"<D:getetag>{escape(_etag(stat))}</D:getetag>"
                    )
                    modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
                    responses.append(
                        f"<D:response><D:href>{href.replace('//', '/')}</D:href><D:propstat><D:prop>"
                        f"{properties}<D:getlastmodified>{modified}</D:getlastmodified>"
                        "</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
                    )
                del base
                body = '<?xml version="1.0"?><D:multistatus xmlns:D="DAV:">' + "".join(responses) + "</D:multistatus>"
                self._reply(207, body.encode(), {"Content-Type": "application/xml; charset=utf-8"})

        server = _QuietServer(("127.0.0.1", self.port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate.cert, self.certificate.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
