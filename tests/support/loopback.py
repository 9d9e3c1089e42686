"""HTTP servers run on a thread of the test process (a file server, a counting proxy), on a fixed loopback
port so that a stopped one can be started again where its clients look for it."""

import socket
import threading
from contextlib import suppress
from http.server import ThreadingHTTPServer
from typing import Any

from .processes import free_port


class QuietServer(ThreadingHTTPServer):
    """Keeps its open connections, so that stopping it can also drop the ones a client holds open; a
    connection dropped on purpose, or one its client gave up on, is not reported."""

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


class ThreadedServer:
    """A server's port and thread; a subclass builds its handler in ``start`` and hands the server to ``_serve``."""

    drops_connections = False  # whether stopping also drops the connections clients hold open

    def __init__(self) -> None:
        self.port = free_port()
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None

    def _serve(self, server: QuietServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self.drops_connections:
                self._server.drop_connections()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
