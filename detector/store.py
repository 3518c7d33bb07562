# SPDX-License-Identifier: Apache-2.0
"""The detector's short-term memory: per entity and signal, one float per tick, for the last few minutes.

An *entity* is a string key (a pod UID, a cgroup path, ...); a *signal* is a string such as
``runq_p99_ns``, ``runq_wait_share``, ``throttled_ratio``, ``cpu_cores``, ``reclaim_stall_ms_per_s``,
``psi_cpu_some``, ``connect_p99_ns`` or ``softirq_delay_p99_ns``. Timestamps are monotonic seconds
(ticks are ~1 s apart, but any spacing works). NaN means "missing" everywhere.

API (the incident engine builds on exactly this)::

    store = SignalStore(retention_s=300.0, max_entities=2000)
    store.add(ts, {(entity, signal): value, ...})     # one tick, any subset; same ts again merges into that tick
    store.window(entity, signal, seconds)             # Window: the present values and their ts, oldest first
    store.stats(entity, signal, seconds)              # WindowStats(n, mean, median, p90, max, last, std, min)
    store.stats_frame(signal, seconds)                # {entity: WindowStats} for every entity with data
    store.frame(signal, seconds, agg="mean")          # {entity: one aggregated value}
    store.correlation(ent_a, sig_a, ent_b, sig_b, seconds)  # Pearson over aligned ticks, or None
    store.entities(); store.signals(); store.forget(entity); store.now

Window semantics: a window of ``seconds`` holds the ticks with ``now - seconds < ts <= now`` where
``now`` is the latest tick added (so at 1 Hz a 1 s window is the last tick, 10 s the last ten).
Statistics ignore missing values; ``n`` counts the present ones, ``std`` is the population standard
deviation (ddof=0, like ``numpy.std``), ``p90``/``median`` use numpy's default linear interpolation,
``last`` is the most recent present value. An entity or signal with no data gives ``n == 0`` and NaN
statistics rather than an error, because the engine asks about entities that may just have gone.

Memory is bounded twice. By time: ticks older than ``retention_s`` are dropped (the tick ring holds
``tick_capacity`` ticks, by default enough for ticks 0.8 s apart; if ticks come faster than that the
oldest are dropped earlier), and an entity with no value for ``retention_s`` is forgotten. By entity
count: at ``max_entities`` the least recently updated entity is dropped to make room.

Layout, in two tiers. An entity with a value in most ticks has a column of the dense tier: per signal
one ``(tick slot, column)`` float32 array, a tick writes one row of it. An entity with values in few
ticks (most pods of a node: their tasks wake now and then) has a ring of ``SPARSE_SAMPLES`` samples
instead, each the values of one tick and that tick's number, so an idle pod costs a tenth of a dense
column. Entities move between the tiers as their rate changes; queries see one (tick, entity) block
either way, so answers do not depend on the tier. A tick's writes are a vectorised scatter per signal
and query results are built only when a query returns (numpy only: pandas cost the agent 40 MiB of
RSS to import).
Whole-window statistics for all entities are computed in
one vectorised pass per (signal, seconds) and cached until the next change, so the engine can call
``stats()`` for every entity each tick for a couple of microseconds each. Measured here (2 shared cores,
under load from other work): 500 entities x 10 signals, one ``add`` ~1.6 ms; stats over 10 s and 60 s
for all 500 entities on 2 signals ~3.4 ms; arrays 13 MiB (``bench/detector.py`` has the full numbers;
these were measured before the sparse tier, with every entity dense).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, NoReturn

import numpy as np

# Values are kept as float32 (7 significant digits: latencies, rates and shares need no more) and
# read back as float64: the arrays are most of the detector's memory (300 pods, 5 minutes: 5 MiB, not 10).
VALUE_DTYPE = np.float32

DEFAULT_RETENTION_S = 300.0
DEFAULT_MAX_ENTITIES = 2000
DEFAULT_MAX_SIGNALS = 64
MIN_POINTS_FOR_CORRELATION = 5
_INITIAL_ROWS = 64
_ROW_STEP = 64  # capacities are multiples of this


def _rows_for(entities: int) -> int:
    """The capacity for this many entities: 25 % headroom, in steps of _ROW_STEP."""
    return max(_INITIAL_ROWS, -(-(entities * 5 // 4 + 1) // _ROW_STEP) * _ROW_STEP)



class StoreError(ValueError):
    """Bad input to the store (a one-line message; nothing was applied)."""


@dataclass(slots=True)
class WindowStats:
    """Statistics of one entity's signal over a window; NaN fields when ``n == 0``.

    Not frozen on purpose: a frozen dataclass's ``__init__`` costs ~7x more, and the engine builds
    thousands of these per tick. Every call returns a fresh record, so mutating one is harmless.
    """

    n: int
    mean: float
    median: float
    p90: float
    max: float
    last: float
    std: float
    min: float

    @property
    def empty(self) -> bool:
        return self.n == 0


_EMPTY_VALUES = (0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
STAT_FIELDS = ("n", "mean", "median", "p90", "max", "last", "std", "min")
FRAME_AGGS = (*STAT_FIELDS, "sum")


@dataclass(frozen=True)
class Window:
    """The present values of one series over a window, and the timestamps of their ticks, oldest first."""

    ts: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    @property
    def empty(self) -> bool:
        return not len(self.values)

    def items(self) -> list[tuple[float, float]]:
        return list(zip(self.ts.tolist(), self.values.tolist(), strict=True))


class EntityIndex:
    """Maps entity names to array rows, least recently updated first, with a hard cap.

    Shared by the store and the baselines so both drop entities the same way. Rows are reused after
    an entity is dropped; the owner clears the row's data through the ``on_free`` callback.
    """

    def __init__(self, max_entities: int, initial_rows: int = _INITIAL_ROWS) -> None:
        """``initial_rows`` 0: no rows until the first entity, and none again once the last is gone
        (the store's two tiers, of which one is often empty)."""
        if max_entities < 1:
            raise StoreError(f"max_entities must be >= 1, got {max_entities}")
        self.max_entities = max_entities
        self.min_rows = min(initial_rows, max_entities)
        self.capacity = self.min_rows
        self._rows: OrderedDict[str, int] = OrderedDict()  # order = least recently touched first
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self.last_touch_ts = np.full(self.capacity, -np.inf)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, entity: object) -> bool:
        return entity in self._rows

    def names(self) -> list[str]:
        return list(self._rows)

    def row(self, entity: str) -> int | None:
        return self._rows.get(entity)

    def items(self) -> Iterable[tuple[str, int]]:
        return self._rows.items()

    def touch(self, entity: str, ts: float) -> tuple[int, int | None, str | None]:
        """Row for ``entity`` (created if new), marked most recently used.

        Returns (row, grown_to, evicted): ``grown_to`` is the new capacity when the arrays must grow,
        ``evicted`` the entity dropped to make room; it owned ``row`` and its data must be cleared.
        """
        row = self._rows.get(entity)
        if row is not None:
            self._rows.move_to_end(entity)
            self.last_touch_ts[row] = ts
            return row, None, None
        grown_to: int | None = None
        evicted: str | None = None
        if not self._free:
            if self.capacity < self.max_entities:
                grown_to = min(max(_rows_for(len(self._rows) + 1), self.capacity + _ROW_STEP), self.max_entities)
                self._free = list(range(grown_to - 1, self.capacity - 1, -1))
                self.last_touch_ts = np.concatenate([self.last_touch_ts, np.full(grown_to - self.capacity, -np.inf)])
                self.capacity = grown_to
            else:
                evicted, evicted_row = self._rows.popitem(last=False)
                self._free.append(evicted_row)
        row = self._free.pop()
        self._rows[entity] = row
        self.last_touch_ts[row] = ts
        return row, grown_to, evicted

    def remove(self, entity: str) -> int | None:
        row = self._rows.pop(entity, None)
        if row is not None:
            self._free.append(row)
            self.last_touch_ts[row] = -np.inf
        return row

    def shrink(self) -> np.ndarray | None:
        """Fit the capacity to the entities left once at most 60 % of it is used (to 80 % full, so
        the next growth is far off: no flapping). The kept entities get rows 0..n-1 in their order;
        returns their old rows in that order (the owner moves its columns: ``arr[:, old]``), or None
        when nothing shrank. Without it the arrays keep the size of the largest crowd ever seen:
        after pod churn, more memory for the same pods."""
        if not self._rows and self.min_rows == 0:
            capacity = 0
        elif self.capacity <= _INITIAL_ROWS or len(self._rows) * 5 > self.capacity * 3:
            return None
        else:
            capacity = min(_rows_for(len(self._rows)), self.capacity)
        if capacity == self.capacity:
            return None
        old_rows = np.fromiter(self._rows.values(), dtype=np.intp, count=len(self._rows))
        touched = self.last_touch_ts[old_rows]
        self._rows = OrderedDict((entity, i) for i, entity in enumerate(self._rows))
        self.capacity = capacity
        self._free = list(range(capacity - 1, len(self._rows) - 1, -1))
        self.last_touch_ts = np.full(capacity, -np.inf)
        self.last_touch_ts[: len(old_rows)] = touched
        return old_rows

    def expire(self, cutoff_ts: float) -> list[int]:
        """Drop entities last touched at or before ``cutoff_ts``; returns their rows."""
        return [row for _, row in self.expire_entries(cutoff_ts)]

    def expire_entries(self, cutoff_ts: float) -> list[tuple[str, int]]:
        """Drop entities last touched at or before ``cutoff_ts``; returns them with their rows."""
        freed: list[tuple[str, int]] = []
        while self._rows:
            entity, row = next(iter(self._rows.items()))
            if self.last_touch_ts[row] > cutoff_ts:
                break
            del self._rows[entity]
            self._free.append(row)
            self.last_touch_ts[row] = -np.inf
            freed.append((entity, row))
        return freed


