"""Log lines as JSON objects (one per line) or as text, in the server process and in every worker."""

import json
import logging
import time
from typing import Any

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record.

    An access record (logger ``gateway.access``) carries a JSON object as its message; its fields are
    lifted to the top level, so every access line is one flat object: request_id, method, path, status...
    """

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        fields: dict[str, Any] = {}
        if message.startswith("{"):
            try:
                parsed = json.loads(message)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fields = parsed
        if not fields:
            fields = {"message": message}
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in fields})
        fields["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{record.msecs:03.0f}Z"
        fields["level"] = record.levelname
        fields["logger"] = record.name
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


def configure_logging(log_format: str = "json") -> None:
    """Route every logger (the gateway's and uvicorn's) to stderr in ``log_format``; idempotent."""
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
