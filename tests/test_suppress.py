# SPDX-License-Identifier: Apache-2.0
"""CPU suppress on real cgroups (cfsQuota and cpuset), via the runner; plus the formula and CPU picking."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actuators.base import Refused
from actuators.cgroupfile import CgroupFiles, parse_cpu_list
from actuators.journal import Journal
from actuators.suppress import (
    CpuTopology,
    SuppressActuator,
)
from detector.decisions import ActionKind, Decision, SuppressAmount, Target
from detector.policy import ResourceThresholdStrategy
from probes.cgroupfiles import CPU_MAX
from probes.cgroupfs import discover
from probes.cpuacct import read_cgroup_cpu
from probes.host import HostPaths
from testkit.koordlet_threshold import CpuUsageSampler, SuppressInputs, be_allowed_cores
from testkit.sandbox import shield
from testkit.tools import require_tool
from tests.helpers_actuators import fake_cpu_topology, fake_v1_host, tree_hashes

REPO = Path(__file__).resolve().parents[1]
LS_WORKER = Path(__file__).resolve().parent.parent / "testkit" / "workloads" / "ls_worker.py"
LAST_CPU = str((os.cpu_count() or 1) - 1)


# -- pure parts ---------------------------------------------------------------------------------


def test_koordlet_formula() -> None:
    inputs = SuppressInputs(capacity_cores=8, node_used_cores=6, pods_used_cores=5, be_used_cores=3,
                            host_apps_used_cores=0.5, node_reserved_cores=0.25)
    # 8*0.65 - (5-3) - 0.5 - max(6-5-0.5, 0.25) = 5.2 - 2 - 0.5 - 0.5
    assert be_allowed_cores(inputs, 65) == pytest.approx(2.2)
    reserved = SuppressInputs(8, 5.2, 5, 3, 0.0, 1.0)
    assert be_allowed_cores(reserved, 65) == pytest.approx(5.2 - 2 - 1.0)


def test_cpu_pick_prefers_siblings_and_spreads_numa(tmp_path: Path) -> None:
    # 2 nodes x 2 cores x 2 threads: cpu i and i+4 are siblings; node0 = cores {0,4},{1,5}; node1 = {2,6},{3,7}
    fake_cpu_topology(tmp_path, ["0,4", "1,5", "2,6", "3,7", "0,4", "1,5", "2,6", "3,7"], {0: "0-1,4-5", 1: "2-3,6-7"})
    topo = CpuTopology.read(HostPaths.under(tmp_path))
    assert topo.pick(2) == (0, 4)  # one whole core
    assert topo.pick(4) == (0, 2, 4, 6)  # a whole core on each node
    assert topo.pick(2, excluded={0}) == (1, 5)  # a broken core goes last
    assert set(topo.pick(2, prefer=(3, 7))) in ({0, 4}, {3, 7}) and len(topo.pick(3)) == 3


def test_quota_floor_dead_band_and_growth_cap(tmp_path: Path) -> None:
    be = "kubepods/besteffort"
    files = CgroupFiles(fake_v1_host(tmp_path, ["kubepods", be]))
    fake_cpu_topology(tmp_path, [str(i) for i in range(10)], {0: "0-9"})
    act = SuppressActuator(files, Journal(tmp_path / "j"), ResourceThresholdStrategy(cpu_suppress_policy="cfsQuota"))

    def decide(cores: float) -> Decision:
        return Decision(ActionKind.SUPPRESS, Target(be, qos="BE"), SuppressAmount("cfs_quota", cpu_cores=cores), "t")

    plan = act.plan(decide(0.0))
    assert plan.writes[-1].new == "2000"  # koordlet's minimum quota
    act.apply(plan)
    plan = act.plan(decide(9.0))  # +8.98 cores wanted, at most 10 % of 10 cores per round
    assert plan.writes[-1].new == str(2000 + 100_000)
    act.apply(plan)
    with pytest.raises(Refused, match="below 1 %"):
        act.plan(decide(1.025))  # 1.02 -> 1.025 cores: 0.05 % of capacity
    assert act.plan(decide(0.5)).writes[-1].new == "50000"  # shrinking is not capped


# -- real cgroups -------------------------------------------------------------------------------

def _rel(cg, controller: str = "cpu") -> str:
    layout = discover(HostPaths())
    return str(cg.path(controller).relative_to(layout.hierarchy_for(controller).mount))


def _usage_cores(rel: str, seconds: float) -> float:
    layout = discover(HostPaths())
    a, t0 = read_cgroup_cpu(layout, rel), time.monotonic()
    time.sleep(seconds)
    b, t1 = read_cgroup_cpu(layout, rel), time.monotonic()
    return (b.usage_ns - a.usage_ns) / ((t1 - t0) * 1e9)


def _culprit_wait(prev, cur, victim: int, culprit: int) -> int:
    """Wait of the victim cgroup while the culprit cgroup ran, between two runqlat snapshots."""
    c = cur.culprits.get((victim, culprit))
    return 0 if c is None else c.delta(prev.culprits.get((victim, culprit))).wait_ns


def _runner(*args: str) -> tuple[subprocess.Popen, dict]:
    p = subprocess.Popen([sys.executable, "-m", "actuators", *args], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line, f"runner printed nothing: {p.stderr.read() if p.poll() is not None else ''}"
    return p, json.loads(line)


def _stop(p: subprocess.Popen, sig: int) -> int:
    p.send_signal(sig)
    return p.wait(timeout=20)


@pytest.fixture
def hog(make_cgroup):
    """A BE cgroup with two CPU hogs pinned to the last CPU, so the contention with the LS worker
    (pinned there too) is ours and not only the other tests' sharing this machine."""
    be = make_cgroup("be", ("cpu", "cpuacct", "cpuset"))
    be.write("cpu", "cpu.shares", "10240")  # a heavy neighbor: it wins the CPU against the LS worker
    stress = require_tool("stress-ng")
    proc = subprocess.Popen(["taskset", "-c", LAST_CPU, stress, "--cpu", "2", "--cpu-method", "int64", "-t", "120",
                             "--quiet"], preexec_fn=be.preexec)
    deadline = time.monotonic() + 10
    while len(be.read("cpu", "tasks").split()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield be
    proc.kill()
    proc.wait()


@pytest.mark.root
@pytest.mark.slow
def test_cfs_quota_suppress_caps_be_and_helps_ls(make_cgroup, hog, tmp_path: Path) -> None:
    from probes.runqlat import RunqLatProbe

    ls = make_cgroup("ls", ("cpu", "cpuacct"))
    # The hog and the LS worker first on their CPU against the rest of the node (other test runs, CI
    # load): otherwise the hog gets ~0.2 cores there and the test has no BE usage to cap.
    unshield = shield(ls)
    worker = subprocess.Popen(["taskset", "-c", LAST_CPU, sys.executable, str(LS_WORKER), "--work-ms", "1.5",
                               "--period-ms", "5", "--seconds", "60"], preexec_fn=ls.preexec, stdout=subprocess.DEVNULL)
    be_rel, ls_ino, be_ino = _rel(hog), os.stat(ls.path("cpu")).st_ino, os.stat(hog.path("cpu")).st_ino
    files = CgroupFiles()
    original = files.read_raw(CPU_MAX, be_rel)
    try:
        with RunqLatProbe() as probe:
            time.sleep(1.0)
            s0 = probe.snapshot()
            time.sleep(3.0)
            s1 = probe.snapshot()
            before = s1.per_cgroup[ls_ino].delta(s0.per_cgroup.get(ls_ino))
            usage_before = _usage_cores(be_rel, 1.0)
            # The machine is shared with other tests: cap well below what BE gets now, so the cap binds.
            planned = round(max(0.1, 0.3 * usage_before), 2)
            runner, out = _runner("apply-suppress", "--cgroup", be_rel, "--policy", "cfsQuota", "--cores", str(planned),
                                  "--journal", str(tmp_path / "j"), "--audit-log", str(tmp_path / "audit.jsonl"))
            assert out["state"] == "applied", out
            assert out["details"]["cpu_cores"] == pytest.approx(planned)
            t_applied = time.monotonic()
            time.sleep(0.3)
            usage_after = _usage_cores(be_rel, 1.5)
            assert time.monotonic() - t_applied < 2.5
            s2 = probe.snapshot()
            time.sleep(3.0)
            s3 = probe.snapshot()
            after = s3.per_cgroup[ls_ino].delta(s2.per_cgroup.get(ls_ino))
        p99_before, p99_after = before.quantile_ns(0.99), after.quantile_ns(0.99)
        be_wait_before = _culprit_wait(s0, s1, ls_ino, be_ino) / max(before.count, 1)
        be_wait_after = _culprit_wait(s2, s3, ls_ino, be_ino) / max(after.count, 1)
        print(f"BE usage {usage_before:.2f} -> {usage_after:.2f} cores (planned {planned:.2f}); "
              f"LS runq p99 {p99_before / 1e6:.2f} -> {p99_after / 1e6:.2f} ms, mean {before.mean_ns / 1e6:.2f} -> "
              f"{after.mean_ns / 1e6:.2f} ms, count {before.count}/{after.count}; "
              f"LS wait behind BE per wakeup {be_wait_before / 1e6:.2f} -> {be_wait_after / 1e6:.2f} ms")
        assert usage_before > 0.25
        assert usage_after == pytest.approx(planned, rel=0.10)
        # The cap takes 70 % of BE's CPU: the LS worker waits behind BE at fewer of its wakeups, so its
        # mean wait falls. Not its p99: a wakeup inside one of BE's bursts still waits out the burst, as
        # long as before (p99 15-70 % lower in most runs here, 1 % higher in one: 29.3 -> 29.7 ms, while
        # the mean wait behind BE per wakeup fell from 26.5 to 1.5 ms).
        assert after.mean_ns < 0.5 * before.mean_ns
        if s1.culprits_available and be_wait_before > 0:  # attribution flavour loaded and saw BE run
            assert be_wait_after < 0.5 * be_wait_before
        assert files.read_cpu_max(be_rel).quota_us == round(planned * 100_000)
        assert _stop(runner, signal.SIGTERM) == 0
        assert files.read_raw(CPU_MAX, be_rel) == original
        audit = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [a["state"] for a in audit if a.get("event") == "action"] == ["applied", "reverted"]
    finally:
        unshield()
        worker.kill()
        worker.wait()


@pytest.mark.root
def test_kill9_then_reconcile_restores(hog, tmp_path: Path) -> None:
    be_rel = _rel(hog)
    files = CgroupFiles()
    original = files.read_raw(CPU_MAX, be_rel)
    runner, out = _runner("apply-suppress", "--cgroup", be_rel, "--policy", "cfsQuota", "--cores", "0.3",
                          "--journal", str(tmp_path / "j"))
    assert out["state"] == "applied"
    assert files.read_cpu_max(be_rel).quota_us == 30_000
    assert _stop(runner, signal.SIGKILL) == -signal.SIGKILL
    assert files.read_cpu_max(be_rel).quota_us == 30_000  # nobody restored it
    rec = subprocess.run([sys.executable, "-m", "actuators", "reconcile", "--journal", str(tmp_path / "j")], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["restored"] == [str(files.path(CPU_MAX, be_rel))]
    assert files.read_raw(CPU_MAX, be_rel) == original
    # a second reconcile has nothing left to do
    rec = subprocess.run([sys.executable, "-m", "actuators", "reconcile", "--journal", str(tmp_path / "j")], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert json.loads(rec.stdout)["restored"] == []


def _allowed(pid: int) -> tuple[int, ...]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


@pytest.mark.root
def test_cpuset_suppress_nested_and_restore(make_cgroup, tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("cpuset suppress needs at least 2 CPUs to shrink anything")
    parent = make_cgroup("be", ("cpu", "cpuacct", "cpuset"))
    child = make_cgroup("be/pod", ("cpu", "cpuacct", "cpuset"))
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"], preexec_fn=child.preexec)
    try:
        files = CgroupFiles()
        rel, child_rel = _rel(parent, "cpuset"), _rel(child, "cpuset")
        all_cpus = files.read_cpus(rel)
        runner, out = _runner("apply-suppress", "--cgroup", rel, "--policy", "cpuset", "--cores", "1", "--min-cpus", "1",
                              "--journal", str(tmp_path / "j"))
        assert out["state"] == "applied", out
        planned = parse_cpu_list(out["details"]["cpus"])
        assert len(planned) == 1
        # union top-down (nothing to widen here), then the new set bottom-up: child before parent
        assert [Path(w[0]).parent.name for w in out["writes"]] == [Path(child_rel).name, Path(rel).name]
        assert files.read_cpus(rel) == planned and files.read_cpus(child_rel) == planned
        assert _allowed(proc.pid) == planned
        assert _stop(runner, signal.SIGTERM) == 0
        assert files.read_cpus(rel) == all_cpus and files.read_cpus(child_rel) == all_cpus
        assert _allowed(proc.pid) == all_cpus
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.root
def test_dry_run_runner_writes_nothing(hog, tmp_path: Path) -> None:
    be_rel = _rel(hog)
    dirs = [hog.path(c) for c in ("cpu", "cpuset")]
    before = {d: tree_hashes(d) for d in dirs}
    runner, out = _runner("apply-suppress", "--cgroup", be_rel, "--policy", "cfsQuota", "--cores", "0.2",
                          "--journal", str(tmp_path / "j"), "--dry-run")
    assert out["state"] == "planned" and out["writes"][0][2] == "20000"
    time.sleep(0.3)
    assert {d: tree_hashes(d) for d in dirs} == before
    runner2, out2 = _runner("apply-suppress", "--cgroup", be_rel, "--policy", "cpuset", "--cores", "1", "--min-cpus", "1",
                            "--journal", str(tmp_path / "j2"), "--dry-run")
    assert out2["state"] == "planned"
    assert {d: tree_hashes(d) for d in dirs} == before
    assert _stop(runner, signal.SIGTERM) == 0 and _stop(runner2, signal.SIGTERM) == 0
    assert {d: tree_hashes(d) for d in dirs} == before


@pytest.mark.root
def test_usage_sampler_matches_cpuacct(hog) -> None:
    files = CgroupFiles()
    be_rel = _rel(hog)
    pods = str(Path(be_rel).parent)  # our prefix dir stands in for kubepods
    sampler = CpuUsageSampler(files, pods, [be_rel])
    assert sampler.sample() is None
    layout = discover(HostPaths())
    a = read_cgroup_cpu(layout, be_rel)
    time.sleep(1.0)
    inputs = sampler.sample()
    b = read_cgroup_cpu(layout, be_rel)
    assert inputs is not None
    assert inputs.capacity_cores == os.cpu_count()
    truth = (b.usage_ns - a.usage_ns) / 1e9
    print(f"sampler BE {inputs.be_used_cores:.2f} cores, cpuacct {truth:.2f}, node {inputs.node_used_cores:.2f}")
    assert inputs.be_used_cores == pytest.approx(truth, rel=0.25)
    assert inputs.node_used_cores >= inputs.be_used_cores * 0.8
