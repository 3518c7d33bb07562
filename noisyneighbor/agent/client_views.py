# SPDX-License-Identifier: Apache-2.0
"""What `kubectl noisyneighbor top|diagnose NODE` reads from the running agent: ``/top`` and ``/diagnose``.

One probe set per node: the agent's. ``/top`` is `noisyneighbor top`'s frame made from the agent's own
snapshots, through top's data path (``noisyneighbor.sections`` sources, ``top.collect``,
``top.frame_record``, ``views.render_frame``): each view's source gets a stand-in for its probe whose
``snapshot()`` is what the agent's last tick read, so no BPF map is read twice and no probe is loaded.
``/diagnose`` is the diagnose report over a window of the agent's own history (its detector's store
and incidents). Both only read; nothing runs in the agent's container on behalf of the client, so a
client costs the agent's cgroup no second probe set (the old `kubectl exec ... noisyneighbor top` did).

Memory: the sources keep the snapshots of the frame before (the interval's start) only while a client
reads; after ``IDLE_SECONDS`` without a request they are dropped. A request keeps nothing of its own: rich
renders without its emoji table and its cell-width cache is cleared after a frame, the HTML report's
modules load only for ``format=html``, and the HTTP server trims the heap after each view
(docs/benchmarks.md: what a client costs the agent).
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs

from noisyneighbor.output import SCHEMA_VERSION

log = logging.getLogger("noisyneighbor.agent")

# Sources (and the snapshots they hold) are dropped after this long without a /top request.
IDLE_SECONDS = 60.0
# The longest /diagnose window: the detector's store keeps about this much history per signal.
MAX_DIAGNOSE_WINDOW_S = 3600.0
FORMATS = ("json", "text", "keys")


class BadRequest(ValueError):
    """A query parameter the endpoint cannot use; ``str(exc)`` is one line for a 400."""


class _AgentProbe:
    """The agent's probe as a `top` source sees it: ``snapshot()`` is the agent's latest tick's reading of
    it, never a second read of the maps. Forgetting dead cgroups and closing stay the agent's business."""

    def __init__(self, name: str, probe: Any, latest: Any) -> None:
        self._name, self._probe, self._latest = name, probe, latest

    def snapshot(self) -> Any:
        snap = self._latest()
        return None if snap is None else snap.probe(self._name)

    def close(self) -> None:
        pass

    def __getattr__(self, attr: str) -> Any:
        if attr == "forget":  # the agent's own tick forgets dead cgroups (DeadCgroups in Agent.step)
            raise AttributeError(attr)
        return getattr(self._probe, attr)


def _query(path: str) -> tuple[str, dict[str, str]]:
    route, _, raw = path.partition("?")
    return route, {k: v[-1] for k, v in parse_qs(raw).items()}


def _int(params: dict[str, str], key: str, default: int | None, lo: int, hi: int) -> int | None:
    if key not in params:
        return default
    try:
        value = int(params[key])
    except ValueError:
        raise BadRequest(f"{key} must be an integer, got {params[key]!r}") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be between {lo} and {hi}, got {value}")
    return value


