# SPDX-License-Identifier: Apache-2.0
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

The kernel work a culprit causes: ksoftirqd running the softirq work its packets made, kswapd
reclaiming for the memory it took (with kcompactd, which kswapd wakes to compact what it freed, and
kdamond, whose DAMON reclaim schemes page out the cold pages a grower streamed through). They are
kernel threads of the node (the root cgroup), so "who ran instead" charges them to the node, not to the
pod. The probe marks their slices (by the task: PF_KSWAPD, comm "ksoftirqd/N", "kcompactdN",
"kdamond.N"; other kernel threads and, on a v1 host, every process of the root cpu cgroup are the node
but not this work). Softirq work the kernel runs outside ksoftirqd (at interrupt exit, or where a
sender re-enables bottom halves) runs on top of whatever task is on the CPU and is charged to it: the
probe times it per CPU and counts a wait's softirq work as kernel work too, whichever slice it ran in
(bpf/runqlat.h). It keeps two per-wait records of that work: per pair, how the culprit's waits move
further when the kernel work in the same waits is taken out (``node_slots``), and on the node's own
pair (``NODE_KEY``) how every wait moves without its kernel work alone, whoever else ran. For a cause
that declares such work (``CauseSpec.kernel_work``: softirq -> softirq work, reclaim -> kswapd,
kcompactd, kdamond) the incident's top BE culprit (the one its actions move; else the top one) is costed
without it too, by whichever record takes more out: a grower kswapd reclaims for, or a sender whose
packets the kernel processes on the victim's CPU, never runs there, and only the second record sees its
cost. The
incident keeps the second one too (``Incident.kernel_work_cost``) for the culprit the planner names
from its traffic. Bounds: all softirq work in a wait counts, whoever's packets (or timers) it served;
kswapd reclaims for every allocation of the node, so a second grower's share of it is taken out with the
top one's; the mark is one bit, not one per cause, so a softirq sender's cost also takes out the reclaim
threads' part of the same waits and a grower's the softirq work in them (a host whose DAMON scheme runs
all the time, as the bench's does at 0.5-2.5 ms/s of the victim's waits, lowers it by that much).

