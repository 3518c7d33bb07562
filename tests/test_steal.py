"""probes/steal.py: hypervisor steal per CPU from /proc/stat, as a plugin — parsing, the interval, the
exported per-CPU counters, the detector's per-workload join; and this VM's own steal against the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.signals import SignalBuilder
from probes import steal
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


def _host(tmp_path, text: str) -> HostPaths:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/stat").write_text(text)
    return HostPaths.under(tmp_path)


def test_parse_takes_the_eighth_column_per_cpu():
    s, total = steal.parse_steal(_stat(7, 0))
    assert s == {0: 7 * 10_000_000, 1: 0}
    assert total[0] == (100 + 50 + 500 + 5 + 2 + 7) * 10_000_000
    # a line without a steal column (ancient kernels) or with junk is left out
    assert steal.parse_steal("cpu0 1 2 3 4\ncpu1 1 2 3 4 5 6 7 x\n") == ({}, {})


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
    with pytest.raises(ProbeError, match="no per-CPU steal column"):
        steal.StealProbe(paths=_host(tmp_path, "cpu0 1 2 3 4\n"))


def test_exporter_publishes_steal_per_cpu_with_steal_only():
    from noisyneighbor.exporter import Exporter, render_text
    from probes.snapshot import NodeSnapshot

    snap = steal.StealSnapshot(1.0, {0: 2_500_000_000, 1: 0}, {0: 10**10, 1: 10**10})
    exporter = Exporter(None, node="n")
    exporter.update(NodeSnapshot(monotonic_s=1.0, wall_s=1.0, plugins={"steal": snap}))
    text = render_text(exporter).decode()
    assert 'noisyneighbor_cpu_steal_seconds_total{node="n",cpu="0"} 2.5' in text
    assert 'cpu="1"' not in text.split("noisyneighbor_cpu_steal_seconds_total", 1)[1].split("# HELP", 1)[0]


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
    again, _ = steal.parse_steal(Path("/proc/stat").read_text())
    for cpu, ns in snap.steal_ns.items():
        assert ns <= again[cpu] <= ns + 2 * 10_000_000 * 100  # grows by at most 2 s of ticks meanwhile
