"""The agent's log line format (one JSON object per line) and the one-line form of an exception."""

from __future__ import annotations

import json
import logging
from typing import Any


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = _one_line(record.exc_info[1]) if record.exc_info[1] else ""
        return json.dumps(line, default=str)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
