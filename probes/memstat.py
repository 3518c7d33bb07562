# SPDX-License-Identifier: Apache-2.0
"""Per-cgroup memory accounting (memory.stat, memory.events, limits) for v1 and v2, and the node's
reclaim counters in /proc/vmstat: the kernel's own numbers next to what probes/reclaim.py measures.

cgroup v1 (memory hierarchy), as this kernel (6.18) prints it:
- memory.stat: gauges in bytes (cache, rss, shmem, mapped_file, dirty, writeback, *_anon, *_file,
  ...), event counters pgpgin, pgpgout, pgfault, pgmajfault, workingset_refault_{anon,file}, and
  the same again with a ``total_`` prefix for the whole subtree. **No pgscan/pgsteal**: v1 has no
  per-cgroup reclaim counter at all.
- pgpgin/pgpgout count charge/uncharge *events*, one per folio, not pages: with large page-cache
  folios (ext4 has them since 6.16) one event can be hundreds of pages, so they are no page count.
- memory.usage_in_bytes, memory.limit_in_bytes (PAGE_COUNTER_MAX pages = unlimited),
  memory.failcnt (charges that hit the limit), memory.oom_control (oom_kill counter).
cgroup v2:
- memory.stat: anon, file (bytes), pgscan, pgsteal, pgscan_{kswapd,direct,khugepaged,proactive},
  pgsteal_*, pgfault, pgmajfault, workingset_refault_{anon,file}, ... (all hierarchical);
- memory.events: low, high (times throttled over memory.high), max, oom, oom_kill, oom_group_kill;
- memory.current, memory.max ("max" = unlimited).
Every field is hierarchical (v1: the ``total_`` keys when present), so v1 and v2 rows compare.

Node (/proc/vmstat): allocstall_<zone> counts global direct reclaim passes (one per
try_to_free_pages → do_try_to_free_pages), pgscan/pgsteal_{direct,kswapd} pages of global reclaim.
Cgroup-limit reclaim is *not* in allocstall or pgsteal_direct, but it is in pgsteal_{anon,file}.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.cgroupfiles import (  # the kernel files table
    MEMORY_EVENTS,
    MEMORY_FAILCNT,
    MEMORY_MAX,
    MEMORY_STAT,
    MEMORY_USAGE,
    PROC_VMSTAT,
    PROC_ZONEINFO,
    CgroupFile,
    KernelFile,
    parse_flat_keyed,
)
from probes.cgroupfs import CgroupLayout
from probes.host import HostPaths, ReadText, read_small

ALLOCSTALL_PREFIX = "allocstall_"
_V2_EVENTS = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")


@dataclass(frozen=True, slots=True)  # one per watched cgroup: no per-instance dict
class MemStat:
    """One memory cgroup, v1 or v2, normalised. None: this kernel/version does not have it."""

    cgroup_version: int
    usage_bytes: int | None  # v1 memory.usage_in_bytes, v2 memory.current
    limit_bytes: int | None  # v1 memory.limit_in_bytes, v2 memory.max; None = unlimited
    anon_bytes: int | None  # v1 total_rss, v2 anon
    file_bytes: int | None  # v1 total_cache, v2 file
    pgfault: int | None
    pgmajfault: int | None
    workingset_refault_anon: int | None  # pages re-read after being reclaimed
    workingset_refault_file: int | None
    # v2 only: pages scanned / reclaimed in this cgroup, by every kind of reclaim and per kind.
    pgscan: int | None = None
    pgsteal: int | None = None
    pgscan_direct: int | None = None  # memcg-limit and global direct reclaim
    pgsteal_direct: int | None = None
    pgscan_kswapd: int | None = None
    pgsteal_kswapd: int | None = None
    # v1 only: charge/uncharge events (one per folio, not pages) and failed charges at the limit.
    pgpgin: int | None = None
    pgpgout: int | None = None
    failcnt: int | None = None
    # memory.events (v2); v1 has only oom_kill (memory.oom_control).
    events_low: int | None = None
    events_high: int | None = None  # v2: times the cgroup was over memory.high and throttled
    events_max: int | None = None
    events_oom: int | None = None
    events_oom_kill: int | None = None
    events_oom_group_kill: int | None = None
    stat: dict[str, int] = field(default_factory=dict, repr=False)  # memory.stat as read
    events: dict[str, int] = field(default_factory=dict, repr=False)  # memory.events / oom_control


@dataclass(frozen=True)
class NodeVmstat:
    """The node's reclaim counters from /proc/vmstat (cumulative since boot)."""

    allocstall: dict[str, int]  # zone ("dma32", "normal", "movable", ...) -> direct reclaim passes
    pgscan_direct: int | None
    pgsteal_direct: int | None
    pgscan_kswapd: int | None
    pgsteal_kswapd: int | None
    pgsteal_anon: int | None
    pgsteal_file: int | None
    raw: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def allocstall_total(self) -> int:
        return sum(self.allocstall.values())


