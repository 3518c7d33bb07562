# SPDX-License-Identifier: Apache-2.0
"""The cause is the larger share of the victim's wait, on the real kernel (issue 41, Deliver 3): an LS
victim on one CPU with both a BE hog on that CPU and NET_RX work steered to it, each dominant in turn.

Hog dominant: the hog at full weight, a paced flood (softirq time past the softirq SLO, so the softirq
rule holds too and the ranking, not the rule list, decides): neighbor_cpu naming the hog. Softirq
dominant: the hog under a 0.25 % quota (1 ms every 400 ms), a full flood: softirq. Which one dominates
the victim's wait is the kernel's to say: after the detector's run with both, each runs alone and the
victim's run_delay (/proc/<pid>/schedstat) says which one makes it wait more. Run_delay counts every
task the victim waited behind, the host's own too (on a loaded machine they add ~7 ms/s to either
window); the hog can make it wait no longer than the hog ran, so its part is bounded by its own CPU
time in that window (cpuacct) as well. The probe's split is bounded by the kernel's
counts over the detector's culprit window: the kernel work it counted inside the victim's waits is no
more than the softirq time (/proc/stat) and ksoftirqd's run time (schedstat) of that CPU, and the wait
it put behind the hog no more than the hog ran (cpuacct). Every tick's cause verdicts are recorded
from the engine's own call to decide(), so the test sees the shares it ranked."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from detector import causes
from detector.decisions import Cause
from detector.incidents import CULPRIT_WINDOW_TICKS
from detector.policy import Policy, SloThresholds
from testkit.scenario_support import scenario_harness

pytestmark = [pytest.mark.root, pytest.mark.slow]

VICTIM_CPU = 1
OTHER_CPU = 1 - VICTIM_CPU
USER_HZ = os.sysconf("SC_CLK_TCK")
HOG_PERIOD_US = 400_000  # with the kernel's least quota (1 ms) a 0.25 % hog: at most 2.5 ms/s of the victim's wait
# (a 0.5 % hog ran 26.5 ms of the victim's waits in a 10-tick window, about half its CPU time, while the
# flood's kernel work the probe counted there was 17 ms: neighbor_cpu 0.24 against softirq 0.21 in one
# make test, 2026-11-29; at half that quota the hog's part is about half that, under the flood's)
# UDP to the far end of the veth pair: `duty` of every 10 ms spent sending, the rest asleep.
FLOOD = ("import socket, sys, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "end, duty = time.monotonic() + float(sys.argv[2]), float(sys.argv[3])\n"
         "while (now := time.monotonic()) < end:\n"
         "    stop = now + 0.01 * duty\n"
         "    while time.monotonic() < stop:\n        s.sendto(b'x' * 64, (sys.argv[1], 9))\n"
         "    if duty < 1.0:\n        time.sleep(0.01 * (1.0 - duty))\n")


def _policy() -> Policy:
    # The run queue breaches in both shapes (a 1 ms p99; quiet it is ~0.1 ms), and softirq time past 30
    # ms/s holds the softirq rule in both: which cause wins is the ranking's to say.
    return dataclasses.replace(Policy(), slo=dataclasses.replace(SloThresholds(), runq_p99_ms=1.0,
                                                                 softirq_ms_per_s=30.0))


@pytest.fixture
def scenario(make_cgroup):
    yield from scenario_harness(make_cgroup, VICTIM_CPU, _policy)


@dataclasses.dataclass(frozen=True)
class KernelCounts:
    """The kernel's cumulative counts after one tick."""

    softirq_ns: float  # /proc/stat softirq time of the victim's CPU (tick-sampled)
    softirq_ticks: int  # ... in USER_HZ ticks
    total_ticks: int  # all of that CPU's time in USER_HZ ticks
    ksoftirqd_ns: int  # ksoftirqd/<victim cpu>'s run time (schedstat)
    hog_ns: int  # the hog pod's CPU use (cpuacct.usage, or cpu.stat usage_usec on v2)


def _cpu_ticks(cpu: int) -> tuple[int, int]:
    for line in Path("/proc/stat").read_text().splitlines():
        f = line.split()
        if f[0] == f"cpu{cpu}":
            values = [int(x) for x in f[1:]]
            return values[6], sum(values[:8])  # softirq; user..steal
    raise AssertionError(f"cpu{cpu} not in /proc/stat")


def _ksoftirqd_pid(cpu: int) -> int:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == f"ksoftirqd/{cpu}":
                    return int(d.name)
            except OSError:
                continue
    raise AssertionError(f"no ksoftirqd/{cpu}")


