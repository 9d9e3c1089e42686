"""uvicorn's HTTP protocol, but a response's header block leaves in the same write as its first body bytes.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body at
the next message. Between the two the event loop may wait for the GIL (a reader thread holds it for
up to the switch interval), and a process killed then leaves the proxy with headers and no body: nginx
has already committed to that answer and cannot try another replica, so the client sees a short read.
Holding the header block until the first body write closes that window: a replica that dies sends
either a whole small answer or nothing, and "nothing" is what the proxy retries.
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeadWithBody:
    """A transport whose response-head writes wait for the next write and go out with it.

    A head waits no longer than the current step of the event loop: the app sends its body in the same
    step as its ``http.response.start`` (nothing to await in between), and an answer without body bytes
    (HEAD, 304) has its head sent as soon as the step ends.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        chunk = data if isinstance(data, bytes) else bytes(data)
        if self._head is not None:
            chunk, self._head = self._head + chunk, None
        elif chunk.startswith(b"HTTP/1.1 ") and not chunk.startswith(b"HTTP/1.1 1") and chunk.endswith(b"\r\n\r\n"):
            self._head = chunk  # a final response's head, as uvicorn writes it at http.response.start
            asyncio.get_running_loop().call_soon(self._release)
            return
        self._transport.write(chunk)

    def _release(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over :class:`_HeadWithBody`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeadWithBody(transport))  # type: ignore[arg-type]