# -- parsing ------------------------------------------------------------------------------------


def _value(file: CgroupFile[Any], version: int, text: str | None) -> int | None:
    """A declared file's value through its one parser; None when the file was not read or its text is
    malformed (a torn read skips the value)."""
    return None if text is None else file.parse_or_none(version, text)


def parse_v1(
    stat_text: str,
    usage_text: str | None = None,
    limit_text: str | None = None,
    failcnt_text: str | None = None,
    oom_control_text: str | None = None,
    keep_raw: bool = True,
) -> MemStat | None:
    """A v1 memory cgroup from its files' contents; None if memory.stat is not a v1 one. ``keep_raw``: keep
    the files' every key in ``stat`` and ``events`` (else empty: the named fields only)."""
    stat = parse_flat_keyed(stat_text)
    if "cache" not in stat and "total_cache" not in stat:
        return None

    def h(key: str) -> int | None:  # hierarchical value when the kernel prints one
        return stat.get(f"total_{key}", stat.get(key))

    oom = parse_flat_keyed(oom_control_text) if oom_control_text is not None else {}
    return MemStat(
        cgroup_version=1,
        usage_bytes=_value(MEMORY_USAGE, 1, usage_text),
        limit_bytes=_value(MEMORY_MAX, 1, limit_text),  # v1's page-rounded LONG_MAX reads as no limit
        anon_bytes=h("rss"),
        file_bytes=h("cache"),
        pgfault=h("pgfault"),
        pgmajfault=h("pgmajfault"),
        workingset_refault_anon=h("workingset_refault_anon"),
        workingset_refault_file=h("workingset_refault_file"),
        pgscan=h("pgscan"),  # absent on every kernel so far; kept in case one adds it
        pgsteal=h("pgsteal"),
        pgpgin=h("pgpgin"),
        pgpgout=h("pgpgout"),
        failcnt=_value(MEMORY_FAILCNT, 1, failcnt_text),
        events_oom_kill=oom.get("oom_kill"),
        stat=stat if keep_raw else {},
        events=oom if keep_raw else {},
    )


def parse_v2(
    stat_text: str,
    events_text: str | None = None,
    current_text: str | None = None,
    max_text: str | None = None,
    keep_raw: bool = True,
) -> MemStat | None:
    """A v2 memory cgroup from its files' contents; None if memory.stat is not a v2 one. ``keep_raw``: as
    :func:`parse_v1`'s."""
    stat = parse_flat_keyed(stat_text)
    if "anon" not in stat or "file" not in stat:
        return None
    events = parse_flat_keyed(events_text) if events_text is not None else {}
    ev = {name: events.get(name) for name in _V2_EVENTS}
    return MemStat(
        cgroup_version=2,
        usage_bytes=_value(MEMORY_USAGE, 2, current_text),
        limit_bytes=_value(MEMORY_MAX, 2, max_text),
        anon_bytes=stat["anon"],
        file_bytes=stat["file"],
        pgfault=stat.get("pgfault"),
        pgmajfault=stat.get("pgmajfault"),
        workingset_refault_anon=stat.get("workingset_refault_anon"),
        workingset_refault_file=stat.get("workingset_refault_file"),
        pgscan=stat.get("pgscan"),
        pgsteal=stat.get("pgsteal"),
        pgscan_direct=stat.get("pgscan_direct"),
        pgsteal_direct=stat.get("pgsteal_direct"),
        pgscan_kswapd=stat.get("pgscan_kswapd"),
        pgsteal_kswapd=stat.get("pgsteal_kswapd"),
        events_low=ev["low"],
        events_high=ev["high"],
        events_max=ev["max"],
        events_oom=ev["oom"],
        events_oom_kill=ev["oom_kill"],
        events_oom_group_kill=ev["oom_group_kill"],
        stat=stat if keep_raw else {},
        events=events if keep_raw else {},
    )


