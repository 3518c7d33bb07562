# SPDX-License-Identifier: Apache-2.0
"""The agent's log line format (one JSON object per line) and the one-line form of an exception."""

from __future__ import annotations

import json
import logging
from typing import Any

from noisyneighbor.output import SCHEMA_VERSION, iso_utc


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: schema_version, ts, level, logger, msg (and exc when there is one).

    ``ts`` is ISO 8601 UTC like every other JSON the project writes (noisyneighbor.output).
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "ts": iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = _one_line(record.exc_info[1]) if record.exc_info[1] else ""
        return json.dumps(line, default=str)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
