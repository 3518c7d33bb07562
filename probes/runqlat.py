# SPDX-License-Identifier: Apache-2.0
"""Runqueue latency per cgroup and per CPU, and who ran instead (decoder for bpf/runqlat.bpf.c).

Who ran instead (sched_info flavour): every wait of a cgroup's tasks is split by what ran on the CPU
meanwhile (own cgroup, idle, a foreign cgroup, unknown, or another CPU before a migration), and the
foreign part is kept per (victim, culprit) pair with the culprit's turns and its preemptions of
the victim. Counters are cumulative like the histograms: diff two snapshots (`top_culprits`).
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np

from probes.base import BpfProbe
from probes.cgroupfiles import PID_MAX
from probes.cgroupfs import CgroupLayout, Hierarchy
from probes.engine import (
    AttachMode,
    Engine,
    LibbpfEngine,
    LoadedProbe,
    ProbeError,
    ProbeSpec,
    Tracepoint,
    missing_btf_features,
)
from probes.hist import (
    HIST_SLOTS,
    NN_HIST_SIZE,
    IntervalHistogram,
    LatencyHistogram,
    add_slots,
    counterfactual_histogram,  # noqa: F401  (re-exported)
    merge_intervals,
)
from probes.host import HostPaths, possible_cpu_count
from probes.plugin import (
    IDLE,
    UNKNOWN,
    CgroupSample,
    MetricSpec,
    NodeSample,
    ProbeOption,
    ProbePlugin,
    RowFieldSpec,
    SignalExtractor,
    SignalSpec,
    SloSpec,
    TopColumn,
    TopInput,
    TopTable,
    WorkloadKey,
)
from probes.striped_slots import StripedSlots, mapped_words
from probes.units import fmt_us

SPEC = ProbeSpec(
    name="runqlat",
    object_file="runqlat.bpf.o",
    tracepoints=(
        Tracepoint("sched_wakeup", "runqlat_wakeup_btf", "runqlat_wakeup_raw"),
        Tracepoint("sched_wakeup_new", "runqlat_wakeup_new_btf", "runqlat_wakeup_new_raw"),
        Tracepoint("sched_switch", "runqlat_switch_btf", "runqlat_switch_raw"),
    ),
)
# Cheapest flavour: one sched_switch program over the kernel's own enqueue stamps (see the BPF file).
SCHED_INFO_SPEC = ProbeSpec(
    name="runqlat",
    object_file="runqlat.bpf.o",
    # Softirq work a wait spent on top of another task, for the counterfactual (bpf/runqlat.h): without
    # them that work stays charged to the task it interrupted. This flavour is BTF-typed only (its switch
    # program reads task_struct and the rq), so they have no raw_tp twins: the name is given twice.
    tracepoints=(Tracepoint("sched_switch", "runqlat_switch_schedinfo", "runqlat_switch_raw"),
                 Tracepoint("softirq_entry", "runqlat_softirq_entry_btf", "runqlat_softirq_entry_btf", required=False),
                 Tracepoint("softirq_exit", "runqlat_softirq_exit_btf", "runqlat_softirq_exit_btf", required=False)),
    btf_needs=(("member", "task_struct.sched_info"), ("member", "cfs_rq.rq"), ("member", "rq.clock")),
)
Flavour = Literal["auto", "sched_info", "tp_btf", "raw_tp"]

# Pseudo culprit ids (kernfs ids of real cgroups are never 0 or 2^64-1).
CULPRIT_IDLE = 0  # the CPU's idle task ran: wakeup latency of an idle CPU
CULPRIT_UNKNOWN = (1 << 64) - 1  # not attributable: older than the slice ring, waited on another CPU, or matrix full
CulpritKind = Literal["foreign", "own", "idle", "unknown"]

# struct runq_cgroup_stats after its nn_hist (then its slot's cgroup_id); struct runq_culprit_key /
# runq_culprit_stats; the head of struct runq_cpu_state (bpf/runqlat.h).
_SPLIT_TAIL = struct.Struct("<7Q")
_SLOT_OWNER = struct.Struct("<Q")
_CULPRIT_KEY = struct.Struct("<QQ")
_CULPRIT_STATS = struct.Struct("<3Q")
_CPU_STATE_HEAD = struct.Struct("<QQIIQQ")
# struct runq_counterfactual: signed slot moves without the culprit, then the further moves without the
# node's kernel threads too (node_slots)
_COUNTERFACTUAL = struct.Struct(f"<{2 * HIST_SLOTS + 1}q")  # (+ node_ns)
# Between its head and its histogram (last: read as the value's tail): the slice ring (24-byte entries),
# the cgroup slot cache (16-byte entries), the pair slot cache (24-byte entries), the softirq sums and
# runs (32-byte entries; never decoded).
RUNQ_RING_SLOTS, RUNQ_SLOT_CACHE, RUNQ_PAIR_CACHE, RUNQ_SOFTIRQ_MARKS = 64, 16, 16, 8
CGROUP_STATS_SIZE = NN_HIST_SIZE + _SPLIT_TAIL.size + _SLOT_OWNER.size
# The words of a slot's copy that move with every update of it, and its owner: a wait adds to the
# histogram's count; a preemption of its task for another cgroup's, which adds no wait, to
# foreign_preemptions (the split's last counter). A pair's turns, preemptions and owner.
CGROUP_CHANGE_WORDS = (HIST_SLOTS + 1, (NN_HIST_SIZE + _SPLIT_TAIL.size) // 8 - 1, CGROUP_STATS_SIZE // 8 - 1)
PAIR_CHANGE_WORDS = (1, 2, 3, 4)
CULPRIT_STATS_SIZE = _CULPRIT_STATS.size + _CULPRIT_KEY.size  # the counters, then the pair owning the slot
# struct runq_cpu_state: the decoded head, the slice ring, the slot cache, the pair cache, the softirq
# state, the CPU's histogram.
CPU_STATE_SIZE = (_CPU_STATE_HEAD.size + 24 * RUNQ_RING_SLOTS + 16 * RUNQ_SLOT_CACHE + 24 * RUNQ_PAIR_CACHE
                  + 32 + 32 * RUNQ_SOFTIRQ_MARKS)
CPU_HIST_SIZE = NN_HIST_SIZE + 40  # struct runq_cpu_hist: a CPU's histogram padded to whole cache lines
# What this module decodes, per map: (key, value), checked against the object's BTF at load (engine).
MAP_LAYOUTS = {
    "cgroup_slots": (_SLOT_OWNER, 4),  # cgroup id -> u32 slot
    "free_slots": (None, 4),
    "cgroup_runq": (4, CGROUP_STATS_SIZE),
    "culprit_slots": (_CULPRIT_KEY, 4),
    "free_culprit_slots": (None, 4),
    "new_culprit_slots": (None, 4),
    "runq_culprits": (4, CULPRIT_STATS_SIZE),
    "runq_cpu": (4, CPU_STATE_SIZE),
    "runq_cpu_hist": (4, CPU_HIST_SIZE),
    "runq_cf": (4, _COUNTERFACTUAL.size),
    "drops": (4, 8),  # probes/base.py
}


class _RunqEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("wait_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("prev_cgroup_id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("prev_pid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("prev_comm", ctypes.c_char * 16),
    ]


@dataclass(frozen=True)
class RunqOutlier:
    """One wait above the outlier threshold, with the task that ran right before the victim."""

    ts_ns: int
    wait_ns: int
    cgroup_id: int
    pid: int
    tgid: int
    comm: str
    cpu: int
    prev_cgroup_id: int
    prev_pid: int
    prev_comm: str

    @classmethod
    def decode(cls, raw: bytes) -> RunqOutlier:
        e = _RunqEvent.from_buffer_copy(raw[: ctypes.sizeof(_RunqEvent)])
        return cls(
            e.ts_ns, e.wait_ns, e.cgroup_id, e.pid, e.tgid, e.comm.decode(errors="replace"), e.cpu,
            e.prev_cgroup_id, e.prev_pid, e.prev_comm.decode(errors="replace"),
        )


@dataclass(frozen=True)
class WaitSplit:
    """One cgroup's wait by who ran meanwhile; the five wait fields add up to its histogram's sum_ns."""

    own_wait_ns: int = 0  # a task of the same cgroup ran
    foreign_wait_ns: int = 0  # another cgroup ran (per culprit: RunqSnapshot.culprits)
    idle_wait_ns: int = 0  # the idle task ran
    unknown_wait_ns: int = 0  # older than the per-CPU ring of the last 64 cgroup turns (RUNQ_RING_SLOTS)
    migrated_wait_ns: int = 0  # waited on another CPU before the load balancer moved the task
    own_preemptions: int = 0  # its tasks switched out while runnable for a task of the same cgroup
    foreign_preemptions: int = 0  # ... for a task of another cgroup

    @property
    def total_wait_ns(self) -> int:
        return self.own_wait_ns + self.foreign_wait_ns + self.idle_wait_ns + self.unknown_wait_ns + self.migrated_wait_ns

    @classmethod
    def decode_percpu(cls, raws: list[bytes]) -> WaitSplit:
        sums = [0] * (_SPLIT_TAIL.size // 8)  # seven u64 counters
        for raw in raws:
            for i, v in enumerate(_SPLIT_TAIL.unpack_from(raw, NN_HIST_SIZE)):
                sums[i] += v
        return cls(*sums)

    def delta(self, earlier: WaitSplit | None) -> WaitSplit:
        if earlier is None or _was_reset(self.total_wait_ns, earlier.total_wait_ns):
            return self
        return WaitSplit(*(max(a - b, 0) for a, b in zip(_fields(self), _fields(earlier), strict=True)))


@dataclass(frozen=True)
class CulpritStats:
    """What one culprit cgroup did to one victim cgroup, cumulative."""

    wait_ns: int = 0  # victim wait during the culprit's slices
    count: int = 0  # culprit turns on the CPU (its consecutive slices merged) inside victim waits
    preemptions: int = 0  # victim tasks switched out while runnable in favour of the culprit
    # The counterfactual: per histogram slot, how the victim's waits move with the culprit's share of
    # each one taken out (-1 where a wait leaves, +1 where it lands; empty: none moved). The victim's
    # histogram plus these is its histogram without the culprit (counterfactual_histogram).
    cf_slots: tuple[int, ...] = ()
    # The further moves of the same waits when the node's kernel threads' part (the root cgroup:
    # ksoftirqd, kswapd, kcompactd, kdamond) is taken out too: cf_slots + cf_node_slots is the victim
    # without both.
    cf_node_slots: tuple[int, ...] = ()
    cf_node_ns: int = 0  # the node's kernel threads' part of the waits behind this culprit (those walked)

    @classmethod
    def decode_percpu(cls, raws: list[bytes], cf_raw: bytes | None = None) -> CulpritStats:
        wait = count = preemptions = 0
        for raw in raws:
            w, c, p = _CULPRIT_STATS.unpack_from(raw)
            wait, count, preemptions = wait + w, count + c, preemptions + p
        both = _COUNTERFACTUAL.unpack_from(cf_raw) if cf_raw else ()
        cf, node = both[:HIST_SLOTS], both[HIST_SLOTS:2 * HIST_SLOTS]
        return cls(wait, count, preemptions, cf if any(cf) else (), node if any(node) else (), both[-1] if both else 0)

    def __add__(self, other: CulpritStats) -> CulpritStats:
        return CulpritStats(self.wait_ns + other.wait_ns, self.count + other.count, self.preemptions + other.preemptions,
                            add_slots(self.cf_slots, other.cf_slots, 1),
                            add_slots(self.cf_node_slots, other.cf_node_slots, 1), self.cf_node_ns + other.cf_node_ns)

    def delta(self, earlier: CulpritStats | None) -> CulpritStats:
        # Counters that went down were restarted (a probe reloaded): then the whole current value is new.
        if earlier is None or _was_reset(self.wait_ns + self.count + self.preemptions,
                                         earlier.wait_ns + earlier.count + earlier.preemptions):
            return self
        return CulpritStats(
            max(self.wait_ns - earlier.wait_ns, 0), max(self.count - earlier.count, 0),
            max(self.preemptions - earlier.preemptions, 0), add_slots(self.cf_slots, earlier.cf_slots, -1),
            add_slots(self.cf_node_slots, earlier.cf_node_slots, -1), max(self.cf_node_ns - earlier.cf_node_ns, 0),
        )


_HIST_WORDS = NN_HIST_SIZE // 8  # a copy's histogram: HIST_SLOTS slots, sum_ns, count, max_ns
_SPLIT_WORDS = _SPLIT_TAIL.size // 8  # then its wait split's counters


def decode_cgroup_slots(copies: list[list[bytes]]) -> list[tuple[LatencyHistogram, WaitSplit]]:
    """Each moved cgroup slot's histogram and wait split from its copies (struct runq_cgroup_stats), all
    slots at once: the copies' counters summed and their all-time maxima's largest taken in numpy, one
    call each for every slot of the tick, where decoding and merging each copy field by field in Python
    was most of a tick with hundreds of busy pods. The same values as LatencyHistogram.decode_percpu and
    WaitSplit.decode_percpu of each slot's copies (counters are u64 in the kernel: sums of a slot's at
    most 8 copies stay below 2^64 for centuries of waits)."""
    out: list[tuple[LatencyHistogram, WaitSplit]] = [(LatencyHistogram.empty(), WaitSplit())] * len(copies)
    filled = [i for i, values in enumerate(copies) if values]
    if not filled:
        return out
    words = _HIST_WORDS + _SPLIT_WORDS
    blob = b"".join(v[: words * 8] for i in filled for v in copies[i])
    rows = np.frombuffer(blob, dtype="<u8").reshape(-1, words)
    starts = np.cumsum([0] + [len(copies[i]) for i in filled[:-1]])
    sums = np.add.reduceat(rows, starts, axis=0).tolist()
    peaks = np.maximum.reduceat(rows[:, _HIST_WORDS - 1], starts).tolist()
    for i, row, peak in zip(filled, sums, peaks, strict=True):
        out[i] = (LatencyHistogram(tuple(row[:HIST_SLOTS]), row[HIST_SLOTS], row[HIST_SLOTS + 1], peak),
                  WaitSplit(*row[_HIST_WORDS:]))
    return out


def _fields(split: WaitSplit) -> tuple[int, ...]:
    return (split.own_wait_ns, split.foreign_wait_ns, split.idle_wait_ns, split.unknown_wait_ns, split.migrated_wait_ns,
            split.own_preemptions, split.foreign_preemptions)


def _was_reset(current_total: int, earlier_total: int) -> bool:
    return current_total < earlier_total


@dataclass(frozen=True)
class RankedCulprit:
    """One entry of `top_culprits`: who ran while the victim waited in the interval."""

    culprit_cgroup_id: int  # a cgroup id, the victim's own id (kind "own"), CULPRIT_IDLE or CULPRIT_UNKNOWN
    kind: CulpritKind
    wait_ns: int
    share: float  # of the victim's whole wait in the interval
    count: int  # culprit turns (foreign culprits only)
    preemptions: int  # of the victim by this culprit (own: by its own tasks)


K = TypeVar("K")
V = TypeVar("V")


class MovedDict(dict[K, V], Generic[K, V]):
    """A dict that remembers which of its keys were set or dropped since `take_moved`, so a reader can
    say what moved between two snapshots without comparing every entry (what delta walks)."""

    def __init__(self) -> None:
        super().__init__()
        self._position: dict[K, int] = {}  # key -> when it was inserted: the dict's own order
        self._moved: set[K] = set()
        self._inserted = 0

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:
            self._position[key] = self._inserted
            self._inserted += 1
        super().__setitem__(key, value)
        self._moved.add(key)

    def __delitem__(self, key: K) -> None:
        super().__delitem__(key)
        del self._position[key]
        self._moved.add(key)

    def pop(self, key: K, *default: Any) -> Any:  # type: ignore[override]
        if key not in self:
            return super().pop(key, *default)  # the default, or KeyError
        value = self[key]
        del self[key]  # through __delitem__: noted
        return value

    def _untracked(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("MovedDict: set a key with [] and drop it with del or pop (so its move is noted)")

    setdefault = update = clear = popitem = __ior__ = _untracked  # type: ignore[assignment]

    def take_moved(self) -> tuple[K, ...]:
        """The keys set since the last call that are still here, in the dict's order (a delta built from
        them lists its entries as a walk over the whole dict would); then forgets them."""
        position = self._position
        moved = sorted((key for key in self._moved if key in position), key=position.__getitem__)
        self._moved = set()
        return tuple(moved)


@dataclass(frozen=True)
class RunqSnapshot:
    """Cumulative counters since load; subtract two snapshots for an interval."""

    monotonic_s: float
    per_cgroup: dict[int, LatencyHistogram]
    per_cpu: list[LatencyHistogram]
    drops: dict[str, int]
    # Who ran instead: only the sched_info flavour fills these (culprits_available says so).
    wait_split: dict[int, WaitSplit] = field(default_factory=dict)  # victim cgroup id -> split
    culprits: dict[tuple[int, int], CulpritStats] = field(default_factory=dict)  # (victim, culprit) -> stats
    culprit_drop_ns: int = 0  # foreign wait whose culprit was lost to a full matrix (in foreign_wait_ns)
    culprits_available: bool = False
    table_use: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (slots used, slots)
    # What moved since the reader's snapshot whose `token` is `read_after`: the cgroups whose
    # histogram and wait split were read again, the pairs whose totals changed, each in its dict's
    # order. Every other entry is the very object of that snapshot, so delta between the two walks only
    # these (an idle cgroup costs nothing). None: not known (a snapshot built by hand): walk them all.
    # Each snapshot's own token (a new object: one built by hand never matches a reader's), and the token
    # of the reader's snapshot just before it (None: not known).
    token: object = field(default_factory=object, compare=False)
    read_after: object | None = field(default=None, compare=False)
    moved_cgroups: tuple[int, ...] | None = field(default=None, compare=False)
    moved_pairs: tuple[tuple[int, int], ...] | None = field(default=None, compare=False)

    def moved_since(self, prev: RunqSnapshot | None) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None:
        """(cgroups, pairs) that can differ from `prev`, when `prev` is the reader's snapshot just
        before this one; None when that is not known."""
        if prev is None or self.read_after is not prev.token or self.moved_cgroups is None or self.moved_pairs is None:
            return None
        return self.moved_cgroups, self.moved_pairs


@dataclass(frozen=True)
class RunqInterval:
    """Two snapshots' difference (the plugin's ``delta``), the one interval layer ``top`` and the agent's
    detector both read. Only what moved is in it: a cgroup in which a wait ended (or new in the map), a
    victim whose wait split changed, a (victim, culprit) pair whose counters changed; so its cost
    follows the cgroups that were active, not the map's size. Raw counts: each reader divides by its
    own interval."""

    interval_s: float  # between the two snapshots' reads (0 when there is no earlier one)
    per_cgroup: dict[int, IntervalHistogram]
    per_cpu: list[IntervalHistogram]
    wait_split: dict[int, WaitSplit]  # only with culprits_available
    culprits: dict[tuple[int, int], CulpritStats]  # only with culprits_available
    culprits_available: bool


_IDLE = IntervalHistogram((0,) * HIST_SLOTS, 0, 0, None)  # a CPU's interval when its histogram did not move


def delta(prev: RunqSnapshot | None, cur: RunqSnapshot) -> RunqInterval:
    """The interval prev → cur (prev None: since load)."""
    before = prev.per_cgroup if prev is not None else {}
    moved = cur.moved_since(prev)
    # Only what can have moved since prev, in the order of a walk over every entry (the same interval).
    hists = cur.per_cgroup if moved is None else {cg: cur.per_cgroup[cg] for cg in moved[0] if cg in cur.per_cgroup}
    per_cgroup: dict[int, IntervalHistogram] = {}
    for cgroup_id, hist in hists.items():
        earlier = before.get(cgroup_id)
        # no wait ended in this cgroup: nothing to subtract (an unread slot's histogram is the same object)
        if earlier is hist or (earlier is not None and earlier.count == hist.count):
            continue
        per_cgroup[cgroup_id] = hist.delta(earlier)
    cpus_before = prev.per_cpu if prev is not None else []
    per_cpu = [_IDLE if cpu < len(cpus_before) and cpus_before[cpu] is hist else
               hist.delta(cpus_before[cpu] if cpu < len(cpus_before) else None) for cpu, hist in enumerate(cur.per_cpu)]
    splits: dict[int, WaitSplit] = {}
    pairs: dict[tuple[int, int], CulpritStats] = {}
    if cur.culprits_available:
        split_before = prev.wait_split if prev is not None else {}
        # The probe hands the same objects again for what did not change: identity first, so an idle
        # cgroup or pair costs a dict lookup, not a comparison of every field.
        now_splits = cur.wait_split if moved is None else {
            cg: cur.wait_split[cg] for cg in moved[0] if cg in cur.wait_split}
        for victim_id, split in now_splits.items():
            was = split_before.get(victim_id)
            if was is not split and was != split:
                splits[victim_id] = split.delta(was)
        pairs_before = prev.culprits if prev is not None else {}
        now_pairs = cur.culprits if moved is None else {pair: cur.culprits[pair] for pair in moved[1]
                                                        if pair in cur.culprits}
        for pair, stats in now_pairs.items():
            was_pair = pairs_before.get(pair)
            if was_pair is not stats and was_pair != stats:
                pairs[pair] = stats.delta(was_pair)
    return RunqInterval(cur.monotonic_s - prev.monotonic_s if prev is not None else 0.0, per_cgroup, per_cpu,
                        splits, pairs, cur.culprits_available)


def top_culprits(prev: RunqSnapshot | None, cur: RunqSnapshot, victim_cgroup_id: int, k: int = 5) -> list[RankedCulprit]:
    """Who ran while `victim_cgroup_id` waited between two snapshots, the largest share first.

    Foreign cgroups come from the matrix; the victim's own cgroup, idle and unknown (including
    foreign wait whose pair did not fit in the matrix) from its wait split, so the shares of all
    entries add up to 1. `prev=None` means since load. Empty when the flavour has no attribution.
    """
    split = cur.wait_split.get(victim_cgroup_id)
    if split is None:
        return []
    d = split.delta(prev.wait_split.get(victim_cgroup_id) if prev else None)
    total = d.total_wait_ns
    foreign: dict[int, CulpritStats] = {}
    for (victim, culprit), stats in cur.culprits.items():
        if victim == victim_cgroup_id:
            foreign[culprit] = stats.delta(prev.culprits.get((victim, culprit)) if prev else None)
    lost = max(d.foreign_wait_ns - sum(c.wait_ns for c in foreign.values()), 0)
    idle_preemptions = foreign.pop(CULPRIT_IDLE, CulpritStats()).preemptions  # preempted in favour of idle: rare
    ranked = [
        RankedCulprit(culprit, "foreign", c.wait_ns, c.wait_ns / total if total else 0.0, c.count, c.preemptions)
        for culprit, c in foreign.items() if c.wait_ns or c.preemptions
    ]
    for culprit, kind, wait, preemptions in (
        (victim_cgroup_id, "own", d.own_wait_ns, d.own_preemptions),
        (CULPRIT_IDLE, "idle", d.idle_wait_ns, idle_preemptions),
        (CULPRIT_UNKNOWN, "unknown", d.unknown_wait_ns + d.migrated_wait_ns + lost, 0),
    ):
        if wait or preemptions:
            ranked.append(RankedCulprit(culprit, kind, wait, wait / total if total else 0.0, 0, preemptions))
    ranked.sort(key=lambda r: (r.wait_ns, r.preemptions), reverse=True)
    return ranked[:k]


MAX_STRIPES = 8  # copies of each statistics slot at most: memory is slots x stripes x value, whatever the CPUs


def stripes_for(possible_cpus: int) -> tuple[int, bool]:
    """(copies of each slot, whether CPUs share a copy): one copy per CPU up to MAX_STRIPES (a power of
    2, so the BPF side takes a CPU's copy with a mask); past it CPUs share copies with atomic adds."""
    stripes = 1
    while stripes < min(possible_cpus, MAX_STRIPES):
        stripes *= 2
    return stripes, possible_cpus > stripes


PID_MAX_LIMIT = 1 << 22  # the kernel's limit on 64-bit: pid_max can be raised up to it
MAX_PID_SLOTS = 1 << 16  # task_run_delay's entries at most (512 KiB), whatever pid_max is (systemd sets 2^22)
MAX_FALLBACK_TASKS = 65536  # the raw_tp flavour's pid -> enqueue time hash (bpf/runqlat.bpf.c)
MIN_CGROUP_SLOTS = 2048  # cgroups tracked at least: 250 kubelet pods (pod, pause, app) and the system's
MIN_PAIR_SLOTS = 8192  # who-ran-instead pairs tracked at least
# Pair slots per cgroup slot: 600 kubelet-shaped pods (1,200 leaves, 2,057 cgroup slots) all waking 3 times
# a second made 5,100-8,200 pairs within 3 s (make test-vm-large, 2026-11-28), held in 8,192 slots with
# quiet pairs giving theirs back at the agent's 1 s tick.
PAIRS_PER_CGROUP = 4
CGROUP_HEADROOM = 256  # cgroup slots beyond what the node holds: system units, cgroups of pods starting
PAIR_QUIET_S = 60.0  # a who-ran-instead pair unchanged this long gives its slot back (its totals are kept)
PAIR_SWEEP_S = 5.0  # how often quiet pairs are looked for (at once when the table is crowded)
PAIR_FULL_QUIET_S = 1.0  # ... and, when crowded, any pair this quiet, least recently moved first
# Totals of pairs that gave their slots back are kept for at least this many pairs (else as many as the
# table has slots): a small table (a test's 8 slots, a --runq-pairs set low) gives back more pairs than it
# has slots within seconds, and a pair that comes back would restart from 0 (9 give-backs in the VM lane
# dropped the first pair's totals, 2026-11-29). A few hundred bytes a pair.
PAIR_TOTALS_KEPT_MIN = 1024
# Crowded: past 3/4 full, given back down to 1/2. A quarter of the table is the room new pairs have between
# two reads: at 7/8 (1,024 of 8,192) the soak's churn lost 438 pairs in its first minute (2026-11-28).
PAIR_CROWDED, PAIR_CROWDED_TARGET = (3, 4), (1, 2)


def _power_of_2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def cgroup_capacity(hierarchy_root: Path | None, expected_cgroups: int = 0) -> int:
    """Cgroups to make room for: the keyed hierarchy's leaves at load (where tasks run: a kubelet pod's
    pause and app containers, not its pod cgroup) and half as many again for pods to come (dead
    cgroups give their slots back), or the cgroups the node is expected to hold (`expected_cgroups`:
    the caller's, e.g. from the kubelet's maxPods) if more, plus CGROUP_HEADROOM; never fewer than
    MIN_CGROUP_SLOTS."""
    leaves = 0
    if hierarchy_root is not None:
        for _, dirs, _ in os.walk(hierarchy_root, onerror=lambda _e: None):
            leaves += not dirs
    return max(MIN_CGROUP_SLOTS, max(leaves * 3 // 2, expected_cgroups) + CGROUP_HEADROOM)


def pair_capacity(cgroup_slots: int) -> int:
    """Who-ran-instead pairs to make room for with this many cgroup slots (PAIRS_PER_CGROUP each)."""
    return max(MIN_PAIR_SLOTS, PAIRS_PER_CGROUP * cgroup_slots)


def _pid_max(paths: HostPaths) -> int:
    """The host's pid_max (pids are below it); the kernel's limit if it cannot be read."""
    try:
        return PID_MAX.read(paths)
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def _check_sizes(max_cgroups: int | None, max_culprit_pairs: int | None, max_pid_slots: int, expected_cgroups: int,
                 pair_quiet_s: float) -> None:
    """One line for table sizes that cannot be (a probe is never opened with them)."""
    if (max_culprit_pairs is not None and max_culprit_pairs < 1) or (max_cgroups is not None and max_cgroups < 1) \
            or max_pid_slots < 1 or expected_cgroups < 0:
        raise ValueError(f"runqlat: map sizes must be >= 1 (max_cgroups={max_cgroups}, "
                         f"max_culprit_pairs={max_culprit_pairs}, max_pid_slots={max_pid_slots}, "
                         f"expected_cgroups={expected_cgroups})")
    if not pair_quiet_s > 0:
        raise ValueError(f"runqlat: pair_quiet_s must be positive, got {pair_quiet_s:g}")


def _root_cgroup_id(hierarchy: Hierarchy | None) -> int:
    """The cgroup id (its kernfs inode) of the hierarchy's root: 1 on every kernel this runs on; the
    stat says so where the hierarchy is mounted, and 1 stands in where it is not."""
    try:
        return os.stat(hierarchy.path_of("/")).st_ino if hierarchy is not None else 1
    except OSError:
        return 1


class PairTable:
    """Who ran instead's table of (victim, culprit) pairs: which of its slots a tick reads, the pairs'
    cumulative totals (kept across a slot given back), and quiet pairs giving their slots back."""

    def __init__(self, probe: LoadedProbe, slot_count: int, stripes: int, quiet_s: float) -> None:
        self.probe, self.slot_count, self.quiet_s = probe, slot_count, quiet_s
        self.slots = StripedSlots(probe, "culprit_slots", "runq_culprits", "free_culprit_slots", CULPRIT_STATS_SIZE,
                                  _CULPRIT_KEY.size, stripes, PAIR_CHANGE_WORDS,
                                  also_zero=(("runq_cf", _COUNTERFACTUAL.size),))
        self._cf_view = mapped_words(probe, "runq_cf")
        # Pairs that gave their slots back while their cgroups live on: their totals so far, added back
        # in snapshots so the matrix stays cumulative when a pair reappears. At most as many as the
        # table's slots (PAIR_TOTALS_KEPT_MIN at least), oldest out first (a snapshot copies them every
        # tick): one that comes back after that starts from 0, a counter reset to whoever reads it as a
        # counter.
        self._base: dict[tuple[int, int], CulpritStats] = {}
        self._in_kernel: dict[tuple[int, int], CulpritStats] = {}  # decoded at the last read
        # in the kernel + _base; which changed since the last snapshot (RunqSnapshot.moved_pairs)
        self.totals: MovedDict[tuple[int, int], CulpritStats] = MovedDict()
        self._moved_at: dict[tuple[int, int], float] = {}  # when each pair in the kernel last changed
        # Which slots to look at in a tick (_candidates): each victim's slots, the victims that moved and
        # the slots handed to new pairs at the last read.
        self._slots_of_victim: dict[int, set[int]] = {}
        self._victims_moved_last: set[int] = set()
        self._new_slots_last: set[int] = set()
        self._new_queue = True
        self._read_once = False
        self._scan_lost = 0
        self._quiet_swept_at = -math.inf
        self.given_back = 0  # slots freed because their pair stopped moving (cumulative)

    def read(self, moved_cgroups: set[int], drops: dict[str, int], now: float) -> None:
        """Decode the pairs that moved since the last read, then give back the slots of quiet ones."""
        for change in self.slots.read_changed(self._candidates(moved_cgroups, drops)):
            if change.old_key is not None:
                self._forget_slot(_CULPRIT_KEY.unpack(change.old_key)[0], change.slot)
            if change.key is not None:
                self._slots_of_victim.setdefault(_CULPRIT_KEY.unpack(change.key)[0], set()).add(change.slot)
            if change.old_key is not None and change.old_key != change.key:
                old_pair: tuple[int, int] = _CULPRIT_KEY.unpack(change.old_key)  # type: ignore[assignment]
                self._in_kernel.pop(old_pair, None)
                self._moved_at.pop(old_pair, None)
                self._total_of(old_pair)
            if change.key is not None:
                pair: tuple[int, int] = _CULPRIT_KEY.unpack(change.key)  # type: ignore[assignment]
                self._in_kernel[pair] = CulpritStats.decode_percpu(
                    self.slots.values(change.key, change.raw), self._counterfactual_raw(change.slot))
                # moved to the end: _moved_at stays ordered by when each pair last moved, oldest first
                self._moved_at.pop(pair, None)
                self._moved_at[pair] = now
                self._total_of(pair)
        self._give_back_quiet(now)

    def _forget_slot(self, victim: int, slot: int) -> None:
        """A pair slot its victim no longer holds; a victim with none left is dropped (pod churn)."""
        slots = self._slots_of_victim.get(victim)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._slots_of_victim[victim]

    def _candidates(self, moved_cgroups: set[int], drops: dict[str, int]) -> set[int] | None:
        """The pair slots that can have moved since the last read (None: look at every used one).

        Every charge of a pair comes with a change to its victim's own cgroup slot in the same program
        run (a wait in its histogram, or a foreign preemption), so only the pairs of victims whose slot
        moved, this tick or the last (the two updates may straddle the reads), and the slots the BPF side
        handed to new pairs (new_culprit_slots, this tick's and the last's: indexed before they are
        written) can have moved. Everything is looked at on the first read, where the queue cannot be
        read, and while updates are lost (a victim without a cgroup slot still charges its pairs)."""
        new: list[int] | None = [] if self._new_queue else None
        while new is not None:
            try:
                raw = self.probe.map_pop("new_culprit_slots")
            except (AttributeError, KeyError, OSError):  # a probe without the queue: every tick looks at all
                self._new_queue, new = False, None
                break
            if raw is None:
                break
            new.append(int.from_bytes(raw, "little"))
        lost = drops.get("key_map_full", 0)
        whole = new is None or lost != self._scan_lost or not self._read_once
        self._scan_lost, self._read_once = lost, True
        victims, self._victims_moved_last = moved_cgroups | self._victims_moved_last, moved_cgroups
        fresh, self._new_slots_last = set(new or ()) | self._new_slots_last, set(new or ())
        if whole:
            return None
        for victim in victims:
            fresh |= self._slots_of_victim.get(victim, set())
        return fresh

    def _counterfactual_raw(self, slot: int) -> bytes | None:
        """The pair slot's counterfactual moves (in place where mapped, else one lookup), for the pairs
        that changed this tick."""
        if self._cf_view is not None:
            words = _COUNTERFACTUAL.size // 8
            raw = self._cf_view[slot * words : (slot + 1) * words].tobytes()
            self.slots.bytes_read += len(raw)
            return raw
        raw = self.probe.map_lookup("runq_cf", slot.to_bytes(4, "little"))
        return raw if isinstance(raw, bytes) else None

    def _total_of(self, pair: tuple[int, int]) -> None:
        """A pair's cumulative total: what the kernel holds plus what was forgotten while it lived on."""
        in_kernel, base = self._in_kernel.get(pair), self._base.get(pair)
        total = in_kernel + base if in_kernel is not None and base is not None else in_kernel or base
        if total is None:
            self.totals.pop(pair, None)
        else:
            self.totals[pair] = total

    def forget(self, gone: set[int]) -> int:
        """Drop the pairs of removed cgroups (as victim or culprit); how many kernel slots went."""
        self._base = {pair: c for pair, c in self._base.items() if not gone.intersection(pair)}
        for pair in [p for p in self.totals if gone.intersection(p) and p not in self._in_kernel]:
            del self.totals[pair]
        stale = [key for key in self.slots.indexed_keys() if gone.intersection(_CULPRIT_KEY.unpack(key))]
        return sum(self.slots.free(key) for key in stale)

    def _give_back_quiet(self, now: float) -> None:
        """Pairs that stopped moving give their slots back, so a node up for weeks with pod churn keeps
        room for the pairs that interfere now, and a tick looks only at live pairs (each costs the
        reader its change words, 8 copies x 4 words at 8+ CPUs, every tick): those quiet for
        quiet_s (PAIR_QUIET_S unless configured), looked for every PAIR_SWEEP_S; once crowded
        (PAIR_CROWDED), at once, also those quiet for PAIR_FULL_QUIET_S, least recently moved first, down
        to PAIR_CROWDED_TARGET.
        Their totals stay here."""
        used = self.slots.used
        crowded = used * PAIR_CROWDED[1] > self.slot_count * PAIR_CROWDED[0]
        if not crowded and now - self._quiet_swept_at < PAIR_SWEEP_S:
            return
        self._quiet_swept_at = now
        if not crowded:
            # Oldest first (read keeps the order): the sweep walks the quiet pairs and stops at the
            # first live one, not over every pair.
            quiet = list(takewhile(lambda item: now - item[1] >= self.quiet_s, self._moved_at.items()))
            for pair, _ in quiet:
                self.give_back(pair)
            return
        quiet = sorted((at, pair) for pair, at in self._moved_at.items() if now - at >= PAIR_FULL_QUIET_S)
        target = self.slot_count * PAIR_CROWDED_TARGET[0] // PAIR_CROWDED_TARGET[1]
        for at, pair in quiet:
            if now - at < self.quiet_s and used <= target:
                break
            used -= self.give_back(pair)

    def give_back(self, pair: tuple[int, int]) -> int:
        """Free a live pair's slot; its totals so far stay here, so the matrix stays cumulative if it
        comes back. (An update racing the free is lost: at most one wait's worth.)"""
        total = self.totals.get(pair)
        if not self.slots.free(_CULPRIT_KEY.pack(*pair)):
            return 0
        self._in_kernel.pop(pair, None)
        self._moved_at.pop(pair, None)
        if total is not None:
            self._base.pop(pair, None)
            self._base[pair] = total  # newest last
            while len(self._base) > max(self.slot_count, PAIR_TOTALS_KEPT_MIN):
                oldest = next(iter(self._base))
                del self._base[oldest]
                if oldest not in self._in_kernel:
                    self.totals.pop(oldest, None)
                else:
                    self._total_of(oldest)
        self.given_back += 1
        return 1

    def give_back_unchanged(self, since: dict[tuple[int, int], CulpritStats]) -> int:
        """Free the slots of the pairs whose totals are still those of `since`; how many went."""
        quiet = [pair for pair in list(self._in_kernel) if since.get(pair) == self.totals.get(pair)]
        return sum(self.give_back(pair) for pair in quiet)


class RunqLatProbe(BpfProbe[RunqOutlier]):
    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        outlier_threshold_ns: int = 0,
        attach_mode: Flavour = "auto",
        outlier_ring_bytes: int = 256 * 1024,
        max_cgroups: int | None = None,
        max_culprit_pairs: int | None = None,
        max_pid_slots: int = MAX_PID_SLOTS,
        node_cgroup_id: int | None = None,
        test_kernel_work_cgroup_id: int = 0,
        pair_quiet_s: float = PAIR_QUIET_S,
        expected_cgroups: int = 0,
    ) -> None:
        """`max_cgroups` bounds the cgroups tracked (None: cgroup_capacity() of the keyed hierarchy and
        `expected_cgroups`); cgroups beyond it are counted in drops["cgroup_map_full"]. `max_culprit_pairs`
        bounds the (victim, culprit) matrix (None: pair_capacity() of the cgroup slots); pairs beyond it
        are counted in drops["culprit_map_full"] and their wait in `culprit_drop_ns`, and pairs that
        stopped moving for `pair_quiet_s` give their slots back.
        Both tables cost slots x stripes x value whatever the CPU count (stripes_for). `max_pid_slots`
        caps the pid-indexed array of the sched_info flavour (8 bytes a slot, sized to the host's
        pid_max up to it: pids share slots past it).
        `node_cgroup_id`: the node's cgroup, whose kswapd, kcompactd, kdamond and ksoftirqd slices are
        the kernel work of the counterfactual's node moves (CulpritStats.cf_node_slots); None: the keyed
        hierarchy's root cgroup. Tests name a cgroup of their own, never touching the root, and make its user tasks stand
        for that kernel work with `test_kernel_work_cgroup_id` (0: none)."""
        _check_sizes(max_cgroups, max_culprit_pairs, max_pid_slots, expected_cgroups, pair_quiet_s)
        self.v1_cpu = self._key_by("cpu", paths, layout)
        if node_cgroup_id is None:
            node_cgroup_id = _root_cgroup_id(self.hierarchy)
        if max_cgroups is None:
            max_cgroups = cgroup_capacity(Path(self.hierarchy.path_of("/")) if self.hierarchy is not None else None,
                                          expected_cgroups)
        max_culprit_pairs = max_culprit_pairs or pair_capacity(max_cgroups)
        engine = engine or LibbpfEngine(self.paths)
        self.cgroup_slot_count, self.pair_slot_count, self.pair_quiet_s = max_cgroups, max_culprit_pairs, pair_quiet_s
        self.stripes, self.stripes_shared = stripes_for(possible_cpu_count(self.paths))
        # A power of 2 (the BPF side masks a pid into it), at most the pid space.
        self.pid_slots = min(_power_of_2_at_least(max_pid_slots), _power_of_2_at_least(_pid_max(self.paths)))
        sizes = self._map_sizes(outlier_ring_bytes)
        options = {
            "rodata": {"v1_cpu_cgroup": self.v1_cpu, "outlier_threshold_ns": outlier_threshold_ns,
                       "pid_slots": self.pid_slots, "pid_slot_bits": self.pid_slots.bit_length() - 1,
                       "stripes": self.stripes, "stripes_shared": self.stripes_shared,
                       "cgroup_slot_count": max_cgroups, "pair_slot_count": max_culprit_pairs,
                       "node_cgroup_id": node_cgroup_id,
                       "test_kernel_work_cgroup_id": test_kernel_work_cgroup_id},
            "map_sizes": sizes,
            "layouts": MAP_LAYOUTS,
        }
        self.probe = self._open(engine, attach_mode, options, sizes)
        self._init_readers()
        self.culprits_available = self.probe.status.attach_mode == "sched_info"
        self.culprits_unavailable_reason = None if self.culprits_available else (
            f"who-ran-instead needs the sched_info flavour, this is {self.probe.status.attach_mode}"
        )
        if outlier_threshold_ns:
            self._watch_events("outliers", RunqOutlier.decode)

    def _map_sizes(self, outlier_ring_bytes: int) -> dict[str, int]:
        """Entries of each sized map (ring buffers: bytes): the tables are slots x stripes."""
        cgroups, pairs = self.cgroup_slot_count, self.pair_slot_count
        return {"outliers": outlier_ring_bytes, "cgroup_slots": cgroups, "free_slots": cgroups,
                "cgroup_runq": cgroups * self.stripes, "runq_culprits": pairs * self.stripes,
                "runq_cf": pairs, "culprit_slots": pairs, "free_culprit_slots": pairs, "new_culprit_slots": pairs,
                "task_run_delay": self.pid_slots, "fallback_queued_ns": 1,
                "runq_cpu_hist": possible_cpu_count(self.paths)}

    def _init_readers(self) -> None:
        """The reader's state over the loaded maps: the slot tables, the CPU histograms, the totals."""
        self._cgroups = StripedSlots(self.probe, "cgroup_slots", "cgroup_runq", "free_slots", CGROUP_STATS_SIZE,
                               _SLOT_OWNER.size, self.stripes, CGROUP_CHANGE_WORDS)
        self.pairs = PairTable(self.probe, self.pair_slot_count, self.stripes, self.pair_quiet_s)
        self._drops_seen: dict[str, int] = {}
        self._status_before_full: tuple[Any, str] | None = None  # (state, reason) while a table is full
        # What the kernel maps held at the last snapshot, decoded; only the slots that changed since are
        # decoded again (most cgroups did nothing). Snapshots get copies.
        # Which cgroups moved since the last snapshot (RunqSnapshot.moved_cgroups); _wait_split has
        # the same keys, set and dropped with these.
        self._per_cgroup: MovedDict[int, LatencyHistogram] = MovedDict()
        self._last_token: object | None = None  # the last snapshot's token (what the moved keys are since)
        self._per_cpu: list[LatencyHistogram] = []  # each CPU's histogram as last read and decoded
        self._cpu_counts = np.zeros(0, dtype="<u8")  # their counts then
        mapped = self.probe.map_mmap("runq_cpu_hist") if hasattr(self.probe, "map_mmap") else None
        cpus, words = possible_cpu_count(self.paths), CPU_HIST_SIZE // 8
        self._cpu_hist_view = None if mapped is None else (
            np.frombuffer(mapped, dtype="<u8")[: cpus * words].reshape(cpus, words))
        self._culprit_drops: tuple[int, int] | None = None  # summed over the CPUs' states, at the last read
        self._cpu_hist_bytes_read = 0
        self._cpu_hist_bytes_scanned = 0
        self._wait_split: dict[int, WaitSplit] = {}

    def _open(self, engine: Engine, attach_mode: Flavour, options: dict[str, Any], sizes: dict[str, int]) -> LoadedProbe:
        """The sched_info flavour when asked for or where it loads (auto), else the wakeup-based ones."""
        sched_info_error: ProbeError | None = None
        if attach_mode in ("auto", "sched_info"):
            missing = missing_btf_features(SCHED_INFO_SPEC) if isinstance(engine, LibbpfEngine) else ["libbpf engine"]
            if not missing:
                try:
                    probe = engine.open_probe(SCHED_INFO_SPEC, attach_mode="tp_btf", **options)
                    probe.status.attach_mode = "sched_info"
                    return probe
                except ProbeError as e:
                    sched_info_error = e
            else:
                sched_info_error = ProbeError(f"runqlat: sched_info flavour unavailable: no {', '.join(missing)}")
            if sched_info_error is not None and attach_mode == "sched_info":
                raise sched_info_error
        # Here: a wakeup-based flavour was asked for, or auto found no sched_info flavour.
        fallback: AttachMode = "auto" if attach_mode == "auto" else attach_mode  # type: ignore[assignment]
        # The wakeup-based flavours do not fill the matrix or the pid array: no memory for them.
        self.pid_slots = 1
        options["rodata"] = {**options["rodata"], "pid_slots": 1, "pid_slot_bits": 0}
        options["map_sizes"] = {**sizes, "runq_culprits": 1, "culprit_slots": 1, "free_culprit_slots": 1,
                                "runq_cf": 1, "new_culprit_slots": 1,
                                "task_run_delay": 1, "fallback_queued_ns": MAX_FALLBACK_TASKS}
        return engine.open_probe(SPEC, attach_mode=fallback, **options)

    def snapshot(self) -> RunqSnapshot:
        moved: list[int] = []
        copies: list[list[bytes]] = []
        for change in self._cgroups.read_changed():
            if change.old_key is not None and change.old_key != change.key:
                gone = _SLOT_OWNER.unpack(change.old_key)[0]
                self._per_cgroup.pop(gone, None)
                self._wait_split.pop(gone, None)
            if change.key is not None:
                moved.append(_SLOT_OWNER.unpack(change.key)[0])
                copies.append(self._cgroups.values(change.key, change.raw))
        # Decoded after the slots given up this tick are dropped: a cgroup whose slot moved within the
        # tick keeps the histogram of its new one.
        for cgroup_id, (hist, split) in zip(moved, decode_cgroup_slots(copies), strict=True):
            self._per_cgroup[cgroup_id] = hist
            if self.culprits_available:
                self._wait_split[cgroup_id] = split
        per_cpu = self._read_cpu_histograms()
        drops = self.read_drops()
        culprit_drops = culprit_drop_ns = 0
        if self.culprits_available:
            now = time.monotonic()
            self.pairs.read(set(moved), drops, now)
            # The CPUs' whole states (2.5 KB each) only when some update was lost since the last read.
            if drops.get("key_map_full", 0) != self._drops_seen.get("key_map_full", 0) or self._culprit_drops is None:
                cpu_states: list[bytes] = self.probe.map_lookup("runq_cpu", b"\0\0\0\0") or []  # type: ignore[assignment]
                self._culprit_drops = (sum(_CPU_STATE_HEAD.unpack_from(raw)[-2] for raw in cpu_states),
                                       sum(_CPU_STATE_HEAD.unpack_from(raw)[-1] for raw in cpu_states))
            culprit_drops, culprit_drop_ns = self._culprit_drops
        # key_map_full is the shared reason: these say which table was full.
        drops["culprit_map_full"] = culprit_drops
        drops["cgroup_map_full"] = max(drops.get("key_map_full", 0) - culprit_drops, 0)
        self._report_full_tables(drops)
        # Unchained until this snapshot is built: one that fails midway leaves the next one unchained.
        token, read_after, self._last_token = object(), self._last_token, None
        snap = RunqSnapshot(
            time.monotonic(), dict(self._per_cgroup), per_cpu, drops, dict(self._wait_split),
            dict(self.pairs.totals), culprit_drop_ns, self.culprits_available, self.table_use,
            token, read_after, self._per_cgroup.take_moved(), self.pairs.totals.take_moved(),
        )
        self._last_token = token
        return snap

    def _read_cpu_histograms(self) -> list[LatencyHistogram]:
        """Each CPU's wait histogram (runq_cpu_hist, in place where mapped): only the CPUs whose count
        moved are decoded again; an idle CPU's is the same object (its delta is then nothing)."""
        if self._cpu_hist_view is not None:
            rows = self._cpu_hist_view
        else:
            blob = self.probe.map_array_values("runq_cpu_hist")
            rows = np.frombuffer(blob, dtype="<u8").reshape(-1, CPU_HIST_SIZE // 8)
        counts = rows[:, HIST_SLOTS + 1].copy()
        mapped = self._cpu_hist_view is not None
        self._cpu_hist_bytes_read += counts.nbytes if mapped else 0
        self._cpu_hist_bytes_scanned += counts.nbytes if mapped else 0
        last = self._per_cpu
        moved = range(len(rows)) if len(last) != len(rows) else np.flatnonzero(counts != self._cpu_counts).tolist()
        if len(last) != len(rows):
            last[:] = [LatencyHistogram.empty()] * len(rows)
        for cpu in moved:
            raw = rows[cpu].tobytes()[:NN_HIST_SIZE]
            self._cpu_hist_bytes_read += len(raw) if mapped else 0
            last[cpu] = LatencyHistogram.decode(raw)
        self._cpu_counts = counts
        return list(last)

    def _report_full_tables(self, drops: dict[str, int]) -> None:
        """A table that lost updates since the last snapshot makes the probe degraded, saying which and
        by how much (the agent's /readyz, top's and diagnose's status lines); it is on again once a
        snapshot loses none. The counts stay in drops (the exporter's noisyneighbor_probe_drops_total)."""
        lost = []
        for table, reason in (("cgroup", "cgroup_map_full"), ("who-ran-instead pair", "culprit_map_full")):
            grew = drops.get(reason, 0) - self._drops_seen.get(reason, 0)
            if grew > 0:
                used, slots = self.table_use["cgroups" if table == "cgroup" else "pairs"]
                lost.append(f"{table} table full ({used} of {slots} slots): {grew} updates lost since the last read")
        self._drops_seen = dict(drops)
        status = self.probe.status
        if lost:
            if self._status_before_full is None:
                self._status_before_full = (status.state, status.reason)
            status.state, status.reason = "degraded", "; ".join(lost)
        elif self._status_before_full is not None:
            status.state, status.reason = self._status_before_full
            self._status_before_full = None

    def forget(self, cgroup_ids: list[int]) -> int:
        """Drop removed cgroups from the kernel maps (as victim or culprit) so pod churn cannot fill
        them. Returns how many map entries went. (Only for cgroups that are gone: a live one's
        counters would start again from zero, less what a CPU wrote into the slot meanwhile.)"""
        gone = set(cgroup_ids)
        removed = sum(self._cgroups.free(_SLOT_OWNER.pack(cg)) for cg in gone)
        if self.culprits_available and gone:
            removed += self.pairs.forget(gone)
        return removed

    def slot_copies(self, table: Literal["cgroups", "pairs"], slot: bytes | int) -> list[bytes]:
        """The copies of one slot of a statistics table (a slot as the index holds it, or its number)."""
        n = int.from_bytes(slot, "little") if isinstance(slot, bytes) else slot
        return (self._cgroups if table == "cgroups" else self.pairs.slots).copies_of(n)

    @property
    def table_use(self) -> dict[str, tuple[int, int]]:
        """Slots in use and slots in all, per table (at the last snapshot)."""
        use = {"cgroups": (self._cgroups.used, self.cgroup_slot_count)}
        if self.culprits_available:
            use["pairs"] = (self.pairs.slots.used, self.pair_slot_count)
        return use

    @property
    def bytes_read(self) -> int:
        """Bytes of the mapped tables looked at or copied out, in place, since load (no syscall copies
        them, so nothing else counts them: bench.metered_agent adds them to its per-tick figure)."""
        return self._cgroups.bytes_read + self.pairs.slots.bytes_read + self._cpu_hist_bytes_read

    @property
    def bytes_scanned(self) -> int:
        """The part of bytes_read that was counters looked at in place to find what moved (no copy)."""
        return self._cgroups.bytes_scanned + self.pairs.slots.bytes_scanned + self._cpu_hist_bytes_scanned

    def forget_quiet_pairs(self, since: RunqSnapshot) -> int:
        """Free the kernel slots of (victim, culprit) pairs that did not change since `since`, now
        (snapshots do it by themselves after pair_quiet_s: PairTable). Returns how many went."""
        return self.pairs.give_back_unchanged(since.culprits) if self.culprits_available else 0

    def poll_outliers(self, timeout_ms: int = 0) -> list[RunqOutlier]:
        return self._poll_events(timeout_ms)



# -- the plugin: metrics, top view, detector signals ------------------------------------------------

RUNQ_LATENCY = "noisyneighbor_runqueue_latency_seconds"
CPU_RUNQ_LATENCY = "noisyneighbor_cpu_runqueue_latency_seconds"
TABLE_SLOTS = "noisyneighbor_runqueue_table_slots"


class WaitCounts(Mapping[int, int]):
    """A snapshot's activity: waits ended per cgroup, read from its histograms when asked (no dict of
    every cgroup built each tick; activity_moved says which can have changed)."""

    __slots__ = ("_hists",)

    def __init__(self, hists: dict[int, LatencyHistogram]) -> None:
        self._hists = hists

    def __getitem__(self, cgroup_id: int) -> int:
        return self._hists[cgroup_id].count

    def get(self, cgroup_id: int, default: Any = None) -> Any:
        hist = self._hists.get(cgroup_id)
        return default if hist is None else hist.count

    def __contains__(self, cgroup_id: object) -> bool:
        return cgroup_id in self._hists

    def __iter__(self) -> Iterator[int]:
        return iter(self._hists)

    def __len__(self) -> int:
        return len(self._hists)


def activity(snap: RunqSnapshot) -> Mapping[int, int]:
    return WaitCounts(snap.per_cgroup)


def activity_moved(prev: RunqSnapshot, cur: RunqSnapshot) -> tuple[int, ...] | None:
    """The cgroups whose wait count can differ from `prev`'s (None: `prev` is not the reader's last)."""
    moved = cur.moved_since(prev)
    return None if moved is None else moved[0]


def cgroup_series(snap: RunqSnapshot) -> Iterator[CgroupSample]:
    for cgroup_id, hist in snap.per_cgroup.items():
        yield RUNQ_LATENCY, cgroup_id, (), hist


def node_series(snap: RunqSnapshot) -> Iterator[NodeSample]:
    for cpu, hist in enumerate(snap.per_cpu):
        yield CPU_RUNQ_LATENCY, (str(cpu),), hist
    for table, (used, slots) in snap.table_use.items():
        yield TABLE_SLOTS, (table, "used"), float(used)
        yield TABLE_SLOTS, (table, "capacity"), float(slots)


def top_rows(view: TopInput) -> list[dict[str, Any]]:
    """A row per cgroup in which a wait ended (unsorted: `top` sorts by the chosen column)."""
    dt, rows = view.dt, []
    for cgroup_id, d in view.interval.per_cgroup.items():
        if d.count:
            rows.append({"cgroup_id": cgroup_id, "events": d.count, "events_per_s": d.count / dt,
                         "wait_ms_per_s": d.sum_ns / 1e6 / dt, "p50_us": d.quantile_ns(0.50) / 1e3,
                         "p99_us": d.quantile_ns(0.99) / 1e3, "max_us": d.max_ns / 1e3,
                         "max_exact": d.exact_max_ns is not None})
    return rows


def top_cpus(probe: Any, paths: HostPaths) -> Callable[[TopInput, Callable[[int], str]], dict[str, Any]]:
    def extras(view: TopInput, name_of: Callable[[int], str]) -> dict[str, Any]:
        return {"cpus": [{"cpu": cpu, "events": d.count, "wait_ms_per_s": d.sum_ns / 1e6 / view.dt,
                          "p99_us": d.quantile_ns(0.99) / 1e3} for cpu, d in enumerate(view.interval.per_cpu)]}

    return extras


def top_footer(section: dict[str, Any]) -> str:
    return "  ".join(f"cpu{c['cpu']}: {c['wait_ms_per_s']:.1f}ms/s p99 {fmt_us(c['p99_us'])}" for c in section["cpus"])


TOP_TABLE = TopTable(
    title="runqueue latency per cgroup",
    columns=(
        TopColumn("WAIT/s", "wait_ms_per_s", "ms", sort="wait"),
        TopColumn("P50", "p50_us", "us", sort="p50"),
        TopColumn("P99", "p99_us", "us", sort="p99"),
        TopColumn("MAX", "max_us", "us", sort="max", exact="max_exact"),
        TopColumn("EVENTS/s", "events_per_s", "count", sort="events"),
    ),
    rows=top_rows,
    nothing="no task waited on a runqueue",
    hotkey="r",
    rows_key="cgroups",
    extras=top_cpus,
    footer=top_footer,
    sort_keys={"wait": "wait_ms_per_s", "p99": "p99_us", "p50": "p50_us", "max": "max_us", "events": "events_per_s",
               "name": "name"},
    sort_hotkeys={"w": "wait", "9": "p99", "5": "p50", "m": "max", "e": "events", "n": "name"},
    record_top_level=True,  # `top --json`: cgroups, cpus and drops are the record's own keys, as before views
    psi_cgroups={"wait_ms_per_s": "runq_wait_ms_per_s"},
)


def workload_signals(interval: RunqInterval, dt: float, workload_key: WorkloadKey) -> dict[str, dict[str, Any]]:
    """Per workload: its runqueue wait (its cgroups' histograms merged), and who ran instead while it
    waited (the victim x culprit matrix of the sched_info flavour, when the probe has it).

    The matrix is per leaf cgroup: two containers of one pod are foreign to each other there but the
    same workload here, so a culprit in the victim's own workload counts as own wait."""
    out: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[IntervalHistogram]] = {}
    for cgid, waited in interval.per_cgroup.items():  # only cgroups in which a wait ended
        key = workload_key(cgid)
        if key is not None:
            groups.setdefault(key, []).append(waited)
            out.setdefault(key, {})
    for key, hists in groups.items():
        d = merge_intervals(hists)
        out[key].update(runq_count=d.count, runq_wait_ms_per_s=d.sum_ns / 1e6 / dt, runq_p99_ns=d.quantile_ns(0.99),
                        runq_max_ns=d.max_ns, runq_hist=d)
    if interval.culprits_available:
        _who_ran_instead(interval, workload_key, out)
    return out


def _who_ran_instead(interval: RunqInterval, workload_key: WorkloadKey, out: dict[str, dict[str, Any]]) -> None:
    for victim_id, split in interval.wait_split.items():
        victim = workload_key(victim_id)
        if victim is None:
            continue
        r = out.setdefault(victim, {})
        r["own_wait_ns"] = r.get("own_wait_ns", 0.0) + split.own_wait_ns
        if split.own_wait_ns:  # behind its own cgroup's tasks (the detector names the container)
            by = r.setdefault("own_wait_by_cgroup", {})
            by[victim_id] = by.get(victim_id, 0.0) + split.own_wait_ns
        ran = r.setdefault("ran_instead_ns", {})
        if split.idle_wait_ns:
            ran[IDLE] = ran.get(IDLE, 0.0) + split.idle_wait_ns
        lost = split.unknown_wait_ns + split.migrated_wait_ns
        if lost:
            ran[UNKNOWN] = ran.get(UNKNOWN, 0.0) + lost
    for (victim_id, culprit_id), pair in interval.culprits.items():
        # The node's own pair may carry only moves: waits that softirq work run on top of another task
        # lengthened (bpf/runqlat.h).
        if not pair.wait_ns and not pair.preemptions and not pair.cf_node_ns:
            continue
        victim = workload_key(victim_id)
        if victim is None:
            continue
        r = out.setdefault(victim, {})
        culprit = workload_key(culprit_id)
        key = UNKNOWN if culprit is None else culprit
        if key == victim:
            r["own_wait_ns"] = r.get("own_wait_ns", 0.0) + pair.wait_ns
            if pair.wait_ns:  # behind a sibling container of the same pod
                by = r.setdefault("own_wait_by_cgroup", {})
                by[culprit_id] = by.get(culprit_id, 0.0) + pair.wait_ns
        else:
            if pair.wait_ns or pair.preemptions:
                ran = r.setdefault("ran_instead_ns", {})
                ran[key] = ran.get(key, 0.0) + pair.wait_ns
                r["preempted_foreign"] = r.get("preempted_foreign", 0) + pair.preemptions
            if pair.cf_slots:  # the counterfactual: how its waits move without this culprit
                moves = r.setdefault("cf_moves", {})
                moves[key] = add_slots(moves.get(key, ()), pair.cf_slots, 1)
            if pair.cf_node_slots:  # ... and further without the node's kernel threads in the same waits
                node = r.setdefault("cf_node_moves", {})
                node[key] = add_slots(node.get(key, ()), pair.cf_node_slots, 1)
            if pair.cf_node_ns:
                node_ns = r.setdefault("cf_node_ns", {})
                node_ns[key] = node_ns.get(key, 0.0) + pair.cf_node_ns


MIN_RUNQ_EVENTS = 20  # fewer switch-ins than this in a tick: a p99 means nothing


def p99_to_check(row: Any) -> float | None:
    """The victim's run-queue wait p99 its SLO checks this tick (its WorkloadSignals row), None: too few
    waits for a p99."""
    return row.runq_p99_ns if row.runq_count >= MIN_RUNQ_EVENTS else None


PLUGIN = ProbePlugin(
    name="runqlat", specs=(SCHED_INFO_SPEC, SPEC), factory=RunqLatProbe,
    flavours=("sched_info",), activity=activity, activity_moved=activity_moved, delta=delta,
    map_entries=lambda s: len(s.per_cgroup), victim_plots=("runq_p99_ns", "runq_wait_ms_per_s"),
    signals=("runq_p99_ns", "runq_wait_ms_per_s", "runq_wait_share", "who_ran_instead_foreign_share",
             "who_ran_instead_own_share"),
    signal_extractor=SignalExtractor(
        stage="tasks",
        fields=("runq_count", "runq_wait_ms_per_s", "runq_p99_ns", "runq_max_ns", "own_wait_ns",
                "ran_instead_ns", "preempted_foreign", "who_ran_instead_available", "runq_hist", "own_wait_by_cgroup",
                "cf_moves", "cf_node_moves", "cf_node_ns"),
        workloads=workload_signals,
        every_row=lambda interval: {"who_ran_instead_available": interval.culprits_available},
        signal_specs=(
            # Stored every tick; the p99 is unknown (NaN) in a tick the workload never switched in.
            SignalSpec("runq_p99_ns", "Run-queue wait p99", "ms", 1e-6, noise_floor=5_000.0, stored="always",
                       stored_when="runq_count", baseline=True, k_sigma=True,
                       slo=SloSpec("runq_p99_ms", 5.0, check_order=10, to_raw=1e6, gate=p99_to_check,
                                   doc=f"checked when it switched in at least {MIN_RUNQ_EVENTS} times in the tick")),
            SignalSpec("runq_wait_ms_per_s", "Run-queue wait per second", "ms/s", stored="always"),
        ),
        # The split of a victim's wait over its recent ticks the cause rules read and cite
        # (detector/causes/base.py CauseContext), from ran_instead_ns, own_wait_ns, cf_node_ns and own_wait_by_cgroup.
        evidence_specs=(
            SignalSpec("who_ran_instead_foreign_share", "Wait spent behind other cgroups", "%", 100.0, stored="never"),
            SignalSpec("who_ran_instead_own_share", "Wait spent behind its own threads", "%", 100.0, stored="never"),
            SignalSpec("who_ran_instead_node_share", "Wait spent behind the node's processes outside pods", "%", 100.0,
                       stored="never"),
            SignalSpec("who_ran_instead_kernel_work_share", "Wait the node's kernel work ran in (softirq, kernel threads)",
                       "%", 100.0, stored="never"),
            SignalSpec("who_ran_instead_container_share", "Own wait behind one of its containers", "%", 100.0,
                       stored="never"),
        ),
        row_specs=(
            RowFieldSpec("runq_count", int), RowFieldSpec("runq_max_ns"),
            # its waits this tick (all its cgroups), for the counterfactual
            RowFieldSpec("runq_hist", lambda: None),
            # culprit workload key -> how its wait histogram moves without that culprit
            # (detector/counterfactual.py), and the further moves without the node's kernel threads in
            # the same waits (ksoftirqd, kswapd, kcompactd, kdamond) with the node's ns in those waits
            RowFieldSpec("cf_moves", dict), RowFieldSpec("cf_node_moves", dict), RowFieldSpec("cf_node_ns", dict),
            # who ran instead: culprit workload key -> ns of this workload's wait while it ran on the CPU
            RowFieldSpec("ran_instead_ns", dict),
            # wait behind its own tasks, and the same by the cgroup id it waited behind
            RowFieldSpec("own_wait_ns"), RowFieldSpec("own_wait_by_cgroup", dict),
            RowFieldSpec("preempted_foreign", int), RowFieldSpec("who_ran_instead_available", bool),
        )),
    metrics=(RUNQ_LATENCY, CPU_RUNQ_LATENCY, TABLE_SLOTS),
    metric_specs=(
        MetricSpec(RUNQ_LATENCY, "histogram", "Runqueue wait (wakeup or preemption to running) of the cgroup's tasks."),
        MetricSpec(CPU_RUNQ_LATENCY, "histogram", "Runqueue wait of all tasks on the node (per CPU they waited on "
                   "with --per-cpu-series).", ("cpu",), per_cgroup=False, per_cpu=True),
        MetricSpec(TABLE_SLOTS, "gauge", "Slots of the run-queue probe's kernel tables (cgroups, who-ran-instead "
                   "pairs): used and capacity. A full table loses updates, counted in noisyneighbor_probe_drops_total "
                   "(cgroup_map_full, culprit_map_full).", ("table", "state"), per_cgroup=False),
    ),
    cgroup_series=cgroup_series,
    node_series=node_series,
    top_view="runq",
    top_table=TOP_TABLE,
    options=(
        ProbeOption("max_cgroups", "--runq-cgroups", label="run-queue cgroups", range=(1, 1 << 20),
                    help="cgroups the run-queue probe tracks (default: 3 per pod the node may run, from its "
                         "capacity.pods or the kubelet's maxPods, or 1.5x its leaf cgroups at start if more; "
                         "+256, at least 2048); more are counted as dropped (cgroup_map_full)"),
        ProbeOption("max_culprit_pairs", "--runq-pairs", label="run-queue pairs", range=(1, 1 << 20),
                    help="who-ran-instead (victim, culprit) pairs the probe tracks (default: 4 per cgroup "
                         "slot, at least 8192); pairs that stop moving give their slots back"),
        ProbeOption("pair_quiet_s", policy="runq_pair_quiet_seconds"),
    ),
    expected_cgroups_option="expected_cgroups",
)
