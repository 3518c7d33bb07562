# SPDX-License-Identifier: Apache-2.0
"""What each view of `noisyneighbor top` shows: one source per probe, each turning two readings into an interval.

A source wraps one probe (or, for PSI, kernel files): `start()` takes the baseline, `collect()` returns
the interval since the previous call as a *section* (JSON-able: rows plus the view's footer numbers),
`close()` detaches. Sources know nothing about rendering (views.py) or the loop (top.py). A probe's
view is what its plugin declares (``ProbePlugin.top_table``): one source class, :class:`TableSource`,
serves every probe; this module names none.

Cgroup ids are per hierarchy: each source names ids in its probe's hierarchy (the plugin's ``id_controller``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from detector.cgroups import CgroupResolver, parse_cgroup_path
from probes.cgroupfs import CgroupLayout, Hierarchy
from probes.collect import cgroup_activity
from probes.cpuacct import CgroupCpuStat, cpu_delta, read_cgroup_cpu
from probes.engine import ProbeError, ProbeOffCode, ProbeStatus
from probes.host import HostPaths
from probes.plugin import ProbePlugin, TopInput, TopTable
from probes.psi import (
    RESOURCES,
    NodePsi,
    PsiReading,
    cgroup_psi_scope,
    cgroup_psi_source,
    psi_rate,
    read_cgroup_psi,
    read_node_psi,
)
from probes.registry import BY_NAME, ENGINE_ATTACH_MODES, PLUGINS

log = logging.getLogger(__name__)

# One view per registered probe that has one (probes.registry), then psi.
_VIEW_PLUGINS = tuple(p for p in PLUGINS if p.top_view is not None)
TABLES: dict[str, TopTable] = {p.top_view: p.top_table for p in _VIEW_PLUGINS if p.top_table is not None}  # type: ignore[misc]
VIEWS = (*(p.top_view for p in _VIEW_PLUGINS), "psi")
# What `--view all` shows: the views of the probes loaded by default, and psi. A probe loaded only when
# asked for (default=False) is shown only when its view is asked for, as the agent loads it only with --probes.
ALL_VIEWS = (*(p.top_view for p in _VIEW_PLUGINS if p.default), "psi")
VIEW_CHOICES = (*VIEWS, "all")  # --view (here, not in top.py: the agent's command line needs no renderer)
# The probes whose view's rows list the cgroups psi reads (CPU usage, throttling, per-cgroup PSI).
_PSI_CGROUP_PLUGINS = tuple(p for p in _VIEW_PLUGINS if p.top_table is not None and p.top_table.psi_cgroups)
# The sources each view needs. The first is the view's own; psi also those listing its cgroups, and
# shows node PSI without them.
VIEW_SOURCES: dict[str, tuple[str, ...]] = {
    **{p.top_view: (p.name,) for p in _VIEW_PLUGINS},
    "psi": ("psi", *(p.name for p in _PSI_CGROUP_PLUGINS)),
}
# --sort: every declared table's sort options (the live view's sort keys follow its sort_hotkeys).
SORT_KEYS: dict[str, str] = {option: key for table in TABLES.values() for option, key in table.sort_keys.items()}
# The views that sort by --sort, and its default: the first option of the first table that has any.
SORT_VIEWS: tuple[str, ...] = tuple(view for view, table in TABLES.items() if table.sort_keys)
DEFAULT_SORT: str = next(iter(SORT_KEYS), "name")
SOURCE_VIEW = {sources[0]: view for view, sources in VIEW_SOURCES.items()}
# Collection order: psi reads the sections of the same interval that list its cgroups.
SOURCE_ORDER = (*(p.name for p in _VIEW_PLUGINS), "psi")

# A cgroup id that no longer resolves and had no activity for this many intervals is dropped from the
# probe's kernel map, so dead cgroups do not fill it on a node with pod churn.
FORGET_AFTER_INTERVALS = 3


def sources_for(views: Iterable[str]) -> list[str]:
    wanted = {name for view in views for name in VIEW_SOURCES[view]}
    return [name for name in SOURCE_ORDER if name in wanted]


def in_subtree(path: str, root: str | None) -> bool:
    """`--cgroup` filter: `path` is `root` or below it (no filter: everything)."""
    return not root or path == root or path.startswith(root.rstrip("/") + "/")


def identify(resolver: CgroupResolver, cgroup_id: int, hierarchy: Hierarchy | None) -> dict[str, Any]:
    """The naming fields every per-cgroup row carries, resolved in the probe's own hierarchy."""
    info = resolver.resolve(cgroup_id, hierarchy)
    if info is None:
        return {"cgroup": "?", "name": f"cgroup:{cgroup_id} (gone)", "kind": "unknown",
                "pod_uid": None, "container_id": None, "qos": None}
    return {"cgroup": info.path, "name": info.display or info.path, "kind": info.kind,
            "pod_uid": info.pod_uid, "container_id": info.container_id, "qos": info.qos}


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100