def _usage_ns(pod) -> int:
    try:
        return int(pod.cgroup.read("cpuacct", "cpuacct.usage"))
    except (OSError, KeyError, ValueError):
        stat = dict(line.split() for line in pod.cgroup.read("cpu", "cpu.stat").splitlines())
        return int(stat["usage_usec"]) * 1000


def _counts(hog_pod, ksoftirqd: int) -> KernelCounts:
    sq, total = _cpu_ticks(VICTIM_CPU)
    run_ns = int(Path(f"/proc/{ksoftirqd}/schedstat").read_text().split()[0])
    return KernelCounts(sq * 1e9 / USER_HZ, sq, total, run_ns, _usage_ns(hog_pod))


def _run_delay_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])


def _run(scenario, veth_pair, monkeypatch, hog_quota: float | None, duty: float):
    """The shape, both loads for 14 ticks, then each alone for 5; returns (scenario, the victim, the
    hog, per-tick kernel counts of the run with both, the victim's verdicts then (time, ctx, {cause:
    share}, winner), the victim's run_delay in ms/s with the hog alone and the flood alone, and the
    hog's CPU time in ms/s in its window alone)."""
    decided: list[tuple] = []
    real = causes.decide

    def recording(ctx, rules=causes.RULES):
        held = {v.cause: v.share for v in (rule(ctx) for rule in rules) if v is not None}
        verdict = real(ctx, rules)
        decided.append((time.monotonic(), ctx, held, verdict.cause))
        return verdict

    monkeypatch.setattr(causes, "decide", recording)
    s = scenario()
    ls = s.pod("web", "LS")
    be = s.pod("batch", "BE", cpu_quota_cores=hog_quota, cpu_period_us=HOG_PERIOD_US if hog_quota else None)
    sender = s.pod("sender", "BE")
    # RPS steers the receiving end's NET_RX to the victim's CPU; the sender runs on the other CPU.
    subprocess.run(["ip", "netns", "exec", veth_pair["b"], "sh", "-c",
                    f"echo {1 << VICTIM_CPU:x} > /sys/class/net/{veth_pair['dev_b']}/queues/rx-0/rps_cpus"],
                   check=True, timeout=10)
    victim = s.ls_worker(ls, [VICTIM_CPU], seconds=40)

    def flood():
        return s.spawn(sender, ["ip", "netns", "exec", veth_pair["a"], sys.executable, "-c", FLOOD, veth_pair["dst"],
                                "30", str(duty)], [OTHER_CPU])

    s.run_for(3)
    hog = s.hog(be, [VICTIM_CPU], seconds=30)
    flooding = flood()
    ksoftirqd = _ksoftirqd_pid(VICTIM_CPU)
    counts: list[tuple[float, KernelCounts]] = []
    for _ in range(14):
        s.run_for(1.0)
        counts.append((time.monotonic(), _counts(be, ksoftirqd)))
    victim_key = f"pod:{ls.uid}"
    mine = [d for d in decided if d[1].key == victim_key]

    def alone_ms_per_s() -> tuple[float, float]:
        """The victim's run_delay and the hog's CPU time, in ms/s, over 4 s."""
        s.run_for(1.0)  # the other one's last waits drain
        t0, d0, h0 = time.monotonic(), _run_delay_ns(victim.pid), _usage_ns(be)
        s.run_for(4.0)
        elapsed = time.monotonic() - t0
        return (_run_delay_ns(victim.pid) - d0) / 1e6 / elapsed, (_usage_ns(be) - h0) / 1e6 / elapsed

    flooding.terminate()
    flooding.wait(timeout=5)
    hog_alone, hog_ran = alone_ms_per_s()
    flooding = flood()
    hog.terminate()
    hog.wait(timeout=5)
    flood_alone, _ = alone_ms_per_s()
    return s, ls, be, counts, mine, hog_alone, flood_alone, hog_ran


def _window(counts: list[tuple[float, KernelCounts]], at: float) -> tuple[KernelCounts, KernelCounts, float]:
    """The kernel counts over the CULPRIT_WINDOW_TICKS ticks ending at the verdict made at ``at``."""
    i = min(range(len(counts)), key=lambda k: abs(counts[k][0] - at))  # read right after that tick
    j = max(0, i - CULPRIT_WINDOW_TICKS)
    return counts[j][1], counts[i][1], counts[i][0] - counts[j][0]


