# SPDX-License-Identifier: Apache-2.0
"""The actuators on kubelet-shaped pods, on the real kernel: this v1 hybrid host and the VM lane's pure
cgroup v2 (Debian 12's 6.1).

Each actuator writes the file of the hierarchy it runs on (v2: ``cpu.max``, ``cpuset.cpus``,
``cpu.max.burst``, ``memory.high``), the kernel is shown to enforce it (``cpu.stat`` usage and
throttling, ``cpuset.cpus.effective`` and the tasks' allowed CPUs, ``nr_bursts``, ``memory.events``),
and it is put back: by revert, by SIGTERM (``python -m actuators`` and the enforcing agent), and from
the journal after ``kill -9`` when the agent starts again (``--act-only`` on our own pods only).
Pods come from tests/kubelet_pods.py (systemd driver layout, a sandbox container in each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from actuators.burst import BurstActuator
from actuators.cgroupfile import CgroupFiles, parse_cpu_list
from actuators.journal import Journal
from actuators.memory import MemorySuppressActuator
from actuators.suppress import SuppressActuator
from detector.decisions import ActionKind, BurstAmount, Decision, MemorySuppressAmount, SuppressAmount, Target
from detector.policy import CpuBurstStrategy, ResourceThresholdStrategy
from probes.cgroupfiles import CPU_BURST, CPU_MAX, CPUSET_CPUS, MEMORY_HIGH, MEMORY_USAGE, CgroupFile
from probes.cgroupfs import discover, self_cgroups
from probes.cpuacct import read_cgroup_cpu
from testkit.exporter_support import REPO, AgentProcess, write_config
from testkit.sandbox import sandbox_layout
from testkit.scenario_support import LS_WORKER
from testkit.timing import slowdown
from tests.kubelet_pods import BE_NEIGHBOUR_SHARES, KContainer, KPod, KubeletNode, pure_v2
from tests.test_v2_pods import SPIN, VICTIM_CPU

pytestmark = [pytest.mark.root, pytest.mark.vm]
# Tests that start the agent: their time grows with the machine's slowness (TCG ~10x), past the suite's 300 s.
SLOW = slowdown()
AGENT_TIMEOUT = pytest.mark.timeout(int(300 * min(max(SLOW, 1.0), 8.0)))

# Holds 48 MiB of its own anonymous memory; on SIGUSR1 asks for 32 MiB more (one line each time).
MEMORY_HOG = """
import signal, sys, time
held = [bytearray(48 << 20)]
grow = []
signal.signal(signal.SIGUSR1, lambda *_: grow.append(1))
print("ready", flush=True)
while True:
    if grow:
        grow.clear()
        held.append(bytearray(32 << 20))
        print("grown", flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def node():
    n = KubeletNode("systemd")
    try:
        yield n
    finally:
        n.close()


def _tasks_in(c: KContainer, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(c.cgroup.read("cpu", "cgroup.procs").split()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} tasks did not join {c.path}")


def _usage_cores(rel: str, seconds: float) -> tuple[float, float]:
    """(CPU cores used, share of CFS periods throttled) of a cgroup over ``seconds``, from its cpu.stat."""
    layout = discover()
    a, t0 = read_cgroup_cpu(layout, "/" + rel), time.monotonic()
    time.sleep(seconds)
    b, t1 = read_cgroup_cpu(layout, "/" + rel), time.monotonic()
    periods = b.nr_periods - a.nr_periods
    return (b.usage_ns - a.usage_ns) / ((t1 - t0) * 1e9), (b.nr_throttled - a.nr_throttled) / periods if periods else 0.0


def _file(files: CgroupFiles, resource: CgroupFile[Any], rel: str) -> str:
    return files.read_raw(resource, rel).strip()


def _same_as(files: CgroupFiles, key: tuple[CgroupFile[Any], str], original: str) -> bool:
    """The file holds its original value, or, for an empty v2 cpuset the kernel would not set again on a
    cgroup with tasks, the parent's effective list it stood for (actuators.cgroupfile.write_file)."""
    resource, cg = key
    now = _file(files, resource, cg)
    if now == original:
        return True
    if resource != CPUSET_CPUS or original:
        return False
    return parse_cpu_list(now) == files.read_effective_cpus(str(Path(cg).parent))


def _allowed(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return set(parse_cpu_list(line.split(":", 1)[1]))
    raise AssertionError("no Cpus_allowed_list")


def _runner(*args: str) -> tuple[subprocess.Popen, dict]:
    p = subprocess.Popen([sys.executable, "-m", "actuators", *args], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line, f"runner printed nothing: {p.stderr.read() if p.poll() is not None else ''}"
    return p, json.loads(line)


def _spinning_be_pod(node: KubeletNode, n: int = 2) -> tuple[KPod, KContainer]:
    be = node.pod("batch", [{"name": "job"}])
    job = be.containers["job"]
    for _ in range(n):
        node.start(job, [sys.executable, "-c", SPIN, "600"], [VICTIM_CPU])
    _tasks_in(job, n, 30 * slowdown())
    return be, job


# -- suppress ---------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_cfs_quota_suppress_writes_the_pods_cpu_max_and_the_kernel_holds_it(node, tmp_path):
    be, _ = _spinning_be_pod(node)
    files = CgroupFiles(layout=sandbox_layout())
    quota_file = files.path(CPU_MAX, be.rel)
    assert quota_file.name == ("cpu.max" if pure_v2() else "cpu.cfs_quota_us")
    original = _file(files, CPU_MAX, be.rel)
    act = SuppressActuator(files, Journal(tmp_path / "j"), ResourceThresholdStrategy(cpu_suppress_policy="cfsQuota"))
    plan = act.plan(Decision(ActionKind.SUPPRESS, Target(be.path, qos="BE"), SuppressAmount("cfs_quota", cpu_cores=0.3), "t"))
    assert [w.path for w in plan.writes] == [str(quota_file)]
    assert plan.writes[0].new == ("30000 100000" if pure_v2() else "30000")
    act.apply(plan)
    window = 2.0 * min(slowdown(), 4.0)
    time.sleep(0.3)
    used, throttled = _usage_cores(be.rel, window)
    print(f"BE pod at 0.30 cores: used {used:.3f} cores, throttled in {throttled:.0%} of periods")
    # the kernel's bandwidth control: at most the quota per period (one period of slack at each end)
    assert used <= 0.3 * (1 + 2 * 0.1 / window) + 0.01
    assert used >= 0.15, "the spinners got too little CPU to show the cap binds"
    assert throttled >= 0.5
    act.revert(plan)
    assert _file(files, CPU_MAX, be.rel) == original
    assert Journal(tmp_path / "j").owned() == {}


def test_cpuset_suppress_keeps_every_child_within_its_parent_and_reverts(node, tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("cpuset suppress needs at least 2 CPUs to shrink anything")
    be = node.pod("batch", [{"name": "job"}])
    job = be.containers["job"]
    sleeper = node.start(job, ["sleep", "600"])
    _tasks_in(job, 1, 30 * slowdown())
    files = CgroupFiles(layout=sandbox_layout())
    tree = [be.rel, be.sandbox_container.path.lstrip("/"), job.path.lstrip("/")]
    before = {cg: _file(files, CPUSET_CPUS, cg) for cg in tree}
    every = _allowed(sleeper.pid)
    act = SuppressActuator(files, Journal(tmp_path / "j"), ResourceThresholdStrategy(cpu_suppress_policy="cpuset",
                                                                                    cpu_suppress_min_cpus=1))
    plan = act.plan(Decision(ActionKind.SUPPRESS, Target(be.path, qos="BE"), SuppressAmount("cpuset", cpus=(0,)), "t"))
    act.apply(plan)
    cpuset_h = files.hierarchy(CPUSET_CPUS)
    eff_name = "cpuset.cpus.effective" if cpuset_h.version == 2 else "cpuset.effective_cpus"

    def effective(cg: str) -> str:
        return (cpuset_h.path_of(cg) / eff_name).read_text().strip()

    for cg in tree:
        assert effective(cg) == "0", (cg, effective(cg))
    assert _allowed(sleeper.pid) == {0}
    # the parent of the pod (its QoS level) keeps every CPU; each child sits within its parent's set
    qos = str(Path(be.rel).parent)
    assert len(effective(qos).split(",")) >= 1 and effective(qos) != "0"
    act.revert(plan)
    for cg in tree:
        now = _file(files, CPUSET_CPUS, cg)
        # An empty v2 list ("the parent's") that 6.1 refuses to set again on a cgroup with tasks comes back
        # as the parent's effective list (actuators.cgroupfile.write_file): the same CPUs.
        assert now == before[cg] or (before[cg] == "" and parse_cpu_list(now) == parse_cpu_list(effective(qos))), \
            (cg, before[cg], now)
        assert effective(cg) == effective(qos), cg
    assert _allowed(sleeper.pid) == every


# -- burst ------------------------------------------------------------------------------------------


def test_burst_writes_cpu_max_burst_and_scales_quota_on_pod_and_container(node, tmp_path):
    files = CgroupFiles(layout=sandbox_layout())
    api = node.pod("api", [{"name": "main", "requests": {"cpu": "500m", "memory": "64Mi"},
                            "limits": {"cpu": "500m", "memory": "128Mi"}}])
    main = api.containers["main"]
    levels = [api.rel, main.path.lstrip("/")]
    if not all(files.exists(CPU_BURST, cg) for cg in levels):
        pytest.skip("this kernel has no CFS burst file (cpu.max.burst / cpu.cfs_burst_us)")
    burst_name = "cpu.max.burst" if pure_v2() else "cpu.cfs_burst_us"
    assert files.path(CPU_BURST, api.rel).name == burst_name
    before = {cg: (_file(files, CPU_MAX, cg), _file(files, CPU_BURST, cg)) for cg in levels}
    journal = Journal(tmp_path / "j")
    act = BurstActuator(files, journal, CpuBurstStrategy(policy="auto", cpu_burst_percent=100), closed_loop=False)
    burst = act.plan(Decision(ActionKind.BURST, Target(api.path, qos="LS"), BurstAmount(), "t"))
    act.apply(burst)
    for cg in levels:
        assert files.read_burst_us(cg) == 50_000  # 100 % of the 0.5-core quota: the kernel allows burst <= quota
    # A task idle most of the time that runs 150 ms at once uses what it saved: the kernel counts bursts.
    bursty = ("import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n"
              "    time.sleep(0.4)\n    t = time.thread_time() + 0.08\n    while time.thread_time() < t:\n        pass\n")
    node.start(main, [sys.executable, "-c", bursty], [VICTIM_CPU])
    stat = files.dir(CPU_MAX, main.path.lstrip("/")) / "cpu.stat"
    deadline = time.monotonic() + 20 * slowdown()
    bursts = 0
    while time.monotonic() < deadline:
        fields = dict(line.split() for line in stat.read_text().splitlines())
        if "nr_bursts" not in fields:
            break
        bursts = int(fields["nr_bursts"])
        if bursts > 0:
            break
        time.sleep(0.2)
    if "nr_bursts" in fields:
        assert bursts > 0, f"no burst counted in {stat}: {fields}"
    scale = act.plan(Decision(ActionKind.BURST, Target(api.path, qos="LS"), BurstAmount(quota_scale=1.2), "t"))
    # growing: the pod's quota before its container's, each quota before its burst
    assert Path(scale.writes[0].path).parent.name == Path(api.rel).name
    act.apply(scale)
    for cg in levels:
        assert files.read_cpu_max(cg).cores == pytest.approx(0.6)
    if pure_v2():
        assert _file(files, CPU_MAX, api.rel) == "60000 100000"
    act.revert(scale)
    act.revert(burst)
    assert {cg: (_file(files, CPU_MAX, cg), _file(files, CPU_BURST, cg)) for cg in levels} == before
    # Under auto a quota step alone sets the burst too, koordlet's static burst: 1000 % of 0.5 cores is more
    # than the base quota, so each level's burst is its base (the kernel refuses a burst above the quota), and
    # the loop's reset to the base (its decision carries the burst it keeps) moves the quota alone.
    auto = BurstActuator(files, journal, CpuBurstStrategy(policy="auto"), closed_loop=False)
    up = auto.plan(Decision(ActionKind.BURST, Target(api.path, qos="LS"), BurstAmount(quota_scale=1.2), "t"))
    auto.apply(up)
    held = [(files.read_cpu_max(cg).quota_us, files.read_burst_us(cg)) for cg in levels]
    assert held == [(60_000, 50_000)] * 2
    reset = auto.plan(Decision(ActionKind.BURST, Target(api.path, qos="LS"),
                               BurstAmount(burst_us=50_000, quota_scale=1.0), "t", follow_up=True))
    assert {Path(w.path).name for w in reset.writes} == {files.path(CPU_MAX, api.rel).name}
    auto.apply(reset)
    assert [(files.read_cpu_max(cg).quota_us, files.read_burst_us(cg)) for cg in levels] == [(50_000, 50_000)] * 2
    auto.revert(reset)
    auto.revert(up)
    assert {cg: (_file(files, CPU_MAX, cg), _file(files, CPU_BURST, cg)) for cg in levels} == before
    assert journal.owned() == {}


# -- memory -----------------------------------------------------------------------------------------


def test_memory_suppress_sets_memory_high_and_the_kernel_throttles_above_it(node, tmp_path):
    be = node.pod("batch", [{"name": "job"}])
    job = be.containers["job"]
    hog = node.start(job, [sys.executable, "-c", MEMORY_HOG], stdout=subprocess.PIPE, text=True)
    assert hog.stdout.readline().strip() == "ready"
    files = CgroupFiles(layout=sandbox_layout())
    limit_file = files.path(MEMORY_HIGH, be.rel)
    assert limit_file.name == ("memory.high" if pure_v2() else "memory.limit_in_bytes")
    original = _file(files, MEMORY_HIGH, be.rel)
    act = MemorySuppressActuator(files, Journal(tmp_path / "j"))
    plan = act.plan(Decision(ActionKind.MEMORY_SUPPRESS, Target(be.path, qos="BE"),
                             MemorySuppressAmount(headroom=0.05, floor_bytes=16 << 20, give_back_to_node=False), "t"))
    usage = int(_file(files, MEMORY_USAGE, be.rel))
    cap = int(plan.writes[0].new)
    assert usage * 0.9 <= cap <= usage * 1.1, (usage, cap)
    act.apply(plan)
    assert int(_file(files, MEMORY_HIGH, be.rel)) == cap
    if pure_v2():
        # memory.high throttles (and tries to reclaim) above it, never OOM-kills: the 32 MiB more the hog
        # asks for arrive late, and the kernel counts each time the cgroup went over
        events = files.dir(MEMORY_HIGH, be.rel) / "memory.events"
        high_before = int(dict(x.split() for x in events.read_text().splitlines())["high"])
        hog.send_signal(signal.SIGUSR1)
        assert hog.stdout.readline().strip() == "grown"
        high_after = int(dict(x.split() for x in events.read_text().splitlines())["high"])
        assert high_after > high_before, (high_before, high_after)
        assert hog.poll() is None, "memory.high must not kill"
    act.revert(plan)
    assert _file(files, MEMORY_HIGH, be.rel) == original


# -- SIGTERM and kill -9 + restart ----------------------------------------------------------------


@AGENT_TIMEOUT
def test_sigterm_and_kill9_restore_cpuset_burst_and_memory_high(node, tmp_path):
    """Three runner processes act on our pods through one journal; SIGTERM puts each file back; after
    ``kill -9`` of all three, the agent's start (enforcing, --act-only our pods) restores every file from
    the journal before it does anything else."""
    files = CgroupFiles(layout=sandbox_layout())
    be = node.pod("batch", [{"name": "job"}])
    node.start(be.containers["job"], [sys.executable, "-c", MEMORY_HOG], stdout=subprocess.PIPE)
    api = node.pod("api", [{"name": "main", "requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}])
    _tasks_in(be.containers["job"], 1, 30 * slowdown())
    time.sleep(1.0 * slowdown())  # the hog has its memory
    watched = {
        (CPUSET_CPUS, be.rel), (CPUSET_CPUS, be.containers["job"].path.lstrip("/")),
        (CPU_MAX, api.rel), (MEMORY_HIGH, be.rel),
    }
    has_burst = files.exists(CPU_BURST, api.rel)
    if has_burst:
        watched.add((CPU_BURST, api.rel))
    original = {k: _file(files, *k) for k in watched}
    journal = tmp_path / "journal"
    cpus = ["--policy", "cpuset", "--cores", "1", "--min-cpus", "1"]
    runs = [["apply-suppress", "--cgroup", be.rel, *cpus],
            ["apply-burst", "--cgroup", api.rel, "--quota-scale", "1.5", *(["--burst-us", "20000"] if has_burst else [])],
            ["apply-memory-suppress", "--cgroup", be.rel, "--headroom", "0.1"]]
    if (os.cpu_count() or 1) < 2:
        runs = [r for r in runs if r[0] != "apply-suppress"]
    mine = self_cgroups()
    if mine.get("memory", mine.get("", "/")) != mine.get("cpu", mine.get("", "/")):
        # The runner and the agent name a pod by its cpu path in every hierarchy, as on a node; here this
        # process's memory cgroup is another than its cpu cgroup, so our pods' memory paths differ.
        runs = [r for r in runs if r[0] != "apply-memory-suppress"]
        watched.discard((MEMORY_HIGH, be.rel))
        original.pop((MEMORY_HIGH, be.rel))
        print("memory suppress runs skipped: this host nests our memory cgroups under another parent than cpu")

    def changed() -> set[tuple[CgroupFile[Any], str]]:
        return {k for k in watched if not _same_as(files, k, original[k])}

    # SIGTERM: each one restores what it wrote
    for args in runs:
        p, out = _runner(*args, "--journal", str(tmp_path / "term"))
        assert out["state"] == "applied", out
        assert changed(), out
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60 * slowdown()) == 0
        assert changed() == set(), {k: _file(files, *k) for k in changed()}
    # kill -9: nothing restores them ...
    for args in runs:
        p, out = _runner(*args, "--journal", str(journal), "--reown")
        assert out["state"] == "applied", out
        p.kill()
        p.wait()
    made = {r[0] for r in runs}
    expected = {(CPU_MAX, api.rel)}
    if "apply-memory-suppress" in made:
        expected.add((MEMORY_HIGH, be.rel))
    if "apply-suppress" in made:
        expected.add((CPUSET_CPUS, be.rel))
    assert expected <= changed()
    assert len(json.loads((journal / "journal.json").read_text())["entries"]) >= len(expected)
    # ... until the agent starts again with that journal
    config = write_config(tmp_path / "config.yaml", {
        "actuators": {"dry_run": False, "cooldown_seconds": 0},
        "kubernetes": {"pod_source": "standalone"},
    })
    agent = AgentProcess(config, tmp_path, "--act-only", f"{be.rel}*", "--act-only", f"{api.rel}*",
                         "--probes", "runqlat")
    assert agent.journal == journal
    try:
        agent.wait_ready(timeout=120 * slowdown())
        assert changed() == set(), {k: (original[k], _file(files, *k)) for k in changed()}
        reconciled = [a for a in agent.audit() if a.get("event") == "reconcile"]
        assert reconciled and not reconciled[0]["failed"], agent.audit()
    finally:
        rc = agent.terminate(timeout=60 * slowdown())
    assert rc == 0, agent.log_tail()
    assert not (journal / "journal.json").exists()


@pytest.mark.slow
@AGENT_TIMEOUT
def test_enforcing_agent_suppresses_the_be_pod_and_restores_after_sigterm_and_kill9(node, tmp_path):
    """The agent on kubelet-shaped pods (standalone: QoS from the path): an LS worker and three BE spinners
    on one CPU -> neighbor_cpu -> the BE pod's cfs quota is cut; SIGTERM restores it; a second run is
    killed with -9 after it acted, and its restart restores the quota from the journal."""
    slow = SLOW
    files = CgroupFiles(layout=sandbox_layout())
    ls = node.pod("web", [{"name": "main", "requests": {"cpu": "500m"}}])
    be = node.pod("batch", [{"name": "job"}])
    node.weigh(be, BE_NEIGHBOUR_SHARES)  # a neighbour of the victim, not crowded out by the rest of a loaded host
    original = _file(files, CPU_MAX, be.rel)
    spinners: list[subprocess.Popen] = []

    def workloads() -> None:
        node.start(ls.containers["main"], [sys.executable, str(LS_WORKER), "--work-ms", "4", "--period-ms", "20",
                                           "--seconds", str(int(900 * slow))], [VICTIM_CPU])
        spinners.extend(node.start(be.containers["job"], [sys.executable, "-c", SPIN, str(900 * slow)], [VICTIM_CPU])
                        for _ in range(3))
    config = write_config(tmp_path / "config.yaml", {
        "slo": {"runq_p99_ms": 2.0},
        # long verification: the suppress must still be in effect when the signal arrives
        "actuators": {"dry_run": False, "verify_intervals": 10000, "cooldown_seconds": 0},
        "kubernetes": {"pod_source": "standalone"},
        "resource-threshold-config": {"cpuSuppressPolicy": "cfsQuota"},
    })
    interval = str(round(min(slow, 5.0), 1))

    def agent_off_the_victims_cpu(workdir: Path) -> AgentProcess:
        """The agent inherits this process's CPUs: kept off the victim's, where it would be one more neighbour
        (and, in a slow guest, would not get ready behind three spinners)."""
        affinity = os.sched_getaffinity(0)
        if len(affinity) > 1:
            os.sched_setaffinity(0, affinity - {VICTIM_CPU})
        try:
            return AgentProcess(config, workdir, "--act-only", f"{be.rel}", "--interval", interval,
                                "--probes", "runqlat")
        finally:
            os.sched_setaffinity(0, affinity)

    def run_until_applied(workdir: Path) -> AgentProcess:
        agent = agent_off_the_victims_cpu(workdir)
        try:
            agent.wait_ready(timeout=120 * slow)
            if not spinners:
                workloads()
            deadline = time.monotonic() + 60 * slow
            applied: list[dict] = []
            while time.monotonic() < deadline and not applied:
                applied = [a for a in agent.audit() if a.get("event") == "action" and a["kind"] == "suppress"
                           and a["state"] == "applied"]
                time.sleep(0.5)
            assert applied, f"no suppress applied; audit {agent.audit()}\n{agent.log_tail()}"
            assert applied[0]["target"].strip("/") == be.rel, applied[0]
            assert [w["path"] for w in applied[0]["writes"]] == [str(files.path(CPU_MAX, be.rel))]
            assert _file(files, CPU_MAX, be.rel) != original
        except BaseException:
            agent.terminate(timeout=60 * slow)  # a failed wait must not leave an enforcing agent running
            raise
        return agent

    first = tmp_path / "first"
    first.mkdir()
    agent = run_until_applied(first)
    try:
        refused = [a for a in agent.audit() if a.get("state") == "refused" and "act-only" in a.get("detail", "")]
        assert all(a["target"].strip("/") != be.rel for a in refused)
    finally:
        rc = agent.terminate(timeout=60 * slowdown())
    assert rc == 0, agent.log_tail()
    assert _file(files, CPU_MAX, be.rel) == original, "SIGTERM did not restore the BE pod's quota"
    # kill -9 after it acted: the quota stays cut ...
    second = tmp_path / "second"
    second.mkdir()
    agent = run_until_applied(second)
    agent.proc.kill()
    agent.proc.wait()
    cut = _file(files, CPU_MAX, be.rel)
    assert cut != original
    for p in spinners:  # the neighbour is gone: the restarted agent has nothing to act on
        p.kill()
        p.wait()
    # ... until the agent starts again on the same journal
    again = agent_off_the_victims_cpu(second)
    try:
        again.wait_ready(timeout=120 * slow)
        assert _file(files, CPU_MAX, be.rel) == original, "the restart did not restore the quota"
        assert any(a.get("event") == "reconcile" for a in again.audit())
    finally:
        rc = again.terminate(timeout=60 * slow)
    assert rc == 0, again.log_tail()


# -- v2 files laid out in a temp dir (no kernel needed) ---------------------------------------------


def test_an_empty_v2_cpuset_is_its_parents_cpus_when_suppress_plans(tmp_path):
    """On v2 a pod's ``cpuset.cpus`` is empty (the kubelet never sets it; it means the parent's CPUs):
    shrinking it from 8 CPUs to 4 is a shrink, not a growth from 0 capped at 10 % of the CPUs."""
    from tests.helpers_actuators import fake_cpu_topology, fake_v2_host, write_files

    be = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice"
    paths = fake_v2_host(tmp_path, ["kubepods.slice", str(Path(be).parent), be], cpus="0-7")
    for cg in ("kubepods.slice", str(Path(be).parent), be):
        write_files(tmp_path / "sys/fs/cgroup" / cg, {"cpuset.cpus.effective": "0-7\n"})
    fake_cpu_topology(tmp_path, [str(i) for i in range(8)], {0: "0-7"})
    files = CgroupFiles(paths)
    act = SuppressActuator(files, Journal(tmp_path / "j"), ResourceThresholdStrategy(cpu_suppress_policy="cpuset",
                                                                                    cpu_suppress_min_cpus=1))
    plan = act.plan(Decision(ActionKind.SUPPRESS, Target(be, qos="BE"), SuppressAmount("cpuset", cpu_cores=4), "t"))
    assert plan.details["cpu_cores"] == 4.0, plan.summary
    assert "capped" not in plan.summary and "0-7 -> " in plan.summary, plan.summary
    act.apply(plan)
    assert files.read_cpus(be) == (0, 1, 2, 3)
    act.revert(plan)
    assert (tmp_path / "sys/fs/cgroup" / be / "cpuset.cpus").read_text().strip() == ""


def test_an_empty_v2_cpuset_the_kernel_refuses_is_restored_as_the_parents_cpus(tmp_path, monkeypatch):
    """6.1 refuses to empty the cpuset.cpus of a cgroup with tasks (ENOSPC, validate_change): the journal's
    restore of an empty original writes what it meant, the parent's effective CPUs, and owns nothing after."""
    import errno

    import actuators.cgroupfile as cgroupfile
    from tests.helpers_actuators import fake_v2_host, write_files

    pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice"
    fake_v2_host(tmp_path, ["kubepods.slice", str(Path(pod).parent), pod], cpus="0-7")
    write_files(tmp_path / "sys/fs/cgroup" / str(Path(pod).parent), {"cpuset.cpus.effective": "0-7\n"})
    cpus = tmp_path / "sys/fs/cgroup" / pod / "cpuset.cpus"
    real = cgroupfile._write_once

    def kernel_6_1(path, value):
        if not value.strip():
            raise cgroupfile.CgroupWriteError(f"write '' to {path}: No space left on device", errno.ENOSPC)
        real(path, value)

    monkeypatch.setattr(cgroupfile, "_write_once", kernel_6_1)
    journal = Journal(tmp_path / "j")
    journal.apply("a1", [(str(cpus), "0")])
    assert cpus.read_text().strip() == "0"
    report = journal.revert("a1")
    assert report.restored == [str(cpus)] and not report.failed
    assert cpus.read_text().strip() == "0-7" and journal.owned() == {}
    # the same refusal for a file that is no cpuset list stays an error
    with pytest.raises(cgroupfile.CgroupWriteError):
        cgroupfile.write_file(tmp_path / "sys/fs/cgroup" / pod / "cpu.max", "")


def test_an_empty_original_is_really_written_back(make_cgroup, tmp_path):
    """A write of zero bytes returns 0 and leaves a cgroup file as it was: the journal restored an empty
    cpuset.cpus that way and reported it restored. Without tasks every kernel takes the empty list."""
    cg = make_cgroup("empty", ("cpuset",))
    cpus = cg.path("cpuset") / "cpuset.cpus"
    if pure_v2():
        assert cpus.read_text().strip() == ""  # a new v2 cpuset: its parent's CPUs
    else:
        cpus.write_text("\n")  # a v1 cpuset without tasks may be empty too (zero bytes would change nothing)
        assert cpus.read_text().strip() == ""
    journal = Journal(tmp_path / "j")
    journal.apply("a1", [(str(cpus), "0")])
    assert cpus.read_text().strip() == "0"
    assert journal.revert("a1").restored == [str(cpus)]
    assert cpus.read_text().strip() == ""
    assert journal.owned() == {}