# --------------------------------------------------------------------------------------------
# Dead cgroups
# --------------------------------------------------------------------------------------------


class DeadCgroups:
    """Forgets cgroup ids in a probe's kernel map once they stop resolving and stay idle.

    `update` gets each id's cumulative activity count (any number that grows while the cgroup is
    active) from two consecutive snapshots. The work per call follows what changed, not how many ids
    the map holds: an id is looked at when its count moves and when a check of it falls due (after
    `after` idle intervals, then every 10 x `after`), from a schedule keyed by interval.
    """

    def __init__(
        self, forget: Callable[[list[int]], int], resolver: CgroupResolver, hierarchy: Hierarchy | None,
        after: int = FORGET_AFTER_INTERVALS,
    ) -> None:
        self.forget, self.resolver, self.hierarchy, self.after = forget, resolver, hierarchy, after
        self.interval = 0
        self.quiet_since: dict[int, int] = {}  # id -> the interval its count last moved (or first seen)
        # interval -> ids whose idleness is checked then (a set: an id re-checked on its 10 x `after` turn
        # that also went quiet again `after` intervals before it is due twice in the same interval)
        self._due: dict[int, set[int]] = {}

    def update(self, prev: Mapping[int, int], cur: Mapping[int, int], changed: Iterable[int] | None = None) -> list[int]:
        """``changed``: the ids whose count differs between ``prev`` and ``cur``, when the caller knows
        them already (the collector does); else worked out here."""
        self.interval = k = self.interval + 1
        if changed is None:
            changed = [cg for cg, n in cur.items() if prev.get(cg) != n]
        for cgroup_id in changed:
            self._quiet(cgroup_id, k)
        if k == 1:  # the first call: ids already unchanged between the two snapshots are idle once
            for cgroup_id in cur:
                if cgroup_id not in self.quiet_since:
                    self._quiet(cgroup_id, 0)
        stale: list[int] = []
        for cgroup_id in self._due.pop(k, ()):
            since = self.quiet_since.get(cgroup_id)
            if since is None or cgroup_id not in cur:
                self.quiet_since.pop(cgroup_id, None)  # the probe dropped it itself
                continue
            idle = k - since
            if idle < self.after or (idle - self.after) % (10 * self.after):
                continue  # moved since this check was scheduled: a later one is due
            # One lstat (the resolver's index keeps a removed cgroup until its next walk).
            if self._exists(cgroup_id):
                self._due.setdefault(k + 10 * self.after, set()).add(cgroup_id)
            else:
                stale.append(cgroup_id)
        if stale:
            self.forget(stale)
            for cgroup_id in stale:
                del self.quiet_since[cgroup_id]
        return stale

    def _quiet(self, cgroup_id: int, since: int) -> None:
        self.quiet_since[cgroup_id] = since
        self._due.setdefault(since + self.after, set()).add(cgroup_id)

    def _exists(self, cgroup_id: int) -> bool:
        info = self.resolver.resolve(cgroup_id, self.hierarchy)
        return info is not None and self.resolver.id_of(info.path, self.hierarchy) == cgroup_id


def _forgetter(probe: Any, resolver: CgroupResolver) -> DeadCgroups | None:
    forget = getattr(probe, "forget", None)
    return DeadCgroups(forget, resolver, probe.hierarchy) if forget is not None else None


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


class Source(Protocol):
    name: str  # the probe's status name (its plugin's name), or psi
    status: ProbeStatus

    def start(self) -> None: ...
    def collect(self, sections: dict[str, Any]) -> Any: ...
    def close(self) -> None: ...


@dataclass
class Context:
    paths: HostPaths
    layout: CgroupLayout
    resolver: CgroupResolver
    cgroup_filter: str | None = None


