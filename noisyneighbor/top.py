# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor top`: live per-cgroup / per-CPU interference, one view per probe.

Views: one per registered probe that declares a table (probes.registry, ``ProbePlugin.top_table``), and
psi (node and cgroup pressure, CPU throttling), or all of them (the probes loaded by default); a probe
loaded only when asked for shows only when its view is asked for. Reads only:
the probes measure, `sections` turns their snapshots into interval rows, the resolver names
cgroups, `views` renders. Output adapts to where it goes: a live, resizable table on a terminal
(keys switch views); plain text tables when piped; JSON lines with `--json` (first a status record
listing every probe's state, then one record per interval).

Which probes load: when piped (plain or JSON) only those the selected view(s) need; on a terminal
all of them, so that a key can switch to any view without a restart. A probe that cannot load does
not stop the others: its view shows its one-line status. The command fails only when none of the
selected views' own probes could start.
"""

from __future__ import annotations

import errno
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

# The terminal helpers live in the kubectl plugin: it is one stdlib-only file (krew ships it alone).
from noisyneighbor.kubectl_plugin import cbreak, read_key
from noisyneighbor.output import SCHEMA_VERSION, now_iso
from noisyneighbor.sections import (
    ALL_VIEWS,
    DEFAULT_SORT,
    SOURCE_ORDER,
    SOURCE_VIEW,
    TABLES,
    VIEW_SOURCES,
    VIEWS,
    Context,
    Source,
    open_source,
    section_interval_s,
    sort_table_rows,
    sources_for,
)
from noisyneighbor.sections import SORT_KEYS as SORT_KEYS  # --sort choices
from noisyneighbor.sections import VIEW_CHOICES as VIEW_CHOICES
from noisyneighbor.views import SORT_HOTKEYS, VIEW_HOTKEYS, render_frame

# The live view's first frame comes after this (or the interval, if shorter): rates are per second
# whatever the span, and a first screen a full interval late reads as a hang.
FIRST_FRAME_S = 0.5


class _Console(Console):
    """rich's Console, except when the reader leaves the pipe (`noisyneighbor top | head`): rich exits 1
    there (SystemExit from on_broken_pipe); raised as BrokenPipeError instead, the CLI's handler for it
    makes that the quiet exit 0 the JSON output already has."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more goes to the closed pipe on the way out
        raise BrokenPipeError(errno.EPIPE, "the reader left the pipe")


def views_of(view: str) -> list[str]:
    return list(ALL_VIEWS) if view == "all" else [view]


def is_live(out: TextIO, as_json: bool, once: bool) -> bool:
    """Whether the output is the live terminal table (as opposed to plain tables or JSON)."""
    return not as_json and not once and Console(file=out).is_terminal


def sources_to_load(view: str, live: bool) -> list[str]:
    return sources_for(VIEWS if live else views_of(view))


def open_sources(names: Sequence[str], ctx: Context, attach_mode: str = "auto") -> list[Source]:
    return [open_source(name, ctx, attach_mode) for name in names]


def unavailable(view: str, sources: Sequence[Source]) -> str | None:
    """One line when none of the selected views' own probes started (nothing to show), else None."""
    own = {VIEW_SOURCES[v][0] for v in views_of(view)}
    mine = [s for s in sources if s.name in own]
    if mine and all(s.status.state == "off" for s in mine):
        return "; ".join(getattr(s, "error", s.status.line()) for s in mine)
    return None


@dataclass
class Frame:
    """One interval: a section per view whose probe is on."""

    ts: str
    sections: dict[str, Any]

    @property
    def interval_s(self) -> float:
        return next((section_interval_s(s) for s in self.sections.values()), 0.0)


def collect(sources: Sequence[Source]) -> Frame:
    sections: dict[str, Any] = {}
    for source in sorted(sources, key=lambda s: SOURCE_ORDER.index(s.name)):
        if source.status.state != "off":
            sections[SOURCE_VIEW[source.name]] = source.collect(sections)
    return Frame(now_iso(), sections)


def frame_record(frame: Frame, sort_key: str = DEFAULT_SORT, limit: int | None = None) -> dict:
    """The JSON interval record: every view whose probe is on adds one key holding its section, except a
    table declared ``record_top_level`` (the first view's: cgroups, cpus, drops, as before views)."""
    record: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "ts": frame.ts, "interval_s": frame.interval_s}
    for view in VIEWS:
        section = frame.sections.get(view)
        if section is None:
            continue
        data = dict(section) if isinstance(section, dict) else asdict(section)
        table = TABLES.get(view)
        if table is not None and table.sort_keys:
            option = sort_key if sort_key in table.sort_keys else next(iter(table.sort_keys))
            data[table.rows_key] = sort_table_rows(data[table.rows_key], table, option)
        for rows in ("rows", "cgroups"):
            if rows in data:
                data[rows] = data[rows][: limit or None]
        if table is not None and table.record_top_level:
            del data["interval_s"]
            record.update(data)
        else:
            record[view] = data
    record["type"] = "interval"
    return record