class AgentTop:
    """`noisyneighbor top`'s frames from a running agent's snapshots (``GET /top``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.sources: list[Any] | None = None
        self.frame: Any = None
        self.frame_tick = -1
        self.started_tick = -1
        self.last_request = 0.0

    # -- sources ------------------------------------------------------------------------------------
    def _open(self) -> None:
        from noisyneighbor.sections import PROBE_SOURCES, VIEWS, Context, OffSource, open_source, sources_for
        from probes.registry import BY_NAME

        agent = self.agent
        ctx = Context(agent.paths, agent.layout, agent._resolver)
        collector = agent.collector
        sources: list[Any] = []
        for name in sources_for(VIEWS):
            if name in collector.probes and name in PROBE_SOURCES:
                probe = _AgentProbe(name, collector.probes[name], lambda: agent.detector.prev)
                sources.append(PROBE_SOURCES[name](probe, ctx))
            elif name in collector.status:  # the agent loaded it and it is off: say why, as top does
                sources.append(OffSource(name, collector.status[name].reason))
            elif name in BY_NAME:  # a probe the agent was not asked to load: never loaded here either
                sources.append(OffSource(name, "not loaded by the agent (its --probes)"))
            else:  # file-backed (psi): reads of /proc/pressure and the cgroups' own files, no probe
                sources.append(open_source(name, ctx))
        for source in sources:
            source.start()
        self.sources = sources
        self.started_tick = agent.stats.ticks
        self.frame, self.frame_tick = None, -1

    def expire(self, now: float | None = None) -> None:
        """Drop the sources (and the snapshots they hold) once no client asked for a while."""
        now = time.monotonic() if now is None else now
        if self.sources is not None and now - self.last_request > IDLE_SECONDS:
            self.sources, self.frame = None, None

    def _current_frame(self) -> Any:
        """The frame of the latest tick (one per tick, shared by every client); None before a second tick."""
        from noisyneighbor.top import collect

        agent = self.agent
        if self.sources is None:
            self._open()
        ticks = agent.stats.ticks
        if ticks > self.started_tick and ticks != self.frame_tick and agent.detector.prev is not None:
            try:
                self.frame, self.frame_tick = collect(self.sources), ticks
            except Exception as e:  # a probe whose snapshot failed this tick (None): start again next request
                log.warning("/top: no frame this tick (%s: %s); the sources start again", type(e).__name__, e)
                self.sources = None
        return self.frame

    # -- the endpoint -------------------------------------------------------------------------------
    def respond(self, path: str, wait_s: float) -> tuple[int, bytes, str]:
        """(status, body, content type) of ``GET /top?view=&sort=&limit=&format=json|text&width=&color=``;
        ``format=keys``: the views, sort columns and their keys (what a client offers and binds, never a copy)."""
        from noisyneighbor.sections import SORT_KEYS
        from noisyneighbor.top import VIEW_CHOICES, frame_record, views_of

        _, params = _query(path)
        view = params.get("view", "all")
        sort = params.get("sort", "wait")
        fmt = params.get("format", "json")
        if fmt == "keys":
            return 200, json.dumps(top_keys()).encode() + b"\n", "application/json"
        if view not in VIEW_CHOICES:
            raise BadRequest(f"view must be one of {', '.join(VIEW_CHOICES)}, got {view!r}")
        if sort not in SORT_KEYS:
            raise BadRequest(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
        if fmt not in FORMATS:
            raise BadRequest(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        limit = _int(params, "limit", None, 1, 100_000)
        width = _int(params, "width", 160, 40, 1000)
        color = params.get("color", "0") in ("1", "true")
        agent = self.agent
        deadline = time.monotonic() + wait_s
        while True:
            with agent._lock:  # the tick thread uses the resolver and swaps the snapshots
                if agent.collector is None or agent._stopped:
                    return 503, b"agent not running\n", "text/plain"
                self.last_request = time.monotonic()
                frame = self._current_frame()
                statuses = {s.name: s.status for s in self.sources or ()}
            if frame is not None or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, agent.interval_s / 4))  # the first interval: until the agent's next tick
        if frame is None:
            return 503, b"no interval yet: the agent has not ticked since the first request; retry\n", "text/plain"
        probes = {name: asdict(status) for name, status in statuses.items()}
        if fmt == "json":
            record = frame_record(frame, sort, limit)
            record["probes"] = probes
            record["node"] = getattr(agent.exporter, "node", None)
            record["views"] = views_of(view)
            return 200, json.dumps(record).encode() + b"\n", "application/json"
        return 200, _render(frame, views_of(view), statuses, sort, limit, width, color).encode(), "text/plain"


def top_keys() -> dict[str, Any]:
    """``/top?format=keys``: the views and sort columns `top` has and the keys that switch them, from the
    registry (noisyneighbor.views), for the kubectl plugin, which keeps no list of its own."""
    from noisyneighbor.sections import SORT_KEYS, VIEW_CHOICES
    from noisyneighbor.views import KEYS_HINT, SORT_HOTKEYS, VIEW_HOTKEYS

    return {"views": list(VIEW_CHOICES), "sorts": sorted(SORT_KEYS), "view_keys": dict(VIEW_HOTKEYS),
            "sort_keys": dict(SORT_HOTKEYS), "hint": KEYS_HINT}


def _render(frame: Any, views: list[str], statuses: dict, sort: str, limit: int | None, width: int,
            color: bool) -> str:
    from rich.cells import cached_cell_len
    from rich.console import Console

    from noisyneighbor.views import render_frame

    out = io.StringIO()
    # emoji=False: a frame has no :emoji: codes, and replacing them imports rich's 4000-entry emoji table
    # into the agent for good.
    console = Console(file=out, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, emoji=False)
    console.print(render_frame(frame.ts, frame.sections, views, statuses, sort_key=sort, limit=limit))
    # rich caches the width of every string it measured (up to 4096): a frame's cells are this interval's
    # numbers, rarely measured again, so the cache would only keep a client's strings alive in the agent.
    cached_cell_len.cache_clear()
    return out.getvalue()


def diagnose_response(agent: Any, path: str) -> tuple[int, bytes, str]:
    """``GET /diagnose?window=SECONDS&format=json|text|html``: the diagnose report over the agent's own
    last ``window`` seconds (its incidents, their series and culprits, the decisions it made)."""
    from noisyneighbor.diagnose import render_text, report_from_history

    _, params = _query(path)
    fmt = params.get("format", "json")
    if fmt not in (*FORMATS, "html"):
        raise BadRequest(f"format must be json, text or html, got {fmt!r}")
    try:
        window = float(params.get("window", "300"))
    except ValueError:
        raise BadRequest(f"window must be seconds, got {params['window']!r}") from None
    if not 1 <= window <= MAX_DIAGNOSE_WINDOW_S:
        raise BadRequest(f"window must be between 1 and {MAX_DIAGNOSE_WINDOW_S:.0f} s, got {window:g}")
    with agent._lock:
        if agent.detector is None or agent._stopped:
            return 503, b"agent not running\n", "text/plain"
        decisions = [r.decision for r in agent.actions()]
        report = report_from_history(
            agent.detector, window, min(agent.stats.ticks, int(window / agent.interval_s)),  # ticks in the window
            {name: st.line() for name, st in agent.collector.status.items()},
            decisions=decisions, pods=agent.pod_source.pods if agent.pod_source is not None else None,
            host=getattr(agent.exporter, "node", None),
        )
    if fmt == "json":
        doc = {**report.to_dict(), "schema_version": SCHEMA_VERSION, "source": "agent history"}
        return 200, json.dumps(doc, default=str).encode() + b"\n", "application/json"
    if fmt == "html":  # imported for this format only: its SVG charts are nothing the agent needs otherwise
        from noisyneighbor.report_html import render_html

        return 200, render_html(report).encode(), "text/html; charset=utf-8"
    return 200, render_text(report).encode(), "text/plain; charset=utf-8"