Several culprits at once (the BE hogs an incident's step suppresses together): each one's moves of the
same waits, added. That is exact where no wait had two of them (a wait woken during one slice, the
common case); a wait that two of them lengthened is moved twice, as a pod's two containers' wait is.

What it is not: a prediction of the scheduler. Without the culprit another task may run in its place
(it is the wait *behind this culprit* that is taken out), and a wait two containers of one culprit pod
both lengthened is moved twice (the histogram is clipped at zero). The scenario bench compares it with
the p99 measured after the action moved the culprit away (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from detector.model import Culprit, CulpritCost
from probes.hist import HIST_SLOTS, IntervalHistogram, counterfactual_histogram, merge_intervals

WINDOW_TICKS = 10  # as the culprit window of detector.incidents (CULPRIT_WINDOW_TICKS)
# The node's workload key (the root cgroup): its own pair's node moves are the kernel work alone, out of
# every wait of the victim that had any (bpf/runqlat.h, struct runq_counterfactual).
NODE_KEY = "/"


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
        return merge_intervals(IntervalHistogram(t.slots, t.sum_ns, t.count, None) for t in self.ticks)

    def cost(self, culprit: str, kernel_work: bool = False) -> CulpritCost | None:
        """The victim's p99 and wait/s over the window, with and without ``culprit``; None when it did not
        wait.

        With ``kernel_work``, without the kernel work it caused too (the marked kernel threads' slices),
        which two per-wait records bound from below: the culprit's waits without it and the kernel work
        in those same waits (its pair's node moves), and the kernel work alone in every wait (the node's
        own pair: a grower kswapd reclaims for never runs on the victim's CPU, nor does a sender whose
        packets ksoftirqd processes). Neither can be added to the other (a wait in both would move
        twice), so the one that takes more out is the counterfactual."""
        hist = self.histogram()  # merged once for both records
        with_it = self._without(_culprits_parts((culprit,), kernel_work), hist)
        alone = self._without(_kernel_work_alone, hist) if kernel_work and with_it is not None else None
        if alone is None:
            return with_it
        return min(with_it, alone, key=lambda c: (c.p99_without_ns, c.wait_ms_per_s_without))

    def kernel_work_cost(self) -> CulpritCost | None:
        """The victim over the window without the kernel work in its waits, whoever caused it."""
        return self._without(_kernel_work_alone, self.histogram())

    def cost_of_set(self, culprits: Sequence[str]) -> CulpritCost | None:
        """The victim over the window without every one of ``culprits`` (each one's moves added)."""
        return self._without(_culprits_parts(culprits), self.histogram())

    def _without(self, parts: Callable[[_Tick], list[tuple[tuple[int, ...], float]]],
                 hist: IntervalHistogram) -> CulpritCost | None:
        """The window's histogram ``hist`` with what ``parts`` takes out of each tick, (slot moves, ns
        removed) pairs; None when the victim did not wait."""
        seconds = sum(t.interval_s for t in self.ticks)
        if not hist.count or seconds <= 0:
            return None
        moves = [0] * HIST_SLOTS
        removed = 0.0
        for t in self.ticks:
            for slot_moves, ns in parts(t):
                for i, m in enumerate(slot_moves):
                    moves[i] += m
                removed += ns
        without = counterfactual_histogram(hist, tuple(moves), int(removed))
        return CulpritCost(hist.quantile_ns(0.99), without.quantile_ns(0.99), hist.sum_ns / 1e6 / seconds,
                           without.sum_ns / 1e6 / seconds)


Parts = Callable[[_Tick], list[tuple[tuple[int, ...], float]]]  # a tick -> (slot moves, ns removed) to take out


def _culprits_parts(culprits: Sequence[str], kernel_work: bool = False) -> Parts:
    """What a tick takes out without ``culprits``: each one's moves, and with ``kernel_work`` the
    further moves without the kernel work in the waits behind it (its pair's node moves)."""
    def parts(t: _Tick) -> list[tuple[tuple[int, ...], float]]:
        out = [(t.moves.get(c, ()), t.removed_ns.get(c, 0.0)) for c in culprits]
        if kernel_work:
            out += [(t.node_moves.get(c, ()), t.node_ns.get(c, 0.0)) for c in culprits]
        return out

    return parts


def _kernel_work_alone(t: _Tick) -> list[tuple[tuple[int, ...], float]]:
    """The node's own pair's node moves: every wait of the tick without its kernel work alone."""
    return [(t.node_moves.get(NODE_KEY, ()), t.node_ns.get(NODE_KEY, 0.0))]


class Counterfactuals:
    """The latency-sensitive workloads' windows, by workload key (the incident engine keeps one)."""

    def __init__(self) -> None:
        self.windows: dict[str, VictimWindow] = {}

    def add(self, key: str, hist: IntervalHistogram | None, interval_s: float, moves: dict[str, tuple[int, ...]],
            removed_ns: dict[str, float], node_moves: dict[str, tuple[int, ...]] | None = None,
            node_ns: dict[str, float] | None = None) -> None:
        window = self.windows.get(key)
        if window is None:  # not setdefault(key, VictimWindow()): that builds a window every tick
            window = self.windows[key] = VictimWindow()
        window.add(hist, interval_s, moves, removed_ns, node_moves, node_ns)

    def cost(self, victim: str, culprit: str, kernel_work: bool = False) -> CulpritCost | None:
        w = self.windows.get(victim)
        return None if w is None else w.cost(culprit, kernel_work)

    def kernel_work_cost(self, victim: str) -> CulpritCost | None:
        w = self.windows.get(victim)
        return None if w is None else w.kernel_work_cost()

    def cost_of_set(self, victim: str, culprits: Sequence[str]) -> CulpritCost | None:
        w = self.windows.get(victim)
        return None if w is None else w.cost_of_set(culprits)

    def forget(self, key: str) -> None:
        self.windows.pop(key, None)


def with_kernel_work(culprits: list[Culprit], cost: Callable[[Culprit], CulpritCost | None],
                     kernel_work: str) -> list[Culprit]:
    """The culprits, one costed without the kernel work it caused too (``kernel_work`` names it:
    "softirq work", "kswapd, kcompactd, kdamond"): the top BE one, which the cause's actions move (suppress, cap, evict), else
    the top one. The others keep their own cost: the node's work is counted once (kswapd reclaims for
    every grower, and a non-BE grower of the node's own ranked above the BE one is not what is moved)."""
    if not culprits:
        return culprits
    i = next((i for i, c in enumerate(culprits) if (c.target.qos or "").upper() == "BE"), 0)
    c = cost(culprits[i])
    if c is None:
        return culprits
    costed = replace(culprits[i], victim_runq_p99_ns=round(c.p99_ns), runq_p99_without_ns=round(c.p99_without_ns),
                     victim_wait_ms_per_s=round(c.wait_ms_per_s, 3),
                     wait_ms_per_s_without=round(c.wait_ms_per_s_without, 3), without_kernel_work=kernel_work)
    return [*culprits[:i], costed, *culprits[i + 1:]]


def cost_of(culprit: Culprit) -> CulpritCost:
    """The cost a culprit of an incident carries (its counterfactual fields must be set)."""
    return CulpritCost(culprit.victim_runq_p99_ns or 0.0, culprit.runq_p99_without_ns or 0.0,
                       culprit.victim_wait_ms_per_s or 0.0, culprit.wait_ms_per_s_without or 0.0)


def describe(culprit: str, victim: str, cost: CulpritCost, kernel_work: str = "", together: int = 1) -> str:
    """'batch-x added 3.1 ms to web's runqueue p99 (5.0 -> 1.9 ms without it)'; with ``kernel_work``
    ("softirq work"): '... without it and the kernel work it caused (softirq work) ...'; for ``together``
    culprits moved at once ('batch and batch-small'): '... without them ...'."""
    if together > 1:
        without = "without them"
    else:
        without = f"without it and the kernel work it caused ({kernel_work})" if kernel_work else "without it"
    return (f"{culprit} added {cost.added_ns / 1e6:.1f} ms to {victim}'s runqueue p99 "
            f"({cost.p99_ns / 1e6:.1f} \u2192 {cost.p99_without_ns / 1e6:.1f} ms {without}; wait "
            f"{cost.wait_ms_per_s:.0f} \u2192 {cost.wait_ms_per_s_without:.0f} ms/s)")
