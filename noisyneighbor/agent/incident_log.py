# SPDX-License-Identifier: Apache-2.0
"""The agent's incident log file (JSON lines, the CLI's JSON conventions)."""

from __future__ import annotations

import json
import logging
from typing import Any

from detector.model import TRANSITIONS, Incident
from noisyneighbor.output import SCHEMA_VERSION, iso_utc

log = logging.getLogger("noisyneighbor.agent")


class IncidentLog:
    """The agent's incident log: one JSON line per incident opened or closed, in the shape and time
    format of every other JSON the CLI writes (``schema_version``; ISO 8601 UTC times, ``ended_at``
    null while open), so one parser reads the log, ``diagnose --json`` and ``top --json``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def record(inc: Incident, event: str) -> dict[str, Any]:
        d = inc.to_dict()
        d.update(
            started_at=iso_utc(inc.started_at),
            updated_at=iso_utc(inc.updated_at or None),
            ended_at=iso_utc(inc.ended_at),
        )
        return {"schema_version": SCHEMA_VERSION, "event": event, **d}

    def write(self, inc: Incident, event: str) -> None:
        if event not in TRANSITIONS:  # every tick of an open incident: the log keeps the transitions
            return
        try:
            line = json.dumps(self.record(inc, event), sort_keys=True, default=str)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            log.error("incident log %s: %s", self.path, e.strerror or e)


