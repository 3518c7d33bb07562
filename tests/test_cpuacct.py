# SPDX-License-Identifier: Apache-2.0
"""Per-cgroup CPU accounting: v1 (separate and co-mounted cpu,cpuacct) and v2 files, deltas, real kernel."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes.cgroupfiles import CPU_MAX, parse_flat_keyed
from probes.cgroupfs import discover
from probes.cpuacct import (
    CgroupCpuReader,
    CgroupCpuStat,
    cpu_delta,
    locate_cpu_stat_dirs,
    read_cgroup_cpu,
    read_v1_cpu_stat,
)
from probes.host import HostPaths
from testkit.cpu_reasons import cpu_stat_unavailable_reason
from testkit.sandbox import OwnedCgroup, shield
from testkit.timing import slowdown

POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")

V2_CPU_STAT = """usage_usec 76841942
user_usec 42954254
system_usec 33887687
nice_usec 0
core_sched.force_idle_usec 0
nr_periods 1200
nr_throttled 300
throttled_usec 4500000
nr_bursts 3
burst_usec 20000
"""
V1_CPU_STAT = "nr_periods 50\nnr_throttled 10\nthrottled_time 123456789\nnr_bursts 0\nburst_time 0\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def v2_host(root: Path) -> HostPaths:
    write(root / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "sys/fs/cgroup/cpu.stat", "usage_usec 900\nuser_usec 600\nsystem_usec 300\n")
    d = root / "sys/fs/cgroup" / POD.lstrip("/")
    write(d / "cpu.stat", V2_CPU_STAT)
    write(d / "cpu.max", "50000 100000\n")
    return HostPaths.under(root)


def v1_host(root: Path, combined: bool) -> HostPaths:
    cg = root / "sys/fs/cgroup"
    if combined:
        (cg / "cpu,cpuacct").mkdir(parents=True)
        os.symlink("cpu,cpuacct", cg / "cpu")
        os.symlink("cpu,cpuacct", cg / "cpuacct")
        cpu_dir = acct_dir = cg / "cpu,cpuacct" / POD.lstrip("/")
    else:
        cpu_dir, acct_dir = cg / "cpu" / POD.lstrip("/"), cg / "cpuacct" / POD.lstrip("/")
    (cg / "memory").mkdir(parents=True)
    write(cg / "unified/cgroup.controllers", "\n")
    write(cpu_dir / "cpu.stat", V1_CPU_STAT)
    write(cpu_dir / "cpu.cfs_quota_us", "20000\n")
    write(cpu_dir / "cpu.cfs_period_us", "100000\n")
    write(acct_dir / "cpuacct.usage", "87844036314\n")
    write(acct_dir / "cpuacct.stat", "user 4910\nsystem 3873\n")
    return HostPaths.under(root)


def _lean_read(layout, path: str) -> CgroupCpuStat | None:
    """The agent's per-tick reader, fresh (so it reads the limit files too): same results as read_cgroup_cpu."""
    return CgroupCpuReader(layout, path).read(limits=True)


BOTH_READERS = pytest.mark.parametrize("read_cpu", [read_cgroup_cpu, _lean_read], ids=["read_cgroup_cpu", "lean"])


# -- parsing ------------------------------------------------------------------------------------


def test_parse_flat_keyed_skips_garbage() -> None:
    text = "usage_usec 10\nbroken\nnr_periods x\n\nthree fields here\nnr_throttled 2\n"
    assert parse_flat_keyed(text) == {"usage_usec": 10, "nr_throttled": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max 100000\n", (None, 100000)),
        ("50000 100000\n", (50000, 100000)),
        ("150000 50000", (150000, 50000)),
        ("", None),
        ("max\n", None),
        ("lots 100000\n", None),
        ("50000 0\n", None),
        ("-1 100000\n", None),
    ],
)
def test_parse_cpu_max(text: str, expected: tuple[int | None, int] | None) -> None:
    got = CPU_MAX.parse_or_none(2, text)  # the one parser (probes.cgroupfiles), as a probe reads it
    assert (None if got is None else (got.quota_us, got.period_us)) == expected


# -- v2 -----------------------------------------------------------------------------------------


@BOTH_READERS
def test_v2_pod_cgroup(read_cpu, tmp_path: Path) -> None:
    layout = discover(v2_host(tmp_path))
    stat = read_cpu(layout, POD)
    assert stat == CgroupCpuStat(
        cgroup_version=2,
        usage_ns=76841942_000,
        user_ns=42954254_000,
        system_ns=33887687_000,
        nr_periods=1200,
        nr_throttled=300,
        throttled_ns=4500000_000,
        nr_bursts=3,
        burst_ns=20000_000,
        quota_us=50000,
        period_us=100000,
    )
    assert stat.quota_cores == pytest.approx(0.5)
    assert cpu_stat_unavailable_reason(layout, POD) is None


