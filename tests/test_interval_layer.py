# SPDX-License-Identifier: Apache-2.0
"""One interval layer (issue 18): each probe plugin's ``delta(prev, cur)`` is what both ``top`` and the
agent's detector (detector.signals.SignalBuilder) read. The same snapshots through both give the same
numbers; the detector gets its BPF inputs only from the plugins' deltas; a delta's work follows the
cgroups that moved, not the map's size."""

from __future__ import annotations

import dataclasses
import random

import pytest

from detector.causes.tcpconnect import ListenJoin
from detector.cgroups import parse_cgroup_path
from detector.decisions import Target
from detector.signals import ProbeTick, SignalBuilder
from detector.workloads import IdMapper, WorkloadIndex
from noisyneighbor.sections import table_section
from probes import registry, runqlat
from probes.cgroupfs import discover
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.host import HostPaths
from probes.reclaim import KINDS, ReclaimSnapshot, ReclaimStats
from probes.reclaim import summarize as reclaim_rows
from probes.runqlat import RunqInterval, RunqSnapshot
from probes.snapshot import NodeSnapshot
from probes.softirq import VECTORS, SoftirqSnapshot, SoftirqStats
from probes.softirq import summarize as softirq_rows
from probes.tcpconnect import ConnectStats, TcpConnectSnapshot
from probes.tcpconnect import summarize as tcp_rows

# One cgroup per workload (standalone globs), so a workload's row is its cgroup's top row.
PATHS = {i: f"/nn-layer/{'ls' if i % 2 else 'be'}-{i}" for i in range(1, 31)}


class _Resolver:
    def resolve(self, cgroup_id: int, hierarchy=None):
        return parse_cgroup_path(PATHS[cgroup_id]) if cgroup_id in PATHS else None


def _hist(rng: random.Random, base: LatencyHistogram | None = None) -> LatencyHistogram:
    if base is not None and rng.random() < 0.4:
        return base  # idle this interval
    slots = [rng.randrange(1, 40) if rng.random() < 0.3 else 0 for _ in range(HIST_SLOTS)]
    if base is not None:
        slots = [a + b for a, b in zip(base.slots, slots, strict=True)]
    count = sum(slots)
    top = max((i for i, n in enumerate(slots) if n), default=0)
    return LatencyHistogram(tuple(slots), sum(n * (1 << i) * 1000 for i, n in enumerate(slots)), count,
                            (1 << top) * 1000 if count else 0)


def _pair(rng: random.Random) -> tuple[NodeSnapshot, NodeSnapshot]:
    ids = sorted(PATHS)
    runq = RunqSnapshot(10.0, {i: _hist(rng) for i in ids}, [_hist(rng), _hist(rng)], {})
    sirq = SoftirqSnapshot(10.0, {(c, v): SoftirqStats(_hist(rng), _hist(rng), 100) for v in VECTORS for c in (0, 1)}, {})
    rec = ReclaimSnapshot(10.0, {(i, KINDS[i % len(KINDS)]): ReclaimStats(_hist(rng), 10 * i, 0) for i in ids},
                          {k: ReclaimStats(_hist(rng), 5, 0) for k in KINDS}, {})
    tcp = TcpConnectSnapshot(10.0, {(i, 1): ConnectStats(_hist(rng), 10, 2, 1, 1, 1, 0, 3) for i in ids}, {}, {})
    runq2 = RunqSnapshot(12.0, {i: _hist(rng, h) for i, h in runq.per_cgroup.items()},
                         [_hist(rng, h) for h in runq.per_cpu], {})
    sirq2 = SoftirqSnapshot(12.0, {k: SoftirqStats(_hist(rng, s.delay), _hist(rng, s.runtime), s.entries + 50)
                                   for k, s in sirq.stats.items()}, {})
    rec2 = ReclaimSnapshot(12.0, {k: ReclaimStats(_hist(rng, s.latency), s.nr_reclaimed + 7, 0)
                                  for k, s in rec.per_cgroup.items()},
                           {k: ReclaimStats(_hist(rng, s.latency), 9, 0) for k, s in rec.node.items()}, {})
    tcp2 = TcpConnectSnapshot(12.0, {k: s if rng.random() < 0.4 else ConnectStats(
        _hist(rng, s.latency), s.successes + 5, s.failures + 2, s.refused + 2, 0, s.aborts + 1, 0, s.syn_retransmits + 4)
        for k, s in tcp.per_key.items()}, {}, {})
    cpus = {0: None, 1: None}
    return (NodeSnapshot(10.0, 0.0, plugins={"runqlat": runq, "softirq": sirq, "reclaim": rec, "tcpconnect": tcp},
                         node_cpu_per_cpu=cpus),
            NodeSnapshot(12.0, 0.0, plugins={"runqlat": runq2, "softirq": sirq2, "reclaim": rec2, "tcpconnect": tcp2},
                         node_cpu_per_cpu=cpus))


