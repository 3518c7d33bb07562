# SPDX-License-Identifier: Apache-2.0
"""Baselines: convergence, freezing, score sign and scale, the Caelus rule, NaN and bad input, bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.baseline import MEAN_ABS_DEV_TO_SIGMA, Baseline, BaselineError, Baselines


def learn(baselines: Baselines, entity: str, signal: str, values: np.ndarray, learning: bool = True) -> None:
    for v in values:
        baselines.update(entity, signal, float(v), learning=learning)


def test_converges_on_stationary_gaussian_series() -> None:
    rng = np.random.default_rng(1)
    mu, sd = 200_000.0, 20_000.0
    baselines = Baselines()
    learn(baselines, "pod", "runq_p99_ns", rng.normal(mu, sd, size=3000))
    base = baselines.get("pod", "runq_p99_ns")
    assert isinstance(base, Baseline)
    assert base.n == 3000
    # An EWMA with span 60 has its own noise: sd/sqrt(~60) for the mean, ~10-15 % for the spreads.
    assert base.ewma == pytest.approx(mu, abs=4 * sd / math.sqrt(30))
    assert base.sigma == pytest.approx(sd, rel=0.3)
    assert base.mad_sigma == pytest.approx(sd, rel=0.3)


def test_spread_estimates_are_unbiased_on_average() -> None:
    """Averaged over many independent series the spreads land on the true sigma (catches a wrong constant)."""
    rng = np.random.default_rng(2)
    baselines = Baselines(min_samples=10)
    sd = 3.0
    for i in range(200):
        learn(baselines, f"e{i}", "x", rng.normal(50.0, sd, size=400))
    sigmas = [baselines.get(f"e{i}", "x").sigma for i in range(200)]  # type: ignore[union-attr]
    mads = [baselines.get(f"e{i}", "x").mad_sigma for i in range(200)]  # type: ignore[union-attr]
    # With 1.4826 instead of sqrt(pi/2) the robust mean would be ~1.18 * sd and fail here.
    assert np.mean(sigmas) == pytest.approx(sd, rel=0.05)
    assert np.mean(mads) == pytest.approx(sd, rel=0.05)


def test_first_samples_are_a_running_mean() -> None:
    baselines = Baselines()
    learn(baselines, "e", "x", np.array([10.0, 20.0, 30.0, 40.0]))
    base = baselines.get("e", "x")
    assert base is not None
    assert base.ewma == pytest.approx(25.0)
    assert base.sigma == pytest.approx(float(np.std([10.0, 20.0, 30.0, 40.0])), rel=0.25)


def test_tracks_a_level_shift_while_learning() -> None:
    baselines = Baselines()
    rng = np.random.default_rng(4)
    learn(baselines, "e", "cpu_cores", rng.normal(1.0, 0.1, size=300))
    learn(baselines, "e", "cpu_cores", rng.normal(3.0, 0.1, size=600))
    base = baselines.get("e", "cpu_cores")
    assert base is not None and base.ewma == pytest.approx(3.0, abs=0.1)


def test_frozen_entity_does_not_learn() -> None:
    rng = np.random.default_rng(5)
    baselines = Baselines()
    learn(baselines, "victim", "runq_p99_ns", rng.normal(100_000, 10_000, size=200))
    learn(baselines, "other", "runq_p99_ns", rng.normal(100_000, 10_000, size=200))
    before = baselines.get("victim", "runq_p99_ns")
    # An incident: latency 10x for two minutes. Frozen through update_tick and through update(learning=False).
    for i in range(120):
        spike = float(rng.normal(1_000_000, 10_000))
        baselines.update_tick({("victim", "runq_p99_ns"): spike, ("other", "runq_p99_ns"): spike}, frozen={"victim"})
        baselines.update("victim", "runq_p99_ns", spike + i, learning=False)
    assert baselines.get("victim", "runq_p99_ns") == before
    assert baselines.score("victim", "runq_p99_ns", 1_000_000) > 20
    # The same values were learned by the entity that was not frozen.
    other = baselines.get("other", "runq_p99_ns")
    assert other is not None and other.ewma > 900_000


def test_score_sign_and_scale() -> None:
    rng = np.random.default_rng(6)
    baselines = Baselines(relative_floor=0.0, sigma_floors={})
    values = rng.normal(10.0, 2.0, size=2000)
    learn(baselines, "e", "x", values)
    base = baselines.get("e", "x")
    assert base is not None
    up = baselines.score("e", "x", base.ewma + 3 * base.mad_sigma)
    down = baselines.score("e", "x", base.ewma - 2 * base.mad_sigma)
    assert up == pytest.approx(3.0)
    assert down == pytest.approx(-2.0)
    assert baselines.score("e", "x", base.ewma) == pytest.approx(0.0, abs=1e-12)
    # Scores of fresh samples from the same distribution look like z-scores.
    fresh = np.array([baselines.score("e", "x", float(v)) for v in rng.normal(10.0, 2.0, size=2000)])
    assert abs(float(np.median(fresh))) < 0.3
    assert float(np.mean(np.abs(fresh) > 3)) < 0.03


def test_score_needs_min_samples_and_a_value() -> None:
    baselines = Baselines(min_samples=30)
    learn(baselines, "e", "x", np.ones(29))
    assert baselines.score("e", "x", 5.0) is None
    baselines.update("e", "x", 1.0)
    assert baselines.score("e", "x", 5.0) is not None
    assert baselines.score("e", "x", math.nan) is None
    assert baselines.score("nobody", "x", 5.0) is None
    assert baselines.score("e", "no_such_signal", 5.0) is None


def test_floor_keeps_constant_series_finite() -> None:
    baselines = Baselines()
    learn(baselines, "e", "throttled_ratio", np.zeros(100))
    base = baselines.get("e", "throttled_ratio")
    assert base is not None and base.sigma == 0.0 and base.mad_sigma == 0.0
    assert baselines.score("e", "throttled_ratio", 0.05) == pytest.approx(0.05 / 0.01)
    learn(baselines, "e", "unknown_signal", np.full(100, 200.0))
    # Relative floor: 5 % of the level.
    assert baselines.score("e", "unknown_signal", 210.0) == pytest.approx(1.0)


def test_robust_spread_resists_spikes_plain_sigma_does_not() -> None:
    rng = np.random.default_rng(8)
    # No floors, so the clip is set by the learned spread alone (with the default 5 % relative floor
    # the clip would be 4 * 5 = 20 here and the robust spread would grow ~3x instead of ~1.3x).
    baselines = Baselines(relative_floor=0.0, sigma_floors={})
    learn(baselines, "e", "x", rng.normal(100.0, 1.0, size=300))
    before = baselines.get("e", "x")
    for v in rng.normal(100.0, 1.0, size=60):
        baselines.update("e", "x", float(v))
    for _ in range(3):
        baselines.update("e", "x", 10_000.0)
    after = baselines.get("e", "x")
    assert before is not None and after is not None
    assert after.sigma > 50 * before.sigma  # a plain EW sigma swallows the spikes
    assert after.mad_sigma < 1.5 * before.mad_sigma
    assert after.ewma == pytest.approx(100.0, abs=1.0)


def test_caelus_rule() -> None:
    rng = np.random.default_rng(9)
    baselines = Baselines()
    learn(baselines, "e", "x", rng.normal(50.0, 5.0, size=10))
    assert baselines.outlier("e", "x", 500.0) is None  # fewer than 11 samples
    baselines.update("e", "x", 50.0)
    base = baselines.get("e", "x")
    assert base is not None and base.n == 11
    assert baselines.outlier("e", "x", base.ewma + 3.2 * base.sigma) is True
    assert baselines.outlier("e", "x", base.ewma - 3.2 * base.sigma) is True
    assert baselines.outlier("e", "x", base.ewma + 2.8 * base.sigma) is False
    assert baselines.outlier("e", "x", math.nan) is None


def test_nan_values_are_ignored() -> None:
    baselines = Baselines()
    baselines.update_tick({("e", "x"): 1.0, ("f", "x"): math.nan})
    baselines.update("e", "x", math.nan)
    base = baselines.get("e", "x")
    assert base is not None and base.n == 1 and base.ewma == 1.0
    assert baselines.entities() == ["e"]


def test_scores_vectorised_matches_score() -> None:
    rng = np.random.default_rng(10)
    baselines = Baselines()
    for _ in range(50):
        baselines.update_tick({(f"e{i}", "runq_p99_ns"): float(rng.normal(1e5 * (i + 1), 1e4)) for i in range(20)})
    baselines.update_tick({("young", "runq_p99_ns"): 1e5})
    probe = {f"e{i}": float(rng.normal(1e5 * (i + 1), 3e4)) for i in range(20)}
    probe["young"] = 2e5
    probe["unknown"] = 1.0
    got = baselines.scores("runq_p99_ns", probe)
    for entity, value in probe.items():
        want = baselines.score(entity, "runq_p99_ns", value)
        if want is None:
            assert math.isnan(got[entity])
        else:
            assert got[entity] == pytest.approx(want, rel=1e-12)
    assert all(math.isnan(v) for v in baselines.scores("nothing", {"e0": 1.0}).values())


def test_entity_cap_drops_least_recently_updated() -> None:
    baselines = Baselines(max_entities=100)
    for tick in range(1000):
        values = {(f"stable-{i}", "x"): 1.0 for i in range(50)}
        values.update({(f"churn-{tick}-{j}", "x"): 1.0 for j in range(5)})
        baselines.update_tick(values)
        assert len(baselines) <= 100
    assert all(baselines.get(f"stable-{i}", "x") is not None for i in range(50))
    assert baselines.get("stable-0", "x").n == 1000  # type: ignore[union-attr]
    assert baselines.get("churn-0-0", "x") is None


def test_reused_row_starts_fresh_and_forget() -> None:
    baselines = Baselines(max_entities=1)
    learn(baselines, "a", "x", np.full(40, 7.0))
    baselines.update("b", "x", 3.0)
    assert baselines.get("a", "x") is None
    assert baselines.get("b", "x") == Baseline(ewma=3.0, sigma=0.0, mad_sigma=0.0, n=1)
    assert baselines.forget("b") is True
    assert baselines.forget("b") is False
    assert baselines.entities() == []


@pytest.mark.parametrize(
    ("values", "message"),
    [({("e", "x"): "high"}, "not a number"), ({("e", "x"): math.inf}, "infinite"), ({"e": 1.0}, "pair of strings")],
)
def test_bad_input_is_rejected_without_half_applying(values: dict, message: str) -> None:
    baselines = Baselines()
    baselines.update("e", "x", 1.0)
    with pytest.raises(BaselineError, match=message):
        baselines.update_tick({("e", "x"): 2.0, ("new", "x"): 2.0, **values})
    assert baselines.get("e", "x") == Baseline(1.0, 0.0, 0.0, 1)
    assert baselines.entities() == ["e"]
    with pytest.raises(BaselineError, match="not a number"):
        baselines.score("e", "x", "high")  # type: ignore[arg-type]


def test_bad_constructor_arguments() -> None:
    with pytest.raises(BaselineError, match="alpha"):
        Baselines(alpha=0)
    with pytest.raises(BaselineError, match="min_samples"):
        Baselines(min_samples=0)
    with pytest.raises(BaselineError, match="clip_k"):
        Baselines(clip_k=-1)
    assert pytest.approx(1.2533, abs=1e-4) == MEAN_ABS_DEV_TO_SIGMA


def test_scalar_and_tick_paths_agree() -> None:
    rng = np.random.default_rng(12)
    values = rng.normal(100.0, 5.0, size=400)
    values[::37] = 5_000.0  # spikes exercise the clipping branch
    values[::53] = np.nan
    one = Baselines()
    many = Baselines()
    for v in values:
        one.update("e", "runq_p99_ns", float(v))
        many.update_tick({("e", "runq_p99_ns"): float(v), ("f", "runq_p99_ns"): 1.0})
    a = one.get("e", "runq_p99_ns")
    b = many.get("e", "runq_p99_ns")
    assert a is not None and b is not None and a.n == b.n == int(np.sum(~np.isnan(values)))
    for field in ("ewma", "sigma", "mad_sigma"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-12)
