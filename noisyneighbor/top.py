"""`noisyneighbor top`: a live table of runqueue latency per cgroup (pod/container when known).

Reads only: the probes measure, the resolver names, this module renders. Output adapts to where
it goes: a live, resizable table on a terminal; plain text tables when piped; JSON lines with
`--json` (first a status record once the probes are attached, then one record per interval).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from detector.cgroups import CgroupResolver
from probes.runqlat import RunqLatProbe, RunqSnapshot

SORT_KEYS = {
    "wait": "wait_ms_per_s",
    "p99": "p99_us",
    "p50": "p50_us",
    "max": "max_us",
    "events": "events_per_s",
    "name": "name",
}
# Interactive keys: one letter per sort column.
SORT_HOTKEYS = {"w": "wait", "9": "p99", "5": "p50", "m": "max", "e": "events", "n": "name"}
# A cgroup id that no longer resolves and had no waits for this many intervals is dropped from the
# kernel map, so dead cgroups do not fill it on a node with pod churn.
FORGET_AFTER_INTERVALS = 3


@dataclass
class CgroupRow:
    cgroup_id: int
    cgroup: str  # path in the cpu hierarchy, or "?" when unresolved
    name: str  # pod/container display name, else the path
    kind: str
    pod_uid: str | None
    container_id: str | None
    qos: str | None
    events: int
    events_per_s: float
    wait_ms_per_s: float
    p50_us: float
    p99_us: float
    max_us: float
    max_exact: bool


@dataclass
class CpuRow:
    cpu: int
    events: int
    wait_ms_per_s: float
    p99_us: float


@dataclass
class Interval:
    ts: str
    interval_s: float
    cgroups: list[CgroupRow]
    cpus: list[CpuRow]
    drops: dict[str, int]  # cumulative since load


def build_interval(
    prev: RunqSnapshot, cur: RunqSnapshot, resolver: CgroupResolver, cgroup_filter: str | None = None
) -> Interval:
    dt = max(cur.monotonic_s - prev.monotonic_s, 1e-9)
    rows: list[CgroupRow] = []
    hierarchy = None
    for cgroup_id, hist in cur.per_cgroup.items():
        d = hist.delta(prev.per_cgroup.get(cgroup_id))
        if not d.count:
            continue
        info = resolver.resolve(cgroup_id, hierarchy)
        path = info.path if info else "?"
        if cgroup_filter and not (path == cgroup_filter or path.startswith(cgroup_filter.rstrip("/") + "/")):
            continue
        rows.append(
            CgroupRow(
                cgroup_id=cgroup_id,
                cgroup=path,
                name=(info.display or info.path) if info else f"cgroup:{cgroup_id} (gone)",
                kind=info.kind if info else "unknown",
                pod_uid=info.pod_uid if info else None,
                container_id=info.container_id if info else None,
                qos=info.qos if info else None,
                events=d.count,
                events_per_s=d.count / dt,
                wait_ms_per_s=d.sum_ns / 1e6 / dt,
                p50_us=d.quantile_ns(0.50) / 1e3,
                p99_us=d.quantile_ns(0.99) / 1e3,
                max_us=d.max_ns / 1e3,
                max_exact=d.exact_max_ns is not None,
            )
        )
    cpus = []
    for cpu, hist in enumerate(cur.per_cpu):
        earlier = prev.per_cpu[cpu] if cpu < len(prev.per_cpu) else None
        d = hist.delta(earlier)
        cpus.append(CpuRow(cpu, d.count, d.sum_ns / 1e6 / dt, d.quantile_ns(0.99) / 1e3))
    return Interval(datetime.now(UTC).isoformat(timespec="seconds"), dt, rows, cpus, dict(cur.drops))


def sort_rows(rows: list[CgroupRow], key: str) -> list[CgroupRow]:
    field = SORT_KEYS[key]
    return sorted(rows, key=lambda r: getattr(r, field), reverse=field != "name")


def _fmt_us(us: float, exact: bool = True) -> str:
    text = f"{us / 1000:.1f}ms" if us >= 1000 else f"{us:.0f}µs"
    return text if exact else f"≤{text}"


def render_table(interval: Interval, sort_key: str, limit: int | None, status_line: str) -> Group:
    table = Table(title=None, expand=True, box=None, header_style="bold", pad_edge=False)
    table.add_column("CGROUP / POD", overflow="ellipsis", no_wrap=True, ratio=1)
    table.add_column("QOS", no_wrap=True)
    for col, key in (("WAIT/s", "wait"), ("P50", "p50"), ("P99", "p99"), ("MAX", "max"), ("EVENTS/s", "events")):
        marker = "▼" if key == sort_key else ""
        table.add_column(f"{col}{marker}", justify="right", no_wrap=True)
    rows = sort_rows(interval.cgroups, sort_key)
    for r in rows[:limit] if limit else rows:
        table.add_row(
            r.name,
            r.qos or "-",
            f"{r.wait_ms_per_s:.1f}ms",
            _fmt_us(r.p50_us),
            _fmt_us(r.p99_us),
            _fmt_us(r.max_us, r.max_exact),
            f"{r.events_per_s:.0f}",
        )
    cpus = "  ".join(f"cpu{c.cpu}: {c.wait_ms_per_s:.1f}ms/s p99 {_fmt_us(c.p99_us)}" for c in interval.cpus)
    drops = sum(interval.drops.values())
    footer = Text(f"{cpus}   drops: {drops}", style="dim")
    header = Text(
        f"noisyneighbor top — runqueue latency per cgroup — {interval.ts} — {status_line}   "
        f"sort: [w]ait [9]9 [5]0 [m]ax [e]vents [n]ame  [q]uit",
        style="bold",
    )
    return Group(header, table, footer)


@contextlib.contextmanager
def _cbreak(stream: TextIO) -> Iterator[bool]:
    """Single-key input on a terminal; a no-op (False) when stdin is not one."""
    if not stream.isatty():
        yield False
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_key(timeout: float) -> str | None:
    ready, _, _ = select.select([sys.stdin], [], [], max(timeout, 0))
    if ready:
        return os.read(sys.stdin.fileno(), 1).decode(errors="ignore")
    return None


def run_top(
    probe: RunqLatProbe,
    resolver: CgroupResolver,
    *,
    interval_s: float = 1.0,
    once: bool = False,
    as_json: bool = False,
    sort_key: str = "wait",
    cgroup_filter: str | None = None,
    limit: int | None = None,
    count: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    status_line = probe.status.line()
    if as_json and not once:
        out.write(json.dumps({"type": "status", "probes": {probe.status.name: asdict(probe.status)}}) + "\n")
        out.flush()
    prev = probe.snapshot()
    idle: dict[int, int] = {}
    shown = 0
    console = Console(file=out)
    live_tty = not as_json and not once and console.is_terminal

    def step() -> Interval:
        nonlocal prev
        cur = probe.snapshot()
        interval = build_interval(prev, cur, resolver, cgroup_filter)
        _forget_dead(probe, resolver, prev, cur, idle)
        prev = cur
        return interval

    if live_tty:
        with _cbreak(sys.stdin) as keys, Live(console=console, auto_refresh=False, screen=False) as live:
            deadline = time.monotonic() + interval_s
            while count is None or shown < count:
                key = _read_key(deadline - time.monotonic()) if keys else (time.sleep(max(deadline - time.monotonic(), 0)))
                if key in ("q", "Q"):
                    return 0
                if key in SORT_HOTKEYS:
                    sort_key = SORT_HOTKEYS[key]
                if time.monotonic() < deadline:
                    continue
                deadline += interval_s
                interval = step()
                live.update(render_table(interval, sort_key, limit or max(console.height - 5, 5), status_line), refresh=True)
                shown += 1
        return 0

    while count is None or shown < count:
        time.sleep(interval_s)
        interval = step()
        shown += 1
        if as_json:
            record = asdict(interval)
            record["type"] = "interval"
            record["cgroups"] = [asdict(r) for r in sort_rows(interval.cgroups, sort_key)][: limit or None]
            out.write(json.dumps(record) + "\n")
        else:
            console.print(render_table(interval, sort_key, limit, status_line))
        out.flush()
        if once:
            break
    return 0


def _forget_dead(
    probe: RunqLatProbe, resolver: CgroupResolver, prev: RunqSnapshot, cur: RunqSnapshot, idle: dict[int, int]
) -> None:
    for cgroup_id, hist in cur.per_cgroup.items():
        before = prev.per_cgroup.get(cgroup_id)
        if before is not None and hist.count == before.count:
            idle[cgroup_id] = idle.get(cgroup_id, 0) + 1
        else:
            idle.pop(cgroup_id, None)
    stale = [cg for cg, n in idle.items() if n >= FORGET_AFTER_INTERVALS and resolver.resolve(cg) is None]
    if stale:
        probe.forget(stale)
        for cg in stale:
            idle.pop(cg, None)
