# SPDX-License-Identifier: Apache-2.0
"""What every JSON document the CLI prints has in common: a schema version and one time format.

Consumers (scripts, the kubectl plugin, dashboards fed from saved reports) key on
``schema_version`` to notice a shape change, and every timestamp is ISO 8601 in UTC with an
explicit offset, the same string `top` and `diagnose` print, so one parser reads both.
"""

from __future__ import annotations

from datetime import UTC, datetime

# Bump when a field is renamed or removed, or a value changes meaning (additions keep it).
SCHEMA_VERSION = 1


def iso_utc(t: float | None) -> str | None:
    """Epoch seconds -> '2026-11-23T20:35:07+00:00' (None stays None: "not yet" / "still open")."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def package_version() -> str:
    """The installed distribution's version; a source checkout that was never installed says so."""
    from importlib import metadata  # here: every command imports this module, only --version asks (~1.5 MiB)

    try:
        return metadata.version("noisyneighbor")
    except metadata.PackageNotFoundError:
        return "0+unknown"
