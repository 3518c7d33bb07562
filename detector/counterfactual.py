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

What it is not: a prediction of the scheduler. Without the culprit another task may run in its place
(it is the wait *behind this culprit* that is taken out), and a wait two containers of one culprit pod
both lengthened is moved twice (the histogram is clipped at zero). The scenario bench compares it with
the p99 measured after the action moved the culprit away (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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


@dataclass
class VictimWindow:
    ticks: deque[_Tick] = field(default_factory=lambda: deque(maxlen=WINDOW_TICKS))

    def add(self, hist: IntervalHistogram | None, interval_s: float, moves: dict[str, tuple[int, ...]],
            removed_ns: dict[str, float]) -> None:
        if hist is None:
            hist = IntervalHistogram((0,) * HIST_SLOTS, 0, 0, None)
        self.ticks.append(_Tick(hist.slots, hist.sum_ns, hist.count, interval_s, dict(moves), dict(removed_ns)))

    def histogram(self) -> IntervalHistogram:
        slots = [0] * HIST_SLOTS
        total = count = 0
        for t in self.ticks:
            for i, n in enumerate(t.slots):
                slots[i] += n
            total += t.sum_ns
            count += t.count
        return IntervalHistogram(tuple(slots), total, count, None)

    def cost(self, culprit: str) -> CulpritCost | None:
        """The victim's p99 and wait/s over the window, with and without ``culprit``; None when it did not wait."""
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
        without = counterfactual_histogram(hist, tuple(moves), int(removed))
        return CulpritCost(hist.quantile_ns(0.99), without.quantile_ns(0.99), hist.sum_ns / 1e6 / seconds,
                           without.sum_ns / 1e6 / seconds)


class Counterfactuals:
    """The latency-sensitive workloads' windows, by workload key (the incident engine keeps one)."""

    def __init__(self) -> None:
        self.windows: dict[str, VictimWindow] = {}

    def add(self, key: str, hist: IntervalHistogram | None, interval_s: float, moves: dict[str, tuple[int, ...]],
            removed_ns: dict[str, float]) -> None:
        self.windows.setdefault(key, VictimWindow()).add(hist, interval_s, moves, removed_ns)

    def cost(self, victim: str, culprit: str) -> CulpritCost | None:
        w = self.windows.get(victim)
        return None if w is None else w.cost(culprit)

    def forget(self, key: str) -> None:
        self.windows.pop(key, None)


def cost_of(culprit: Culprit) -> CulpritCost:
    """The cost a culprit of an incident carries (its counterfactual fields must be set)."""
    return CulpritCost(culprit.victim_runq_p99_ns or 0.0, culprit.runq_p99_without_ns or 0.0,
                       culprit.victim_wait_ms_per_s or 0.0, culprit.wait_ms_per_s_without or 0.0)


def describe(culprit: str, victim: str, cost: CulpritCost) -> str:
    """'batch-x added 3.1 ms to web's runqueue p99 (5.0 -> 1.9 ms without it)'."""
    return (f"{culprit} added {cost.added_ns / 1e6:.1f} ms to {victim}'s runqueue p99 "
            f"({cost.p99_ns / 1e6:.1f} \u2192 {cost.p99_without_ns / 1e6:.1f} ms without it; wait "
            f"{cost.wait_ms_per_s:.0f} \u2192 {cost.wait_ms_per_s_without:.0f} ms/s)")
