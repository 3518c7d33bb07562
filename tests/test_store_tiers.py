# SPDX-License-Identifier: Apache-2.0
"""SignalStore's two tiers: an idle entity costs a sparse ring, not a dense column, and every query
answers exactly as from the plain (tick, entity) table while entities move between the tiers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.runtime import store_for
from detector.store import SPARSE_SAMPLES, VALUE_DTYPE, SignalStore

SIGNALS = ("cpu_cores", "runq_p99_ns", "memory_bytes")


def test_an_idle_workload_costs_a_sparse_ring_not_a_dense_column() -> None:
    """300 pods whose task wakes every 30 s and 3 busy ones, as the agent's store holds them at 1 s
    ticks: the idle pods stay sparse and the store holds a fraction of the dense table's bytes."""
    busy = [f"busy-{i}" for i in range(3)]
    idle = [f"idle-{i}" for i in range(300)]
    stores = {}
    for name, idle_pods in (("busy only", []), ("busy and idle", idle)):
        store = stores[name] = store_for(1.0)
        for t in range(400):
            values = {(e, s): float(t + 1) for e in busy for s in SIGNALS}
            values.update({(e, s): 1.0 for i, e in enumerate(idle_pods) if (t + i) % 30 == 0 for s in SIGNALS})
            store.add(float(t), values)
    store = stores["busy and idle"]
    assert store.tier_sizes() == (3, 300)
    assert store.stats("idle-7", "cpu_cores", 300).n == 10
    # What the 300 idle pods cost, capacity headroom included, against a dense column each.
    idle_bytes = store.nbytes() - stores["busy only"].nbytes()
    dense_columns = 300 * store.tick_capacity * len(SIGNALS) * np.dtype(VALUE_DTYPE).itemsize
    assert idle_bytes < dense_columns / 4
    assert idle_bytes < 300 * SPARSE_SAMPLES * (len(SIGNALS) * np.dtype(VALUE_DTYPE).itemsize + 8) * 1.4


def _expected(values: list[float]) -> tuple:
    present = np.array([v for v in values if not math.isnan(v)])
    if not len(present):
        return (0,)
    return (len(present), float(np.mean(present)), float(np.median(present)), float(np.percentile(present, 90)),
            float(np.max(present)), float(present[-1]), float(np.std(present)), float(np.min(present)))


def _approx_equal(got, want: tuple) -> bool:
    if want[0] == 0:
        return got.n == 0
    fields = (got.n, got.mean, got.median, got.p90, got.max, got.last, got.std, got.min)
    return fields[0] == want[0] and all(a == pytest.approx(b, rel=1e-12, abs=1e-12) for a, b in zip(fields[1:], want[1:],
                                                                                                   strict=True))


def test_answers_equal_the_plain_table_while_entities_change_tier() -> None:
    """Entities that are busy, idle, busy then idle, or idle then busy, with missing values, merged
    ticks and forgotten entities: stats, window, frame and correlation equal a plain per-tick table."""
    rng = np.random.default_rng(23)
    retention = 120.0
    store = SignalStore(retention_s=retention)
    # Rate of each entity by phase (ticks 0-149, 150-299, 300-449): the chance of a value in a tick.
    rates = {"steady": (1.0, 1.0, 1.0), "idle": (0.03, 0.03, 0.03), "burst": (0.02, 0.9, 0.02),
             "quiet": (0.9, 0.02, 0.02), "wakes": (0.02, 0.02, 0.95), "half": (0.3, 0.3, 0.3)}
    table: list[tuple[float, dict[tuple[str, str], float]]] = []  # (ts, values) per tick
    tiers_seen: set[tuple[int, int]] = set()
    for tick in range(450):
        ts = float(tick)
        phase = tick // 150
        values: dict[tuple[str, str], float] = {}
        for name, rate in rates.items():
            for k in range(4):
                if rng.random() < rate[phase]:
                    for s in SIGNALS:
                        values[(f"{name}-{k}", s)] = math.nan if rng.random() < 0.1 else float(rng.lognormal(5, 1))
        store.add(ts, values)
        merged = {(f"steady-{k}", "late_signal"): float(tick + k) for k in range(2)}
        store.add(ts, merged)  # the same tick again: merged into it
        values.update(merged)
        table.append((ts, {k: float(np.float32(v)) for k, v in values.items()}))
        if tick == 200:
            assert store.forget("burst-3")
            for _, vals in table:
                for key in [k for k in vals if k[0] == "burst-3"]:
                    del vals[key]
        tiers_seen.add(store.tier_sizes())
        if tick % 37 != 36:
            continue
        now = ts
        for seconds in (1, 10, 60, 1000):
            ticks = [(t, v) for t, v in table if t > now - min(seconds, retention) and t <= now]
            for name in rates:
                for k in range(4):
                    entity = f"{name}-{k}"
                    for s in (*SIGNALS, "late_signal"):
                        series = [v.get((entity, s), math.nan) for _, v in ticks]
                        got = store.stats(entity, s, seconds)
                        assert _approx_equal(got, _expected(series)), (tick, entity, s, seconds)
                        window = store.window(entity, s, seconds)
                        want = [(t, v[(entity, s)]) for t, v in ticks if not math.isnan(v.get((entity, s), math.nan))]
                        assert window.items() == want
            frame = store.frame("runq_p99_ns", seconds, "max")
            want_frame = {}
            for name in rates:
                for k in range(4):
                    series = [v.get((f"{name}-{k}", "runq_p99_ns"), math.nan) for _, v in ticks]
                    if _expected(series)[0]:
                        want_frame[f"{name}-{k}"] = _expected(series)[4]
            assert frame == want_frame
            a = [v.get(("steady-0", "cpu_cores"), math.nan) for _, v in ticks]
            for other in ("half-1", "burst-0", "wakes-2"):
                b = [v.get((other, "runq_p99_ns"), math.nan) for _, v in ticks]
                both = [(x, y) for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
                got_corr = store.correlation("steady-0", "cpu_cores", other, "runq_p99_ns", seconds)
                if len(both) < 5:
                    assert got_corr is None
                else:
                    xs, ys = np.array(both).T
                    assert got_corr == pytest.approx(float(np.corrcoef(xs, ys)[0, 1]), abs=1e-9)
    # The feed moved entities both ways: dense counts rose (bursts) and fell again (quiet, burst over).
    dense_counts = sorted({d for d, _ in tiers_seen})
    assert dense_counts[0] < 8 < dense_counts[-1]
    assert store.tier_sizes()[0] < dense_counts[-1]
