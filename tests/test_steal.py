# SPDX-License-Identifier: Apache-2.0
"""probes/steal.py: hypervisor steal per CPU from /proc/stat, as a plugin — parsing, the interval, the
exported per-CPU counters, the detector's per-workload join; and this VM's own steal against the kernel."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from detector.signals import SignalBuilder
from probes import steal
from probes.cgroupfiles import parse_proc_stat
from probes.engine import ProbeError
from probes.host import HostPaths
from probes.registry import BY_NAME

STAT = """cpu  300 0 100 1000 10 0 5 {s0s1} 0 0
cpu0 100 0 50 500 5 0 2 {s0} 0 0
cpu1 200 0 50 500 5 0 3 {s1} 0 0
intr 12345
"""


def _stat(s0: int, s1: int) -> str:
    return STAT.format(s0=s0, s1=s1, s0s1=s0 + s1)


def _parse_steal(text: str) -> tuple[dict[int, int], dict[int, int]]:
    return steal.steal_of(parse_proc_stat(text)[1])


def _host(tmp_path, text: str) -> HostPaths:
    (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/stat").write_text(text)
    return HostPaths.under(tmp_path)


def test_parse_takes_the_eighth_column_per_cpu():
    s, total = _parse_steal(_stat(7, 0))
    assert s == {0: 7 * 10_000_000, 1: 0}
    assert total[0] == (100 + 50 + 500 + 5 + 2 + 7) * 10_000_000
    # a line short of the steal column (ancient kernels) reads as no steal; a line with junk is left out
    assert _parse_steal("cpu0 1 2 3 4\ncpu1 1 2 3 4 5 6 7 x\n") == ({0: 0}, {0: 10 * 10_000_000})


def test_probe_interval_and_series_from_a_fake_proc_stat(tmp_path):
    paths = _host(tmp_path, _stat(10, 0))
    probe = steal.StealProbe(paths=paths)
    first = probe.snapshot()
    (tmp_path / "proc/stat").write_text(_stat(60, 0).replace("cpu0 100 0 50 500", "cpu0 100 0 50 550"))
    second = probe.snapshot()
    d = steal.delta(first, second)
    assert d.steal_ns == {0: 500_000_000}  # 50 ticks; cpu1 did not move
    assert d.share(0) == pytest.approx(50 / (50 + 50))  # 50 ticks idle, 50 stolen
    assert d.share(1) == 0.0
    series = list(steal.node_series(second))
    assert series == [(steal.CPU_STEAL, ("0",), 0.6)]  # cpu1 has no steal: no series
    assert BY_NAME["steal"] is steal.PLUGIN and steal.PLUGIN.default


def test_probe_off_with_one_line_reason(tmp_path):
    with pytest.raises(ProbeError, match=r"^steal: .*stat is missing$"):
        steal.StealProbe(paths=HostPaths.under(tmp_path))
    with pytest.raises(ProbeError, match="no per-CPU lines"):
        steal.StealProbe(paths=_host(tmp_path, "cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 x\n"))


def test_exporter_publishes_steal_per_cpu_with_steal_only():
    from noisyneighbor.exporter import Exporter, render_text
    from probes.snapshot import NodeSnapshot

    snap = steal.StealSnapshot(1.0, {0: 2_500_000_000, 1: 0}, {0: 10**10, 1: 10**10})
    per_cpu = Exporter(None, node="n", per_cpu_series=True)
    per_cpu.update(NodeSnapshot(monotonic_s=1.0, wall_s=1.0, plugins={"steal": snap}))
    text = render_text(per_cpu).decode()
    assert 'noisyneighbor_cpu_steal_seconds_total{node="n",cpu="0"} 2.5' in text
    assert 'cpu="1"' not in text.split("noisyneighbor_cpu_steal_seconds_total", 1)[1].split("# HELP", 1)[0]
    summed = Exporter(None, node="n")  # the series budget's default: per-CPU families summed
    summed.update(NodeSnapshot(monotonic_s=1.0, wall_s=1.0, plugins={"steal": snap}))
    assert 'noisyneighbor_cpu_steal_seconds_total{node="n"} 2.5' in render_text(summed).decode()


def test_workload_steal_is_weighted_by_where_it_ran():
    """A workload on CPU 0 only gets CPU 0's steal: 400 ms/s there, 0 on CPU 1."""
    from detector.cgroups import CgroupResolver
    from detector.workloads import IdMapper, WorkloadIndex
    from probes.cgroupfs import discover
    from probes.cpuacct import CgroupCpuStat
    from probes.snapshot import NodeSnapshot

    paths = HostPaths()
    layout = discover(paths)
    index = WorkloadIndex(ls_globs=["/ls-*"])
    builder = SignalBuilder(layout, IdMapper(CgroupResolver(paths, layout), index))
    s0 = steal.StealSnapshot(10.0, {0: 0, 1: 0}, {0: 0, 1: 0})
    s1 = steal.StealSnapshot(11.0, {0: 400_000_000, 1: 0}, {0: 10**9, 1: 10**9})
    def cpu(usage_ns: int) -> CgroupCpuStat:
        return CgroupCpuStat(2, usage_ns, None, None, 0, 0, 0, None, None, None, None)

    prev = NodeSnapshot(monotonic_s=10.0, wall_s=0.0, plugins={"steal": s0}, cgroup_cpus={"/ls-web": (0,)},
                        cgroup_cpu={"/ls-web": cpu(0)})
    cur = NodeSnapshot(monotonic_s=11.0, wall_s=1.0, plugins={"steal": s1}, cgroup_cpus={"/ls-web": (0,)},
                       cgroup_cpu={"/ls-web": cpu(300_000_000)})
    signals = builder.build(prev, cur, extra_paths=["/ls-web"])
    assert signals.steal_ms_per_s_by_cpu == {0: pytest.approx(400.0)}
    assert signals.workloads["/ls-web"].steal_ms_per_s == pytest.approx(400.0)


