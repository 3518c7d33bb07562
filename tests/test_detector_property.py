# SPDX-License-Identifier: Apache-2.0
"""Every valid configuration through ``Detector.step`` on random snapshots: no exception, ever.

The configurations are drawn from the declarations the policy validates against (the `slo:` settings in
``detector.catalog``, the actuator and suppress switches the engine reads) and pass through the real
loader, so the test covers exactly what a user may write. The snapshots are random cumulative readings
of a few workloads (runqueue histograms with who-ran-instead, softirq, reclaim, connects, CPU
accounting and throttling, memory, PSI) that grow tick by tick, so breaches open incidents and every
cause rule runs on the values it divides by. Found by it first: an SLO of 0 that a rule divides by
(refused at load now).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.catalog import KNOBS, SLO_SIGNALS
from detector.cgroups import parse_cgroup_path
from detector.decisions import LoggingSink
from detector.policy import CPU_SUPPRESS_POLICIES, policy_from_mapping
from detector.runtime import Detector
from probes.cgroupfs import discover
from probes.cpuacct import CgroupCpuStat
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.host import HostPaths
from probes.memstat import MemStat, NodeVmstat
from probes.psi import PsiLine, PsiReading
from probes.reclaim import KINDS, ReclaimSnapshot, ReclaimStats
from probes.runqlat import CulpritStats, RunqSnapshot, WaitSplit
from probes.snapshot import NodeSnapshot
from probes.softirq import VECTORS, SoftirqSnapshot, SoftirqStats
from probes.tcpconnect import ConnectStats, TcpConnectSnapshot

# Standalone workloads, one cgroup each: odd ids latency-sensitive, even ids best-effort.
PATHS = {i: f"/nn-prop/{'ls' if i % 2 else 'be'}-{i}" for i in range(1, 7)}
CPUS = (0, 1)
TICKS = 8


class _Resolver:
    """Cgroup ids <-> the paths above; no pods on this fake node."""

    def __init__(self) -> None:
        self.layout = discover(HostPaths())

    def resolve(self, cgroup_id: int, hierarchy: Any = None):
        return parse_cgroup_path(PATHS[cgroup_id]) if cgroup_id in PATHS else None

    def id_of(self, path: str, hierarchy: Any = None) -> int | None:
        return next((i for i, p in PATHS.items() if p == path), None)

    def all(self, hierarchy: Any = None, max_age: float = 0.0) -> list:
        return []


def _setting(lo: float | None, hi: float | None, kind: type, exclude_min: bool = False) -> st.SearchStrategy:
    if kind is int:
        low = int(lo or 0)
        return st.integers(low, int(hi) if hi is not None else 2**63)
    return st.floats(lo, hi, exclude_min=exclude_min, allow_nan=False, allow_infinity=False)  # the whole range


def _slo() -> st.SearchStrategy[dict]:
    fields = {s.slo.field: _setting(*s.slo.range, float, exclude_min=s.slo.divides)
              for s in SLO_SIGNALS if s.slo is not None}
    # breach_seconds is drawn as ticks of the interval (an incident must be able to open in 8 ticks too)
    fields.update({k.field: _setting(*k.range, k.type) for k in KNOBS if k.field != "breach_seconds"})
    fields["breach_seconds"] = st.one_of(st.floats(0, 4), _setting(*next(k.range for k in KNOBS
                                                                         if k.field == "breach_seconds"), float))
    return st.fixed_dictionaries({}, optional=fields)


CONFIGS = st.fixed_dictionaries({
    "slo": _slo(),
    "actuators": st.fixed_dictionaries({}, optional={
        name: st.booleans() for name in ("suppress_enabled", "evict_enabled", "burst_enabled")}),
    "resource-threshold-config": st.fixed_dictionaries({}, optional={
        "cpuSuppressPolicy": st.sampled_from(CPU_SUPPRESS_POLICIES), "cpuSuppressMinCpus": st.integers(0, 4)}),
    "interval_seconds": st.floats(0.01, 3600),
})


def _hist(rng: random.Random, base: LatencyHistogram | None, scale: int) -> LatencyHistogram:
    """``base`` plus a random interval's events (latencies up to 2^(scale) µs)."""
    add = [rng.randrange(0, 60) if i <= scale and rng.random() < 0.4 else 0 for i in range(HIST_SLOTS)]
    slots = add if base is None else [a + b for a, b in zip(base.slots, add, strict=True)]
    count = sum(slots)
    top = max((i for i, n in enumerate(slots) if n), default=0)
    return LatencyHistogram(tuple(slots), sum(n * (1 << i) * 1000 for i, n in enumerate(slots)), count,
                            (1 << top) * 1000 if count else 0)


def _grow(rng: random.Random, value: int | None, step: int) -> int:
    return (value or 0) + rng.randrange(0, step + 1)


