# SPDX-License-Identifier: Apache-2.0
"""Robust per-(entity, signal) baselines: what "normal" looks like, so the engine can score deviations.

API (the incident engine builds on exactly this)::

    baselines = Baselines(alpha=2/61, min_samples=30, max_entities=2000)
    baselines.score(entity, signal, value)            # (value - ewma) / max(robust sigma, floor), or None
    baselines.scores(signal, {entity: value, ...})    # the same for many entities: {entity: score} (NaN = no score)
    baselines.outlier(entity, signal, value, k=3.0)   # Caelus rule |x - ewma| > k*sigma with >= 11 samples, or None
    baselines.update_tick({(entity, signal): value, ...}, frozen={entities with an open incident})
    baselines.update(entity, signal, value, learning=True)
    baselines.get(entity, signal) -> Baseline(ewma, sigma, mad_sigma, n) | None
    baselines.entities(); baselines.forget(entity)

Score a tick *before* learning from it (score, then update_tick), so a value is never compared with a
baseline that already contains it. While an incident is open on an entity the engine passes it in
``frozen`` (or ``learning=False``): its values are not learned, so an incident never becomes the new
normal; the entity still counts as recently updated for the entity cap.

The estimators, per (entity, signal), with ``alpha`` the EWMA weight of a new sample:

* ``ewma``: exponentially weighted mean. For the first ``1/alpha`` samples the weight is ``1/n``
  instead (a plain running mean), so the start value does not bias the baseline for minutes.
* ``sigma``: exponentially weighted standard deviation (the incremental EW variance
  ``var = (1 - a) * (var + a * d^2)``, d = x - previous ewma): the plain, non-robust spread Caelus uses.
* ``mad_sigma``: the robust spread, an EWMA of the absolute deviation |x - ewma| expressed in sigma
  units. The brief's "1.4826 * MAD" constant converts a *median* absolute deviation to sigma; an EWMA
  of absolute deviations estimates the *mean* absolute deviation, whose Gaussian conversion factor is
  sqrt(pi/2) ~ 1.2533, so that is the factor used here (1.4826 would overstate sigma by ~18 %; the
  tests check mad_sigma ~ sigma on Gaussian noise). Robustness comes from clipping: once warmed up, a
  deviation enters ``ewma`` and ``mad_sigma`` clipped at ``clip_k`` robust sigmas, so one spike moves
  them by a bounded amount while ``sigma`` takes it in full.

The robust sigma used by ``score`` never goes below a floor, ``max(sigma_floor[signal],
relative_floor * |ewma|)``: a series that was perfectly constant (throttled_ratio = 0 for an hour)
must not turn the first tiny wobble into an infinite score. The per-signal floors are judgement
calls in the signal's own unit (ns, shares, cores, ms/s, PSI percent) and are configurable.

Bounded by entity count like the store (least recently updated dropped first); nothing persists.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass

import numpy as np

from detector.catalog import NOISE_FLOORS
from detector.store import DEFAULT_MAX_ENTITIES, DEFAULT_MAX_SIGNALS, EntityIndex, StoreError

DEFAULT_ALPHA = 2.0 / (60 + 1)  # EWMA span of 60 samples: about a minute at 1 Hz
DEFAULT_MIN_SAMPLES = 30
DEFAULT_CLIP_K = 4.0
DEFAULT_RELATIVE_FLOOR = 0.05
DEFAULT_ABSOLUTE_FLOOR = 1e-9
CAELUS_K = 3.0
CAELUS_MIN_SAMPLES = 11
MEAN_ABS_DEV_TO_SIGMA = math.sqrt(math.pi / 2.0)

# Smallest spread worth calling noise, per signal, in the signal's unit: the catalog's noise floors.
DEFAULT_SIGMA_FLOORS: dict[str, float] = dict(NOISE_FLOORS)


class BaselineError(StoreError):
    """Bad input to the baselines (a one-line message; nothing was applied)."""


@dataclass(frozen=True, slots=True)
class Baseline:
    """The learned normal of one (entity, signal); ``n`` counts the samples learned."""

    ewma: float
    sigma: float
    mad_sigma: float
    n: int


@dataclass(slots=True)
class _SignalState:
    ewma: np.ndarray
    var: np.ndarray
    mean_abs_dev: np.ndarray
    n: np.ndarray

    @classmethod
    def empty(cls, rows: int) -> _SignalState:
        return cls(np.zeros(rows), np.zeros(rows), np.zeros(rows), np.zeros(rows, dtype=np.int64))

    def grow(self, rows: int) -> None:
        extra = rows - len(self.n)
        self.ewma = np.concatenate([self.ewma, np.zeros(extra)])
        self.var = np.concatenate([self.var, np.zeros(extra)])
        self.mean_abs_dev = np.concatenate([self.mean_abs_dev, np.zeros(extra)])
        self.n = np.concatenate([self.n, np.zeros(extra, dtype=np.int64)])

    def reset(self, row: int) -> None:
        self.ewma[row] = self.var[row] = self.mean_abs_dev[row] = 0.0
        self.n[row] = 0


def _as_value(key: object, raw: object) -> float:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BaselineError(f"value for {key!r} is not a number: {raw!r}") from None
    if math.isinf(v):
        raise BaselineError(f"value for {key!r} is infinite")
    return v


class Baselines:
    """EWMA baselines with plain and robust spread per (entity, signal); see the module docstring."""

    def __init__(
        self,
        alpha: float = DEFAULT_ALPHA,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_entities: int = DEFAULT_MAX_ENTITIES,
        sigma_floors: Mapping[str, float] | None = None,
        absolute_floor: float = DEFAULT_ABSOLUTE_FLOOR,
        relative_floor: float = DEFAULT_RELATIVE_FLOOR,
        clip_k: float | None = DEFAULT_CLIP_K,
        max_signals: int = DEFAULT_MAX_SIGNALS,
    ) -> None:
        if not 0 < alpha <= 1:
            raise BaselineError(f"alpha must be in (0, 1], got {alpha!r}")
        if min_samples < 1:
            raise BaselineError(f"min_samples must be >= 1, got {min_samples!r}")
        if clip_k is not None and not clip_k > 0:
            raise BaselineError(f"clip_k must be > 0 or None, got {clip_k!r}")
        self.alpha = float(alpha)
        self.min_samples = int(min_samples)
        self.sigma_floors = dict(DEFAULT_SIGMA_FLOORS if sigma_floors is None else sigma_floors)
        self.absolute_floor = float(absolute_floor)
        self.relative_floor = float(relative_floor)
        self.clip_k = clip_k
        self.max_signals = max_signals
        self._index = EntityIndex(max_entities)
        self._signals: dict[str, _SignalState] = {}
        self._clock = 0  # update counter: the "time" of the LRU order

    # ---- learning ---------------------------------------------------------------------------

    def update(self, entity: str, signal: str, value: float, learning: bool = True) -> None:
        """Learn one sample (NaN = missing: ignored). With ``learning=False`` only mark the entity alive.

        Scalar twin of ``update_tick`` (same arithmetic, in Python floats): the engine calls it per
        value, where a one-element numpy round trip would cost ten times more.
        """
        if not (isinstance(entity, str) and isinstance(signal, str)):
            raise BaselineError(f"entity and signal must be strings, got {entity!r}, {signal!r}")
        x = _as_value((entity, signal), value)
        if math.isnan(x):
            return
        state = self._signals.get(signal)
        if state is None:
            if len(self._signals) >= self.max_signals:
                raise BaselineError(f"too many distinct signals: {len(self._signals) + 1} > max_signals {self.max_signals}")
            state = self._signals[signal] = _SignalState.empty(self._index.capacity)
        self._clock += 1
        row, grown_to, evicted = self._index.touch(entity, float(self._clock))
        if grown_to is not None:
            for st in self._signals.values():
                st.grow(grown_to)
        elif evicted is not None:
            for st in self._signals.values():
                st.reset(row)
        if not learning:
            return
        n = int(state.n[row])
        if n == 0:
            state.ewma[row] = x
            state.var[row] = state.mean_abs_dev[row] = 0.0
            state.n[row] = 1
            return
        ewma = float(state.ewma[row])
        var = float(state.var[row])
        mad = float(state.mean_abs_dev[row])
        a = max(self.alpha, 1.0 / (n + 1))
        d = x - ewma
        robust_d = d
        if self.clip_k is not None and n >= self.min_samples:
            limit = self.clip_k * max(mad * MEAN_ABS_DEV_TO_SIGMA, self.floor(signal, ewma))
            robust_d = min(max(d, -limit), limit)
        state.ewma[row] = ewma + a * robust_d
        state.var[row] = (1.0 - a) * (var + a * d * d)
        state.mean_abs_dev[row] = mad + a * (abs(robust_d) - mad)
        state.n[row] = n + 1

    def update_tick(self, values: Mapping[tuple[str, str], float], frozen: Container[str] = ()) -> None:
        """Learn one tick of values; entities in ``frozen`` are kept alive but not learned from."""
        if not isinstance(values, Mapping):
            raise BaselineError(f"values must be a mapping of (entity, signal) -> float, got {type(values).__name__}")
        items: list[tuple[str, str, float]] = []
        new_signals: set[str] = set()
        for key, raw in values.items():
            if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], str)):
                raise BaselineError(f"key must be an (entity, signal) pair of strings, got {key!r}")
            v = _as_value(key, raw)
            if math.isnan(v):
                continue
            items.append((key[0], key[1], v))
            if key[1] not in self._signals:
                new_signals.add(key[1])
        if len(self._signals) + len(new_signals) > self.max_signals:
            total = len(self._signals) + len(new_signals)
            raise BaselineError(f"too many distinct signals: {total} > max_signals {self.max_signals}")

        for signal in new_signals:
            self._signals[signal] = _SignalState.empty(self._index.capacity)
        self._clock += 1
        # Phase 1: one row per entity. An entity evicted during this very tick (more entities in one
        # tick than the cap) loses its values for the tick instead of writing into its successor's row.
        rows: dict[str, int] = {}
        for entity, _, _ in items:
            if entity in rows:
                continue
            row, grown_to, evicted = self._index.touch(entity, float(self._clock))
            if grown_to is not None:
                for state in self._signals.values():
                    state.grow(grown_to)
            elif evicted is not None:
                rows.pop(evicted, None)
                for state in self._signals.values():
                    state.reset(row)
            rows[entity] = row
        # Phase 2: vectorised update per signal.
        grouped: dict[str, tuple[list[int], list[float]]] = {}
        for entity, signal, v in items:
            row = rows.get(entity)
            if row is None or entity in frozen:
                continue
            group = grouped.get(signal)
            if group is None:
                group = grouped[signal] = ([], [])
            group[0].append(row)
            group[1].append(v)
        for signal, (row_list, value_list) in grouped.items():
            self._learn(signal, np.asarray(row_list, dtype=np.intp), np.asarray(value_list))

    def _learn(self, signal: str, rows: np.ndarray, x: np.ndarray) -> None:
        state = self._signals[signal]
        n = state.n[rows]
        ewma = state.ewma[rows]
        var = state.var[rows]
        mad = state.mean_abs_dev[rows]
        first = n == 0
        # Running mean for the first 1/alpha samples, then the fixed EWMA weight.
        a = np.maximum(self.alpha, 1.0 / (n + 1))
        d = x - ewma
        robust_d = d
        if self.clip_k is not None:
            limit = self.clip_k * self._floored(signal, ewma, mad * MEAN_ABS_DEV_TO_SIGMA)
            robust_d = np.where(n >= self.min_samples, np.clip(d, -limit, limit), d)
        state.ewma[rows] = np.where(first, x, ewma + a * robust_d)
        state.var[rows] = np.where(first, 0.0, (1.0 - a) * (var + a * d * d))
        state.mean_abs_dev[rows] = np.where(first, 0.0, mad + a * (np.abs(robust_d) - mad))
        state.n[rows] = n + 1

    def forget(self, entity: str) -> bool:
        row = self._index.remove(entity)
        if row is None:
            return False
        for state in self._signals.values():
            state.reset(row)
        return True

    # ---- reading ----------------------------------------------------------------------------

    def entities(self) -> list[str]:
        """Entities with a baseline, least recently updated first."""
        return self._index.names()

    def __len__(self) -> int:
        return len(self._index)

    def floor(self, signal: str, ewma: float) -> float:
        """Smallest sigma ``score`` divides by for this signal at this level."""
        return max(self.sigma_floors.get(signal, self.absolute_floor), self.relative_floor * abs(ewma))

    def _floored(self, signal: str, ewma: np.ndarray, spread: np.ndarray) -> np.ndarray:
        absolute = self.sigma_floors.get(signal, self.absolute_floor)
        return np.maximum(spread, np.maximum(absolute, self.relative_floor * np.abs(ewma)))

    def get(self, entity: str, signal: str) -> Baseline | None:
        row = self._index.row(entity)
        state = self._signals.get(signal)
        if row is None or state is None or state.n[row] == 0:
            return None
        return Baseline(
            ewma=float(state.ewma[row]),
            sigma=math.sqrt(float(state.var[row])),
            mad_sigma=float(state.mean_abs_dev[row]) * MEAN_ABS_DEV_TO_SIGMA,
            n=int(state.n[row]),
        )

    def score(self, entity: str, signal: str, value: float) -> float | None:
        """(value - ewma) / max(robust sigma, floor); None before ``min_samples`` or for a missing value."""
        v = _as_value((entity, signal), value)
        base = self.get(entity, signal)
        if base is None or base.n < self.min_samples or math.isnan(v):
            return None
        return (v - base.ewma) / max(base.mad_sigma, self.floor(signal, base.ewma))

    def scores(self, signal: str, values: Mapping[str, float]) -> dict[str, float]:
        """``score`` for many entities of one signal at once (NaN where there is no score)."""
        entities = list(values)
        state = self._signals.get(signal)
        out = np.full(len(entities), np.nan)
        if state is not None and entities:
            positions: list[int] = []
            rows: list[int] = []
            for pos, entity in enumerate(entities):
                row = self._index.row(entity)
                if row is not None:
                    positions.append(pos)
                    rows.append(row)
            if rows:
                r = np.asarray(rows, dtype=np.intp)
                x = np.fromiter(values.values(), dtype=float, count=len(entities))[positions]
                ewma = state.ewma[r]
                spread = self._floored(signal, ewma, state.mean_abs_dev[r] * MEAN_ABS_DEV_TO_SIGMA)
                got = (x - ewma) / spread
                got[state.n[r] < self.min_samples] = np.nan
                out[positions] = got
        return dict(zip(entities, out.tolist(), strict=True))

    def outlier(
        self, entity: str, signal: str, value: float, k: float = CAELUS_K, min_samples: int = CAELUS_MIN_SAMPLES
    ) -> bool | None:
        """Caelus rule: |value - ewma| > k * sigma (plain sigma, floored) once ``min_samples`` were learned."""
        v = _as_value((entity, signal), value)
        base = self.get(entity, signal)
        if base is None or base.n < min_samples or math.isnan(v):
            return None
        return abs(v - base.ewma) > k * max(base.sigma, self.floor(signal, base.ewma))