def test_this_hosts_steal_matches_the_kernel():
    """The probe's per-CPU steal is /proc/stat's, read at the same moment (ticks, so exact)."""
    probe = steal.StealProbe()
    snap = probe.snapshot()
    again, _ = _parse_steal(Path("/proc/stat").read_text())
    for cpu, ns in snap.steal_ns.items():
        assert ns <= again[cpu] <= ns + 2 * 10_000_000 * 100  # grows by at most 2 s of ticks meanwhile


def test_a_collector_tick_reads_proc_stat_once_and_the_probe_takes_that_reading(monkeypatch):
    """/proc/stat once a tick (issue 42): the collector reads it at the start of the tick and the steal
    probe takes that reading, so the node's CPU times and the probe's steal are the same read."""
    from probes import cgroupfiles
    from probes.collect import NodeCollector

    reads: list[Path] = []
    real = cgroupfiles._read_text  # every read of a declared /proc file goes through it

    def counted(path: str) -> str:
        if Path(path) == HostPaths().proc / "stat":
            reads.append(Path(path))
        return real(path)

    monkeypatch.setattr(cgroupfiles, "_read_text", counted)
    with NodeCollector(probes=("steal",)) as collector:
        assert collector.status["steal"].state == "on"
        for _ in range(2):
            reads.clear()
            snap = collector.collect()
            assert reads == [HostPaths().proc / "stat"]
            stolen = snap.probe("steal")
            assert stolen.steal_ns == {cpu: t.steal_ns for cpu, t in snap.node_cpu_per_cpu.items()}
            assert stolen.monotonic_s == collector.proc_stat.latest.monotonic_s


# -- the cause --------------------------------------------------------------------------------------


def _steal_signals(tmp_path, stolen_ticks_per_s: int | list[int], foreign_ns: float | list[float] = 0.0,
                   wait_ms_per_s: float | list[float] = 120.0, p99_ns: float | list[float] = 8e6):
    """Signals of ticks over a fake /proc/stat whose CPU 1 loses `stolen_ticks_per_s` ticks a second to
    the hypervisor, with an LS victim on CPU 1 breaching its runqueue SLO (p99 8 ms): five ticks, or one
    a value where lists give each tick its own (all lists as long as ``stolen_ticks_per_s``)."""
    def at(v, i):
        return v[i] if isinstance(v, list) else v
    from detector.cgroups import CgroupResolver
    from detector.workloads import IdMapper, WorkloadIndex
    from probes.cgroupfs import discover
    from probes.cpuacct import CgroupCpuStat
    from probes.snapshot import NodeSnapshot

    paths = _host(tmp_path, _stat(0, 0))
    probe = steal.StealProbe(paths=paths)
    layout = discover(HostPaths())
    builder = SignalBuilder(layout, IdMapper(CgroupResolver(HostPaths(), layout), WorkloadIndex(ls_globs=["/ls-*"])))
    prev = None
    ticks = len(stolen_ticks_per_s) if isinstance(stolen_ticks_per_s, list) else 5
    stolen_total = 0
    for t in range(ticks + 1):
        stolen_total += at(stolen_ticks_per_s, t - 1) if t else 0
        (tmp_path / "proc/stat").write_text(_stat(0, stolen_total))
        stolen = dataclasses.replace(probe.snapshot(), monotonic_s=float(t))  # the fake clock of these ticks
        snap = NodeSnapshot(monotonic_s=float(t), wall_s=float(t), plugins={"steal": stolen},
                            cgroup_cpus={"/ls-web": (1,)},
                            cgroup_cpu={"/ls-web": CgroupCpuStat(2, t * 300_000_000, None, None, 0, 0, 0, None, None,
                                                                 None, None)})
        if prev is not None:
            signals = builder.build(prev, snap, extra_paths=["/ls-web"])
            row = signals.workloads["/ls-web"]
            row.runq_count, row.runq_p99_ns, row.runq_wait_ms_per_s = 1000, at(p99_ns, t - 1), at(wait_ms_per_s, t - 1)
            row.who_ran_instead_available = True
            if at(foreign_ns, t - 1):
                row.ran_instead_ns["pod:batch"] = at(foreign_ns, t - 1)
            yield signals
        prev = snap