def _snapshots(seed: int):
    """TICKS cumulative snapshots of the same random node, each a random interval after the last."""
    rng = random.Random(seed)
    ids = sorted(PATHS)
    t = 100.0
    prev: NodeSnapshot | None = None
    for _ in range(TICKS):
        t += rng.choice((0.0, 0.001, 0.5, 1.0, 1.0, 2.0))  # a zero-length interval too
        scale = rng.choice((4, 12, 20, HIST_SLOTS - 1))
        p = prev
        runq = RunqSnapshot(
            t, {i: _hist(rng, p.probe("runqlat").per_cgroup.get(i) if p else None, scale) for i in ids},
            [_hist(rng, p.probe("runqlat").per_cpu[c] if p else None, scale) for c in CPUS], {},
            wait_split={i: WaitSplit(*(_grow(rng, getattr(p.probe("runqlat").wait_split.get(i), f, 0) if p else 0, 10**8)
                                       for f in ("own_wait_ns", "foreign_wait_ns", "idle_wait_ns",
                                                 "unknown_wait_ns", "migrated_wait_ns", "own_preemptions",
                                                 "foreign_preemptions"))) for i in ids},
            culprits={(v, c): CulpritStats(_grow(rng, p.probe("runqlat").culprits[(v, c)].wait_ns if p else 0, 10**8),
                                           _grow(rng, p.probe("runqlat").culprits[(v, c)].count if p else 0, 50),
                                           _grow(rng, p.probe("runqlat").culprits[(v, c)].preemptions if p else 0, 50))
                      for v in ids for c in ids if v != c},
            culprits_available=bool(seed % 3),
        )
        sirq = SoftirqSnapshot(t, {(c, v): SoftirqStats(
            _hist(rng, p.probe("softirq").stats[(c, v)].delay if p else None, scale),
            _hist(rng, p.probe("softirq").stats[(c, v)].runtime if p else None, scale),
            _grow(rng, p.probe("softirq").stats[(c, v)].entries if p else 0, 1000)) for v in VECTORS for c in CPUS}, {})
        rec = ReclaimSnapshot(
            t, {(i, k): ReclaimStats(_hist(rng, p.probe("reclaim").per_cgroup[(i, k)].latency if p else None, scale),
                                     _grow(rng, p.probe("reclaim").per_cgroup[(i, k)].nr_reclaimed if p else 0, 10**5), 0)
                for i in ids for k in KINDS},
            {k: ReclaimStats(_hist(rng, p.probe("reclaim").node[k].latency if p else None, scale),
                             _grow(rng, p.probe("reclaim").node[k].nr_reclaimed if p else 0, 10**5), 0) for k in KINDS}, {})

        def connect(old: ConnectStats | None, scale: int = scale) -> ConnectStats:
            fields = [_grow(rng, getattr(old, f) if old else 0, 3) for f in (
                "successes", "failures", "refused", "timeouts", "aborts", "local_errors", "syn_retransmits")]
            return ConnectStats(_hist(rng, old.latency if old else None, scale), *fields)

        tcp = TcpConnectSnapshot(t, {(i, 1): connect(p.probe("tcpconnect").per_key.get((i, 1)) if p else None)
                                     for i in ids}, {}, {})
        cpu = {}
        mem = {}
        psi = {}
        for path in PATHS.values():
            old = p.cgroup_cpu.get(path) if p else None
            quota = rng.choice((None, 10_000, 50_000, 200_000))
            cpu[path] = CgroupCpuStat(
                rng.choice((1, 2)), _grow(rng, old.usage_ns if old else 0, 2 * 10**9), None, None,
                _grow(rng, old.nr_periods if old else 0, 20), _grow(rng, old.nr_throttled if old else 0, 20),
                _grow(rng, old.throttled_ns if old else 0, 10**9), None, None, quota, 100_000 if quota else None)
            mem[path] = MemStat(2, rng.randrange(0, 2**34), rng.choice((None, 2**30)), rng.randrange(0, 2**30),
                                rng.randrange(0, 2**30), None, None, None, None)
            psi[path] = {r: PsiReading(r, PsiLine(rng.uniform(0, 100), rng.uniform(0, 100), 0.0,
                                                  _grow(rng, 0, 10**6)), None) for r in ("cpu", "memory", "io")}
        vmstat = NodeVmstat({"normal": _grow(rng, p.node_vmstat.allocstall["normal"] if p else 0, 100)}, None, None,
                            None, _grow(rng, p.node_vmstat.pgsteal_kswapd if p else 0, 10**6), None, None)
        snap = NodeSnapshot(t, t, plugins={"runqlat": runq, "softirq": sirq, "reclaim": rec, "tcpconnect": tcp},
                            node_vmstat=vmstat, cgroup_cpu=cpu, cgroup_mem=mem,
                            cgroup_psi=psi, cgroup_cpus={path: CPUS for path in PATHS},
                            cgroup_cpu_percpu={path: tuple(rng.randrange(0, 10**9) for _ in CPUS) for path in PATHS})
        prev = snap
        yield snap


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, seed=st.integers(0, 2**32))
def test_every_valid_config_survives_random_snapshots(config: dict, seed: int) -> None:
    policy = policy_from_mapping(config, source="<property>")
    policy = dataclasses.replace(policy, ls_cgroups=("nn-prop/ls-*",), be_cgroups=("nn-prop/be-*",),
                                 pod_source="standalone", incident_log=None)
    resolver = _Resolver()
    detector = Detector(policy, HostPaths(), resolver.layout, resolver, sink=LoggingSink())  # type: ignore[arg-type]
    for snap in _snapshots(seed):
        detector.step(snap)
    detector.close()
