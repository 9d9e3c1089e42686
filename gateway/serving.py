"""uvicorn's HTTP protocol with limits on request heads, and a response's header block in the same write as
its first body bytes.

Limits: uvicorn's httptools protocol takes a request head of any size and waits for it, and for a
body, for ever (its keep-alive timeout ends once a byte arrives). Reached directly (no proxy in front),
one client could hold a connection open or grow a worker's memory at will. Here a head longer than
``max_header_bytes`` is answered 431, and a connection that has not sent a whole request (line,
headers and any body) within ``header_timeout`` seconds of opening (or of its previous answer) is
closed, with a 408 if it had begun one and had no answer yet. The gateway reads no request body, so a
client that sends one slowly has only that time to finish it. Granian gets the head limits from its
own options (see :mod:`gateway.cli.servers`) and closes a connection whose body its app did not read.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body at
the next message. Between the two the event loop may wait for the GIL (a reader thread holds it for
up to the switch interval), and a process killed then leaves the proxy with headers and no body: nginx
has already committed to that answer and cannot try another replica, so the client sees a short read.
Holding the header block until the first body write closes that window: a replica that dies sends
either a whole small answer or nothing, and "nothing" is what the proxy retries.
"""

import asyncio
import json
import os
import sys
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .settings import ENV_PREFIX, Settings


def head_limits() -> tuple[int, float]:
    """``max_header_bytes`` and ``header_timeout`` as start-up handed them to the workers (the environment)."""
    fields = Settings.model_fields
    size = os.environ.get(f"{ENV_PREFIX}MAX_HEADER_BYTES") or fields["max_header_bytes"].default
    timeout = os.environ.get(f"{ENV_PREFIX}HEADER_TIMEOUT") or fields["header_timeout"].default
    return int(size), float(timeout)


def _refusal(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message, "status": status}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _HeadWithBody:
    """A transport whose response head waits for the body and goes out with it in one ``writelines``.

    The head and every write after it in the same step of the event loop are held and handed to the
    transport together when the response is complete (or when the step ends, for an answer whose body
    is still being read): one ``writelines`` call, which uvloop sends as one ``writev`` without joining
    the buffers, so no body is copied to prepend its head. The app sends its body in the same step as
    its ``http.response.start`` (nothing to await in between); an answer without body bytes (HEAD, 304)
    has its head sent as soon as it is complete.
    """

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes | bytearray | memoryview] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            held.append(data)
        elif (
            type(data) is bytes
            and data.startswith(b"HTTP/1.1 ")
            and not data.startswith(b"HTTP/1.1 1")
            and data.endswith(b"\r\n\r\n")
        ):
            self._held = [data]  # a final response's head, as uvicorn writes it at http.response.start
            asyncio.get_running_loop().call_soon(self.release)
        else:
            self._transport.write(data)

    def release(self) -> None:
        """Hand what is held (a head and the body written with it) to the transport in one call."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self.release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over :class:`_HeadWithBody`, with the limits on request heads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_head, self._head_timeout = head_limits()
        self._in_head = True  # between requests or inside a request's line and headers
        self._in_body = False  # a request's head has arrived, its body (if it announced one) not yet wholly
        self._head_bytes = 0
        # The head clock: its deadline (None: stopped), and the timer that looks at it. Moving the deadline on
        # for every request costs a float; the timer, when it fires early, is set again for the deadline.
        self._head_deadline: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._one_write = _HeadWithBody(transport)
        super().connection_made(self._one_write)  # type: ignore[arg-type]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                self._refuse(
                    431, "Request Header Fields Too Large", f"request line and headers exceed {self._max_head} bytes"
                )
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head, self._in_body = False, True
        if self._head_deadline is None:  # a pipelined request, its head read while another was answered
            self._arm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._in_body, self._head_bytes = True, False, 0  # what follows is the next request's head
        self._cancel_head_timer()
        answered = self.cycle is not None and self.cycle.response_complete
        super().on_message_complete()
        if answered and not self.transport.is_closing():
            self._arm_head_timer()  # answered while its body arrived: waiting for the next request now

    def on_response_complete(self) -> None:
        self._one_write.release()  # the whole answer is written: it goes out now, head and body together
        super().on_response_complete()
        if not self._in_body and not self.pipeline and not self.transport.is_closing():
            self._arm_head_timer()  # waiting for the next request now (a body still arriving keeps its clock)

    def _arm_head_timer(self) -> None:
        """Start the head clock anew: ``head_timeout`` from now."""
        self._head_deadline = deadline = self.loop.time() + self._head_timeout
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(deadline, self._head_clock)

    def _cancel_head_timer(self) -> None:
        """Stop the head clock (its timer, if set, finds it stopped)."""
        self._head_deadline = None

    def _head_clock(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:  # moved on since the timer was set
            self._head_timer = self.loop.call_at(deadline, self._head_clock)
            return
        self._head_deadline = None
        self._head_timed_out()

    def _head_timed_out(self) -> None:
        if self.transport.is_closing():
            return
        if self._in_body:
            if self.cycle is not None and self.cycle.response_started:
                self.transport.close()  # the answer began: nothing can be said any more
            else:
                self._refuse(
                    408, "Request Timeout", f"the request's body did not arrive within {self._head_timeout:g} s"
                )
            return
        answering = self.cycle is not None and not self.cycle.response_complete
        if answering:
            return
        if self._head_bytes:
            self._refuse(
                408, "Request Timeout", f"the request's headers did not arrive within {self._head_timeout:g} s"
            )
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A head httptools cannot parse (raw UTF-8 in the URL, LF-only lines, Content-Length beside
        Transfer-Encoding) is a JSON 400 that says what the parser found, as every other error is: uvicorn's own
        answer is plain text. Called from the parser's ``except`` clause, whose exception holds the reason."""
        found = sys.exc_info()[1]
        reason = str(found) if found is not None and str(found) else msg
        self._refuse(400, "Bad Request", f"malformed request head: {reason}")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.write(_refusal(status, reason, message))
            self.transport.close()


class StrictFraming:
    """Under Granian, a request that carries Transfer-Encoding is a JSON 400 that closes the connection, on every
    path, before the gateway sees it.

    Granian's parser drops a Content-Length sent beside Transfer-Encoding, so the app cannot tell that ambiguous
    framing (whose body a proxy in front may have framed otherwise: request smuggling) from a chunked body alone;
    httptools refuses the pair itself. Reads carry no body, so refusing every request with a transfer coding, as
    the shipped proxy does, loses no client."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and any(name.lower() == b"transfer-encoding" for name, _ in scope["headers"]):
            body = json.dumps(
                {"error": "malformed request: a read carries no body, and Transfer-Encoding is refused", "status": 400}
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
