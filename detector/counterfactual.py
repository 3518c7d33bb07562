"""What each culprit costs the victim, in the victim's own units: its runqueue p99 and wait per second
with that culprit's share of each wait taken out.

The runqueue probe splits every wait by who ran meanwhile, and for each (victim, culprit) pair it keeps
how the victim's wait histogram moves when the culprit's part of each wait is removed: a wait of
``full`` ns of which the culprit ran ``part`` ns leaves slot(full) for slot(full - part)
(``runq_counterfactual`` in bpf/runqlat.h, ``CulpritStats.cf_slots``). That is per-wait data: a culprit
that lengthens a few waits a lot moves the tail, one that adds a little to many waits moves none of it,
which an average of shares could not tell apart. The victim's histogram over the window plus the
culprit's moves is the histogram it would have had without the culprit; its p99 is the counterfactual.

Waits shorter than 128 µs are not moved (the kernel skips them to keep the switch path cheap; the
exporter's first bucket holds them all anyway): the counterfactual is exact from 128 µs up.

The kernel work a culprit causes: ksoftirqd running the softirq work its packets made. It is a kernel
thread of the node (the root cgroup), so "who ran instead" charges it to the node, not to the pod. For
a cause that declares such work (``CauseSpec.kernel_work``) the incident's top culprit is costed
without it too: the probe also keeps, per pair, how the same waits move further when the node's part
of each is taken out (``node_slots``; per wait, so a wait behind the culprit and ksoftirqd both is
moved by both). In softirq-starve (host) it moved 1-13 of the ~400 waits of an incident tick: one
tick's counterfactual went from 1.03 to 0.95 ms, another's from 0.46 to 0.39 ms, against 0.03-0.17 ms
measured once the culprit was moved away. (The 1.46 -> 0.08 ms that motivated it had added the root
pair's moves to the culprit's, which also moves waits behind the node alone, and some twice.)
Bounds: the node's part is all of the root cgroup's time in those waits (a v2 systemd node keeps its
services in system.slice, so its root holds kernel threads; a root holding more takes out more than
the culprit caused), and softirq work run at interrupt exit on top of another task (the idle task,
the victim's own) is charged to that task and stays in.
kswapd is not declared: capping a global-reclaim grower does not stop it (the node stays below its
watermark until memory is freed); a counterfactual without it said 0.11 ms where 0.71 ms was measured
after the cap (make bench, global-reclaim / mitigate, 2026-11-27).

What it is not: a prediction of the scheduler. Without the culprit another task may run in its place
(it is the wait *behind this culprit* that is taken out), and a wait two containers of one culprit pod
both lengthened is moved twice (the histogram is clipped at zero). The scenario bench compares it with
the p99 measured after the action moved the culprit away (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from detector.model import Culprit
from probes.hist import HIST_SLOTS, IntervalHistogram, counterfactual_histogram

WINDOW_TICKS = 10  # as the culprit window of detector.incidents (CULPRIT_WINDOW_TICKS)


@dataclass(frozen=True, slots=True)
class CulpritCost:
    """The victim over the window, with and without one culprit."""

    p99_ns: float
    p99_without_ns: float
    wait_ms_per_s: float
    wait_ms_per_s_without: float

    @property
    def added_ns(self) -> float:
        return max(self.p99_ns - self.p99_without_ns, 0.0)


@dataclass
class _Tick:
    slots: tuple[int, ...]
    sum_ns: int
    count: int
    interval_s: float
    moves: dict[str, tuple[int, ...]]  # culprit key -> signed slot moves
    removed_ns: dict[str, float]  # culprit key -> ns of the victim's wait it ran for
    node_moves: dict[str, tuple[int, ...]]  # culprit key -> the further moves without the node's part
    node_ns: dict[str, float]  # culprit key -> the node's ns in the waits behind it


@dataclass
class VictimWindow:
    ticks: deque[_Tick] = field(default_factory=lambda: deque(maxlen=WINDOW_TICKS))

    def add(self, hist: IntervalHistogram | None, interval_s: float, moves: dict[str, tuple[int, ...]],
            removed_ns: dict[str, float], node_moves: dict[str, tuple[int, ...]] | None = None,
            node_ns: dict[str, float] | None = None) -> None:
        if hist is None:
            hist = IntervalHistogram((0,) * HIST_SLOTS, 0, 0, None)
        self.ticks.append(_Tick(hist.slots, hist.sum_ns, hist.count, interval_s, dict(moves), dict(removed_ns),
                                dict(node_moves or {}), dict(node_ns or {})))

    def histogram(self) -> IntervalHistogram:
        slots = [0] * HIST_SLOTS
        total = count = 0
        for t in self.ticks:
            for i, n in enumerate(t.slots):
                slots[i] += n
            total += t.sum_ns
            count += t.count
        return IntervalHistogram(tuple(slots), total, count, None)

    def cost(self, culprit: str, kernel_work: bool = False) -> CulpritCost | None:
        """The victim's p99 and wait/s over the window, with and without ``culprit`` (and, with
        ``kernel_work``, without the node's kernel threads' part of the same waits); None when it did not
        wait."""
        hist = self.histogram()
        seconds = sum(t.interval_s for t in self.ticks)
        if not hist.count or seconds <= 0:
            return None
        moves = [0] * HIST_SLOTS
        removed = 0.0
        for t in self.ticks:
            for i, m in enumerate(t.moves.get(culprit, ())):
                moves[i] += m
            removed += t.removed_ns.get(culprit, 0.0)
            if kernel_work:
                for i, m in enumerate(t.node_moves.get(culprit, ())):
                    moves[i] += m
                removed += t.node_ns.get(culprit, 0.0)
        without = counterfactual_histogram(hist, tuple(moves), int(removed))
        return CulpritCost(hist.quantile_ns(0.99), without.quantile_ns(0.99), hist.sum_ns / 1e6 / seconds,
                           without.sum_ns / 1e6 / seconds)


class Counterfactuals:
    """The latency-sensitive workloads' windows, by workload key (the incident engine keeps one)."""

    def __init__(self) -> None:
        self.windows: dict[str, VictimWindow] = {}

    def add(self, key: str, hist: IntervalHistogram | None, interval_s: float, moves: dict[str, tuple[int, ...]],
            removed_ns: dict[str, float], node_moves: dict[str, tuple[int, ...]] | None = None,
            node_ns: dict[str, float] | None = None) -> None:
        self.windows.setdefault(key, VictimWindow()).add(hist, interval_s, moves, removed_ns, node_moves, node_ns)

    def cost(self, victim: str, culprit: str, kernel_work: bool = False) -> CulpritCost | None:
        w = self.windows.get(victim)
        return None if w is None else w.cost(culprit, kernel_work)

    def forget(self, key: str) -> None:
        self.windows.pop(key, None)


