# SPDX-License-Identifier: Apache-2.0
"""The enforcing agent's neighbour ladder on real processes (issue 41): a BE pod with two CPU spinners on an LS
victim's CPU, the agent as a user runs it (default verify window and cool-down), acting only on this test's
cgroups (``--act-only``). Ground truth: the victim's own response times (bench.scenarios.victim logs each
one), the BE cgroup's cpuset and cpuacct files and its tasks' allowed CPUs (/proc/<pid>/status).

Before the ladder went on, the agent capped the BE pod with a quota (the node has 2 CPUs, fewer than the
cpuset floor leaves), judged it on the run-queue p99 ("did not help", 4.0 -> 3.9 ms), undid it, and then
did nothing more: the victim stayed at 3.6x its quiet p99 until SIGTERM.

In the VM lane (cgroup v2 on 6.1 under TCG, ``NN_VM=1``) latencies are inexact, so there the test judges what
the issue asks of the lane on the kernel's files: the spinners moved off the victim's CPU and kept off it
while they run, still running elsewhere, and everything put back at SIGTERM; the p99 bounds hold on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actuators.cgroupfile import parse_cpu_list
from testkit.exporter_support import REPO, AgentProcess, cgroup_rel_path, write_config
from testkit.sandbox import shield
from testkit.timing import slowdown

SPIN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end:\n    pass\n"
QUIET_S = 12.0  # the victim without the spinners on its CPU: its quiet p99
RECOVERED_P99_RATIO = 1.2  # the acceptance: back within 1.2x its quiet p99
SETTLE_S = 3.0  # after the step that moved the spinners: their last slices on its CPU, the victim's backlog
MOVED_WITHIN_S = 60.0  # a real neighbour is moved off the victim's CPU within tens of seconds
WINDOW_S = 10.0  # each window the victim is judged over once back (two in a row: "and keeps it there")


def _samples(log: Path) -> list[tuple[float, float]]:
    """(monotonic s, response ms) of every request the victim logged so far."""
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]) / 1e9, int(parts[1]) / 1e6))
    return out


def _p99(samples: list[tuple[float, float]], start: float, end: float) -> tuple[float, int]:
    xs = sorted(ms for t, ms in samples if start <= t < end)
    assert xs, f"no victim samples in [{start:.1f}, {end:.1f})"
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))], len(xs)


def _allowed(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return set(parse_cpu_list(line.split(":", 1)[1]))
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def _usage_s(cg) -> float:
    path = cg.path("cpuacct") / "cpuacct.usage"
    if path.exists():
        return int(path.read_text()) / 1e9
    stat = dict(line.split() for line in (cg.path("cpu") / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


@pytest.mark.vm
@pytest.mark.root
@pytest.mark.slow
def test_enforcing_agent_moves_two_be_spinners_off_the_victims_cpu_and_the_victim_stays_back(make_cgroup, tmp_path):
    ncpu = os.cpu_count() or 1
    if ncpu < 2:
        pytest.skip("moving a BE pod off the victim's CPU needs a second CPU")
    sd = slowdown()  # measured now, before this test's spinners share this process's CPU
    cpu = ncpu - 1
    others = set(range(ncpu)) - {cpu}
    ls = make_cgroup("nnls", ("cpu", "cpuacct"))
    be = make_cgroup("nnbe", ("cpu", "cpuacct", "cpuset"))
    v2 = not (be.path("cpu") / "cpu.shares").exists()
    # The weights the kubelet gives a small LS pod and a busy BE one on either hierarchy (as in test_agent's
    # enforcing test): the victim's fair share of the CPU (1/5) is below what it needs (3/10), so it waits.
    ls.write("cpu", "cpu.weight" if v2 else "cpu.shares", "20" if v2 else "512")
    be.write("cpu", "cpu.weight" if v2 else "cpu.shares", "79" if v2 else "2048")
    cpuset_file = be.path("cpuset") / "cpuset.cpus"
    cpuset_before = cpuset_file.read_text().strip()
    quota_file = be.path("cpu") / ("cpu.max" if v2 else "cpu.cfs_quota_us")
    quota_before = quota_file.read_text().strip()
    config = write_config(tmp_path / "config.yaml", {
        "slo": {"runq_p99_ms": 2.0},
        "actuators": {"dry_run": False},  # the default verify window and cool-down, as a user runs it
        "kubernetes": {"pod_source": "standalone"},
        "standalone": {"ls_cgroups": [cgroup_rel_path(ls)], "be_cgroups": [cgroup_rel_path(be)]},
    })
    log = tmp_path / "victim.log"
    unshield = shield(ls)  # this test's cgroups first on the victim's CPU against the rest of the node
    affinity = os.sched_getaffinity(0)
    procs: list[subprocess.Popen] = []
    agent = None
    try:
        # The agent (and this process) off the victim's CPU: there they would be neighbours of their own. It
        # starts first: under TCG its start takes minutes, longer than a victim started before it would run.
        os.sched_setaffinity(0, others)
        agent = AgentProcess(config, tmp_path, "--act-only", cgroup_rel_path(be), "--interval", "1")
        assert agent.wait_ready()["actuators"]["mode"] == "enforcing"
        run_s = f"{QUIET_S + MOVED_WITHIN_S * sd + SETTLE_S + 2 * WINDOW_S + 30:.0f}"
        victim = subprocess.Popen(
            ["taskset", "-c", str(cpu), sys.executable, "-m", "bench.scenarios.victim", "cpu", "--out", str(log),
             "--seconds", run_s, "--work-ms", "1.5", "--period-ms", "5"],
            cwd=REPO, preexec_fn=ls.preexec, stdout=subprocess.DEVNULL)
        procs.append(victim)
        # The spinners start on the other CPU: the victim's quiet p99 is measured with the node as it will be
        # once they are moved there (this machine's CPUs are vCPUs: a busy one slows its sibling's work by
        # up to a fifth, measured here), so the acceptance bound compares like with like.
        spinners = [subprocess.Popen(["taskset", "-c", ",".join(map(str, others)), sys.executable, "-c", SPIN, run_s],
                                     preexec_fn=be.preexec) for _ in range(2)]
        procs += spinners
        started = time.monotonic() + 30 * sd
        while not (log.exists() and log.stat().st_size) and time.monotonic() < started:
            time.sleep(0.2)  # the victim's first requests logged
        t_quiet = time.monotonic()
        time.sleep(QUIET_S)
        quiet_p99, quiet_n = _p99(_samples(log), t_quiet, t_quiet + QUIET_S)
        t_on = time.monotonic()
        for p in spinners:  # onto the victim's CPU
            os.sched_setaffinity(p.pid, {cpu})
        # The ladder: whatever it takes, until the spinners are off the victim's CPU (tens of seconds).
        moved = None
        deadline = t_on + MOVED_WITHIN_S * sd
        while time.monotonic() < deadline and moved is None:
            time.sleep(0.5)
            moved = next((a for a in agent.audit() if a.get("event") == "action" and a["kind"] == "suppress"
                          and a["state"] == "applied" and a["details"].get("policy") == "cpuset"), None)
        t_moved = time.monotonic()
        actions = [(a["state"], a["summary"], a["detail"]) for a in agent.audit() if a.get("event") == "action"]
        assert moved is not None, \
            f"the spinners were not moved off CPU {cpu} within {MOVED_WITHIN_S * sd:.0f} s: {actions}\n{agent.log_tail()}"
        hurt_p99, _ = _p99(_samples(log), t_on + 1.0, t_moved - 1.0)
        # Two windows after the move, each judged alone: back, and staying back.
        start = t_moved + SETTLE_S
        usage0 = _usage_s(be)
        time.sleep(start + 2 * WINDOW_S - time.monotonic())
        usage1 = _usage_s(be)
        samples = _samples(log)
        after = [_p99(samples, start + i * WINDOW_S, start + (i + 1) * WINDOW_S) for i in range(2)]
        # Ground truth of the move, read while it is in place: the cgroup's cpuset and the spinners' CPUs.
        moved_to = set(parse_cpu_list(cpuset_file.read_text()))
        allowed = [_allowed(p.pid) for p in spinners]
        alive = [p.poll() is None for p in spinners]
        audit = [a for a in agent.audit() if a.get("event") == "action"]
    finally:
        os.sched_setaffinity(0, affinity)
        rc = agent.terminate() if agent is not None else 0
        for p in procs:
            p.kill()
            p.wait()
        unshield()
    print(f"victim p99: quiet {quiet_p99:.2f} ms ({quiet_n} requests), with the spinners {hurt_p99:.2f} ms, after the "
          f"move {[f'{p:.2f} ms ({n})' for p, n in after]}; moved {t_moved - t_on:.1f} s after the spinners started; "
          f"BE used {(usage1 - usage0) / (start + 2 * WINDOW_S - t_moved):.2f} cores after; actions "
          f"{[(a['state'], a['summary'], a['detail']) for a in audit]}")
    exact_latency = os.environ.get("NN_VM") != "1"  # the VM lane's guest runs under TCG
    if exact_latency:
        assert hurt_p99 > 1.5 * quiet_p99, "the spinners did not hurt the victim: this test could not fail"
    assert moved_to == others and all(a == others for a in allowed), (moved_to, allowed)
    # Still running, elsewhere (under the quota the ladder kept: it helped before the move, and stays).
    assert all(alive) and usage1 - usage0 >= 0.25 * (time_after := start + 2 * WINDOW_S - t_moved), \
        (usage1 - usage0, time_after)
    for p99, _ in after:
        assert not exact_latency or p99 <= RECOVERED_P99_RATIO * quiet_p99, (quiet_p99, after)
    # The step that moved them stayed: not reverted within the windows.
    cpuset_records = [a for a in audit if a["kind"] == "suppress" and a["details"].get("policy") == "cpuset"]
    assert cpuset_records and all(a["state"] in ("applied", "verified") for a in cpuset_records), cpuset_records
    # SIGTERM put every file back.
    assert rc == 0, agent.log_tail()
    # An empty v2 cpuset (the parent's CPUs) comes back as the parent's effective list where the kernel
    # (6.1) refuses to empty the cpuset of a cgroup with tasks: the same CPUs (actuators.cgroupfile.write_file).
    cpuset_after = cpuset_file.read_text().strip()
    parent_cpus = (cpuset_file.parent.parent / "cpuset.cpus.effective")
    assert cpuset_after == cpuset_before or (
        cpuset_before == "" and parent_cpus.exists()
        and parse_cpu_list(cpuset_after) == parse_cpu_list(parent_cpus.read_text())), (cpuset_before, cpuset_after)
    assert quota_file.read_text().strip() == quota_before
    journal = agent.journal / "journal.json"
    assert not journal.exists() or json.loads(journal.read_text())["entries"] == []