@BOTH_READERS
def test_v2_unlimited_and_root_without_bandwidth(read_cpu, tmp_path: Path) -> None:
    paths = v2_host(tmp_path)
    write(paths.cgroup_root / POD.lstrip("/") / "cpu.max", "max 100000\n")
    layout = discover(paths)
    stat = read_cpu(layout, POD)
    assert stat is not None and stat.quota_us is None and stat.period_us == 100000 and stat.quota_cores is None
    # The root (or any cgroup without the cpu controller) has no cpu.max and no throttling counters.
    root = read_cpu(layout, "/")
    assert root is not None
    assert (root.usage_ns, root.nr_periods, root.nr_throttled, root.throttled_ns) == (900_000, 0, 0, 0)
    assert (root.quota_us, root.period_us, root.nr_bursts, root.burst_ns) == (None, None, None, None)


@BOTH_READERS
def test_v2_bad_files_give_none_and_a_reason(read_cpu, tmp_path: Path) -> None:
    paths = v2_host(tmp_path)
    layout = discover(paths)
    pod = paths.cgroup_root / POD.lstrip("/")
    write(pod / "cpu.max", "garbage\n")
    assert read_cpu(layout, POD) is None
    assert "malformed" in (cpu_stat_unavailable_reason(layout, POD) or "")
    write(pod / "cpu.max", "max 100000\n")
    write(pod / "cpu.stat", "nr_periods 3\n")
    assert read_cpu(layout, POD) is None
    assert "usage_usec" in (cpu_stat_unavailable_reason(layout, POD) or "")


# -- v1 -----------------------------------------------------------------------------------------


@BOTH_READERS
@pytest.mark.parametrize("combined", [False, True], ids=["separate", "cpu,cpuacct"])
def test_v1_layouts(read_cpu, tmp_path: Path, combined: bool) -> None:
    layout = discover(v1_host(tmp_path, combined))
    assert layout.mode == "hybrid"
    dirs = locate_cpu_stat_dirs(layout, POD)
    assert dirs is not None and dirs.cgroup_version == 1
    assert (dirs.cpu_dir == dirs.cpuacct_dir) is combined
    stat = read_cpu(layout, POD)
    assert stat == CgroupCpuStat(
        cgroup_version=1,
        usage_ns=87844036314,
        user_ns=4910 * TICK_NS,
        system_ns=3873 * TICK_NS,
        nr_periods=50,
        nr_throttled=10,
        throttled_ns=123456789,
        nr_bursts=0,
        burst_ns=0,
        quota_us=20000,
        period_us=100000,
    )
    assert stat.quota_cores == pytest.approx(0.2)


def test_v1_tick_conversion_and_unlimited_quota(tmp_path: Path) -> None:
    layout = discover(v1_host(tmp_path, combined=True))
    d = layout.v1["cpu"].path_of(POD)
    write(d / "cpu.cfs_quota_us", "-1\n")
    write(d / "cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")  # pre-5.14: no burst lines
    stat = read_v1_cpu_stat(d, d, clock_ticks=250)
    assert stat is not None
    assert stat.user_ns == 4910 * 4_000_000 and stat.system_ns == 3873 * 4_000_000
    assert stat.quota_us is None and stat.quota_cores is None
    assert stat.nr_bursts is None and stat.burst_ns is None