def _builder() -> SignalBuilder:
    index = WorkloadIndex(ls_globs=("/nn-layer/ls-*",), be_globs=("/nn-layer/be-*",))
    return SignalBuilder(discover(HostPaths()), IdMapper(_Resolver(), index))  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_top_and_the_detector_read_the_same_interval(seed):
    prev, cur = _pair(random.Random(seed))
    signals = _builder().build(prev, cur)
    by_path = {r.workload.target.cgroup: r for r in signals.workloads.values()}

    runq = table_section(runqlat.PLUGIN, prev.probe("runqlat"), cur.probe("runqlat"), _Resolver())["cgroups"]  # type: ignore[arg-type]
    assert runq, "some cgroups waited"
    for row in runq:
        w = by_path[PATHS[row["cgroup_id"]]]
        assert (w.runq_count, w.runq_wait_ms_per_s) == (row["events"], row["wait_ms_per_s"])
        assert (w.runq_p99_ns, w.runq_max_ns) == (row["p99_us"] * 1e3, row["max_us"] * 1e3)
    assert {r["cgroup_id"] for r in runq} == {i for i, p in PATHS.items() if by_path.get(p) and by_path[p].runq_count}

    for row in reclaim_rows(prev.probe("reclaim"), cur.probe("reclaim")):  # type: ignore[arg-type]
        w = by_path[PATHS[row["cgroup_id"]]]
        assert w.reclaim_by_kind_ms_per_s[row["kind"]] == row["stall_ms_per_s"]
        assert w.reclaim_pages_per_s == row["pages_per_s"]

    tcp = tcp_rows(prev.probe("tcpconnect"), cur.probe("tcpconnect"))  # type: ignore[arg-type]
    assert tcp
    for row in tcp:
        w = by_path[PATHS[row["cgroup_id"]]]
        assert w.connect_failures_per_s == (row["failures"] + row["aborts"]) / 2.0
        assert w.syn_retransmits_per_s == row["syn_retransmits"] / 2.0
        if row["latency_p99_ms"] is not None:  # successful connects' latency, rounded to µs in top's row
            assert row["latency_p99_ms"] == pytest.approx(w.connect_p99_ns / 1e6, abs=1e-3)

    per_cpu: dict[int, float] = {}
    for row in softirq_rows(prev.probe("softirq"), cur.probe("softirq"), include_idle=True):  # type: ignore[arg-type]
        per_cpu[row["cpu"]] = per_cpu.get(row["cpu"], 0.0) + row["runtime_s"] * 1e3 / 2.0
    assert per_cpu == pytest.approx(signals.softirq_ms_per_s_by_cpu)


def test_the_detector_takes_its_bpf_inputs_from_the_plugins_delta(monkeypatch):
    prev, cur = _pair(random.Random(7))
    calls: list[str] = []
    for name in ("runqlat", "softirq", "reclaim", "tcpconnect"):
        plugin = registry.BY_NAME[name]

        def spy(p, c, plugin=plugin):
            calls.append(plugin.name)
            return plugin.delta(p, c)

        monkeypatch.setitem(registry.BY_NAME, name, dataclasses.replace(plugin, delta=spy))
    assert _builder().build(prev, cur).workloads
    assert sorted(calls) == ["reclaim", "runqlat", "softirq", "tcpconnect"]

    # What the plugin's interval leaves out, the detector does not see: a runq delta with no cgroup
    # gives no runqueue wait to any workload.
    def nothing(p, c):
        return RunqInterval(2.0, {}, [], {}, {}, False)

    monkeypatch.setitem(registry.BY_NAME, "runqlat", dataclasses.replace(registry.BY_NAME["runqlat"], delta=nothing))
    assert all(not w.runq_count for w in _builder().build(prev, cur).workloads.values())


def test_a_culprit_source_fed_before_the_step_shares_the_detectors_interval(monkeypatch):
    """As the agent runs a tick: the connect cause's culprit source (the listen join) hears the tick before the
    detector's step (ListenQueues.attach, with the detector's probe_tick), and the step builds on a copy of the
    snapshot holding the same readings (the listen report added), given the same tick. The probe's interval is
    computed once, and the source sees the tick's trouble in it."""
    prev, cur = _pair(random.Random(7))
    calls: list[str] = []
    plugin = registry.BY_NAME["tcpconnect"]

    def spy(p, c):
        calls.append(plugin.name)
        return plugin.delta(p, c)

    monkeypatch.setitem(registry.BY_NAME, "tcpconnect", dataclasses.replace(plugin, delta=spy))
    builder = _builder()
    join = ListenJoin(lambda cgroup_id: None, Target)
    tick = ProbeTick(prev, cur)
    assert join.observe(tick) is True  # failed connects in _pair's second tick
    assert join.observe(tick) is True and calls == ["tcpconnect"]  # asked again: the same interval
    assert builder.build(prev, dataclasses.replace(cur, listen=None), probes=tick).workloads
    assert calls == ["tcpconnect"]
    # The next tick computes its own: an interval is held by its tick only.
    assert builder.build(cur, dataclasses.replace(prev, monotonic_s=14.0)) and calls == ["tcpconnect"] * 2
    # Without a tick handed in, the build computes each interval itself, once.
    assert builder.build(prev, cur) and calls == ["tcpconnect"] * 3


def test_a_delta_works_on_the_cgroups_that_moved_not_the_whole_map(monkeypatch):
    idle = {i: LatencyHistogram((5,) + (0,) * (HIST_SLOTS - 1), 5000, 5, 1000) for i in range(1, 2001)}
    moved = dict(idle)
    moved[7] = LatencyHistogram((9,) + (0,) * (HIST_SLOTS - 1), 9000, 9, 1000)
    subtracted: list[int] = []
    real = LatencyHistogram.delta

    def counting(self, earlier):
        subtracted.append(self.count)
        return real(self, earlier)

    monkeypatch.setattr(LatencyHistogram, "delta", counting)
    interval = registry.BY_NAME["runqlat"].delta(RunqSnapshot(1.0, idle, [], {}), RunqSnapshot(2.0, moved, [], {}))
    assert list(interval.per_cgroup) == [7] and interval.per_cgroup[7].count == 4
    assert subtracted == [9]  # one histogram subtracted, not 2000