def node_vmstat(raw: dict[str, int]) -> NodeVmstat:
    """The reclaim counters of /proc/vmstat's `key value` lines (PROC_VMSTAT's parse)."""
    return NodeVmstat(
        allocstall={k[len(ALLOCSTALL_PREFIX):]: v for k, v in raw.items() if k.startswith(ALLOCSTALL_PREFIX)},
        pgscan_direct=raw.get("pgscan_direct"),
        pgsteal_direct=raw.get("pgsteal_direct"),
        pgscan_kswapd=raw.get("pgscan_kswapd"),
        pgsteal_kswapd=raw.get("pgsteal_kswapd"),
        pgsteal_anon=raw.get("pgsteal_anon"),
        pgsteal_file=raw.get("pgsteal_file"),
        raw=raw,
    )


# -- readers ------------------------------------------------------------------------------------


def _read(file: CgroupFile[Any], cgroup_dir: Path, version: int) -> str | None:
    try:
        return file.raw(cgroup_dir, version)
    except OSError:
        return None  # unreadable counts as missing


def _read_node_file(file: KernelFile[dict[str, int]], paths: HostPaths) -> dict[str, int] | None:
    try:
        return file.read_or_none(paths)
    except OSError:
        return None  # unreadable counts as missing


def read_v1_memstat(cgroup_dir: Path) -> MemStat | None:
    """One cgroup in the v1 memory hierarchy; None when it vanished (or is not a memory cgroup)."""
    stat = _read(MEMORY_STAT, cgroup_dir, 1)
    if stat is None:
        return None
    files = [_read(f, cgroup_dir, 1) for f in MemStatReader.V1_DECLARED]
    if any(t is None for t in files[:3]) and not cgroup_dir.is_dir():
        return None  # removed between the reads
    return parse_v1(stat, *files)


def read_v2_memstat(cgroup_dir: Path) -> MemStat | None:
    """One v2 cgroup with the memory controller; None when it vanished or has no memory.stat.

    The v2 root has memory.stat but no memory.events/current/max: those fields are None there.
    """
    stat = _read(MEMORY_STAT, cgroup_dir, 2)
    if stat is None:
        return None
    files = [_read(f, cgroup_dir, 2) for f in MemStatReader.V2_DECLARED]
    if any(t is None for t in files) and not cgroup_dir.is_dir():
        return None
    return parse_v2(stat, *files)


def read_memstat(layout: CgroupLayout, cgroup_path: str) -> MemStat | None:
    """Memory accounting of one cgroup given by its path in the memory hierarchy (`/kubepods/...`).

    v1 memory hierarchy on v1/hybrid hosts, v2 otherwise; None when there is no memory controller
    or the cgroup is gone.
    """
    hierarchy = layout.hierarchy_for("memory")
    if hierarchy is None:
        return None
    d = hierarchy.path_of(cgroup_path)
    return read_v1_memstat(d) if hierarchy.version == 1 else read_v2_memstat(d)


def read_node_vmstat(paths: HostPaths | None = None) -> NodeVmstat | None:
    paths = paths or HostPaths()
    raw = _read_node_file(PROC_VMSTAT, paths)
    return None if raw is None else node_vmstat(raw)


# -- the node's free memory against its watermarks ------------------------------------------------