class _ProbeSource:
    """A BPF probe: snapshot → previous snapshot → section; dead cgroups forgotten when it can."""

    name = ""

    def __init__(self, probe: Any, ctx: Context) -> None:
        self.probe, self.ctx, self.status = probe, ctx, probe.status
        self.dead = _forgetter(probe, ctx.resolver)
        self.prev: Any = None

    def start(self) -> None:
        self.prev = self.probe.snapshot()

    def collect(self, sections: dict[str, Any]) -> Any:
        cur = self.probe.snapshot()
        section = self.section(self.prev, cur, sections)
        if self.dead is not None:
            self.dead.update(self.activity(self.prev), self.activity(cur))
        self.prev = cur
        return section

    def section(self, prev: Any, cur: Any, sections: dict[str, Any]) -> Any:
        raise NotImplementedError

    def activity(self, snap: Any) -> Mapping[int, int]:
        """Cumulative activity per cgroup id (for DeadCgroups)."""
        return {}

    def name_of(self, cgroup_id: int) -> dict[str, Any]:
        return identify(self.ctx.resolver, cgroup_id, self.probe.hierarchy)

    def close(self) -> None:
        self.probe.close()


class OffSource:
    """A source that could not start: it only has a status."""

    def __init__(self, name: str, error: ProbeError | str) -> None:
        self.name = name
        self.error = str(error)
        self.status = ProbeStatus(name, "off", reason=self.error.removeprefix(f"{name}: off: "),
                                  code=error.code if isinstance(error, ProbeError) else ProbeOffCode.UNAVAILABLE)

    def start(self) -> None:
        pass

    def collect(self, sections: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        pass


# -- a plugin's declared table (ProbePlugin.top_table) -----------------------------------------------


def name_path(path: str) -> dict[str, Any]:
    """The naming fields of a row keyed by cgroup path (no id to resolve): what the path itself says."""
    info = parse_cgroup_path(path)
    return {"cgroup": path, "name": info.display or info.path, "kind": info.kind, "pod_uid": info.pod_uid,
            "container_id": info.container_id, "qos": info.qos}


class TableSource(_ProbeSource):
    """Any plugin with a ``top_table``: its ``delta`` between two snapshots, made rows by the plugin and
    named here (by path, or by id in the probe's hierarchy); the section is a JSON-able dict."""

    def __init__(self, probe: Any, ctx: Context) -> None:
        super().__init__(probe, ctx)
        self.name = probe.status.name
        self.plugin = BY_NAME[self.name]
        self.table: TopTable = self.plugin.top_table  # type: ignore[assignment]
        self.extras: Callable[[TopInput, Callable[[int], str]], dict[str, Any]] | None = None

    def start(self) -> None:
        super().start()
        if self.table.extras is not None:  # after the baseline: what happened before it is not this interval's
            self.extras = self.table.extras(self.probe, self.ctx.paths)

    def section(self, prev: Any, cur: Any, sections: dict[str, Any]) -> dict[str, Any]:
        return table_section(self.plugin, prev, cur, self.ctx.resolver, self.probe.hierarchy, self.ctx.cgroup_filter,
                             self.extras)

    def activity(self, snap: Any) -> Mapping[int, int]:
        return cgroup_activity(self.name, snap)


def table_section(
    plugin: ProbePlugin, prev: Any, cur: Any, resolver: CgroupResolver, hierarchy: Hierarchy | None = None,
    cgroup_filter: str | None = None,
    extras: Callable[[TopInput, Callable[[int], str]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A plugin's ``top`` section between two snapshots: its table's rows of the plugin's ``delta``, each
    named (by path, or by id in ``hierarchy``) and kept when under ``cgroup_filter``; ``extras``' fields
    (made by ``TopTable.extras`` at the baseline), then the probe's drops."""
    table: TopTable = plugin.top_table  # type: ignore[assignment]
    dt = max(cur.monotonic_s - prev.monotonic_s, 1e-9)
    view = TopInput(prev, cur, plugin.delta(prev, cur), dt)  # type: ignore[misc]
    rows = []
    for r in table.rows(view):
        if "cgroup_id" in r:
            names = identify(resolver, r["cgroup_id"], hierarchy)
            if table.kind_key != "kind":  # the row has a "kind" of its own
                names[table.kind_key] = names.pop("kind")
            named = {"cgroup_id": r["cgroup_id"], **names, **r}
        elif "cgroup" in r:
            names = name_path(r["cgroup"])
            named = {**r, **names}
        else:  # a row of no cgroup (a CPU's)
            rows.append(r)
            continue
        if in_subtree(names["cgroup"], cgroup_filter):
            rows.append(named)
    extra = extras(view, lambda cgroup_id: identify(resolver, cgroup_id, hierarchy)["name"]) if extras else {}
    return {"interval_s": dt, table.rows_key: rows, **extra, "drops": dict(getattr(cur, "drops", {}))}


def sort_table_rows(rows: list[dict], table: TopTable, option: str) -> list[dict]:
    """A table's rows by one of its sort options (``TopTable.sort_keys``): highest first, names A-Z."""
    key = table.sort_keys[option]
    return sorted(rows, key=lambda r: r[key], reverse=key != "name")


def section_interval_s(section: Any) -> float:
    """The interval a section covers (a plugin table's section is a dict, psi's a dataclass)."""
    return section["interval_s"] if isinstance(section, dict) else section.interval_s


# -- psi + cpuacct -------------------------------------------------------------------------------


@dataclass
class PsiSection:
    interval_s: float
    # resource -> {"available": True, some_pct, full_pct (Δtotal over the interval), some_avg10, full_avg10}
    #          or {"available": False, "reason": ...}
    node: dict[str, dict]
    cgroup_psi_scope: str  # which cgroups have PSI on this host (one line)
    cgroups: list[dict]  # the cgroups the listing views saw: CPU usage, quota, throttling, their PSI where available
    note: str | None = None  # why there are no cgroup rows, when there cannot be


@dataclass
class _CgroupReading:
    at: float
    cpu: CgroupCpuStat | None
    psi: dict[str, PsiReading]
    psi_cgroup: str | None  # the v2 cgroup the PSI came from (same path in the unified tree)


@dataclass
class _CgroupTracker:
    """cpuacct and per-cgroup PSI for the cgroups the listing views saw, as rates between consecutive reads.

    Per-cgroup PSI exists only in v2: on hybrid hosts it is read from the same path in the unified
    tree, which exists when systemd (the kubelet's systemd driver) mirrors the slice there.
    A cgroup not seen for FORGET_AFTER_INTERVALS intervals is no longer read.
    """

    layout: CgroupLayout
    prev: dict[str, _CgroupReading] = field(default_factory=dict)
    unseen: dict[str, int] = field(default_factory=dict)

    def read(self, path: str) -> _CgroupReading:
        source = cgroup_psi_source(self.layout, path)
        psi = read_cgroup_psi(source.cgroup_dir) if source.available and source.cgroup_dir else {}
        return _CgroupReading(time.monotonic(), read_cgroup_cpu(self.layout, path), psi, path if psi else None)

    def baseline(self, paths: Iterable[str]) -> None:
        """Read every cgroup once, so the first interval has rates; unseen ones are dropped after it."""
        for path in paths:
            self.prev[path] = self.read(path)
            self.unseen[path] = FORGET_AFTER_INTERVALS

    def step(self, seen: list[dict], shown: Mapping[str, str]) -> list[dict]:
        """``seen``: the rows of the views listing cgroups; ``shown``: their values psi's rows carry."""
        by_path = {r["cgroup"]: r for r in seen if r["cgroup"] != "?"}
        rows = []
        for path in set(self.prev) | set(by_path):
            self.unseen[path] = 0 if path in by_path else self.unseen.get(path, 0) + 1
            if self.unseen[path] > FORGET_AFTER_INTERVALS:
                self.prev.pop(path, None)
                del self.unseen[path]
                continue
            cur, before = self.read(path), self.prev.get(path)
            if cur.cpu is None and not cur.psi:
                self.prev.pop(path, None)  # gone, or nothing to read for it here
                continue
            self.prev[path] = cur
            if path in by_path and before is not None and cur.at > before.at:
                rows.append(self._row(by_path[path], before, cur, shown))
        rows.sort(
            key=lambda r: (r["throttled_pct"] or 0, max((p["some_pct"] or 0 for p in (r["psi"] or {}).values()),
                                                        default=0), r["cores"] or 0),
            reverse=True,
        )
        return rows

    @staticmethod
    def _row(seen: dict, before: _CgroupReading, cur: _CgroupReading, shown: Mapping[str, str]) -> dict:
        elapsed = cur.at - before.at
        d = cpu_delta(before.cpu, cur.cpu, elapsed) if before.cpu and cur.cpu else None
        psi = None
        if cur.psi:
            psi = {}
            for resource, reading in cur.psi.items():
                earlier = before.psi.get(resource)
                rate = psi_rate(earlier, reading, elapsed) if earlier is not None else None
                psi[resource] = {"some_pct": _pct(rate and rate.some), "full_pct": _pct(rate and rate.full)}
        return {
            **{key: seen[key] for key in ("cgroup_id", "cgroup", "name", "kind", "pod_uid", "container_id", "qos")},
            **{psi_key: seen.get(key) for key, psi_key in shown.items()},
            "cores": d.usage_cores if d else None,
            "quota_cores": cur.cpu.quota_cores if cur.cpu else None,
            "quota_used_pct": _pct(d.quota_utilisation) if d else None,
            "throttled_pct": _pct(d.throttled_fraction) if d else None,
            "throttled_ms_per_s": d.throttled_s_per_s * 1e3 if d and d.throttled_s_per_s is not None else None,
            "psi_cgroup": cur.psi_cgroup,
            "psi": psi,
        }


def node_psi_rows(prev: NodePsi, cur: NodePsi, elapsed_s: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for resource in RESOURCES:
        reading = cur.get(resource)
        if reading is None:
            out[resource] = {"available": False, "reason": cur.unavailable.get(resource, f"{resource}: absent")}
            continue
        earlier = prev.get(resource)
        rate = psi_rate(earlier, reading, elapsed_s) if earlier is not None else None
        out[resource] = {
            "available": True,
            "some_pct": _pct(rate and rate.some),
            "full_pct": _pct(rate and rate.full),
            "some_avg10": reading.some.avg10 if reading.some else None,
            "full_avg10": reading.full.avg10 if reading.full else None,
        }
    return out


class PsiSource:
    """Node PSI from /proc/pressure, and CPU usage/throttling + per-cgroup PSI of the cgroups the views
    listing cgroups (``TopTable.psi_cgroups``) saw."""

    name = "psi"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        node = read_node_psi(ctx.paths)
        if not node.readings:
            raise ProbeError(f"psi: off: {'; '.join(node.unavailable.values())}")
        # Short here (the status line is a view title); the section's node rows say why each one is missing.
        missing = [r for r in RESOURCES if r in node.unavailable]
        degraded = any(r in missing for r in ("cpu", "memory", "io"))
        self.status = ProbeStatus(
            "psi", "degraded" if degraded else "on", reason=", ".join(f"no {r} pressure" for r in missing)
        )
        self.scope = cgroup_psi_scope(ctx.layout)
        self.tracker = _CgroupTracker(ctx.layout)

    def start(self) -> None:
        self.node, self.at = read_node_psi(self.ctx.paths), time.monotonic()
        self.tracker.baseline(
            info.path for info in self.ctx.resolver.all() if in_subtree(info.path, self.ctx.cgroup_filter)
        )

    def collect(self, sections: dict[str, Any]) -> PsiSection:
        node, at = read_node_psi(self.ctx.paths), time.monotonic()
        elapsed = max(at - self.at, 1e-9)
        rows = node_psi_rows(self.node, node, elapsed)
        self.node, self.at = node, at
        seen: list[dict] = []
        shown: dict[str, str] = {}
        listing = [p for p in _PSI_CGROUP_PLUGINS if sections.get(p.top_view) is not None]
        for p in listing:
            table: TopTable = p.top_table  # type: ignore[assignment]
            seen.extend(sections[p.top_view][table.rows_key])
            shown.update(table.psi_cgroups or {})
        note = None
        if not listing:
            names = ", ".join(p.name for p in _PSI_CGROUP_PLUGINS)
            note = f"per-cgroup rows list the cgroups {names} saw: {names} is not running"
        cgroups = self.tracker.step(seen, shown)
        return PsiSection(interval_s=elapsed, node=rows, cgroup_psi_scope=self.scope, cgroups=cgroups, note=note)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Opening
# --------------------------------------------------------------------------------------------


def open_source(name: str, ctx: Context, attach_mode: str = "auto") -> Source:
    """Load one source; a probe that cannot run here comes back as an OffSource with the reason.

    `attach_mode` values other than the engine's (auto, tp_btf, raw_tp) are one probe's own flavours
    (``ProbePlugin.flavours``): the other probes then pick their own. A probe is opened with the options
    its plugin gives `top` (probes.registry) and shown through its view's source class here.
    """
    if name == "psi":
        return PsiSource(ctx)
    plugin = BY_NAME.get(name)
    source_class = PROBE_SOURCES.get(name)
    if plugin is None or source_class is None:
        raise ValueError(f"unknown source {name!r}")
    mode = attach_mode if attach_mode in ENGINE_ATTACH_MODES or attach_mode in plugin.flavours else "auto"
    try:
        return source_class(plugin.open(paths=ctx.paths, layout=ctx.layout, attach_mode=mode, **plugin.top_options), ctx)
    except ProbeError as e:
        log.info("%s", e)  # shown in its view and the status record, not as a warning
        return OffSource(name, e)


# The view of each probe in the registry that has one: every plugin declares it as a table
# (ProbePlugin.top_table), which one source class serves.
PROBE_SOURCES: dict[str, type[_ProbeSource]] = {p.name: TableSource for p in PLUGINS if p.top_table is not None}