def _raise_bad_item(values: Mapping) -> NoReturn:
    """Name the first item of a tick that is not ``(str, str) -> finite float or NaN``."""
    for key, raw in values.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], str)):
            raise StoreError(f"tick key must be an (entity, signal) pair of strings, got {key!r}")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise StoreError(f"value for {key!r} is not a number: {raw!r}") from None
        if math.isinf(v):
            raise StoreError(f"value for {key!r} is infinite")
    raise StoreError("tick values are not all (entity, signal) -> float")


def _check_seconds(seconds: float) -> float:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise StoreError(f"window seconds must be a number, got {seconds!r}") from None
    if not s > 0:  # also rejects NaN
        raise StoreError(f"window seconds must be > 0, got {seconds!r}")
    return s


def _column_stats(block: np.ndarray) -> dict[str, np.ndarray]:
    """WindowStats fields for every column of ``block`` (ticks x entities, chronological, NaN = missing)."""
    cols = block.shape[1]
    if block.shape[0] == 0:
        nan = np.full(cols, np.nan)
        return {"n": np.zeros(cols, dtype=np.intp), "mean": nan, "median": nan, "p90": nan, "max": nan, "last": nan,
                "std": nan, "min": nan, "sum": np.zeros(cols)}
    valid = ~np.isnan(block)
    n = valid.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.where(valid, block, 0.0).sum(axis=0)
        mean = total / n
        std = np.sqrt(np.where(valid, (block - mean) ** 2, 0.0).sum(axis=0) / n)
    # np.sort puts NaN last, so each column's present values are its first n entries, ascending.
    ordered = np.sort(block, axis=0)
    idx_cols = np.arange(cols)
    safe_top = np.maximum(n - 1, 0)

    def quantile(q: float) -> np.ndarray:
        # numpy's default "linear" method: position (n-1)*q between the two neighbouring order statistics.
        pos = safe_top * q
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, safe_top)
        frac = pos - lo
        a = ordered[lo, idx_cols]
        b = ordered[hi, idx_cols]
        return np.where(frac == 0, a, a + frac * (b - a))

    empty = n == 0
    last_pos = block.shape[0] - 1 - np.argmax(valid[::-1], axis=0)
    last = block[last_pos, idx_cols]
    median = quantile(0.5)
    p90 = quantile(0.9)
    vmax = ordered[safe_top, idx_cols]
    vmin = ordered[0, idx_cols]
    for arr in (median, p90, vmax, vmin, last):
        arr[empty] = np.nan
    return {"n": n, "mean": mean, "median": median, "p90": p90, "max": vmax, "last": last, "std": std, "min": vmin,
            "sum": total}


