"""Log lines for machines (JSON objects, one a line) or for people (text), in the server and every worker.

``log_format`` ``auto`` picks text when standard error is a terminal and JSON otherwise. Either way a
record is exactly one line that nothing from a request can break or forge: JSON escapes every control
character, and text lines escape control characters, separators and quotes in what a client sent
(paths, methods, request ids, exception messages) and indent the lines of a traceback.
"""

import asyncio
import json
import logging
import sys
import time
from typing import Any, TextIO
from urllib.parse import quote

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


def utc_stamp(created: float) -> str:
    """A record's time as every log line writes it: ISO 8601 in UTC, to the millisecond."""
    second = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{int((created - second) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's ``extra`` fields at the top level.

    Access lines do not pass through here: see :class:`AccessLog`.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"message": record.getMessage()}
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in fields})
        fields["time"] = utc_stamp(record.created)
        fields["level"] = record.levelname
        fields["logger"] = record.name
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


def resolve_format(log_format: str) -> str:
    """``json`` or ``text``: ``auto`` is text for a person at a terminal, JSON for a collector."""
    if log_format == "auto":
        isatty = getattr(sys.stderr, "isatty", None)
        return "text" if isatty is not None and isatty() else "json"
    return log_format


def field(text: str) -> str:
    """``text`` as one field of a text line: control characters, blanks, quotes and ``%`` percent-encoded."""
    if text.isprintable() and not any(c in text for c in ' %"\\'):
        return text
    return "".join(c if c.isprintable() and c not in ' %"\\' else quote(c, safe="") for c in text)


def one_line(text: str) -> str:
    """``text`` on one line: line breaks and other control characters written as escapes (``\\n``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, the message on one line; a traceback follows, each line indented,
    so a line that starts at the margin is always a record of its own."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """UTC, as the access lines and the JSON records write it (``2026-12-01T19:56:55.123Z``)."""
        return utc_stamp(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return "\n".join("    " + one_line(line) for line in super().formatException(ei).splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("    " + one_line(line) for line in stack_info.splitlines())


def json_string(text: str) -> str:
    """``json.dumps(text)``, in a quarter of its time for the plain text of nearly every access line (printable
    ASCII, neither quote nor backslash: nothing to escape)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


class AccessLog:
    """Access lines, one per request: written in batches, without logging's per-record machinery.

    Building a LogRecord, finding its caller and formatting it cost more than
    answering a pass-through chunk, so access lines are rendered here and
    written once per event-loop turn. They honour the ``gateway.access``
    logger's level and the configured format.
    """

    def __init__(self) -> None:
        self.log_format = "json"
        self._pending: list[str] = []
        self._second = -1
        self._stamp = ""
        self._logger = logging.getLogger("gateway.access")

    def _time(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def write(self, request_id: str, method: str, path: str, status: int, sent: int, ms: float) -> None:
        if not self._logger.isEnabledFor(logging.INFO):  # (getLogger takes the logging module's lock each call)
            return
        stamp = self._time(time.time())
        if self.log_format == "json":
            line = (
                f'{{"request_id": {json_string(request_id)}, "method": {json_string(method)}, '
                f'"path": {json_string(path)}, "status": {status}, "bytes": {sent}, "ms": {ms:.3f}, '
                f'"time": "{stamp}", "level": "INFO", '
                '"logger": "gateway.access"}'
            )
        else:
            line = (
                f"{stamp} INFO gateway.access: {field(method)} {field(path)} {status} {sent}B {ms:.3f}ms "
                f"id={field(request_id)}"
            )
        self._pending.append(line)
        if len(self._pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        lines, self._pending = self._pending, []
        if lines:
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()


access_log = AccessLog()


class _GatewayHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs, so that calling it again replaces it."""


def configure_logging(log_format: str = "auto") -> None:
    """Route every logger (the gateway's and uvicorn's) to stderr in ``log_format``; idempotent."""
    log_format = resolve_format(log_format)
    access_log.log_format = log_format
    handler = _GatewayHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _GatewayHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # warnings become log lines too, in the same format