def _check_bounds(ctx, hog_key: str, start: KernelCounts, end: KernelCounts) -> tuple[float, float]:
    """The probe's split against the kernel's counts over the same window; returns (softirq ns incl.
    ksoftirqd, hog ns) by the kernel."""
    n = end.total_ticks - start.total_ticks
    sq = end.softirq_ticks - start.softirq_ticks
    # /proc/stat samples the CPU's state at each tick (no IRQ time accounting here): the softirq ticks
    # of n are binomial; 4 standard deviations (and one tick) above the count bound the time itself.
    p = sq / n if n else 0.0
    softirq_high = (sq + 4 * math.sqrt(n * p * (1 - p)) + 1) * 1e9 / USER_HZ
    ksoftirqd = end.ksoftirqd_ns - start.ksoftirqd_ns
    hog = end.hog_ns - start.hog_ns
    edge = 2 * 20e6  # the probe's tick and this read are up to ~20 ms apart at either end of the window
    assert ctx.kernel_work_ns <= softirq_high + ksoftirqd + edge, (ctx.kernel_work_ns, softirq_high, ksoftirqd)
    assert ctx.foreign.get(hog_key, 0.0) <= hog + edge, (ctx.foreign.get(hog_key), hog)
    return (sq * 1e9 / USER_HZ) + ksoftirqd, hog


def test_hog_dominant_is_neighbor_cpu_naming_the_hog(scenario, veth_pair, monkeypatch):
    s, ls, be, counts, mine, hog_alone, flood_alone, _ = _run(scenario, veth_pair, monkeypatch, hog_quota=None,
                                                              duty=0.3)
    # The shape, by the kernel: the hog alone makes the victim wait more than the flood alone.
    assert hog_alone > flood_alone, (hog_alone, flood_alone)
    hog_key = f"pod:{be.uid}"
    last = [d for d in mine if d[0] > counts[6][0]]  # the culprit window full of both
    assert last, "the victim breached no SLO: no verdicts recorded"
    ranked = 0
    for at, ctx, held, winner in last:
        start, end, _ = _window(counts, at)
        _check_bounds(ctx, hog_key, start, end)
        assert winner == Cause.NEIGHBOR_CPU, (held, ctx.kernel_work_ns, ctx.total_wait_ns)
        ranked += Cause.SOFTIRQ in held
    # The softirq rule held on these ticks too (softirq time past its SLO): the shares decided.
    assert ranked >= len(last) // 2, [d[2] for d in last]
    with_both = [i for i in s.incidents_for(ls) if i.started_at <= counts[-1][0]]
    assert with_both and with_both[-1].cause == Cause.NEIGHBOR_CPU, [i.to_dict() for i in with_both]
    assert with_both[-1].culprits[0].target.cgroup == be.path, with_both[-1].to_dict()
    print(f"hog dominant: run_delay hog alone {hog_alone:.1f} ms/s, flood alone {flood_alone:.1f}; {len(last)} "
          f"verdicts, softirq held in {ranked}; shares {[{str(c): round(v, 2) for c, v in d[2].items()} for d in last[-3:]]}")


def test_softirq_dominant_is_softirq(scenario, veth_pair, monkeypatch):
    s, ls, be, counts, mine, hog_alone, flood_alone, hog_ran = _run(scenario, veth_pair, monkeypatch,
                                                                    hog_quota=0.0025, duty=1.0)
    # The hog's part of the victim's wait alone: its run_delay then, but never more than the hog ran.
    assert flood_alone > min(hog_alone, hog_ran), (hog_alone, hog_ran, flood_alone)
    hog_key = f"pod:{be.uid}"
    last = [d for d in mine if d[0] > counts[6][0]]
    assert last, "the victim breached no SLO: no verdicts recorded"
    for at, ctx, held, winner in last:
        start, end, _ = _window(counts, at)
        _check_bounds(ctx, hog_key, start, end)
        assert winner == Cause.SOFTIRQ, (held, ctx.kernel_work_ns, ctx.total_wait_ns, ctx.foreign)
    with_both = [i for i in s.incidents_for(ls) if i.started_at <= counts[-1][0]]
    assert with_both and with_both[-1].cause == Cause.SOFTIRQ, [i.to_dict() for i in with_both]
    print(f"softirq dominant: run_delay hog alone {hog_alone:.1f} ms/s (it ran {hog_ran:.1f}), flood alone "
          f"{flood_alone:.1f}; "
          f"{len(last)} verdicts; shares {[{str(c): round(v, 2) for c, v in d[2].items()} for d in last[-3:]]}")
