# SPDX-License-Identifier: Apache-2.0
"""TCP connect latency and outcomes per (cgroup, network namespace) (decoder for bpf/tcpconnect.bpf.c).

What the counters mean, against the kernel's own per-namespace MIBs (`/proc/<pid>/net/snmp`, Tcp):
- `successes + failures + aborts` = ActiveOpens (connects that sent a SYN);
- `failures` = AttemptFails (SYN_SENT → CLOSE with an error: RST, SYN retries exhausted, ICMP);
- `aborts`: the application closed the socket while connecting (no error, e.g. its own timeout);
- `local_errors`: the connect never sent a SYN (no free source port: EADDRNOTAVAIL) — neither MIB
  counts those;
- `syn_retransmits` = TcpExt TCPSynRetrans for active opens, counted as they happen (a connect
  stuck retransmitting shows up before it ends).
The latency histogram holds successful connects only: connect() → ESTABLISHED.
"""

from __future__ import annotations

import ctypes
import errno
import math
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes.base import BpfProbe
from probes.cgroupfs import CgroupLayout
from probes.engine import AttachMode, Engine, LibbpfEngine, LoadedProbe, ProbeSpec, Tracepoint
from probes.hist import HIST_SLOTS, IntervalHistogram, LatencyHistogram, merge_intervals
from probes.host import HostPaths
from probes.plugin import (
    CgroupSample,
    MetricSpec,
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

_STATE = Tracepoint("inet_sock_set_state", "tcpconnect_state_btf", "tcpconnect_state_raw")
# Without it only syn_retransmits stay 0.
_RETRANSMIT = Tracepoint("tcp_retransmit_skb", "tcpconnect_retransmit_btf", "tcpconnect_retransmit_raw", required=False)
# Every connect's end removes its start from the in-flight table (a socket always leaves SYN_SENT
# through inet_sock_set_state). tp_btf runs no program per socket destroyed; the raw_tp fallback keeps
# tcp_destroy_sock as a second cleanup (optional). Both rely on the sweep in snapshot() for the rest.
SPEC_BTF = ProbeSpec(name="tcpconnect", object_file="tcpconnect.bpf.o", tracepoints=(_STATE, _RETRANSMIT))
SPEC_RAW = ProbeSpec(
    name="tcpconnect",
    object_file="tcpconnect.bpf.o",
    tracepoints=(
        _STATE,
        _RETRANSMIT,
        Tracepoint("tcp_destroy_sock", "tcpconnect_destroy_raw", "tcpconnect_destroy_raw", required=False),
    ),
)
SPEC = SPEC_RAW  # every tracepoint the probe may use
OUTCOMES = ("established", "failed", "aborted", "local_error")  # enum tcpconnect_outcome
# An in-flight start older than this belongs to a socket that is gone without its end being seen:
# far longer than any connect (127 SYN retries at the 120 s maximum RTO would be the extreme).
STALE_START_NS = 3 * 3600 * 1_000_000_000
SWEEP_EVERY_S = 60.0
# The detector judges a victim's connect p99 over this many recent ticks (its SLO's window_ticks), and its
# failed connects and SYN retransmits over the same window.
CONNECT_WINDOW_TICKS = 5
_START_TS = struct.Struct("<Q")  # struct tcpconnect_start begins with ts_ns
_SLOT_HEAD = struct.Struct("<QQ")  # struct tcpconnect_slot: sk, then the start's ts_ns
_START_NETNS_AT = 24  # struct tcpconnect_start: ts_ns, cgroup_id, task, then netns
_START_NETNS = struct.Struct(f"<{_START_NETNS_AT}xI")
_SLOT_NETNS = struct.Struct(f"<{8 + _START_NETNS_AT}xI")  # struct tcpconnect_slot: sk, then a start
SLOT_SIZE = 64

# struct tcpconnect_stats: nn_hist (32 slots + sum, count, max) then 7 counters.
_STATS_COUNTERS = ("successes", "failures", "refused", "timeouts", "aborts", "local_errors", "syn_retransmits")
_STATS = struct.Struct(f"<{HIST_SLOTS + 3}Q{len(_STATS_COUNTERS)}Q")
_KEY = struct.Struct("<QII")  # struct tcpconnect_key (also a bucket's owner)
_CGROUP_ID = struct.Struct("<Q")  # the first field of both keys (0: a free bucket)
_OWNER_NETNS = struct.Struct("<8xI")  # the netns of both keys, set last when a bucket is claimed
_DEST_KEY = struct.Struct("<QIHH16s")  # struct tcpconnect_dest_key
_DEST_STATS = struct.Struct("<4Q")  # struct tcpconnect_dest_stats
START_SIZE = 48  # struct tcpconnect_start (only its ts_ns is read)
# What this module decodes, per map: (key, value), checked against the object's BTF at load (engine).
MAP_LAYOUTS = {
    "inflight_slots": (4, SLOT_SIZE),
    "inflight": (8, START_SIZE),  # socket address -> start
    "connect_bucket_owner": (4, _KEY),
    "connect_buckets": (4, _STATS),
    "connect_stats": (_KEY, _STATS),
    "dest_bucket_owner": (4, _DEST_KEY),
    "dest_buckets": (4, _DEST_STATS),
    "dest_stats": (_DEST_KEY, _DEST_STATS),
    "drops": (4, 8),  # probes/base.py
}


class _ConnectEvent(ctypes.Structure):
    """struct tcpconnect_event (bpf/tcpconnect.h)."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("latency_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("netns", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("family", ctypes.c_uint16),
        ("outcome", ctypes.c_uint16),
        ("error", ctypes.c_int32),
        ("syn_retrans", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("_pad", ctypes.c_uint32),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("comm", ctypes.c_char * 16),
    ]


# Sizes of the C structs, for the test that checks them against the object's BTF.
STRUCT_SIZES = {
    "tcpconnect_stats": _STATS.size,
    "tcpconnect_key": _KEY.size,
    "tcpconnect_dest_key": _DEST_KEY.size,
    "tcpconnect_dest_stats": _DEST_STATS.size,
    "tcpconnect_event": ctypes.sizeof(_ConnectEvent),
    "tcpconnect_slot": SLOT_SIZE,
}


def format_addr(family: int, raw: bytes) -> str:
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, raw[:16])
    return socket.inet_ntop(socket.AF_INET, raw[:4])


def format_endpoint(family: int, addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if family == socket.AF_INET6 else f"{addr}:{port}"


@dataclass(frozen=True)
class ConnectStats:
    """Counters of one (cgroup, netns) since load (its bucket's and its hash entry's, summed)."""

    latency: LatencyHistogram  # successful connects
    successes: int
    failures: int
    refused: int
    timeouts: int
    aborts: int
    local_errors: int
    syn_retransmits: int

    @classmethod
    def decode_sum(cls, raws: Iterable[bytes]) -> ConnectStats:
        """The sum of several values of one key (the maps are shared: one value per place it is in)."""
        hists, sums = [], [0] * len(_STATS_COUNTERS)
        for raw in raws:
            hists.append(LatencyHistogram.decode(raw))
            counters = _STATS.unpack_from(raw)[HIST_SLOTS + 3:]
            sums = [a + b for a, b in zip(sums, counters, strict=True)]
        return cls(LatencyHistogram.merge(hists), *sums)

    @property
    def connects(self) -> int:
        """Every connect that ended, whatever the outcome."""
        return self.successes + self.failures + self.aborts + self.local_errors

    @property
    def active_opens(self) -> int:
        """What the kernel's ActiveOpens counts: connects that sent a SYN."""
        return self.successes + self.failures + self.aborts


@dataclass(frozen=True)
class DestKey:
    cgroup_id: int
    netns: int
    family: int
    daddr: str
    dport: int

    @property
    def endpoint(self) -> str:
        return format_endpoint(self.family, self.daddr, self.dport)


@dataclass(frozen=True)
class DestStats:
    count: int  # successful connects
    sum_ns: int
    max_ns: int  # since the entry was created (LRU: entries can be evicted and start over)
    failures: int


@dataclass(frozen=True)
class ConnectOutlier:
    """One connect at or above the threshold, or one that did not succeed."""

    ts_ns: int
    latency_ns: int
    cgroup_id: int
    netns: int
    pid: int
    tid: int
    comm: str
    family: int
    outcome: str  # OUTCOMES
    error: int  # sk_err: ECONNREFUSED, ETIMEDOUT, ... (0 on success)
    syn_retrans: int
    saddr: str
    sport: int
    daddr: str
    dport: int

    @classmethod
    def decode(cls, raw: bytes) -> ConnectOutlier:
        e = _ConnectEvent.from_buffer_copy(raw[: ctypes.sizeof(_ConnectEvent)])
        outcome = OUTCOMES[e.outcome] if e.outcome < len(OUTCOMES) else f"outcome_{e.outcome}"
        return cls(
            e.ts_ns, e.latency_ns, e.cgroup_id, e.netns, e.pid, e.tid, e.comm.decode(errors="replace"),
            e.family, outcome, e.error, e.syn_retrans,
            format_addr(e.family, bytes(e.saddr)), e.sport, format_addr(e.family, bytes(e.daddr)), e.dport,
        )

    @property
    def error_name(self) -> str:
        return errno.errorcode.get(self.error, str(self.error)) if self.error else ""

    @property
    def destination(self) -> str:
        return format_endpoint(self.family, self.daddr, self.dport)


@dataclass(frozen=True)
class TcpConnectSnapshot:
    """Cumulative counters since load; subtract two snapshots for an interval (see summarize)."""

    monotonic_s: float
    per_key: dict[tuple[int, int], ConnectStats]  # (cgroup_id, netns inode) ->
    destinations: dict[DestKey, DestStats]
    drops: dict[str, int]


def _nonzero_u32(blob: bytes, record_size: int, offset: int) -> list[int]:
    """Indexes of the records (``record_size`` bytes each) whose u32 at ``offset`` is not zero."""
    if not blob or record_size <= 0 or record_size % 4 or offset % 4:
        return []
    words = np.frombuffer(blob, dtype="<u4", count=len(blob) // 4)
    return [int(i) for i in np.flatnonzero(words[offset // 4 :: record_size // 4])]


def _stale_slots(blob: bytes, cutoff_ns: int) -> list[int]:
    """Indexes of the in-flight slots (``SLOT_SIZE`` bytes each, ``_SLOT_HEAD`` first: sk, then the
    start's ts) holding a socket whose start is older than ``cutoff_ns`` (ts 0: being filled, never
    stale). Scanned without a Python step per slot: the array has 8,192 and almost all are free."""
    words = SLOT_SIZE // 8
    slots = np.frombuffer(blob, dtype="<u8", count=len(blob) // SLOT_SIZE * words).reshape(-1, words)
    sk, ts = slots[:, 0], slots[:, 1]
    return [int(i) for i in np.flatnonzero((sk != 0) & (ts > 0) & (ts < np.uint64(max(cutoff_ns, 0))))]


class TcpConnectProbe(BpfProbe["ConnectOutlier"]):
    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        outlier_threshold_ns: int = 100_000_000,
        attach_mode: AttachMode = "auto",
        outlier_ring_bytes: int = 256 * 1024,
        max_keys: int = 1024,
        max_destinations: int = 2048,
        run_counts_live: bool = False,
    ) -> None:
        self.v1_cpu = self._key_by("cpu", paths, layout)
        engine = engine or LibbpfEngine(self.paths)
        rodata: dict[str, int | bool] = {"v1_cpu_cgroup": self.v1_cpu, "outlier_threshold_ns": outlier_threshold_ns}
        sizes = {"outliers": outlier_ring_bytes, "connect_stats": max_keys, "dest_stats": max_destinations}
        probe: LoadedProbe | None = None
        if attach_mode in ("auto", "tp_btf"):
            probe = engine.open_probe(SPEC_BTF, rodata=rodata, attach_mode=attach_mode, map_sizes=sizes,
                                      layouts=MAP_LAYOUTS)
            if probe.status.attach_mode != "tp_btf":
                probe.close()  # auto chose raw_tp on this kernel: load it with its cleanup program
                probe = None
        if probe is None:
            probe = engine.open_probe(SPEC_RAW, rodata=rodata, attach_mode="raw_tp", map_sizes=sizes, layouts=MAP_LAYOUTS)
        self.probe = probe
        self._last_sweep = time.monotonic()
        # The counter maps the snapshot reads change only when this object's programs run (or forget
        # drops entries): while their run counts stand still, the last read's counters are still the
        # maps' (a node without connects reads nothing: the owner tables were most of an idle tick's
        # probe reads). The kernel keeps run counts only while run-time stats are on, and turning them on
        # costs every BPF program on the node a clock read per run: the probe does not do it itself. The
        # caller says it holds them for the probe's life (``run_counts_live``, the agent); otherwise every
        # snapshot reads the maps.
        self._run_counts_live = run_counts_live
        self._runs_at_read: tuple[tuple[str, int, int], ...] | None = None
        self._counters: tuple[dict[tuple[int, int], ConnectStats], dict[DestKey, DestStats]] | None = None
        if outlier_threshold_ns:
            self._watch_events("outliers", ConnectOutlier.decode)

    def forget(self, cgroup_ids: list[int]) -> int:
        """Drop removed cgroups' entries (every netns, every destination) so pod churn cannot fill
        the per-cgroup maps. Returns how many entries went.

        A bucket is zeroed, then released for another key. A connect of the removed
        cgroup that ends between the two (started before the cgroup went, still in flight) is
        counted for whichever key takes the bucket next: rare, and at most a few connects."""
        gone = set(cgroup_ids)
        removed = 0
        self._counters = None  # the maps change without a program run: the next snapshot reads them
        for owners, buckets in (("connect_bucket_owner", "connect_buckets"), ("dest_bucket_owner", "dest_buckets")):
            for bucket, owner in list(self.probe.map_items(owners)):
                if _CGROUP_ID.unpack_from(owner)[0] not in gone:  # type: ignore[arg-type]
                    continue
                self.probe.map_zero(buckets, bucket)
                self.probe.map_zero(owners, bucket)
                removed += 1
        for name, layout in (("connect_stats", _KEY), ("dest_stats", _DEST_KEY)):
            keys = [key for key, _ in self.probe.map_items(name) if layout.unpack(key)[0] in gone]
            removed += sum(self.probe.map_delete(name, key) for key in keys)
        return removed

    def _owned_buckets(self, owners: str, buckets: str) -> Iterator[tuple[bytes, bytes]]:
        """(owner key, its bucket's value) for every owned bucket. Only those are read:
        most buckets of a node are free. A netns word of 0 is a free owner or one being claimed
        (nothing counted in it yet). The owner table is read as one blob and scanned without a
        Python step per bucket: it is read every tick, and almost all of it is free."""
        size = _KEY.size if owners == "connect_bucket_owner" else _DEST_KEY.size
        blob = self.probe.map_array_values(owners)
        if len(blob) % size:
            raise OSError(errno.EINVAL, f"{owners}: {len(blob)} bytes is not a whole number of {size}-byte owners")
        for index in _nonzero_u32(blob, size, _OWNER_NETNS.size - 4):
            owner = blob[index * size : (index + 1) * size]
            value = self.probe.map_lookup(buckets, index.to_bytes(4, "little"))
            if value is not None:
                yield owner, value  # type: ignore[misc]

    def snapshot(self) -> TcpConnectSnapshot:
        # The run counts before the maps: a run that ends after this read is in the maps now or seen next
        # tick (its count moved), never lost behind counts that already include it.
        programs = self.probe.program_stats()
        runs = tuple((p.name, p.run_count, p.recursion_misses) for p in programs)
        if self._counters is None or not self._run_counts_live or not runs or runs != self._runs_at_read:
            self._counters = self._read_counters()
            self._runs_at_read = runs
        per_key, destinations = self._counters
        drops = self.read_drops()
        # A state change in softirq that interrupts this probe's program on the same CPU is skipped
        # by the kernel (recursion protection): it counts those per program; report them as drops.
        drops["recursion_misses"] = sum(s.recursion_misses for s in programs)
        now = time.monotonic()
        if now - self._last_sweep >= SWEEP_EVERY_S:
            self.sweep_stale_starts()
        return TcpConnectSnapshot(now, dict(per_key), dict(destinations), drops)

    def _read_counters(self) -> tuple[dict[tuple[int, int], ConnectStats], dict[DestKey, DestStats]]:
        """Every key's and destination's counters, from the maps."""
        # A key's counters: its bucket's (if it owns one) plus its hash entry's (if it has one).
        raws: dict[tuple[int, int], list[bytes]] = {}
        for owner, value in self._owned_buckets("connect_bucket_owner", "connect_buckets"):
            raws.setdefault(_KEY.unpack(owner)[:2], []).append(value)
        for key, value in self.probe.map_items("connect_stats"):
            cgroup_id, netns, _ = _KEY.unpack(key)
            raws.setdefault((cgroup_id, netns), []).append(value)  # type: ignore[arg-type]
        per_key = {key: ConnectStats.decode_sum(values) for key, values in raws.items()}
        dest_raws: dict[bytes, list[bytes]] = {}
        for owner, value in self._owned_buckets("dest_bucket_owner", "dest_buckets"):
            dest_raws.setdefault(owner, []).append(value)
        for key, value in self.probe.map_items("dest_stats"):
            dest_raws.setdefault(key, []).append(value)  # type: ignore[arg-type]
        destinations = {}
        for key, values in dest_raws.items():
            cgroup_id, netns, family, dport, daddr = _DEST_KEY.unpack(key)
            count = sum_ns = max_ns = failures = 0
            for v in values:
                c, s, m, f = _DEST_STATS.unpack(v)
                count, sum_ns, max_ns, failures = count + c, sum_ns + s, max(max_ns, m), failures + f
            dk = DestKey(cgroup_id, netns, family, format_addr(family, daddr), dport)
            destinations[dk] = DestStats(count, sum_ns, max_ns, failures)
        return per_key, destinations

    def in_flight(self, netns: int | None = None) -> int:
        """Connect starts held now (slots and overflow hash): connects in progress, plus stale ones.

        With `netns`, only those of sockets in that network namespace: the maps are node-wide, and
        any other process's connect may be in flight at the moment of the read.
        """
        held = 0
        for _, value in self.probe.map_items("inflight_slots"):
            if _SLOT_HEAD.unpack_from(value)[0] and (netns is None or _SLOT_NETNS.unpack_from(value)[0] == netns):  # type: ignore[arg-type]
                held += 1
        for _, value in self.probe.map_items("inflight"):
            if netns is None or _START_NETNS.unpack_from(value)[0] == netns:  # type: ignore[arg-type]
                held += 1
        return held

    def sweep_stale_starts(self, max_age_ns: int = STALE_START_NS) -> int:
        """Free in-flight starts older than `max_age_ns` (sockets gone without an end); how many.

        A slot is freed by writing it whole (userspace has no compare-and-swap): if, between the
        read and the write, its stale socket's address came back as a new socket that connects
        again, that one connect loses its start (its end then finds nothing: it is not counted).
        A slot whose start is being filled (ts 0) is never taken for stale.
        """
        self._last_sweep = time.monotonic()
        cutoff = time.monotonic_ns() - max_age_ns
        swept = 0
        for index in _stale_slots(self.probe.map_array_values("inflight_slots"), cutoff):
            self.probe.map_zero("inflight_slots", index.to_bytes(4, "little"))
            swept += 1
        stale = [key for key, value in self.probe.map_items("inflight") if _START_TS.unpack_from(value)[0] < cutoff]  # type: ignore[arg-type]
        swept += sum(1 for key in stale if self.probe.map_delete("inflight", key))
        return swept

    def poll_outliers(self, timeout_ms: int = 0) -> list[ConnectOutlier]:
        return self._poll_events(timeout_ms)



def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _dest_rows(prev: TcpConnectSnapshot | None, cur: TcpConnectSnapshot, key: tuple[int, int], top_n: int) -> list[dict]:
    rows = []
    for dk, now in cur.destinations.items():
        if (dk.cgroup_id, dk.netns) != key:
            continue
        before = prev.destinations.get(dk) if prev else None
        if before is not None and (now.count < before.count or now.failures < before.failures):
            before = None  # evicted (LRU) and created again: its counters started over
        count = now.count - (before.count if before else 0)
        failures = now.failures - (before.failures if before else 0)
        if not count and not failures:
            continue
        sum_ns = now.sum_ns - (before.sum_ns if before else 0)
        # The interval's max is known when the all-time max grew in it; otherwise only the mean is.
        exact_max = now.max_ns if count and (before is None or now.max_ns > before.max_ns) else None
        rows.append({
            "dest": dk.endpoint,
            "connects": count,
            "failures": failures,
            "mean_ms": _ms(sum_ns / count if count else 0.0),
            "max_ms": _ms(exact_max),
        })
    rows.sort(key=lambda r: (r["mean_ms"], r["failures"], r["connects"]), reverse=True)
    return rows[:top_n]


@dataclass(frozen=True, slots=True)
class ConnectDelta:
    """One (cgroup, netns) over an interval: ConnectStats' counters as differences (not clamped: a
    reader that sums several keys clamps the sum), the successful connects' latency."""

    latency: IntervalHistogram
    successes: int
    failures: int
    refused: int
    timeouts: int
    aborts: int
    local_errors: int
    syn_retransmits: int


@dataclass(frozen=True)
class TcpConnectInterval:
    """Two snapshots' difference (the plugin's ``delta``), read by ``top`` and the agent's detector: only
    the (cgroup, netns) keys whose counters changed. Raw counts: readers divide by their interval."""

    interval_s: float | None  # None when there is no earlier snapshot
    per_key: dict[tuple[int, int], ConnectDelta]


def delta(prev: TcpConnectSnapshot | None, cur: TcpConnectSnapshot) -> TcpConnectInterval:
    """The interval prev → cur (prev None: since load)."""
    per_key: dict[tuple[int, int], ConnectDelta] = {}
    for key, now in cur.per_key.items():
        before = prev.per_key.get(key) if prev else None
        if before == now:
            continue  # nothing connected from it
        per_key[key] = ConnectDelta(
            now.latency.delta(before.latency if before else None),
            *(getattr(now, name) - (getattr(before, name) if before else 0) for name in _STATS_COUNTERS),
        )
    return TcpConnectInterval(cur.monotonic_s - prev.monotonic_s if prev else None, per_key)


def summarize(prev: TcpConnectSnapshot | None, cur: TcpConnectSnapshot, top_n: int = 5) -> list[dict]:
    """JSON-able rows for the interval prev → cur, one per (cgroup, netns) with activity in it.

    Latency percentiles are over successful connects (log2 histogram: within a factor of 2; max is
    exact when it grew during the interval). `top_destinations` ranks by mean connect latency in the
    interval, then failures. Rows are sorted worst first: failures + SYN retransmits, then p99.
    """
    return _summary(delta(prev, cur), prev, cur, top_n)


def _summary(interval: TcpConnectInterval, prev: TcpConnectSnapshot | None, cur: TcpConnectSnapshot,
             top_n: int) -> list[dict]:
    rows = []
    for key, moved in interval.per_key.items():
        d = {name: max(getattr(moved, name), 0) for name in _STATS_COUNTERS}
        connects = d["successes"] + d["failures"] + d["aborts"] + d["local_errors"]
        if not connects and not d["syn_retransmits"]:
            continue
        lat = moved.latency
        rows.append({
            "cgroup_id": key[0],
            "netns": key[1],
            "interval_s": None if interval.interval_s is None else round(interval.interval_s, 3),
            "connects": connects,
            **d,
            "latency_p50_ms": _ms(lat.quantile_ns(0.5)) if lat.count else None,
            "latency_p99_ms": _ms(lat.quantile_ns(0.99)) if lat.count else None,
            "latency_max_ms": _ms(lat.max_ns) if lat.count else None,
            "top_destinations": _dest_rows(prev, cur, key, top_n),
        })
    rows.sort(
        key=lambda r: (r["failures"] + r["syn_retransmits"], r["latency_p99_ms"] or -math.inf), reverse=True
    )
    return rows


# -- the plugin: metrics, top view, detector signals ------------------------------------------------

CONNECT_LATENCY = "noisyneighbor_tcp_connect_latency_seconds"
CONNECT_SUCCESSES = "noisyneighbor_tcp_connect_successes_total"
CONNECT_FAILURES = "noisyneighbor_tcp_connect_failures_total"
CONNECT_ERRORS = "noisyneighbor_tcp_connect_errors_total"
CONNECT_SYN_RETRANSMITS = "noisyneighbor_tcp_connect_syn_retransmits_total"
TOP_DESTINATIONS = 3  # per row of `top`'s view


def activity(snap: TcpConnectSnapshot) -> dict[int, int]:
    out: dict[int, int] = {}
    for (cgroup_id, _netns), stats in snap.per_key.items():
        out[cgroup_id] = out.get(cgroup_id, 0) + stats.connects + stats.syn_retransmits
    return out


def cgroup_series(snap: TcpConnectSnapshot) -> Iterator[CgroupSample]:
    for (cgroup_id, _netns), stats in snap.per_key.items():
        yield CONNECT_LATENCY, cgroup_id, (), stats.latency
        yield CONNECT_SUCCESSES, cgroup_id, (), float(stats.successes)
        yield CONNECT_FAILURES, cgroup_id, (), float(stats.failures)
        yield CONNECT_SYN_RETRANSMITS, cgroup_id, (), float(stats.syn_retransmits)
        for reason, count in (("refused", stats.refused), ("timeout", stats.timeouts), ("aborted", stats.aborts),
                              ("local_error", stats.local_errors)):
            yield CONNECT_ERRORS, cgroup_id, (reason,), float(count)


def top_rows(view: TopInput) -> list[dict[str, Any]]:
    return [{**r, "connects_per_s": r["connects"] / view.dt}
            for r in _summary(view.interval, view.prev, view.cur, TOP_DESTINATIONS)]


def _destinations(row: dict) -> str:
    return ", ".join(
        f"{d['dest']} ({d['connects']}{', ' + str(d['failures']) + ' failed' if d['failures'] else ''})"
        for d in row["top_destinations"]
    ) or "-"


TOP_TABLE = TopTable(
    title="TCP connects per cgroup and netns",
    columns=(
        TopColumn("NETNS", "netns", left=False),
        TopColumn("CONN/s", "connects_per_s", "rate"),
        TopColumn("FAIL", "failures", "count", sorted_by=True),
        TopColumn("SYN RTX", "syn_retransmits", "count"),
        TopColumn("P50", "latency_p50_ms", "us", scale=1e3),
        TopColumn("P99", "latency_p99_ms", "us", scale=1e3),
        TopColumn("MAX", "latency_max_ms", "us", scale=1e3),
        TopColumn("TOP DESTINATIONS", "top_destinations", text=_destinations, flex=True),
    ),
    rows=top_rows,
    nothing="no TCP connect",
    hotkey="t",
    footer=lambda section: "sorted by failures + SYN retransmits, then p99; latency of successful connects",
)


def workload_signals(interval: TcpConnectInterval, dt: float, workload_key: WorkloadKey) -> dict[str, dict[str, Any]]:
    """Per workload: its successful connects' p99, and its failed connects and SYN retransmits per second."""
    acc: dict[str, list] = {}
    for key, cd in interval.per_key.items():  # only the (cgroup, netns) keys whose counters changed
        w = workload_key(key[0])
        if w is None:
            continue
        a = acc.setdefault(w, [[], 0, 0])
        a[0].append(cd.latency)
        # A connect the application gave up on (its own timeout: an abort in SYN_SENT) failed for the
        # user just as a refused or timed-out one did.
        a[1] += cd.failures + cd.aborts
        a[2] += cd.syn_retransmits
    out: dict[str, dict[str, Any]] = {}
    for w, (hists, failures, retrans) in acc.items():
        d = merge_intervals(hists)
        out[w] = {"connects": d.count, "connect_p99_ns": d.quantile_ns(0.99),
                  "connect_failures_per_s": max(failures, 0) / dt, "syn_retransmits_per_s": max(retrans, 0) / dt}
    return out


PLUGIN = ProbePlugin(
    name="tcpconnect", specs=(SPEC_BTF, SPEC_RAW), factory=TcpConnectProbe,
    activity=activity, delta=delta, map_entries=lambda s: len(s.per_key),
    signals=("connect_p99_ns", "syn_retransmits_per_s", "connect_failures_per_s"),
    signal_extractor=SignalExtractor(
        stage="network", fields=("connects", "connect_p99_ns", "connect_failures_per_s", "syn_retransmits_per_s"),
        workloads=workload_signals,
        signal_specs=(
            # The p99 is stored every tick, unknown (NaN) in a tick with no connect that completed.
            SignalSpec("connect_p99_ns", "TCP connect p99", "ms", 1e-6, noise_floor=20_000.0, stored="always",
                       stored_when="connects", baseline=True,
                       # Connect trouble is sparse: the worst p99 of the recent ticks where a connect completed.
                       slo=SloSpec("connect_p99_ms", 200.0, check_order=20, to_raw=1e6,
                                   gate=lambda row: row.connect_p99_ns if row.connects else 0.0,
                                   window_ticks=CONNECT_WINDOW_TICKS, doc="worst p99 of the recent ticks")),
            SignalSpec("syn_retransmits_per_s", "SYN retransmits", "/s", stored="never"),
            # refused, timed out, or abandoned by the application while connecting
            SignalSpec("connect_failures_per_s", "Failed connects", "/s", stored="never"),
        ),
        row_specs=(RowFieldSpec("connects", int),)),
    metrics=(CONNECT_LATENCY, CONNECT_SUCCESSES, CONNECT_FAILURES, CONNECT_ERRORS, CONNECT_SYN_RETRANSMITS),
    metric_specs=(
        MetricSpec(CONNECT_LATENCY, "histogram", "TCP connect() to ESTABLISHED of successful connects."),
        MetricSpec(CONNECT_SUCCESSES, "counter", "TCP connects that reached ESTABLISHED."),
        MetricSpec(CONNECT_FAILURES, "counter", "TCP connects that failed after sending a SYN (ActiveOpens - "
                   "successes - aborts)."),
        MetricSpec(CONNECT_ERRORS, "counter", "TCP connects that did not succeed, by reason (refused, timeout, aborted, "
                   "local_error; refused and timeout are also failures).", ("reason",)),
        MetricSpec(CONNECT_SYN_RETRANSMITS, "counter", "SYN retransmits of connecting sockets."),
    ),
    cgroup_series=cgroup_series,
    top_view="tcp",
    top_table=TOP_TABLE,
    top_options={"outlier_threshold_ns": 0},
    run_counts_option="run_counts_live",
)