def with_kernel_work(culprits: list[Culprit], cost: Callable[[Culprit], CulpritCost | None],
                     kernel_work: str) -> list[Culprit]:
    """The culprits, the top one costed without the kernel work it caused too (``kernel_work`` names it:
    "ksoftirqd"); the others keep their own cost (the node's work is counted once, for the culprit the
    incident blames)."""
    if not culprits:
        return culprits
    top = culprits[0]
    c = cost(top)
    if c is None:
        return culprits
    return [replace(top, victim_runq_p99_ns=round(c.p99_ns), runq_p99_without_ns=round(c.p99_without_ns),
                    victim_wait_ms_per_s=round(c.wait_ms_per_s, 3), wait_ms_per_s_without=round(c.wait_ms_per_s_without, 3),
                    without_kernel_work=kernel_work), *culprits[1:]]


def cost_of(culprit: Culprit) -> CulpritCost:
    """The cost a culprit of an incident carries (its counterfactual fields must be set)."""
    return CulpritCost(culprit.victim_runq_p99_ns or 0.0, culprit.runq_p99_without_ns or 0.0,
                       culprit.victim_wait_ms_per_s or 0.0, culprit.wait_ms_per_s_without or 0.0)


def describe(culprit: str, victim: str, cost: CulpritCost, kernel_work: str = "") -> str:
    """'batch-x added 3.1 ms to web's runqueue p99 (5.0 -> 1.9 ms without it)'; with ``kernel_work``
    ("ksoftirqd"): '... without it and the kernel work it caused (ksoftirqd) ...'."""
    without = f"without it and the kernel work it caused ({kernel_work})" if kernel_work else "without it"
    return (f"{culprit} added {cost.added_ns / 1e6:.1f} ms to {victim}'s runqueue p99 "
            f"({cost.p99_ns / 1e6:.1f} \u2192 {cost.p99_without_ns / 1e6:.1f} ms {without}; wait "
            f"{cost.wait_ms_per_s:.0f} \u2192 {cost.wait_ms_per_s_without:.0f} ms/s)")
