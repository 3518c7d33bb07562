# SPDX-License-Identifier: Apache-2.0
"""Log2 latency histograms as the BPF programs keep them (`struct nn_hist` in bpf/nn_events.h)."""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable
from dataclasses import dataclass

HIST_SLOTS = 32  # NN_HIST_SLOTS
_NN_HIST = struct.Struct(f"<{HIST_SLOTS}Q3Q")
NN_HIST_SIZE = _NN_HIST.size


def slot_bounds_us(slot: int) -> tuple[float, float]:
    """[low, high) in µs of a slot: slot 0 holds 0 µs (<1 µs), slot k holds [2^(k-1), 2^k)."""
    if slot == 0:
        return 0.0, 1.0
    return float(1 << (slot - 1)), float(1 << slot)


@dataclass(frozen=True)
class LatencyHistogram:
    slots: tuple[int, ...]
    sum_ns: int
    count: int
    max_ns: int  # largest value since the probe loaded (kernel side never resets it)

    @classmethod
    def empty(cls) -> LatencyHistogram:
        return cls((0,) * HIST_SLOTS, 0, 0, 0)

    @classmethod
    def decode(cls, raw: bytes) -> LatencyHistogram:
        values = _NN_HIST.unpack_from(raw)
        return cls(values[:HIST_SLOTS], values[HIST_SLOTS], values[HIST_SLOTS + 1], values[HIST_SLOTS + 2])

    @classmethod
    def decode_percpu(cls, raws: Iterable[bytes]) -> LatencyHistogram:
        """Sum one value per CPU (per-CPU maps) into one histogram."""
        return cls.merge(cls.decode(r) for r in raws)

    @classmethod
    def merge(cls, hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
        slots = [0] * HIST_SLOTS
        total = count = peak = 0
        for h in hists:
            for i, n in enumerate(h.slots):
                slots[i] += n
            total += h.sum_ns
            count += h.count
            peak = max(peak, h.max_ns)
        return cls(tuple(slots), total, count, peak)

    def delta(self, earlier: LatencyHistogram | None) -> IntervalHistogram:
        """What happened between `earlier` and this snapshot.

        The interval's exact max is known when the all-time max grew during the interval (then the new
        maximum happened in it); otherwise only its slot's upper bound is known.
        """
        if earlier is None:
            earlier = LatencyHistogram.empty()
        if len(self.slots) != len(earlier.slots):
            raise ValueError(f"histograms of {len(self.slots)} and {len(earlier.slots)} slots")
        # map(sub) rather than a generator: this runs for every cgroup and CPU whose waits moved, each tick
        slots = tuple(map(operator.sub, self.slots, earlier.slots))
        if min(slots, default=0) < 0:  # a counter that went back (a slot reused): nothing happened in it
            slots = tuple(max(d, 0) for d in slots)
        count = max(self.count - earlier.count, 0)
        exact_max = self.max_ns if self.max_ns > earlier.max_ns and count else None
        return IntervalHistogram(slots, max(self.sum_ns - earlier.sum_ns, 0), count, exact_max)


@dataclass(frozen=True)
class IntervalHistogram:
    """A histogram over one interval, for percentiles and rates."""

    slots: tuple[int, ...]
    sum_ns: int
    count: int
    exact_max_ns: int | None

    @property
    def mean_ns(self) -> float:
        return self.sum_ns / self.count if self.count else 0.0

    @property
    def max_ns(self) -> float:
        """Exact when known, else the upper bound of the highest populated slot."""
        if self.exact_max_ns is not None:
            return float(self.exact_max_ns)
        for i in range(HIST_SLOTS - 1, -1, -1):
            if self.slots[i]:
                return slot_bounds_us(i)[1] * 1000.0
        return 0.0

    def quantile_ns(self, q: float) -> float:
        """q-quantile, interpolated linearly inside its log2 slot (so within a factor of 2)."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for i, n in enumerate(self.slots):
            if n and seen + n >= rank:
                lo, hi = slot_bounds_us(i)
                if self.exact_max_ns is not None:
                    hi = min(hi, self.exact_max_ns / 1000.0)
                frac = (rank - seen) / n
                return (lo + (max(hi, lo) - lo) * frac) * 1000.0
            seen += n
        return self.max_ns


def merge_intervals(intervals: Iterable[IntervalHistogram]) -> IntervalHistogram:
    """Several keys' interval histograms as one (a workload's cgroups, a CPU's vectors)."""
    slots = [0] * HIST_SLOTS
    total = count = 0
    exact_max: int | None = None
    for d in intervals:
        slots = [a + b for a, b in zip(slots, d.slots, strict=False)]
        total += d.sum_ns
        count += d.count
        if d.exact_max_ns is not None:
            exact_max = max(exact_max or 0, d.exact_max_ns)
    return IntervalHistogram(tuple(slots), total, count, exact_max)


def add_slots(a: tuple[int, ...], b: tuple[int, ...], sign: int) -> tuple[int, ...]:
    """a + sign * b per slot; () for all zeros (the common case: no wait moved)."""
    if not b:
        return a
    if not a:
        a = (0,) * len(b)
    out = tuple(x + sign * y for x, y in zip(a, b, strict=True))
    return out if any(out) else ()


def counterfactual_histogram(victim: IntervalHistogram, moves: tuple[int, ...], removed_ns: int) -> IntervalHistogram:
    """The victim's interval histogram with a culprit's share of each wait taken out: its slots plus the
    culprit's moves (signed, clipped at 0), its sum less the culprit's wait. The count is the same (every
    wait still happens, shorter); its exact max is unknown."""
    if not moves:
        return IntervalHistogram(victim.slots, max(victim.sum_ns - removed_ns, 0), victim.count, victim.exact_max_ns)
    slots = tuple(max(n + m, 0) for n, m in zip(victim.slots, moves, strict=True))
    return IntervalHistogram(slots, max(victim.sum_ns - removed_ns, 0), sum(slots), None)