@dataclass(frozen=True)
class NodeMemory:
    """Free and reclaimable memory of the machine in pages, from the kernel's own zone counters.

    Read from /proc/vmstat and /proc/zoneinfo, not /proc/meminfo: sandboxes and container runtimes
    may rewrite meminfo (on the VM this was written on, meminfo says 24 GiB total while the zones
    manage 5 GiB), but not the zone counters the allocator actually checks.
    """

    free_pages: int  # nr_free_pages
    file_pages: int  # nr_active_file + nr_inactive_file: page cache on the LRU (clean or not)
    wmark_min_pages: int  # sums over every zone: below min, allocations reclaim directly
    wmark_low_pages: int  # below low, kswapd wakes
    wmark_high_pages: int  # kswapd reclaims up to high
    managed_pages: int  # pages the allocator manages now
    present_pages: int  # pages present; much more than managed when the kernel initialises memory
    # lazily (deferred struct page init grown on demand): zones then grow before they reclaim


def read_node_memory(paths: HostPaths | None = None) -> NodeMemory | None:
    """The node's free memory and watermarks; None when /proc/vmstat or /proc/zoneinfo is unreadable."""
    paths = paths or HostPaths()
    raw, zones = _read_node_file(PROC_VMSTAT, paths), _read_node_file(PROC_ZONEINFO, paths)
    if raw is None or zones is None or "nr_free_pages" not in raw:
        return None
    return NodeMemory(
        free_pages=raw["nr_free_pages"],
        file_pages=raw.get("nr_active_file", 0) + raw.get("nr_inactive_file", 0),
        wmark_min_pages=zones["min"], wmark_low_pages=zones["low"], wmark_high_pages=zones["high"],
        managed_pages=zones["managed"], present_pages=zones["present"],
    )


class MemStatReader:
    """One cgroup's memory accounting, read often: its directory is resolved once (the per-tick cost
    was mostly pathlib), the results are those of :func:`read_memstat`."""

    __slots__ = ("_names", "dir", "version")  # one per watched cgroup

    V1_DECLARED = (MEMORY_USAGE, MEMORY_MAX, MEMORY_FAILCNT, MEMORY_EVENTS)  # parse_v1's order
    V2_DECLARED = (MEMORY_EVENTS, MEMORY_USAGE, MEMORY_MAX)  # parse_v2's order
    V1_FILES = tuple(f.name(1) for f in V1_DECLARED)
    V2_FILES = tuple(f.name(2) for f in V2_DECLARED)
    USAGE_AT = {1: V1_DECLARED.index(MEMORY_USAGE), 2: V2_DECLARED.index(MEMORY_USAGE)}  # in other_files

    def __init__(self, layout: CgroupLayout, cgroup_path: str) -> None:
        hierarchy = layout.hierarchy_for("memory")
        self.version = hierarchy.version if hierarchy is not None else 0
        self.dir = str(hierarchy.path_of(cgroup_path)) if hierarchy is not None else ""
        # Only the directory is kept: the files' full paths, kept per watched cgroup, were ~800 bytes each
        # of the agent's memory (tracemalloc at 1,000 pods); an f-string a read costs next to nothing.
        self._names = self.V1_FILES if self.version == 1 else self.V2_FILES

    @property
    def stat_file(self) -> str:
        return f"{self.dir}/memory.stat"

    @property
    def other_files(self) -> list[str]:
        return [f"{self.dir}/{name}" for name in self._names]

    def files(self) -> list[str]:
        return [self.stat_file, *self.other_files] if self.version else []

    def read(self, read_small: ReadText = read_small, read_usage: ReadText | None = None) -> MemStat | None:
        """``read_small``: how to read one file (HotFiles.read keeps hot ones open); ``read_usage``: how to
        read its usage file (``memory.usage_in_bytes`` on v1, ``memory.current`` on v2), where the caller
        notes it."""
        if not self.version:
            return None
        stat = read_small(self.stat_file)
        if stat is None:
            return None
        usage_at = self.USAGE_AT[self.version]
        files = [read_small(f) if read_usage is None or i != usage_at else read_usage(f)
                 for i, f in enumerate(self.other_files)]
        required = files[:3] if self.version == 1 else files  # v1: oom_control may be absent
        if any(t is None for t in required) and not os.path.isdir(self.dir):
            return None  # removed between the reads
        # The named fields only: memory.stat's ~40 keys kept for every watched cgroup were ~3 KiB each of
        # the agent's memory (thousands of cgroups at node scale), and nothing reads them from the watch.
        return parse_v1(stat, *files, keep_raw=False) if self.version == 1 else parse_v2(stat, *files, keep_raw=False)