@BOTH_READERS
def test_v1_without_cfs_bandwidth_files(read_cpu, tmp_path: Path) -> None:
    layout = discover(v1_host(tmp_path, combined=False))
    d = layout.v1["cpu"].path_of(POD)
    for name in ("cpu.stat", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
        (d / name).unlink()  # CONFIG_CFS_BANDWIDTH=n: the directory exists, the files do not
    stat = read_cpu(layout, POD)
    assert stat is not None and stat.usage_ns == 87844036314
    assert (stat.nr_periods, stat.nr_throttled, stat.quota_us, stat.period_us) == (0, 0, None, None)


@BOTH_READERS
@pytest.mark.parametrize("combined", [False, True], ids=["separate", "cpu,cpuacct"])
def test_vanished_cgroup_is_none(read_cpu, tmp_path: Path, combined: bool) -> None:
    layout = discover(v1_host(tmp_path, combined))
    assert read_cpu(layout, "/kubepods.slice/gone") is None
    assert "does not exist" in (cpu_stat_unavailable_reason(layout, "/kubepods.slice/gone") or "")


@BOTH_READERS
def test_v1_cgroup_removed_from_one_hierarchy_mid_read(read_cpu, tmp_path: Path) -> None:
    # The cpu directory went away after cpuacct was read: no half-filled sample.
    layout = discover(v1_host(tmp_path, combined=False))
    cpu_dir = layout.v1["cpu"].path_of(POD)
    for f in cpu_dir.iterdir():
        f.unlink()
    cpu_dir.rmdir()
    assert read_cpu(layout, POD) is None
    assert "does not exist" in (cpu_stat_unavailable_reason(layout, POD) or "")


@BOTH_READERS
def test_v1_garbage_usage_and_missing_cpuacct(read_cpu, tmp_path: Path) -> None:
    layout = discover(v1_host(tmp_path, combined=False))
    write(layout.v1["cpuacct"].path_of(POD) / "cpuacct.usage", "12abc\n")
    assert read_cpu(layout, POD) is None
    assert "not an integer" in (cpu_stat_unavailable_reason(layout, POD) or "")

    no_acct = tmp_path / "noacct"
    (no_acct / "sys/fs/cgroup/cpu").mkdir(parents=True)
    layout = discover(HostPaths.under(no_acct))
    assert read_cpu(layout, "/") is None
    assert "cpuacct" in (cpu_stat_unavailable_reason(layout, "/") or "")


@BOTH_READERS
def test_v2_vanished_cgroup_is_none(read_cpu, tmp_path: Path) -> None:
    layout = discover(v2_host(tmp_path))
    assert read_cpu(layout, "/kubepods.slice/gone") is None


# -- deltas -------------------------------------------------------------------------------------


def sample(usage_ns: int, periods: int = 0, throttled: int = 0, throttled_ns: int = 0,
           quota_us: int | None = 50_000, version: int = 2) -> CgroupCpuStat:
    return CgroupCpuStat(version, usage_ns, usage_ns // 2, usage_ns // 2, periods, throttled, throttled_ns,
                         None, None, quota_us, 100_000)


def test_delta_rates() -> None:
    d = cpu_delta(sample(1_000_000_000, 100, 10, 0), sample(1_500_000_000, 120, 18, 200_000_000), 1.0)
    assert not d.reset
    assert d.usage_cores == pytest.approx(0.5)
    assert d.user_cores == pytest.approx(0.25) and d.system_cores == pytest.approx(0.25)
    assert d.throttled_fraction == pytest.approx(8 / 20)
    assert d.throttled_s_per_s == pytest.approx(0.2)
    assert d.quota_cores == pytest.approx(0.5)
    assert d.quota_utilisation == pytest.approx(1.0)  # at its own quota


def test_delta_without_periods_or_quota() -> None:
    d = cpu_delta(sample(0, quota_us=None), sample(2_000_000_000, quota_us=None), 2.0)
    assert d.usage_cores == pytest.approx(1.0)
    assert d.throttled_fraction is None and d.quota_cores is None and d.quota_utilisation is None


@pytest.mark.parametrize(
    "cur",
    [sample(10), sample(2_000_000_000, periods=5), sample(2_000_000_000, 100, 1), sample(2_000_000_000, 100, 10, 0),
     sample(2_000_000_000, 100, 10, 5, version=1)],
    ids=["usage", "periods", "throttled", "throttled_ns", "version"],
)
def test_delta_counters_going_backwards_reset(cur: CgroupCpuStat) -> None:
    prev = sample(1_000_000_000, 100, 10, 5)
    d = cpu_delta(prev, cur, 1.0)
    assert d.reset
    assert (d.usage_cores, d.throttled_fraction, d.throttled_s_per_s) == (None, None, None)


def test_delta_rejects_zero_elapsed() -> None:
    with pytest.raises(ValueError, match="positive"):
        cpu_delta(sample(0), sample(1), 0)


# -- real kernel --------------------------------------------------------------------------------

BUSY_LOOP = ("import sys, time\nprint('go', flush=True)\nend = time.monotonic() + float(sys.argv[1])\n"
             "while time.monotonic() < end:\n    pass\n")


def spawn_busy(cg: OwnedCgroup, seconds: float) -> subprocess.Popen:
    """A bounded busy loop that joins `cg` before it execs, so all its CPU time is charged there."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)], preexec_fn=cg.preexec,
                            stdout=subprocess.PIPE)


def schedstat_runtime_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@pytest.mark.smoke
@pytest.mark.vm
@pytest.mark.root
def test_real_quota_throttles_and_usage_matches_schedstat(make_cgroup) -> None:
    layout = discover()
    cpu = layout.hierarchy_for("cpu")
    if cpu is None:
        pytest.skip("no cpu controller on this host")
    if cpu.version == 1:
        cg = make_cgroup("quota", ("cpu", "cpuacct"))
        cg.write("cpu", "cpu.cfs_period_us", "100000")
        cg.write("cpu", "cpu.cfs_quota_us", "20000")
    else:
        cg = make_cgroup("quota", ("cpu",))
        cg.write("cpu", "cpu.max", "20000 100000")
    rel = "/" + str(cg.path("cpu").relative_to(cpu.mount))
    # The loop must want more than its quota in every period, or nothing throttles: on a loaded machine
    # (CI, a slow guest) a task at the root's default weight gets a few % of a CPU. Our nn-test-<pid>
    # directory gets 16 times a nice-0 task's weight (the quota, not the weight, is what is measured).
    unshield = shield(cg)
    try:
        _throttle_and_check(layout, cg, rel)
    finally:
        unshield()


def _stop(pid: int) -> None:
    """SIGSTOP and wait until the task is stopped (off the CPU): a slow guest takes a while."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5 * slowdown()
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.01)
    time.sleep(0.05)  # its last switch-out accounted


