# SPDX-License-Identifier: Apache-2.0
"""The kernel's counts a mitigation moves, to judge "recovered" where latency is not exact.

In the VM lane (Debian's 6.1 under qemu TCG) every instruction is emulated: the victim's latencies are
~10x the host's and vary with the host's load, but the kernel still counts exactly what the action
changes. Per scenario cause, the count that says whether the action undid the antagonist:

- ``neighbor_cpu``: the BE pods' CPU time on the victim's CPU, from each BE task's own run time
  (``/proc/<tid>/schedstat``, first field) while its allowed CPUs include the victim's; a task the
  cpuset action moved off the victim's CPU adds nothing after it;
- ``self_throttling``: the victim pod's throttled periods (``nr_throttled`` in its ``cpu.stat``, v1 and v2);
- ``reclaim``: the pages the node's global reclaim scanned, kswapd's and direct (``pgscan_kswapd`` +
  ``pgscan_direct`` in ``/proc/vmstat``: the kernel counts a memory cgroup's own reclaim, memory.high's,
  only in that cgroup's memory.stat). In the VM lane's global-reclaim the node reclaimed through kswapd
  (25,000-51,000 pages/s) with no entry into direct reclaim (allocstall 0) at all.

Each is sampled as a running total once per detector tick; the judgement compares its rate per second
before the onset, in the seconds that led to the first action, and after it (``count_recovery``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

BE_CPU_ON_VICTIM = "be_cpu_on_victim_cpu_ms"
VICTIM_THROTTLED = "victim_nr_throttled"
GLOBAL_RECLAIM_SCAN = "node_global_reclaim_scanned_pages"

COUNT_OF_CAUSE = {"neighbor_cpu": BE_CPU_ON_VICTIM, "self_throttling": VICTIM_THROTTLED, "reclaim": GLOBAL_RECLAIM_SCAN}
COUNT_LABEL = {
    BE_CPU_ON_VICTIM: "BE pods' CPU time on the victim's CPU, ms/s",
    VICTIM_THROTTLED: "victim pod's throttled periods/s",
    GLOBAL_RECLAIM_SCAN: "pages/s the node's global reclaim scanned (pgscan_kswapd + pgscan_direct)",
}
UNDONE_SHARE = 0.9  # recovered: the action undid at least 90 % of the rise the antagonist made in the count
DURING_S = 3.0  # the rate the action acted on: the seconds that led to it


class PodCgroupFiles(Protocol):
    def pids(self) -> set[int]: ...

    def read(self, controller: str, filename: str) -> str: ...


class CgroupPod(Protocol):  # tests/scenario_support.PodCgroup
    qos_class: str
    cgroup: PodCgroupFiles


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:  # the task exited between the listing and the read
        return ""


def global_reclaim_scanned(vmstat: str) -> int:
    """``/proc/vmstat``'s pgscan_kswapd + pgscan_direct: pages scanned by the node's global reclaim."""
    return sum(int(parts[1]) for line in vmstat.splitlines()
               if (parts := line.split()) and len(parts) == 2 and parts[0] in ("pgscan_kswapd", "pgscan_direct"))


def nr_throttled(cpu_stat: str) -> int | None:
    for line in cpu_stat.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "nr_throttled":
            return int(parts[1])
    return None


@dataclass
class CountSampler:
    """Running totals of the counts above, one call per tick."""

    victim_cpus: frozenset[int]
    proc: Path = Path("/proc")
    _exec_ns: dict[int, int] = field(default_factory=dict)  # per BE tid: its run time at the last sample
    _be_on_victim_ns: int = 0

    def _be_tids(self, be_pids: Iterable[int]) -> list[int]:
        tids = []
        for pid in be_pids:
            try:
                tids += [int(t) for t in os.listdir(self.proc / str(pid) / "task")]
            except OSError:
                continue
        return tids

    def sample(self, be_pids: Iterable[int], victim_cpu_stat: str | None) -> dict[str, float]:
        for tid in self._be_tids(be_pids):
            fields = _read(str(self.proc / str(tid) / "schedstat")).split()
            if not fields:
                continue
            now = int(fields[0])
            delta = now - self._exec_ns.get(tid, now)  # a task first seen adds from here on
            self._exec_ns[tid] = now
            try:
                allowed = os.sched_getaffinity(tid)
            except OSError:
                continue
            if allowed & self.victim_cpus:
                self._be_on_victim_ns += delta
        out = {BE_CPU_ON_VICTIM: self._be_on_victim_ns / 1e6,
               GLOBAL_RECLAIM_SCAN: float(global_reclaim_scanned(_read(str(self.proc / "vmstat"))))}
        throttled = nr_throttled(victim_cpu_stat) if victim_cpu_stat else None
        if throttled is not None:
            out[VICTIM_THROTTLED] = float(throttled)
        return out

    def sample_pods(self, pods: Mapping[str, CgroupPod], victim: str | None) -> dict[str, float]:
        be_pids = [pid for p in pods.values() if p.qos_class == "BE" for pid in p.cgroup.pids()]
        stat = None
        if victim in pods:
            try:
                stat = pods[victim].cgroup.read("cpu", "cpu.stat")
            except OSError:
                stat = None
        return self.sample(be_pids, stat)


def rate(samples: Sequence[tuple[float, str, float]], counter: str, lo: float, hi: float) -> float | None:
    """The count's rate per second over [lo, hi] from its running totals (s since onset, counter, total):
    between the last sample at or before ``lo`` (else the first after it) and the last at or before ``hi``."""
    pts = sorted((t, v) for t, c, v in samples if c == counter)
    before_lo = [p for p in pts if p[0] <= lo]
    start = before_lo[-1] if before_lo else next((p for p in pts if p[0] >= lo), None)
    ends = [p for p in pts if p[0] <= hi]
    if start is None or not ends or ends[-1][0] - start[0] < 0.5:
        return None
    return (ends[-1][1] - start[1]) / (ends[-1][0] - start[0])


@dataclass(frozen=True)
class CountRecovery:
    counter: str
    before: float | None
    during: float | None
    after: float | None
    recovered: bool | None  # None: no rise to undo, or a window without samples

    def summary(self) -> str:
        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"
        verdict = {True: "recovered", False: "not recovered", None: "not judged"}[self.recovered]
        return (f"{verdict} on counts: {COUNT_LABEL[self.counter]} {f(self.before)} before, "
                f"{f(self.during)} before the action, {f(self.after)} after")


def count_recovery(samples: Sequence[tuple[float, str, float]], cause: str, baseline_s: float, ttm: float,
                   after_lo: float, after_hi: float) -> CountRecovery | None:
    """Recovered on the count of ``cause``: its rate after the action back within 10 % of the rise the
    antagonist made (from before the onset to the ``DURING_S`` seconds sampled before the action)."""
    counter = COUNT_OF_CAUSE.get(cause)
    if counter is None:
        return None
    before = rate(samples, counter, -baseline_s, 0.0)
    # The seconds that led to the action, as sampled: the DURING_S seconds up to the last sample at or
    # before it. A sample is taken once per detector tick, and under TCG a tick takes seconds: in the VM
    # lane's global-reclaim (2026-11-28 15:26 UTC) no sample fell in the 3 s before the action, and the
    # row was not judged.
    last = max((t for t, c, _ in samples if c == counter and t <= ttm), default=ttm)
    during = rate(samples, counter, max(0.0, last - DURING_S), last)
    after = rate(samples, counter, after_lo, after_hi)
    recovered = None
    if None not in (before, during, after) and during > before:  # type: ignore[operator]
        recovered = after <= before + (1 - UNDONE_SHARE) * (during - before)  # type: ignore[operator]
    return CountRecovery(counter, before, during, after, recovered)
