# SPDX-License-Identifier: Apache-2.0
"""The bench's own work stays off the victim's CPU during a pass (bench/scenarios/placement.py), and the
softirq floor is measured with the other CPU busy, as a pass has it.

The checks read the kernel's own view: each thread's allowed CPUs (``sched_getaffinity`` of its tid) and
``/proc/stat``'s per-CPU busy time. They use no helper of placement.py, so they run as well on code
without it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or (os.cpu_count() or 1) < 2,
                                reason="needs two CPUs this process may use (the victim's and another)")


def _threads_allowed_on(cpu: int, pid: int | None = None) -> dict[int, set[int]]:
    """tid -> allowed CPUs, for every thread of ``pid`` (this process) that may run on ``cpu``."""
    out = {}
    for tid in map(int, os.listdir(f"/proc/{pid or os.getpid()}/task")):
        try:
            allowed = os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
        if cpu in allowed:
            out[tid] = allowed
    return out


def _thp_enabled(pid: int | str = "self") -> str | None:
    """/proc/<pid>/status's THP_enabled: "0" once the process set PR_SET_THP_DISABLE (khugepaged skips it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("THP_enabled:"):
            return line.split()[1]
    return None


def _helpers(pid: int) -> list[int]:
    """This process's children that are in its own cgroup (the bench's helpers, not a pod's processes)."""
    own = Path(f"/proc/{pid}/cgroup").read_text()
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and Path(f"/proc/{entry}/cgroup").read_text() == own:
                kids.append(int(entry))
        except (OSError, ValueError):
            continue
    return kids


@pytest.mark.root
@pytest.mark.slow
def test_a_pass_keeps_every_bench_thread_and_helper_off_the_victims_cpu():
    """A real cpu-neighbor pass in mitigate mode (detector, actuators, fake kubelet threads): at the onset, no
    thread of the bench, including one that ran before the pass began, may run on the victim's CPU, and
    khugepaged skips its memory (its passes over the bench's heap ran on the victim's CPU in the VM lane);
    the pods' workloads keep their own CPUs (the victim on VICTIM_CPU) and the node's huge page setting;
    afterwards each thread has its CPUs back and the process its setting."""
    from bench.scenarios.catalog import by_name
    from bench.scenarios.runner import VICTIM_CPU, Timing, run_pass

    before = os.sched_getaffinity(0)
    thp_before = _thp_enabled()
    assert VICTIM_CPU in before, "this check needs the victim's CPU among this process's CPUs"
    stop = threading.Event()
    waiter = threading.Thread(target=stop.wait, name="started-before-the-pass", daemon=True)
    waiter.start()
    seen: dict[str, object] = {}

    def during(ctx, onset: float) -> None:
        seen["at_onset"] = _threads_allowed_on(VICTIM_CPU)
        seen["waiter"] = os.sched_getaffinity(waiter.native_id)
        seen["victim"] = os.sched_getaffinity(ctx.victim.pid)
        seen["helpers"] = {p: os.sched_getaffinity(p) for p in _helpers(os.getpid())}
        seen["thp"] = (_thp_enabled(), _thp_enabled(ctx.victim.pid))

    try:
        spec = by_name(["cpu-neighbor"])[0]
        result, _ = run_pass(spec, "mitigate", Timing(baseline_s=2.0, run_s=5.0), during=during)
        after = _threads_allowed_on(VICTIM_CPU)
        waiter_after = os.sched_getaffinity(waiter.native_id)
    finally:
        stop.set()
        waiter.join(timeout=5)
    assert not result.skipped, result.skipped
    assert seen["at_onset"] == {}, f"bench threads that may run on CPU {VICTIM_CPU} during the pass: {seen['at_onset']}"
    assert VICTIM_CPU not in seen["waiter"], "a thread started before the pass stayed on the victim's CPU"
    assert all(VICTIM_CPU not in cpus for cpus in seen["helpers"].values()), seen["helpers"]
    assert seen["victim"] == {VICTIM_CPU}, "the victim's own request loop belongs on its CPU"
    if _thp_enabled() is not None:  # kernels since 5.0 say it
        assert seen["thp"] == ("0", "1"), f"THP_enabled (bench, victim) during the pass: {seen['thp']}: khugepaged " \
                                          "should skip the bench's memory and the pods keep the node's setting"
        assert _thp_enabled() == thp_before, "the pass did not give the huge page setting back"
    assert os.sched_getaffinity(0) == before and waiter_after == before, "the pass did not give the CPUs back"
    assert os.getpid() in after


@pytest.mark.root
@pytest.mark.slow
def test_the_softirq_floor_is_measured_with_the_other_cpu_busy():
    """measure_softirq_floor runs with OTHER_CPU busy, as a pass has it (the bench's ticks and the
    antagonists placed there): over the measurement, OTHER_CPU's busy time in /proc/stat is most of it."""
    from bench.scenarios.runner import OTHER_CPU, measure_softirq_floor

    def busy_and_total(cpu: int) -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"cpu{cpu} "):
                    v = list(map(int, line.split()[1:]))
                    idle = v[3] + v[4]  # idle + iowait
                    return sum(v[:8]) - idle, sum(v[:8])
        raise AssertionError(f"no cpu{cpu} in /proc/stat")

    b0, t0 = busy_and_total(OTHER_CPU)
    floor = measure_softirq_floor(seconds=3)
    b1, t1 = busy_and_total(OTHER_CPU)
    busy = (b1 - b0) / max(1, t1 - t0)
    assert floor.ms_per_s >= 0 and floor.delay_p99_ms >= 0
    assert busy >= 0.8, f"CPU {OTHER_CPU} was busy {busy:.0%} of the floor's measurement: measured idle"