def _rows_per_view(height: int, views: Sequence[str]) -> int:
    # Per view: a title, a table header and a footer line; psi adds its node table and two notes.
    fixed = 2 + 3 * len(views) + (8 if "psi" in views else 0)
    return max((height - fixed) // max(len(views), 1), 3)


def _run_live(sources: Sequence[Source], statuses: dict[str, Any], console: Console, shown_views: list[str],
              interval_s: float, sort_key: str, limit: int | None, count: int | None) -> int:
    """The live terminal table: a frame per interval, keys switch views and runq's sort."""
    shown = 0
    frame: Frame | None = None

    def draw() -> None:
        if frame is not None:
            rows = limit or _rows_per_view(console.height, shown_views)
            live.update(
                render_frame(frame.ts, frame.sections, shown_views, statuses, sort_key=sort_key, limit=rows,
                             keys=True),
                refresh=True,
            )

    # screen=True: the alternate screen, so the table neither scrolls the terminal nor stays under the prompt.
    with cbreak(sys.stdin) as keys, Live(console=console, auto_refresh=False, screen=True) as live:
        # Something at once: the probes' states and that the first interval is being measured.
        live.update(Group(render_frame(now_iso(), {}, shown_views, statuses, keys=True),
                          Text("measuring the first interval…", style="dim")), refresh=True)
        deadline = time.monotonic() + min(interval_s, FIRST_FRAME_S)
        while count is None or shown < count:
            key = read_key(deadline - time.monotonic()) if keys else time.sleep(max(deadline - time.monotonic(), 0))
            if key in ("q", "Q"):
                return 0
            if key in SORT_HOTKEYS:
                sort_key = SORT_HOTKEYS[key]
                draw()
            elif key in VIEW_HOTKEYS:
                shown_views = views_of(VIEW_HOTKEYS[key])
                draw()
            if time.monotonic() < deadline:
                continue
            deadline += interval_s
            frame = collect(sources)
            draw()
            shown += 1
    return 0


def run_top(
    sources: Sequence[Source],
    view: str = "runq",
    *,
    interval_s: float = 1.0,
    once: bool = False,
    as_json: bool = False,
    sort_key: str = DEFAULT_SORT,
    limit: int | None = None,
    count: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    statuses = {s.name: s.status for s in sources}
    probes = {name: asdict(status) for name, status in statuses.items()}
    if as_json and not once:
        out.write(json.dumps({"schema_version": SCHEMA_VERSION, "type": "status", "ts": now_iso(), "probes": probes}) + "\n")
        out.flush()
    for source in sources:
        source.start()
    shown_views = views_of(view)
    shown = 0
    console = _Console(file=out)

    if is_live(out, as_json, once):
        return _run_live(sources, statuses, console, views_of(view), interval_s, sort_key, limit, count)
    while count is None or shown < count:
        time.sleep(interval_s)
        frame = collect(sources)
        shown += 1
        if as_json:
            record = frame_record(frame, sort_key, limit)
            if once:  # no status record before it: carry the probes' states
                record["probes"] = probes
            out.write(json.dumps(record) + "\n")
        else:
            console.print(render_frame(frame.ts, frame.sections, shown_views, statuses, sort_key=sort_key, limit=limit))
        out.flush()
        if once:
            break
    return 0