# A workload with a value in few ticks (a pod whose task wakes every 30 s: ~10 of a 5-minute retention's
# 300 ticks) keeps its samples in a ring of its own, each with its tick's number: 32 samples cost a tenth
# of a column of the dense (tick slot, workload) arrays, which for such a pod is ~97 % NaN (300 idle pods:
# 5 MiB of the agent's RSS). A workload whose ring is full of samples still inside the retention moves to
# the dense arrays; one whose dense column holds at most half a ring's samples moves back (looked at
# every _DEMOTE_EVERY ticks: the gap between the two keeps a workload from flapping between them).
SPARSE_SAMPLES = 32
_DEMOTE_AT = SPARSE_SAMPLES // 2
_DEMOTE_EVERY = 32


def _resized(arr: np.ndarray, capacity: int, fill: float, cols: np.ndarray | None = None) -> np.ndarray:
    """``arr`` with ``capacity`` columns (its last axis), new cells ``fill``: its columns kept in place, or
    ``cols`` of them moved to the front in that order (a shrink)."""
    out = np.full((*arr.shape[:-1], capacity), fill, dtype=arr.dtype)
    if cols is None:
        kept = min(arr.shape[-1], capacity)
        out[..., :kept] = arr[..., :kept]
    else:
        out[..., : len(cols)] = arr[..., cols]
    return out