def _raw_throttled(cg: OwnedCgroup) -> int:
    """nr_throttled straight from the kernel's cpu.stat (the same name on v1 and v2)."""
    for line in cg.read("cpu", "cpu.stat").splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            return int(value)
    raise AssertionError("cpu.stat has no nr_throttled")


def _throttle_and_check(layout, cg: OwnedCgroup, rel: str) -> None:
    before = read_cgroup_cpu(layout, rel)
    assert before is not None, cpu_stat_unavailable_reason(layout, rel)
    assert (before.quota_us, before.period_us, before.quota_cores) == (20000, 100000, pytest.approx(0.2))
    proc = spawn_busy(cg, 600)  # bounded even if this test dies; stopped after the window
    try:
        # The window starts once the loop runs: an interpreter takes seconds to start in a TCG guest.
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], 60 * slowdown())[0]
        assert ready and proc.stdout.readline() == b"go\n", "the busy loop did not start"
        # Frozen at both ends of the window so schedstat and the cgroup agree: the child's CPU time
        # before it joined the cgroup (fork, preexec: ~1 ms here, >100 ms in a slow guest) is its own.
        _stop(proc.pid)
        mid = read_cgroup_cpu(layout, rel)
        on_cpu_mid_ns = schedstat_runtime_ns(proc.pid)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGCONT)
        time.sleep(2.0)
        _stop(proc.pid)
        raw_before = _raw_throttled(cg)
        after = read_cgroup_cpu(layout, rel)
        raw_after = _raw_throttled(cg)
        t1 = time.monotonic()
        on_cpu_ns = schedstat_runtime_ns(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=5)
    assert after is not None and mid is not None

    delta = cpu_delta(mid, after, t1 - t0)
    assert not delta.reset
    assert after.nr_throttled > mid.nr_throttled
    # The reader's count is the kernel's, read around it (stopped: nothing runs, nothing throttles).
    assert raw_before <= after.nr_throttled <= raw_after
    assert after.throttled_ns > mid.throttled_ns
    assert delta.usage_cores == pytest.approx(0.2, rel=0.25)
    assert delta.throttled_fraction is not None and delta.throttled_fraction > 0.5
    assert delta.quota_utilisation == pytest.approx(1.0, rel=0.25)
    # Every on-CPU nanosecond of the process was charged to the cgroup (it joined before exec).
    assert after.usage_ns - mid.usage_ns == pytest.approx(on_cpu_ns - on_cpu_mid_ns, rel=0.05)
    assert after.usage_ns - before.usage_ns <= on_cpu_ns


def test_lean_reader_reads_limits_only_when_asked(tmp_path: Path) -> None:
    """Quota and period come from the first read and from reads with limits=True; cpu.stat (v1) is
    read only while a quota is set."""
    paths = v1_host(tmp_path, combined=True)
    layout = discover(paths)
    d = tmp_path / "sys/fs/cgroup/cpu,cpuacct" / POD.lstrip("/")
    reader = CgroupCpuReader(layout, POD)
    first = reader.read()
    assert first is not None and first.quota_us == 20000 and first.nr_throttled == 10
    write(d / "cpu.cfs_quota_us", "-1\n")
    assert reader.read().quota_us == 20000  # not re-read without limits=True
    unlimited = reader.read(limits=True)
    assert unlimited is not None and unlimited.quota_us is None and unlimited.period_us == 100000
    (d / "cpu.stat").unlink()  # no quota: cpu.stat is not needed, so its absence is not a vanished cgroup
    still = reader.read()
    assert still is not None and still.usage_ns == 87844036314 and still.nr_throttled == 0
    write(d / "cpu.cfs_quota_us", "50000\n")
    assert reader.read(limits=True) is None  # a quota, but cpu.stat is gone: vanished mid-read
