"""Structured JSON logs on stderr. No line carries a secret: handles and tokens
are never passed to a logger, and a filter masks anything that looks like one."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

_SECRET_RE = re.compile(r"(rift_|task_[a-z2-7]{8}\.)[A-Za-z0-9_-]{20,}")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def redact(text: str) -> str:
    return _SECRET_RE.sub(lambda m: m.group(1) + "<redacted>", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, default=str))


def setup_logging(level: str = "INFO", stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("rift")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    sdk = logging.getLogger("mcp")  # the MCP SDK's own warnings: JSON, redacted, too
    sdk.handlers[:] = [handler]
    sdk.setLevel(logging.WARNING)
    sdk.propagate = False