class _SampleTiers:
    """SignalStore's two tiers of samples (see the module docstring): where a tick's values go,
    the moves between the tiers, and an entity's or a signal's values read back as (tick, entity).
    Its state is made by SignalStore.__init__."""

    _index: EntityIndex
    _dense: EntityIndex
    _sparse: EntityIndex
    _data: dict[str, np.ndarray]
    _sp_data: dict[str, np.ndarray]
    _dense_row: np.ndarray
    _sp_seq: np.ndarray
    _sp_head: np.ndarray
    _sp_row: np.ndarray
    _seq: int
    _live: int
    _now: float
    _version: int
    tick_capacity: int

    def _chronological(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _tick_cells(self, rows: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """Where each entity's values of the latest tick go: its dense column (at the tick's slot), or the
        cell of its sparse ring's sample for this tick (a flat index into the (sample, column) arrays),
        the sample made unless this tick has one already (a merged tick)."""
        dense: dict[str, int] = {}
        sparse: dict[str, tuple[int, int]] = {}
        new_pos: list[int] = []
        new_cols: list[int] = []
        seq, first_live = self._seq, self._seq - self._live + 1
        for entity, row in rows.items():
            col = self._dense.row(entity)
            if col is not None:
                dense[entity] = col
                continue
            col = self._sparse.row(entity)
            if col is None:
                col = self._sparse_column(entity, row)
            else:
                head = int(self._sp_head[col])
                latest = (head - 1) % SPARSE_SAMPLES
                if self._sp_seq[latest, col] == seq:
                    sparse[entity] = (latest, col)
                    continue
                if self._sp_seq[head % SPARSE_SAMPLES, col] >= first_live:  # the ring is full of live samples
                    dense[entity] = self._promote(entity, row, col)
                    continue
            pos = int(self._sp_head[col]) % SPARSE_SAMPLES
            self._sp_seq[pos, col] = seq
            self._sp_head[col] += 1
            new_pos.append(pos)
            new_cols.append(col)
            sparse[entity] = (pos, col)
        for arr in self._sp_data.values():
            arr[new_pos, new_cols] = np.nan  # a reused cell: no value of an older sample stays
        width = self._sparse.capacity  # after any growth above
        return dense, {entity: pos * width + col for entity, (pos, col) in sparse.items()}

    def _sparse_column(self, entity: str, row: int) -> int:
        col, grown_to, _ = self._sparse.touch(entity, self._now)  # never evicts: it holds fewer than the store
        if grown_to is not None:
            self._sp_data = {s: _resized(a, grown_to, np.nan) for s, a in self._sp_data.items()}
            self._sp_seq = _resized(self._sp_seq, grown_to, -1)
            self._sp_head = _resized(self._sp_head, grown_to, 0)
            self._sp_row = _resized(self._sp_row, grown_to, -1)
        self._sp_row[col] = row
        return col

    def _dense_column(self, entity: str, row: int) -> int:
        col, grown_to, _ = self._dense.touch(entity, self._now)
        if grown_to is not None:
            self._data = {s: _resized(a, grown_to, np.nan) for s, a in self._data.items()}
            self._dense_row = _resized(self._dense_row, grown_to, -1)
        self._dense_row[col] = row
        return col

    def _promote(self, entity: str, row: int, scol: int) -> int:
        """Move an entity's live samples from its sparse ring (column ``scol``) to a dense column; returns the
        dense column."""
        self._sparse.remove(entity)
        seqs = self._sp_seq[:, scol]
        live = seqs >= self._seq - self._live + 1
        slots = seqs[live] % self.tick_capacity
        col = self._dense_column(entity, row)
        for signal, arr in self._data.items():
            arr[slots, col] = self._sp_data[signal][live, scol]
        self._free_sparse(scol)
        return col

    def _demote(self) -> bool:
        """Move entities whose dense column holds at most _DEMOTE_AT live samples to sparse rings."""
        cols = np.flatnonzero(self._dense_row >= 0)
        if not len(cols):
            return False
        first_live = self._seq - self._live + 1
        slots, _ = self._chronological()
        present = np.zeros((len(slots), len(cols)), dtype=bool)
        for arr in self._data.values():
            present |= ~np.isnan(arr[np.ix_(slots, cols)])
        few = np.flatnonzero(present.sum(axis=0) <= _DEMOTE_AT)
        if not len(few):
            return False
        name_of = {col: name for name, col in self._dense.items()}
        for i in few.tolist():
            col = int(cols[i])
            entity, row = name_of[col], int(self._dense_row[col])
            ticks = np.flatnonzero(present[:, i])  # oldest first
            values = {signal: arr[slots[ticks], col] for signal, arr in self._data.items()}
            self._free_dense(entity)
            scol = self._sparse_column(entity, row)
            n = len(ticks)
            self._sp_seq[:n, scol] = first_live + ticks
            self._sp_head[scol] = n
            for signal, arr in self._sp_data.items():
                arr[:n, scol] = values[signal]
        return True

    def _shrink(self) -> None:
        """Fit the rows and both tiers' columns to the entities left (see EntityIndex.shrink)."""
        if self._index.shrink() is not None:
            self._version += 1
            for tier, row_of_col in ((self._dense, self._dense_row), (self._sparse, self._sp_row)):
                for entity, col in tier.items():
                    row_of_col[col] = self._index.row(entity)
        cols = self._dense.shrink()
        if cols is not None:
            width = self._dense.capacity
            self._data = {s: _resized(a, width, np.nan, cols) for s, a in self._data.items()}
            self._dense_row = _resized(self._dense_row, width, -1, cols)
        cols = self._sparse.shrink()
        if cols is not None:
            width = self._sparse.capacity
            self._sp_data = {s: _resized(a, width, np.nan, cols) for s, a in self._sp_data.items()}
            self._sp_seq = _resized(self._sp_seq, width, -1, cols)
            self._sp_head = _resized(self._sp_head, width, 0, cols)
            self._sp_row = _resized(self._sp_row, width, -1, cols)

    def _drop_samples(self, entity: str) -> None:
        """Free the entity's dense column or sparse ring (it left the store)."""
        self._free_dense(entity)
        col = self._sparse.remove(entity)
        if col is not None:
            self._free_sparse(col)

    def _free_dense(self, entity: str) -> None:
        col = self._dense.remove(entity)
        if col is not None:
            for arr in self._data.values():
                arr[:, col] = np.nan
            self._dense_row[col] = -1

    def _free_sparse(self, col: int) -> None:
        self._sp_seq[:, col] = -1
        self._sp_head[col] = 0
        self._sp_row[col] = -1

    def _series(self, entity: str, signal: str, slots: np.ndarray) -> np.ndarray | None:
        """The entity's values of a known ``signal`` in the window's ticks (``slots``), float64, NaN where
        missing; None when the entity is not stored."""
        col = self._dense.row(entity)
        if col is not None:
            return self._data[signal][slots, col].astype(np.float64)
        col = self._sparse.row(entity)
        if col is None:
            return None
        first = self._seq - len(slots) + 1
        out = np.full(len(slots), np.nan)
        seqs = self._sp_seq[:, col]
        inside = seqs >= first
        out[seqs[inside] - first] = self._sp_data[signal][inside, col]
        return out

    def _block(self, signal: str, slots: np.ndarray) -> np.ndarray:
        """The window's (tick, entity row) values of a known signal, float64, NaN where missing."""
        block = np.full((len(slots), self._index.capacity), np.nan)
        if not len(slots):
            return block
        if len(self._dense):
            cols = np.flatnonzero(self._dense_row >= 0)
            block[:, self._dense_row[cols]] = self._data[signal][np.ix_(slots, cols)]
        if len(self._sparse):
            first = self._seq - len(slots) + 1
            pos, cols = np.nonzero(self._sp_seq >= first)
            block[self._sp_seq[pos, cols] - first, self._sp_row[cols]] = self._sp_data[signal][pos, cols]
        return block



class SignalStore(_SampleTiers):
    """Rolling per-(entity, signal) time series in numpy rings, dense or per entity; see the module docstring."""

    def __init__(
        self,
        retention_s: float = DEFAULT_RETENTION_S,
        max_entities: int = DEFAULT_MAX_ENTITIES,
        tick_capacity: int | None = None,
        max_signals: int = DEFAULT_MAX_SIGNALS,
    ) -> None:
        if not isinstance(retention_s, int | float) or not 0 < retention_s < math.inf:
            raise StoreError(f"retention_s must be a finite number > 0, got {retention_s!r}")
        self.retention_s = float(retention_s)
        # Default: room for ticks as close as 0.8 s over the whole retention, plus a little slack.
        self.tick_capacity = tick_capacity if tick_capacity is not None else math.ceil(retention_s / 0.8) + 4
        if self.tick_capacity < 2:
            raise StoreError(f"tick_capacity must be >= 2, got {self.tick_capacity}")
        self.max_signals = max_signals
        self._index = EntityIndex(max_entities)  # every entity's row: the rows of the query tables
        # Dense tier: per signal one (tick slot, column) array; _dense_row maps a column to its entity's row.
        self._dense = EntityIndex(max_entities, initial_rows=0)
        self._data: dict[str, np.ndarray] = {}
        self._dense_row = np.empty(0, dtype=np.intp)  # -1: free column
        # Sparse tier: per entity (column) a ring of SPARSE_SAMPLES samples: per signal its values, and
        # the number of each sample's tick (-1: no sample); _sp_head is where the next sample goes.
        self._sparse = EntityIndex(max_entities, initial_rows=0)
        self._sp_data: dict[str, np.ndarray] = {}
        self._sp_seq = np.empty((SPARSE_SAMPLES, 0), dtype=np.int64)
        self._sp_head = np.empty(0, dtype=np.int64)
        self._sp_row = np.empty(0, dtype=np.intp)
        self._ts = np.full(self.tick_capacity, np.nan)  # ts per slot; NaN = slot holds no live tick
        self._head = -1  # slot of the latest tick
        self._seq = -1  # number of the latest tick (ticks are numbered from 0; its slot is _seq % tick_capacity)
        self._live = 0  # number of live ticks, ending at _head
        self._now = -math.inf
        self._version = 0  # bumped by every change; queries cache per version
        self._order_cache: tuple[int, np.ndarray, np.ndarray] | None = None
        self._stats_cache: dict[tuple[str, float], dict[str, Any]] = {}
        self._stats_version = -1

    # ---- writes -----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Timestamp of the latest tick (-inf before the first)."""
        return self._now

    @property
    def max_entities(self) -> int:
        return self._index.max_entities

    def add(self, ts: float, values: Mapping[tuple[str, str], float]) -> None:
        """Record one tick. ``ts`` must not go backwards; the same ``ts`` again merges into that tick.

        The whole tick is validated before anything is written, so bad input changes nothing.
        """
        t = self._tick_time(ts)
        if not isinstance(values, Mapping):
            raise StoreError(f"tick values must be a mapping of (entity, signal) -> float, got {type(values).__name__}")
        # Validation and grouping run at C speed (map/fromiter/numpy) because a tick carries thousands
        # of values; on failure a slow pass names the first offending item.
        keys = list(values)
        if set(map(type, keys)) - {tuple} or set(map(len, keys)) - {2}:
            _raise_bad_item(values)
        entities = [k[0] for k in keys]
        signals = [k[1] for k in keys]
        if set(map(type, entities)) - {str} or set(map(type, signals)) - {str}:
            _raise_bad_item(values)
        try:
            vals = np.fromiter(values.values(), dtype=np.float64, count=len(keys))
        except (TypeError, ValueError):
            _raise_bad_item(values)
        present = ~np.isnan(vals)
        if np.isinf(vals).any():
            _raise_bad_item(values)
        present_list = present.tolist()
        signal_names = dict.fromkeys(compress(signals, present_list))
        new_signals = [sig for sig in signal_names if sig not in self._data]
        if len(self._data) + len(new_signals) > self.max_signals:
            total = len(self._data) + len(new_signals)
            raise StoreError(f"too many distinct signals: {total} > max_signals {self.max_signals}")

        self._version += 1
        if t > self._now:
            self._advance(t)
        for signal in new_signals:
            self._data[signal] = np.full((self.tick_capacity, self._dense.capacity), np.nan, dtype=VALUE_DTYPE)
            self._sp_data[signal] = np.full((SPARSE_SAMPLES, self._sparse.capacity), np.nan, dtype=VALUE_DTYPE)
        # One touch per entity with a present value, in first-seen order.
        index = self._index
        rows_this_tick: dict[str, int] = {}
        for entity in dict.fromkeys(compress(entities, present_list)):
            row, _, evicted = index.touch(entity, t)
            if evicted is not None:
                # Only when one tick carries more than max_entities entities: the earliest lose.
                rows_this_tick.pop(evicted, None)
                self._drop_samples(evicted)
            rows_this_tick[entity] = row
        dense_cols, sparse_cells = self._tick_cells(rows_this_tick)
        d_col = np.fromiter(map(dense_cols.get, entities, repeat(-1)), dtype=np.intp, count=len(keys))
        s_cell = np.fromiter(map(sparse_cells.get, entities, repeat(-1)), dtype=np.intp, count=len(keys))
        signal_ids = {sig: i for i, sig in enumerate(signal_names)}
        sig_idx = np.fromiter(map(signal_ids.get, signals, repeat(-1)), dtype=np.intp, count=len(keys))
        to_dense = present & (d_col >= 0)
        to_sparse = present & (s_cell >= 0)
        for signal, i in signal_ids.items():
            is_signal = sig_idx == i
            mask = to_dense & is_signal
            self._data[signal][self._head, d_col[mask]] = vals[mask]
            mask = to_sparse & is_signal
            np.put(self._sp_data[signal], s_cell[mask], vals[mask])  # flat (sample, column) cells

    def _tick_time(self, ts: float) -> float:
        """A tick's timestamp as a float: a finite number, not before the latest tick."""
        try:
            t = float(ts)
        except (TypeError, ValueError):
            raise StoreError(f"tick timestamp must be a number, got {ts!r}") from None
        if not math.isfinite(t):
            raise StoreError(f"tick timestamp must be finite, got {ts!r}")
        if t < self._now:
            raise StoreError(f"tick timestamp went backwards: {t} < latest {self._now}")
        return t

    def forget(self, entity: str) -> bool:
        """Drop everything about ``entity``; False when it was not stored."""
        row = self._index.remove(entity)
        if row is None:
            return False
        self._drop_samples(entity)
        self._version += 1
        self._shrink()
        return True

    def _advance(self, t: float) -> None:
        self._head = (self._head + 1) % self.tick_capacity
        self._seq += 1
        self._ts[self._head] = t
        for arr in self._data.values():
            arr[self._head, :] = np.nan
        self._live = min(self._live + 1, self.tick_capacity)
        self._now = t
        cutoff = t - self.retention_s
        # Drop ticks past retention from the old end of the ring (they stay allocated but unreachable;
        # sparse samples of ticks before the first live one are never read again).
        while self._live > 1:
            oldest = (self._head - self._live + 1) % self.tick_capacity
            if self._ts[oldest] > cutoff:
                break
            self._ts[oldest] = np.nan
            self._live -= 1
        self._order_cache = None
        expired = self._index.expire_entries(cutoff)
        for entity, _ in expired:
            self._drop_samples(entity)
        demoted = self._seq % _DEMOTE_EVERY == 0 and self._demote()
        if expired or demoted:
            self._shrink()

    # ---- queries ----------------------------------------------------------------------------

    def entities(self) -> list[str]:
        """Stored entities, least recently updated first."""
        return self._index.names()

    def signals(self) -> list[str]:
        return list(self._data)

    def __len__(self) -> int:
        return len(self._index)

    def nbytes(self) -> int:
        """Bytes held by the sample arrays (the bulk of the store's memory)."""
        arrays = [*self._data.values(), *self._sp_data.values(), self._sp_seq, self._sp_head, self._sp_row,
                  self._dense_row, self._ts, self._index.last_touch_ts, self._dense.last_touch_ts,
                  self._sparse.last_touch_ts]
        return int(sum(a.nbytes for a in arrays))

    def tier_sizes(self) -> tuple[int, int]:
        """Entities with a dense column, and with a sparse ring."""
        return len(self._dense), len(self._sparse)

    def _chronological(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, ts) of the live ticks, oldest first."""
        cached = self._order_cache
        if cached is not None and cached[0] == self._version:
            return cached[1], cached[2]
        slots = (self._head - self._live + 1 + np.arange(self._live)) % self.tick_capacity
        ts = self._ts[slots]
        self._order_cache = (self._version, slots, ts)
        return slots, ts

    def _window_slots(self, seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """(slots, ts) of the window's ticks, oldest first: the latest ones, so the last is tick _seq."""
        s = _check_seconds(seconds)
        slots, ts = self._chronological()
        start = int(np.searchsorted(ts, self._now - s, side="right"))
        return slots[start:], ts[start:]

    def window(self, entity: str, signal: str, seconds: float) -> Window:
        """The present values of one series over the window with their tick timestamps (oldest first)."""
        slots, ts = self._window_slots(seconds)
        vals = self._series(entity, signal, slots) if signal in self._data and len(slots) else None
        if vals is None:
            return Window(np.empty(0), np.empty(0))
        keep = ~np.isnan(vals)
        return Window(ts[keep], vals[keep])

    def _all_stats(self, signal: str, seconds: float) -> dict[str, Any] | None:
        s = _check_seconds(seconds)
        if self._stats_version != self._version:
            self._stats_cache.clear()
            self._stats_version = self._version
        key = (signal, s)
        cached = self._stats_cache.get(key)
        if cached is not None:
            return cached
        if signal not in self._data:
            return None
        slots, _ = self._window_slots(s)
        cached = _column_stats(self._block(signal, slots))
        self._stats_cache[key] = cached
        return cached

    def stats(self, entity: str, signal: str, seconds: float) -> WindowStats:
        """Window statistics for one series (``n == 0`` when there is no data)."""
        # Fast path first: the engine calls this for every entity each tick, on a handful of windows.
        table = self._stats_cache.get((signal, seconds)) if self._stats_version == self._version else None
        if table is None:
            table = self._all_stats(signal, seconds)
        row = self._index.row(entity)
        if table is None or row is None:
            return WindowStats(*_EMPTY_VALUES)
        per_row = table.get("_per_row")
        if per_row is None:
            # Python values for every row at once: far cheaper than numpy scalar reads per call when the
            # engine asks for every entity each tick.
            per_row = list(zip(*(table[f].tolist() for f in STAT_FIELDS), strict=True))
            table["_per_row"] = per_row
        return WindowStats(*per_row[row])

    def stats_frame(self, signal: str, seconds: float) -> dict[str, WindowStats]:
        """WindowStats of every entity with data in the window (least recently updated first)."""
        table = self._all_stats(signal, seconds)
        if table is None or len(self._index) == 0:
            return {}
        names, rows = self._named_rows(table["n"])
        columns = [table[f][rows].tolist() for f in STAT_FIELDS]
        return {name: WindowStats(*values) for name, values in zip(names, zip(*columns, strict=True), strict=True)}

    def frame(self, signal: str, seconds: float, agg: str = "mean") -> dict[str, float]:
        """One aggregate per entity with data in the window (``agg`` is a WindowStats field or "sum")."""
        if agg not in FRAME_AGGS:
            raise StoreError(f"unknown aggregate {agg!r}; use one of {', '.join(FRAME_AGGS)}")
        table = self._all_stats(signal, seconds)
        if table is None or len(self._index) == 0:
            return {}
        names, rows = self._named_rows(table["n"])
        return dict(zip(names, table[agg][rows].tolist(), strict=True))

    def _named_rows(self, counts: np.ndarray) -> tuple[list[str], np.ndarray]:
        names: list[str] = []
        rows: list[int] = []
        for name, row in self._index.items():
            if counts[row] > 0:
                names.append(name)
                rows.append(row)
        return names, np.asarray(rows, dtype=np.intp)

    def correlation(self, entity_a: str, signal_a: str, entity_b: str, signal_b: str, seconds: float) -> float | None:
        """Pearson correlation over the ticks where both series are present; None with fewer than 5 such
        ticks or when either side is constant (correlation is undefined, not zero)."""
        slots, _ = self._window_slots(seconds)
        if signal_a not in self._data or signal_b not in self._data or len(slots) < MIN_POINTS_FOR_CORRELATION:
            return None
        a = self._series(entity_a, signal_a, slots)
        b = self._series(entity_b, signal_b, slots)
        if a is None or b is None:
            return None
        both = ~(np.isnan(a) | np.isnan(b))
        if int(both.sum()) < MIN_POINTS_FOR_CORRELATION:
            return None
        a = a[both]
        b = b[both]
        if a.min() == a.max() or b.min() == b.max():
            return None
        da = a - a.mean()
        db = b - b.mean()
        denom = math.sqrt(float(np.dot(da, da)) * float(np.dot(db, db)))
        if denom == 0.0:
            return None
        return max(-1.0, min(1.0, float(np.dot(da, db)) / denom))
