"""Log lines as JSON objects (one per line) or as text, in the server process and in every worker."""

import asyncio
import json
import logging
import sys
import time
from typing import Any

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's ``extra`` fields at the top level.

    Access lines do not pass through here: see :class:`AccessLog`.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"message": record.getMessage()}
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in fields})
        fields["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{record.msecs:03.0f}Z"
        fields["level"] = record.levelname
        fields["logger"] = record.name
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


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

    def _time(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def write(self, request_id: str, method: str, path: str, status: int, sent: int, ms: float) -> None:
        if not logging.getLogger("gateway.access").isEnabledFor(logging.INFO):
            return
        stamp = self._time(time.time())
        if self.log_format == "json":
            line = (
                f'{{"request_id": {json.dumps(request_id)}, "method": "{method}", "path": {json.dumps(path)}, '
                f'"status": {status}, "bytes": {sent}, "ms": {ms:.3f}, "time": "{stamp}", "level": "INFO", '
                '"logger": "gateway.access"}'
            )
        else:
            line = f"{stamp} INFO gateway.access: {method} {path} {status} {sent}B {ms:.3f}ms id={request_id}"
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


def configure_logging(log_format: str = "json") -> None:
    """Route every logger (the gateway's and uvicorn's) to stderr in ``log_format``; idempotent."""
    access_log.log_format = log_format
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_zarr_gateway", False):
            root.removeHandler(old)
    handler._zarr_gateway = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # warnings become log lines too, in the same format
