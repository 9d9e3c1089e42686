"""An S3-protocol server for tests (moto in server mode) and a counting, fault-injecting proxy in front of it."""

import http.client
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .emulators import environment
from .loopback import QuietServer, ThreadedServer
from .processes import free_port, stop_process, wait_until_answering

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Variables that would point a gateway elsewhere than the endpoint a test chose.
_OVERRIDDEN = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN")


@contextmanager
def aws_environment(endpoint: str) -> Iterator[None]:
    """``os.environ`` pointing S3 clients at ``endpoint``: the gateway's (obstore, in stores opened and gateways
    started meanwhile) and boto3's; restored afterwards."""
    with environment({**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}, _OVERRIDDEN):
        yield


@dataclass
class Moto:
    """A moto S3 server on a loopback port."""

    endpoint: str
    process: "subprocess.Popen[bytes]"

    def client(self) -> Any:  # a boto3 S3 client, which writes the test data (the gateway reads with obstore)
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def stop(self) -> None:
        stop_process(self.process)


def start_moto(log_path: Path) -> Moto:
    port = free_port()
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    wait_until_answering(endpoint + "/moto-api/", process, 30, lambda: f"moto: {log_path.read_text()}", interval=0.1)
    return Moto(endpoint, process)


def upload_tree(client: Any, local: Path, bucket: str, prefix: str) -> int:
    """Every file under ``local`` as ``prefix/<relative path>``; returns how many."""
    count = 0
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")
            count += 1
    return count


# --- the proxy --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    """One request the proxy saw: what was asked, and how many body bytes went back."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}


class CountingProxy(ThreadedServer):
    """A threaded HTTP proxy to ``upstream`` that records every request and can be told to fail.

    Modes: ``"forward"`` (pass everything through), ``"error"`` (answer 500), ``"close"`` (drop the
    connection without an answer). A failing mode hits only paths containing ``fail_only`` and only the
    methods in ``fail_methods``, where these are set, and forwards the rest. :meth:`stop` closes the
    listening socket, so the store is unreachable (connection refused) until :meth:`start` opens it
    again on the same port.
    """

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.removeprefix("http://")
        self.mode = "forward"
        self.fail_only: str | None = None
        self.fail_methods: set[str] | None = None
        self.fetches: list[Fetch] = []
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: stopping the proxy leaves none open

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                mode = proxy.mode
                if proxy.fail_only is not None and proxy.fail_only not in self.path:
                    mode = "forward"
                if proxy.fail_methods is not None and self.command not in proxy.fail_methods:
                    mode = "forward"
                if mode == "close":
                    proxy._record(Fetch(self.command, self.path, self.headers.get("Range"), 0, 0))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "error":
                    payload = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    proxy._record(Fetch(self.command, self.path, self.headers.get("Range"), 500, 0))
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                connection = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                connection.request(self.command, self.path, body=body or None, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                connection.close()
                proxy._record(Fetch(self.command, self.path, self.headers.get("Range"), answer.status, len(data)))
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(answer.getheader("Content-Length", len(data))))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self._serve(QuietServer(("127.0.0.1", self.port), Handler))

    def _record(self, fetch: Fetch) -> None:
        with self._lock:
            self.fetches.append(fetch)

    def take(self) -> list[Fetch]:
        """The requests recorded since the last call."""
        with self._lock:
            fetches, self.fetches = self.fetches, []
        return fetches


@contextmanager
def uploaded_behind_proxy(work: Path, local: Path, bucket: str, prefix: str) -> Iterator[tuple[Any, "CountingProxy"]]:
    """moto (its log in ``work``) holding every file under ``local`` as ``bucket/prefix/...``, reached through a
    started :class:`CountingProxy`: its boto3 client and the proxy; both stopped afterwards."""
    moto = start_moto(work / "moto.log")
    proxy = CountingProxy(moto.endpoint)
    try:
        client = moto.client()
        client.create_bucket(Bucket=bucket)
        upload_tree(client, local, bucket, prefix)
        proxy.start()
        yield client, proxy
    finally:
        proxy.stop()
        moto.stop()