def _engine():
    from detector.incidents import IncidentEngine
    from detector.policy import Policy

    return IncidentEngine(Policy(), clock=lambda: 0.0)


def test_steal_from_a_fake_proc_stat_is_hypervisor_steal_with_no_culprit_and_no_action(tmp_path):
    engine = _engine()
    for signals in _steal_signals(tmp_path, stolen_ticks_per_s=30):  # 300 ms/s of CPU 1 stolen
        assert signals.workloads["/ls-web"].steal_ms_per_s == pytest.approx(300.0)
        engine.step(signals, ts=0.0)
    incidents = engine.all_incidents()
    assert [str(i.cause) for i in incidents] == ["hypervisor_steal"], [i.to_dict() for i in incidents]
    inc = incidents[0]
    assert inc.culprits == []
    e = next(e for e in inc.evidence if e.signal == "steal_ms_per_s")
    assert e.value == pytest.approx(300.0) and "CPUs [1]" in e.note
    assert engine.sink.decisions == []  # no suppress, no action: nothing on the node to act on


def test_little_steal_or_a_neighbour_that_explains_more_is_not_steal(tmp_path):
    engine = _engine()
    for signals in _steal_signals(tmp_path / "a", stolen_ticks_per_s=1):  # 10 ms/s: a healthy VM
        engine.step(signals, ts=0.0)
    assert all(str(i.cause) != "hypervisor_steal" for i in engine.all_incidents())
    engine = _engine()
    # 100 ms/s stolen, but a BE pod ran for 110 ms/s of the victim's 120 ms/s wait: the neighbour.
    for signals in _steal_signals(tmp_path / "b", stolen_ticks_per_s=10, foreign_ns=110e6):
        engine.step(signals, ts=0.0)
    assert [str(i.cause) for i in engine.all_incidents()] == ["neighbor_cpu"]


def test_a_burst_of_steal_as_a_neighbour_starts_does_not_name_the_incident(tmp_path):
    """Five quiet ticks, then a BE pod takes the victim's CPU and, in the second the incident opens, the
    hypervisor takes 600 ms of it: the incident may open as steal, but once the steal is gone and the pod explains
    the wait, the incident is the neighbour's (it stayed hypervisor_steal, with no culprit, for its
    whole life in a scenario bench run)."""
    quiet, n = 5, 5
    engine = _engine()
    # The burst comes in the second tick of the breach, the one the incident opens on.
    for signals in _steal_signals(tmp_path, stolen_ticks_per_s=[0] * quiet + [0, 60] + [0] * (n - 1),
                                  foreign_ns=[0.0] * quiet + [250e6] * (n + 1),
                                  wait_ms_per_s=[20.0] * quiet + [300.0] * (n + 1),
                                  p99_ns=[0.5e6] * quiet + [8e6] * (n + 1)):
        engine.step(signals, ts=0.0)
    incidents = engine.all_incidents()
    assert [str(i.cause) for i in incidents] == ["neighbor_cpu"], [i.to_dict() for i in incidents]
    assert [c.target.cgroup for c in incidents[0].culprits] == ["pod:batch"]


@pytest.fixture
def scenario(make_cgroup):
    from testkit.scenario_support import scenario_harness
    from tests.test_detector_scenarios import VICTIM_CPU, _policy

    yield from scenario_harness(make_cgroup, VICTIM_CPU, _policy)


@pytest.mark.root
@pytest.mark.slow
def test_quiet_runs_on_this_vm_open_no_steal_incident(scenario):
    """This machine is a VM with non-zero steal: a quiet LS pod (and whatever else the node runs meanwhile)
    must not get a hypervisor_steal incident from its few ms/s."""
    from tests.test_detector_scenarios import VICTIM_CPU

    s = scenario()
    assert s.collector.status["steal"].state == "on"
    ls = s.pod("web", "LS")
    s.ls_worker(ls, [VICTIM_CPU], seconds=12)
    s.run_for(10)
    steal_now = s.detector.prev.probe("steal")
    assert steal_now is not None and sum(steal_now.steal_ns.values()) > 0, "this VM's steal counters"
    assert all(str(i.cause) != "hypervisor_steal" for i in s.incidents()), [i.to_dict() for i in s.incidents()]


def active_interval() -> steal.StealInterval:
    """An interval in which CPU 0 was stolen from (tests/test_signal_plugins.py)."""
    return steal.StealInterval(1.0, {0: 200_000_000}, {0: 10**9, 1: 10**9})
