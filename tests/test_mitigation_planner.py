# SPDX-License-Identifier: Apache-2.0
"""Issue 19: softirq from a pod's traffic, the planner's incident notes, and the refusals that keep non-BE pods
untouched (pure: no root needed, except the last test, which sends real packets through a test netns)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from actuators.base import ActionOutcome, ActionRecord, ActionState
from actuators.cgroupfile import CgroupFiles
from actuators.journal import Journal
from actuators.manager import ActuatorManager
from actuators.mitigate import MitigationPlanner, NetnsTrafficSampler
from actuators.suppress import SuppressActuator
from detector.causes import neighbor_cpu
from detector.causes.softirq import softirq_traffic_decision
from detector.decisions import (
    ActionKind,
    BurstAmount,
    Cause,
    Decision,
    LoggingSink,
    PodTraffic,
    SuppressAmount,
    Target,
)
from detector.model import CLEAN, Incident
from detector.policy import ActuatorPolicy
from noisyneighbor.agent import ScopedActuator
from probes.cgroupfiles import parse_netdev_packets
from probes.cgroupfs import discover
from probes.host import HostPaths
from testkit.sandbox import PREFIX

VICTIM = Target("/kubepods.slice/kubepods-burstable.slice/web", qos="LS", pod="web")
FLOOD = Target("/kubepods.slice/kubepods-besteffort.slice/flood", qos="BE", pod="flood")
API = Target("/kubepods.slice/kubepods-burstable.slice/api", qos="LS", pod="api")


def test_be_pod_carrying_the_traffic_is_quota_suppressed() -> None:
    d, why = softirq_traffic_decision(VICTIM, "inc-1", [PodTraffic(FLOOD, 90_000, 1.0), PodTraffic(API, 500, 0.1)])
    assert d is not None and d.kind == ActionKind.SUPPRESS and d.target == FLOOD
    # sends at most the harmless rate: 1 core x 2000 / 90000 pkt/s = 0.022 cores
    assert isinstance(d.amount, SuppressAmount) and d.amount.policy == "cfs_quota" and d.amount.cpu_cores == 0.02
    d, _ = softirq_traffic_decision(VICTIM, "inc-1", [PodTraffic(FLOOD, 9_000, 2.0)])
    assert d is not None and d.amount.cpu_cores == 0.44  # 2 cores x 2000 / 9000
    assert d.victim == VICTIM and d.incident_id == "inc-1" and "pkt/s" in why


@pytest.mark.parametrize("traffic, words", [
    ([PodTraffic(API, 90_000, 1.0), PodTraffic(FLOOD, 100, 0.1)], "not touched"),  # the source is LS
    ([PodTraffic(FLOOD, 90_000, 1.0, host_network=True)], "node's devices"),  # host network: node counters
    ([PodTraffic(FLOOD, 1_000, 0.5)], "no dominant"),  # too little to matter
    ([PodTraffic(FLOOD, 40_000, 0.5), PodTraffic(Target("/b", qos="BE"), 60_000, 0.5),
      PodTraffic(Target("/c", qos="BE"), 60_000, 0.5)], "no dominant"),  # nobody carries most of it
    ([], "node's devices"),
])
def test_refusals_give_advice_and_never_a_decision(traffic, words) -> None:
    d, why = softirq_traffic_decision(VICTIM, "inc-1", traffic)
    assert d is None and words in why and ("IRQ/RPS" in why or "rate-limit" in why)


def test_netdev_packets_skips_lo() -> None:
    text = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs\n"
            "    lo: 100 7 0 0 0 0 0 0 100 7 0 0 0 0 0 0\n"
            "  nnva: 500 3 0 0 0 0 0 0 9000 40 0 0 0 0 0 0\n")
    assert parse_netdev_packets(text) == 43  # /proc/<pid>/net/dev: probes.cgroupfiles.PID_NET_DEV's parser


class _FakeSampler:
    def __init__(self, traffic: list[PodTraffic]) -> None:
        self.traffic = traffic
        self.calls = 0

    def sample(self, targets) -> list[PodTraffic]:
        self.calls += 1
        return self.traffic


def _incident(cause: Cause = Cause.SOFTIRQ, victim: Target = VICTIM, signal: str = "runq_p99_ns") -> Incident:
    return Incident("inc-1", victim, cause, started_at=0.0, confidence=0.8, signal=signal)


@pytest.mark.parametrize("breached, verified_on", [
    ("softirq_ms_per_s", "softirq_ms_per_s"), ("softirq_delay_p99_ns", "softirq_delay_p99_ns"),
    ("runq_p99_ns", "runq_p99_ns"), ("psi_cpu_some", "runq_p99_ns"),  # PSI is not the victim's own: its p99
])
def test_the_senders_quota_is_verified_on_the_signal_the_incident_breached_on(breached, verified_on) -> None:
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD], _FakeSampler([PodTraffic(FLOOD, 80_000, 0.8)]),
                                ActuatorPolicy(dry_run=False))
    planner(_incident(signal=breached), "opened")
    (d,) = sink.decisions
    assert d.code == "softirq.own_traffic" and d.victim_signal == verified_on


def test_planner_acts_once_per_incident_and_notes_why() -> None:
    sink = LoggingSink()
    sampler = _FakeSampler([PodTraffic(FLOOD, 80_000, 0.8)])
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD, API], sampler, ActuatorPolicy(dry_run=False))
    inc = _incident()
    planner(inc, "opened")
    planner(inc, "updated")
    assert [d.target for d in sink.decisions] == [FLOOD]
    assert sampler.calls == 1  # acted: every pod's traffic is not read again each tick
    assert inc.actions == ["suppress:flood"]
    assert any(e.signal == "mitigation" and "pkt/s" in e.note for e in inc.evidence)
    # a cause the planner has nothing to add for: no decision
    planner(_incident(Cause.NEIGHBOR_CPU), "opened")
    assert len(sink.decisions) == 1


def test_the_sender_is_named_first_and_costed_by_the_kernel_work_its_packets_made() -> None:
    """It never ran on the victim's CPU (no who-ran-instead share): its cost is the victim's waits without
    the ksoftirqd work in them (Incident.kernel_work_cost, which the engine refreshes every tick)."""
    from detector.model import Culprit, CulpritCost

    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD, API], _FakeSampler(
        [PodTraffic(FLOOD, 60_000, 0.8), PodTraffic(API, 20_000, 0.2)]), ActuatorPolicy(dry_run=False))
    inc = _incident()
    inc.culprits = [Culprit(API, 0.4, who_ran_instead_share=0.1)]
    inc.kernel_work_cost = CulpritCost(2_100_000, 300_000, 40.0, 12.0)
    planner(inc, "opened")
    first = inc.culprits[0]
    assert first.target == FLOOD and first.attribution == 0.75 and first.score >= 1.0
    assert (first.victim_runq_p99_ns, first.runq_p99_without_ns) == (2_100_000, 300_000)
    assert (first.victim_wait_ms_per_s, first.wait_ms_per_s_without, first.without_kernel_work) == (40.0, 12.0, "softirq work")
    assert [c.target for c in inc.culprits] == [FLOOD, API]
    # The engine's step for a new top culprit does not move it off the victim's CPUs as well: it never
    # ran there (its quota is the planner's); one that did run there still is.
    from detector.causes import ActContext
    from detector.causes.neighbor_cpu import suppress_top_be
    from detector.policy import Policy

    ctx = ActContext(Policy(), lambda c: SuppressAmount("cpuset", cpus=(0,)))
    assert suppress_top_be(inc, first, ctx) is None
    shared = Culprit(FLOOD, 1.0, who_ran_instead_share=0.3, attribution=0.75)
    assert suppress_top_be(inc, shared, ctx) is not None


def test_the_sender_stays_first_while_the_incident_lives_and_is_forgotten_when_it_closes() -> None:
    """The traffic is sampled once per incident; the engine's ranking is made again every tick (here: the
    node's root cgroup alone, as who-ran-instead sees the victim's CPU). The sender found stays first
    (costed by each tick's kernel work, rank_first), until the incident closes (then the next samples again)."""
    from detector.model import Culprit

    sink = LoggingSink()
    sampler = _FakeSampler([PodTraffic(FLOOD, 60_000, 0.8), PodTraffic(API, 20_000, 0.2)])
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD, API], sampler, ActuatorPolicy(dry_run=False))
    inc = _incident()
    planner(inc, "opened")
    found = inc.culprits[0]
    assert found.target == FLOOD and found.attribution == 0.75
    node = Culprit(Target(cgroup="/"), 0.9, who_ran_instead_share=0.8)
    for _ in range(3):
        inc.culprits = [node]  # the engine's tick
        planner(inc, "updated")
        assert inc.culprits == [found, node]
    assert sampler.calls == 1
    planner(inc, "closed")
    again = _incident()
    again.culprits = [node]
    planner(again, "opened")  # a new incident with the same id: nothing kept from the closed one
    assert sampler.calls == 2


def test_planner_never_names_a_non_be_source_and_ignores_victims_it_does_not_know() -> None:
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [VICTIM, API], _FakeSampler([PodTraffic(API, 80_000, 0.8)]))
    inc = _incident()
    planner(inc, "opened")
    assert sink.decisions == []
    assert any("not touched" in e.note for e in inc.evidence)
    stranger = _incident(victim=Target("/other-suite/pod", qos="LS"))
    sampler = _FakeSampler([PodTraffic(FLOOD, 80_000, 0.8)])
    MitigationPlanner(sink, lambda: [VICTIM, FLOOD], sampler)(stranger, "opened")
    assert sink.decisions == [] and sampler.calls == 0


def test_reverted_or_refused_actions_are_said_in_the_incident() -> None:
    planner = MitigationPlanner(LoggingSink(), lambda: [])
    d = Decision(ActionKind.BURST, VICTIM, BurstAmount(quota_scale=1.0), "x", incident_id="inc-1")
    planner.note_record(ActionRecord("a1", None, d, ActionState.REVERTED, "steadily above its limit: ..."))
    planner.note_record(ActionRecord("a2", None, d, ActionState.APPLIED, "fine"))
    inc = _incident(Cause.SELF_THROTTLING)
    planner(inc, "updated")
    notes = [e.note for e in inc.evidence if e.signal == "mitigation"]
    assert len(notes) == 1 and "steadily above its limit" in notes[0]


def test_manager_refuses_suppress_of_non_be_even_when_the_planner_is_fooled(tmp_path: Path) -> None:
    """Defence in depth: a suppress decision naming an LS pod is refused by the manager, nothing written."""
    from tests.helpers_actuators import fake_v2_host

    cg = "kubepods.slice/kubepods-burstable.slice/api"
    files = CgroupFiles(fake_v2_host(tmp_path, ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice", cg]))
    journal = Journal(tmp_path / "j")
    manager = ActuatorManager([SuppressActuator(files, journal)], journal, ActuatorPolicy(dry_run=False),
                              registry=CollectorRegistry())
    for qos in ("LS", "LSR", "LSE", "SYSTEM", None):
        manager.submit(Decision(ActionKind.SUPPRESS, Target("/" + cg, qos=qos),
                                SuppressAmount("cfs_quota", cpu_cores=0.2), "x"))
        assert manager.records[-1].state == ActionState.REFUSED, qos
    assert not journal.owned()
    assert (tmp_path / "sys/fs/cgroup" / cg / "cpu.max").read_text().strip() == "max 100000"


FLOOD_CODE = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        s.sendto(b"x" * 64, (sys.argv[1], 9))
    except OSError:
        pass
"""


@pytest.mark.root
def test_real_flood_from_a_be_pod_netns_is_found_and_quota_suppressed(make_cgroup, tmp_path: Path) -> None:
    """Real packets through a test netns (nn-test-<pid>-*), sent by a task in a BE pod cgroup of our own:
    the sampler sees the pod's own traffic, the planner names it, the scoped manager caps its quota,
    and the pod sends less. The LS victim pod is only a candidate: never written."""
    be = make_cgroup("kubepods.slice/kubepods-besteffort.slice/flood", ("cpu", "cpuacct"))
    ls = make_cgroup("kubepods.slice/kubepods-burstable.slice/web", ("cpu", "cpuacct"))
    layout = discover(HostPaths())
    mount = layout.hierarchy_for("cpu").mount
    be_rel, ls_rel = (str(c.path("cpu").relative_to(mount)) for c in (be, ls))
    ns_a, ns_b = f"{PREFIX}-{os.getpid()}-pa", f"{PREFIX}-{os.getpid()}-pb"
    made: list[str] = []
    proc = None
    files = CgroupFiles(HostPaths(), layout)
    journal = Journal(tmp_path / "j")
    manager = ActuatorManager([ScopedActuator(SuppressActuator(files, journal), [be_rel])], journal,
                              ActuatorPolicy(dry_run=False), registry=CollectorRegistry())
    try:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            made.append(ns)
        subprocess.run(["ip", "-n", ns_a, "link", "add", "nnpa", "type", "veth", "peer", "name", "nnpb", "netns", ns_b],
                       check=True, capture_output=True)
        for ns, dev, addr in ((ns_a, "nnpa", "10.232.0.1/30"), (ns_b, "nnpb", "10.232.0.2/30")):
            subprocess.run(["ip", "-n", ns, "addr", "add", addr, "dev", dev], check=True, capture_output=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True, capture_output=True)
        proc = subprocess.Popen(["ip", "netns", "exec", ns_a, sys.executable, "-c", FLOOD_CODE, "10.232.0.2", "30"],
                                preexec_fn=be.preexec)
        victim = Target("/" + ls_rel, qos="LS", pod="web")
        flood = Target("/" + be_rel, qos="BE", pod="flood")
        sampler = NetnsTrafficSampler(files)
        planner = MitigationPlanner(manager, lambda: [victim, flood], sampler, ActuatorPolicy(dry_run=False))
        inc = _incident(victim=victim)
        time.sleep(1.0)
        planner(inc, "opened")  # first sample
        time.sleep(1.0)
        planner(inc, "updated")  # rates: decides
        rec = manager.records[-1]
        assert rec.state == ActionState.APPLIED and rec.decision.target == flood, rec.detail
        before = next(n for n in inc.evidence if n.signal == "mitigation").note
        assert files.read_cpu_max(be_rel).quota_us is not None
        time.sleep(1.0)
        sampler.sample([flood])
        time.sleep(2.0)
        after = sampler.sample([flood])[0]
        print(f"{before} -> after: {after.packets_per_s:.0f} pkt/s, {after.cpu_cores:.2f} cores")
        pps_before = float(before.split(" pkt/s")[0].split()[-1])
        cores_before = float(before.split("cfs quota ")[1].split()[0])
        cap = files.read_cpu_max(be_rel)
        cap_cores = cap.quota_us / cap.period_us
        assert f"-> {cap_cores:.2f} cores" in before  # the quota written is the one the note gives
        # The cap holds: CFS bandwidth lets a cgroup run at most quota per period, plus the slack of one
        # period at each end of the 2 s sample.
        assert after.cpu_cores <= cap_cores * (1 + 2 * cap.period_us / 1e6 / 2.0) + 0.01, (after.cpu_cores, cap_cores)
        if cores_before >= 0.2:  # on a machine loaded enough to give the sender less, the cap cuts little
            assert after.packets_per_s <= 0.7 * pps_before
        assert files.read_cpu_max(ls_rel).quota_us is None  # the LS pod: never written
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        manager.close()
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert files.read_cpu_max(be_rel).quota_us is None and not journal.owned()


def _record(d: Decision, state: ActionState, detail: str) -> ActionRecord:
    """As the manager finishes one: a revert by verification says so in its outcome code."""
    outcome = ActionOutcome.DID_NOT_HELP if detail.startswith("did not help") else ActionOutcome.NONE
    return ActionRecord("a", None, d, state, detail, outcome=outcome)


def _neighbor(culprit_cores: float = 1.0) -> Incident:
    from detector.model import Culprit

    inc = _incident(Cause.NEIGHBOR_CPU)
    inc.culprits = [Culprit(FLOOD, 0.9, who_ran_instead_share=0.8, cpu_cores=culprit_cores)]
    return inc


def _applied_then(planner: MitigationPlanner, d: Decision, state: ActionState, detail: str) -> None:
    """The manager's records of one action: applied, then its verdict."""
    planner.note_record(_record(d, ActionState.APPLIED, ""))
    planner.note_record(_record(d, state, detail))


def _ladder_on_a_small_node(policy: ActuatorPolicy, quota_cores: float) -> tuple[list[float], LoggingSink,
                                                                                MitigationPlanner, Incident, Decision]:
    """A planner on a 2-CPU node with a neighbour incident (the victim on CPU 1) and the engine's first step,
    a quota on the hog: (clock, sink, planner, incident, that quota)."""
    now = [0.0]
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=policy, clock=lambda: now[0])
    planner.online_cpus = lambda: [0, 1]  # type: ignore[method-assign]
    inc = _neighbor()
    inc.victim_cpus = [1]
    quota = Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=quota_cores), "engine",
                     incident_id="inc-1", victim=VICTIM, code=neighbor_cpu.SUPPRESS)
    return now, sink, planner, inc, quota


def test_neighbor_escalation_isolation_then_quota_to_request_then_evict() -> None:
    now = [100.0]
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=ActuatorPolicy(dry_run=False, evict_enabled=True,
                                                                         cooldown_seconds=3.0),
                                request_of=lambda t: 0.5 if t == FLOOD else None, clock=lambda: now[0])
    inc = _neighbor()
    cpuset = Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cpuset", cpus=(0,)), "engine", incident_id="inc-1",
                      victim=VICTIM)
    planner(inc, "opened")
    assert sink.decisions == []  # the engine's isolation goes first
    planner.note_record(_record(cpuset, ActionState.APPLIED, ""))
    planner(inc, "updated")
    assert sink.decisions == []  # its verdict is not in
    planner.note_record(_record(cpuset, ActionState.REVERTED, "did not help: runq_wait_ms_per_s 5 -> 5"))
    now[0] += 1.0
    planner(inc, "updated")  # the next tick: the next step (the manager lets the incident's next step through)
    quota = sink.decisions[-1]
    assert quota.kind == ActionKind.SUPPRESS and quota.amount == SuppressAmount("cfs_quota", cpu_cores=0.5)
    assert quota.code == neighbor_cpu.QUOTA_TO_REQUEST
    planner(inc, "updated")
    assert len(sink.decisions) == 1  # waits for the verdict on the quota
    _applied_then(planner, quota, ActionState.REVERTED, "did not help: runq_wait_ms_per_s 5 -> 5")
    now[0] += 1.0
    planner(inc, "updated")
    evict = sink.decisions[-1]
    assert evict.kind == ActionKind.EVICT and evict.target == FLOOD and evict.incident_id == "inc-1"
    planner(inc, "updated")
    assert len(sink.decisions) == 2


def test_neighbor_ladder_after_a_quota_moves_the_culprit_off_the_victims_cpus() -> None:
    """A small node (the engine's first step a quota: a cpuset would leave the BE pod fewer CPUs than the
    policy's floor): the quota did not help, so the next tick moves the culprit off the victim's CPUs, below
    that floor; that not helping either, eviction (off: said, nothing more)."""
    now, sink, planner, inc, quota = _ladder_on_a_small_node(ActuatorPolicy(dry_run=False, evict_enabled=False), 0.35)
    _applied_then(planner, quota, ActionState.REVERTED, "did not help: x")
    now[0] += 1.0
    planner(inc, "updated")
    (cpuset,) = sink.decisions
    assert cpuset.target == FLOOD and cpuset.code == neighbor_cpu.CPUSET_AWAY
    assert cpuset.amount == SuppressAmount("cpuset", cpus=(0,), floor_cpus=1)
    assert cpuset.victim_signal == neighbor_cpu.VERIFY_SIGNAL
    assert any("cpuset off its CPUs 1 to CPUs 0" in e.note for e in inc.evidence), inc.evidence
    _applied_then(planner, cpuset, ActionState.REVERTED, "did not help: x")
    now[0] += 1.0
    planner(inc, "updated")
    assert len(sink.decisions) == 1 and any("eviction is disabled" in e.note for e in inc.evidence)


def test_neighbor_ladder_goes_on_in_the_incidents_clear_windows() -> None:
    """The quota was undone as "did not help" while the victim sat in its incident's clear windows (on 6.1 a
    waking victim preempts the hog and stops breaching for a few ticks): the next clean tick moves the hog off
    the victim's CPUs; before, nothing ran until the incident closed with the hog back on its CPU (make
    bench-vm-mitigate, 2026-11-29: 1 run of 4). A clean tick runs no cause plan, and a verified step is not
    followed on clean ticks (only breach ticks count against it)."""
    now, sink, planner, inc, quota = _ladder_on_a_small_node(ActuatorPolicy(dry_run=False, verify_intervals=1), 0.35)
    planner(inc, "opened")
    planner.note_record(_record(quota, ActionState.APPLIED, ""))
    planner(inc, CLEAN)
    assert sink.decisions == []  # the quota's verdict is not in
    planner.note_record(_record(quota, ActionState.REVERTED, "did not help: x"))
    now[0] += 1.0
    planner(inc, CLEAN)
    (cpuset,) = sink.decisions
    assert cpuset.code == neighbor_cpu.CPUSET_AWAY and cpuset.amount.cpus == (0,)
    assert any("cpuset off its CPUs 1 to CPUs 0" in e.note for e in inc.evidence), inc.evidence
    planner.note_record(_record(cpuset, ActionState.APPLIED, ""))
    planner.note_record(_record(cpuset, ActionState.VERIFIED, "victim improved"))
    for _ in range(3):
        now[0] += 1.0
        planner(inc, CLEAN)
    assert len(sink.decisions) == 1  # helped, and the victim does not breach: nothing on top


def test_neighbor_ladder_goes_on_when_a_step_helped_but_the_victim_still_breaches() -> None:
    """A quota verified (the victim's mean wait fell) while the incident keeps breaching: after as many breach
    ticks as the verification took, the next step goes on top; a victim that stopped breaching gets none."""
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=ActuatorPolicy(dry_run=False, verify_intervals=3))
    planner.online_cpus = lambda: [0, 1]  # type: ignore[method-assign]
    inc = _neighbor()
    inc.victim_cpus = [1]
    quota = Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.35), "engine",
                     incident_id="inc-1", victim=VICTIM, code=neighbor_cpu.SUPPRESS)
    _applied_then(planner, quota, ActionState.VERIFIED, "victim improved")
    planner(inc, "updated")
    planner(inc, "updated")
    assert sink.decisions == []
    planner(inc, "updated")
    (cpuset,) = sink.decisions
    assert cpuset.amount.policy == "cpuset" and any("helped, yet" in e.note for e in inc.evidence)
    # the same, for an incident that closes once the step is verified: nothing more
    inc2 = _neighbor()
    inc2.incident_id = "inc-2"
    _applied_then(planner, Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.35),
                                    "engine", incident_id="inc-2", victim=VICTIM), ActionState.VERIFIED, "victim improved")
    inc2.ended_at = 5.0
    planner(inc2, "closed")
    assert len(sink.decisions) == 1


@pytest.mark.parametrize("improvement, p99_ms, ticks_to_next", [
    (14.0, 9.8, 1),  # the VM lane's quota (10:43 UTC): +14 %, the victim at 4.9x its 2 ms SLO: next breach tick
    (14.0, 2.6, 5),  # nearly back (1.3x its SLO): the verification's 5 ticks, as before
    (80.0, 9.8, 5),  # took most of the wait away: it is given the same time to show it was enough
])
def test_a_step_that_helped_little_with_the_victim_far_above_its_slo_is_followed_at_the_next_breach_tick(
        improvement: float, p99_ms: float, ticks_to_next: int) -> None:
    """Issue 41: the quota verified by a small margin (the victim's mean wait 130 -> 112 ms/s) with its run-queue
    p99 still 4-5x its SLO; the ladder waited its 5 breach ticks and the cpuset came at +11.27 s (make
    bench-vm-mitigate, 2026-11-29 10:43 UTC). The wait follows how far the victim still is from its SLO."""
    from detector.model import Evidence

    now, sink, planner, inc, quota = _ladder_on_a_small_node(ActuatorPolicy(dry_run=False, verify_intervals=5), 0.21)
    planner.note_record(_record(quota, ActionState.APPLIED, ""))
    verified = _record(quota, ActionState.VERIFIED, "victim improved")
    verified.effect["improvement_percent"] = improvement  # as the manager's _judge writes it
    planner.note_record(verified)
    ticks = 0
    while not sink.decisions and ticks < 8:
        inc.evidence = [Evidence("runq_p99_ns", p99_ms * 1e6, 1.0, threshold=2e6)]  # this breach tick's
        now[0] += 1.0
        ticks += 1
        planner(inc, "updated")
    (cpuset,) = sink.decisions
    assert cpuset.code == neighbor_cpu.CPUSET_AWAY and cpuset.amount.cpus == (0,)
    assert ticks == ticks_to_next
    said = " | ".join(e.note for e in inc.evidence)
    if ticks_to_next == 1:
        assert f"took only {improvement:.0f} %" in said and "at 4.9x its SLO" in said, said
    else:
        assert "helped, yet" in said, said


def test_the_engines_step_refused_for_a_while_is_taken_up_by_the_ladder_once_the_limit_passes() -> None:
    """cpu-neighbor-shared (ladder7's host run, 2026-11-29 13:20 UTC, pass 1): the second LS pod's incident opened
    first, the engine's cpuset on the BE pod did not help it and was undone; the victim's own incident then
    asked for the same move and was refused ("reverted recently: blocked for 4 s more"). The engine submits its
    step once per incident, so the victim stayed at 7 ms to the end of the pass. The ladder takes it up: its
    cpuset off the victim's CPUs once the block has passed, not before."""
    now, sink, planner, inc, engine_step = _ladder_on_a_small_node(ActuatorPolicy(dry_run=False), 0.35)
    planner(inc, "opened")
    refused = ActionRecord("a", None, engine_step, ActionState.REFUSED, "default/batch was reverted recently: blocked "
                           "for 4 s more", outcome=ActionOutcome.WAIT)
    refused.effect["retry_in_s"] = 4.0
    planner.note_record(refused)
    for _ in range(3):
        now[0] += 1.0
        planner(inc, "updated")
    assert sink.decisions == []  # blocked
    now[0] += 1.0
    planner(inc, "updated")
    (cpuset,) = sink.decisions
    assert cpuset.code == neighbor_cpu.CPUSET_AWAY and cpuset.incident_id == "inc-1" and cpuset.amount.cpus == (0,)
    assert any("cpuset off its CPUs 1 to CPUs 0" in e.note for e in inc.evidence), inc.evidence


def test_a_reopened_incident_continues_the_ladder_of_the_victims_last_one() -> None:
    """The VM lane's failure (issue 41): the quota did not help, the incident closed before the next tick
    (6.1's CFS lets the waking victim preempt the hog) and the next incident for the same victim and hog
    started with nothing. The ladder belongs to the (victim, culprit) pair: the next incident goes on with
    the cpuset, and says so."""
    now, sink, planner, inc, quota = _ladder_on_a_small_node(ActuatorPolicy(dry_run=False, evict_enabled=False), 0.21)
    _applied_then(planner, quota, ActionState.REVERTED, "did not help: x")
    inc.ended_at = 1.0
    planner(inc, "closed")
    assert sink.decisions == []
    now[0] += 5.0
    inc2 = _neighbor()
    inc2.incident_id = "inc-2"
    inc2.victim_cpus = [1]
    planner(inc2, "opened")
    (cpuset,) = sink.decisions
    assert cpuset.code == neighbor_cpu.CPUSET_AWAY and cpuset.incident_id == "inc-2"
    assert cpuset.amount == SuppressAmount("cpuset", cpus=(0,), floor_cpus=1)
    assert any("goes on (tried: quota)" in e.note for e in inc2.evidence), inc2.evidence


def test_neighbor_escalation_stops_when_it_helped_or_eviction_is_off() -> None:
    now = [0.0]
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=ActuatorPolicy(dry_run=False, evict_enabled=False),
                                request_of=lambda t: None, clock=lambda: now[0])
    cpuset = Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cpuset", cpus=(0,)), "engine", incident_id="inc-1",
                      victim=VICTIM)
    inc = _neighbor()
    _applied_then(planner, cpuset, ActionState.VERIFIED, "victim improved")
    now[0] += 100
    inc.culprits = []  # the victim stopped breaching: the engine stops calling; an "opened"-only hook moves nothing
    planner(inc, "opened")
    assert sink.decisions == []
    inc2 = _neighbor()
    inc2.incident_id = "inc-2"
    _applied_then(planner, Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cpuset", cpus=(0,)), "e",
                                    incident_id="inc-2", victim=VICTIM), ActionState.REVERTED, "did not help: x")
    now[0] += 100
    planner(inc2, "updated")  # no request known: straight to eviction, which policy forbids
    assert sink.decisions == []
    assert any("eviction is disabled" in e.note for e in inc2.evidence)
    # a non-BE target never enters the ladder
    ls = Decision(ActionKind.SUPPRESS, API, SuppressAmount("cpuset", cpus=(0,)), "e", incident_id="inc-3", victim=VICTIM)
    _applied_then(planner, ls, ActionState.REVERTED, "did not help: x")
    inc3 = _neighbor()
    inc3.incident_id = "inc-3"
    now[0] += 100
    planner(inc3, "updated")
    assert sink.decisions == []


def _fake_task(proc: Path, pid: int, policy: int, cpus: str, ticks: int = 500) -> None:
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12], fields[38] = str(ticks), "0", str(policy)
    (proc / str(pid)).mkdir(parents=True)
    (proc / f"{pid}/stat").write_text(f"{pid} (busy task) " + " ".join(fields) + "\n")
    (proc / f"{pid}/status").write_text(f"Name:\tbusy\nCpus_allowed_list:\t{cpus}\n")


def test_rt_task_of_a_be_pod_on_the_victims_cpu_is_ranked_and_moved_off_it(tmp_path: Path, monkeypatch) -> None:
    from actuators import mitigate
    from tests.helpers_actuators import fake_v1_host

    web, flood, api = (t.cgroup.strip("/") for t in (VICTIM, FLOOD, API))
    paths = fake_v1_host(tmp_path, ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
                                    "kubepods.slice/kubepods-besteffort.slice", web, flood, api], cpus="0-1")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-1\n")
    cg = tmp_path / "sys/fs/cgroup/cpu"
    (cg / web / "cgroup.procs").write_text("10\n")
    (cg / flood / "cgroup.procs").write_text("20\n21\n")
    (cg / api / "cgroup.procs").write_text("30\n")
    proc = tmp_path / "proc"
    _fake_task(proc, 10, 0, "1")  # the victim, pinned to CPU 1
    _fake_task(proc, 20, 0, "0")  # the flood sender (SCHED_OTHER)
    _fake_task(proc, 21, 1, "1")  # SCHED_FIFO on the victim's CPU
    _fake_task(proc, 30, 2, "0-1", ticks=900)  # an LS pod's SCHED_RR task, also allowed there, more CPU
    files = CgroupFiles(paths)
    sink = LoggingSink()
    now = [0.0]
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD, API], NetnsTrafficSampler(files), clock=lambda: now[0])
    reads = []
    real_task_sched = mitigate.task_sched
    monkeypatch.setattr(mitigate, "task_sched", lambda proc, pid: reads.append(pid) or real_task_sched(proc, pid))
    inc = _incident()
    planner(inc, "opened")
    assert len(sink.decisions) == 1
    d = sink.decisions[0]
    assert d.target == FLOOD and d.amount == SuppressAmount("cpuset", cpus=(0,)) and d.incident_id == "inc-1"
    ranking = next(e.note for e in inc.evidence if "real-time" in e.note)
    assert ranking.index("api") < ranking.index("flood")  # ranked by RT CPU time: the LS pod first ...
    assert inc.culprits[0].target == FLOOD  # ... and the BE one put first in the incident's culprits
    inc.culprits = []  # the engine's next update replaces the culprits: the RT pod is put first again
    planner(inc, "updated")  # ... but never touched; and one RT move per incident
    assert all(x.target != API for x in sink.decisions) and len(sink.decisions) == 1
    assert inc.culprits[0].target == FLOOD
    assert len([e for e in inc.evidence if "real-time" in e.note]) == 1
    # Between scans the ranking is put back without reading every pod's tasks again; 5 s on, it is read.
    scanned = len(reads)
    inc.culprits = []
    planner(inc, "updated")
    assert len(reads) == scanned and inc.culprits[0].target == FLOOD
    now[0] = 6.0
    planner(inc, "updated")
    assert len(reads) > scanned and inc.culprits[0].target == FLOOD
    # only a non-BE pod has RT tasks: said, nothing done
    (cg / flood / "cgroup.procs").write_text("20\n")
    sink2 = LoggingSink()
    inc2 = _incident()
    MitigationPlanner(sink2, lambda: [VICTIM, FLOOD, API], NetnsTrafficSampler(files))(inc2, "opened")
    assert sink2.decisions == []
    assert any("no BE pod among them" in e.note for e in inc2.evidence)


def test_requests_from_a_pod_source_include_batch_cpu() -> None:
    from actuators.mitigate import requests_from
    from detector.pods import pod_from_dict
    from testkit.fakekube import make_pod

    uid = "7d1b7f0e-0000-4000-8000-00000000000a"
    pods = [pod_from_dict(make_pod("batch", uid=uid, qos_class="BE", requests={"cpu": "250m"}))]
    request_of = requests_from(lambda: pods)
    assert request_of(Target("/x", pod_uid=uid, qos="BE")) == pytest.approx(0.25)
    assert request_of(Target("/x", pod_uid="other", qos="BE")) is None
    assert request_of(Target("/x", qos="BE")) is None


def _netdev(packets: int) -> str:
    """/proc/<pid>/net/dev of a pod's netns: ``packets`` sent on its one device (lo is skipped)."""
    return ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs\n"
            "    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
            f"  eth0: 0 0 0 0 0 0 0 0 0 {packets} 0 0 0 0 0 0\n")


def _starve_host(tmp_path: Path, rt_cpus: str = "3") -> tuple[CgroupFiles, Path, Path]:
    """softirq-starve on a fake 4-CPU v1 host: the LS victim pinned to CPU 3; the BE pod 'flood' with a
    SCHED_FIFO task allowed on ``rt_cpus`` and a sender (pid 20) in its own netns. (files, proc, cgroup root)."""
    from tests.helpers_actuators import fake_cpu_topology, fake_v1_host

    web, flood, api = (t.cgroup.strip("/") for t in (VICTIM, FLOOD, API))
    paths = fake_v1_host(tmp_path, ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
                                    "kubepods.slice/kubepods-besteffort.slice", web, flood, api], cpus="0-3")
    fake_cpu_topology(tmp_path, ["0", "1", "2", "3"], {0: "0-3"})
    cg = tmp_path / "sys/fs/cgroup"
    (cg / "cpu" / web / "cgroup.procs").write_text("10\n")
    (cg / "cpu" / flood / "cgroup.procs").write_text("20\n21\n")
    proc = tmp_path / "proc"
    _fake_task(proc, 10, 0, "3")  # the victim
    _fake_task(proc, 20, 0, "0-3")  # the sender, SCHED_OTHER
    _fake_task(proc, 21, 1, rt_cpus)  # SCHED_FIFO
    for pid in (1, 20):  # the node's netns (pid 1's) and the pod's own: two files, two inodes
        (proc / f"{pid}/ns").mkdir(parents=True, exist_ok=True)
        (proc / f"{pid}/ns/net").write_text("")
    (proc / "20/net").mkdir()
    return CgroupFiles(paths), proc, cg


@pytest.mark.parametrize("first_move", ["rt_move", "engine"])
@pytest.mark.parametrize("helped", [True, False])
def test_the_senders_traffic_cap_joins_its_move_off_the_victims_cpus_and_the_two_are_judged_as_one(
        tmp_path: Path, helped: bool, first_move: str) -> None:
    """softirq-starve (issue 41): a BE pod's RT task on the victim's CPU, and its own packets' NET_RX
    steered there too. Moving the pod off the victim's CPUs (the planner's RT move, or the engine's first
    step of an incident re-caused softirq in its first ticks) leaves the NET_RX where it was; only its
    quota ("sends less") takes that away. The real planner and manager over a fake host's files: the quota
    comes the tick after the move (its first traffic sample, taken on the move's tick, gives the rate),
    applied while the move is being verified, and the two are judged as one action: both kept, or both
    undone and neither tried again for this victim. Before, the manager refused the quota every tick
    ("still being verified") until the move's verdict was in, and the move alone could be undone."""
    from actuators.mitigate import RECORD_NOTE
    from detector.causes import softirq

    files, proc, cg = _starve_host(tmp_path, rt_cpus="3" if first_move == "rt_move" else "0-2")
    flood = FLOOD.cgroup.strip("/")
    now = [100.0]
    journal = Journal(tmp_path / "j")
    policy = ActuatorPolicy(dry_run=False)
    manager = ActuatorManager([SuppressActuator(files, journal)], journal, policy, registry=CollectorRegistry(),
                              audit_log=tmp_path / "audit.jsonl", clock=lambda: now[0])
    planner = MitigationPlanner(manager, lambda: [VICTIM, FLOOD, API], NetnsTrafficSampler(files, clock=lambda: now[0]),
                                policy, clock=lambda: now[0])
    manager.on_record.append(planner.note_record)
    inc = _incident()
    inc.breach_signals = {"runq_p99_ns": 4_000_000.0}  # the victim over its breach: the verification's baseline
    signal = f"{VICTIM.cgroup}:runq_p99_ns"
    packets, usage_ns = 1_000_000, 50 * 10**9

    def tick(what: str, p99_ns: float) -> None:
        nonlocal packets, usage_ns
        (proc / "20/net/dev").write_text(_netdev(packets))
        (cg / "cpuacct" / flood / "cpuacct.usage").write_text(f"{usage_ns}\n")
        if what == "opened" and first_move == "engine":  # the engine's step, as the incident opened
            manager.submit(inc.for_verification(Decision(
                ActionKind.SUPPRESS, FLOOD, SuppressAmount("cpuset", cpus=(0, 1, 2)), "engine", incident_id="inc-1",
                victim=VICTIM, victim_signal="runq_p99_ns", code=neighbor_cpu.SUPPRESS)))
        planner(inc, what)
        manager.observe({signal: p99_ns}, now[0])
        now[0] += 1.0
        packets, usage_ns = packets + 80_000, usage_ns + 8 * 10**8  # 80,000 pkt/s on 0.8 cores

    after = 600_000.0 if helped else 4_000_000.0
    tick("opened", 4_000_000.0)  # the move; the traffic's first sample
    assert files.read_cpus(flood) == (0, 1, 2) and files.read_cpu_max(flood).quota_us is None
    tick("updated", after)  # its rate: the same pod sends 100 % of the pods' packets
    move, cap = (r for r in {id(r): r for r in manager.records}.values())
    assert move.decision.code == (softirq.RT_MOVE if first_move == "rt_move" else neighbor_cpu.SUPPRESS)
    assert (cap.decision.code, cap.state) == (softirq.OWN_TRAFFIC, ActionState.APPLIED), cap.detail
    assert cap.outcome == ActionOutcome.JOINED
    assert cap.at - move.at < 5  # the tick after, not after the move's verdict
    assert files.read_cpus(flood) == (0, 1, 2) and files.read_cpu_max(flood).quota_us == 2000  # both in place
    assert manager.active_records() == [move, cap]
    assert [r.state for r in manager.records].count(ActionState.REFUSED) == 0
    # The incident says the cap went on top of the move, by the record's outcome code.
    assert any(k.code == RECORD_NOTE and k.subject[-1] == "applied" for k in planner._notes[inc.incident_id])
    for _ in range(4):
        tick("updated", after)  # the verification: 5 samples from the tick the cap joined the move
    verdict = ActionState.VERIFIED if helped else ActionState.REVERTED
    assert move.state == cap.state == verdict and move.detail.endswith(f"(judged with {cap.action_id})")
    assert cap.detail.endswith(f"(judged with {move.action_id})")
    if helped:  # both stay until shutdown
        assert files.read_cpus(flood) == (0, 1, 2) and files.read_cpu_max(flood).quota_us == 2000
    else:  # both undone, and neither is tried again for this victim
        assert files.read_cpus(flood) == (0, 1, 2, 3) and files.read_cpu_max(flood).quota_us is None
        now[0] += 2 * policy.cooldown_seconds  # past the target's block after a revert
        for step in (move, cap):
            manager.submit(step.decision)
            assert manager.records[-1].outcome == ActionOutcome.TRIED_BEFORE
    # The ladder per step in the audit log: each action applied, the move joined, each its verdict.
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    steps = [(x["action_id"], x["state"]) for x in lines if x.get("event") == "action"]
    assert steps[:4] == [(move.action_id, "applied"), (move.action_id, "applied"), (cap.action_id, "applied"),
                         (move.action_id, str(verdict))] and (cap.action_id, str(verdict)) in steps
    manager.close()
    assert not journal.owned()
    assert files.read_cpus(flood) == (0, 1, 2, 3) and files.read_cpu_max(flood).quota_us is None


def test_a_step_joins_only_its_own_incidents_move_of_the_same_pod_on_another_knob(tmp_path: Path) -> None:
    """The manager's rule is narrow: the same knob again, another incident's step, or a step that names
    no step in place is still refused while the target's action is being verified (WAIT: the ladders retry)."""
    from detector.causes import softirq

    files, _, _ = _starve_host(tmp_path)
    journal = Journal(tmp_path / "j")
    manager = ActuatorManager([SuppressActuator(files, journal)], journal, ActuatorPolicy(dry_run=False),
                              registry=CollectorRegistry())

    def decision(amount: SuppressAmount, code: str, joins: tuple[str, ...] = (), incident: str = "inc-1") -> Decision:
        return Decision(ActionKind.SUPPRESS, FLOOD, amount, "x", incident_id=incident, victim=VICTIM,
                        victim_signal="runq_p99_ns", victim_before=4e6, code=code, joins=joins)

    quota = SuppressAmount("cfs_quota", cpu_cores=0.5)
    manager.submit(decision(SuppressAmount("cpuset", cpus=(0, 1, 2)), softirq.RT_MOVE))
    assert manager.records[-1].state == ActionState.APPLIED
    for d in (decision(quota, softirq.OWN_TRAFFIC),  # joins nothing
              decision(quota, softirq.OWN_TRAFFIC, joins=(softirq.RT_MOVE,), incident="inc-2"),  # another incident
              decision(quota, softirq.OWN_TRAFFIC, joins=("softirq.other",)),  # not the step in place
              decision(SuppressAmount("cpuset", cpus=(0, 1)), softirq.OWN_TRAFFIC, joins=(softirq.RT_MOVE,))):  # same knob
        manager.submit(d)
        assert (manager.records[-1].state, manager.records[-1].outcome) == (ActionState.REFUSED, ActionOutcome.WAIT), d
    manager.submit(decision(quota, softirq.OWN_TRAFFIC, joins=softirq.MOVES_OFF_VICTIM_CPUS))
    assert (manager.records[-1].state, manager.records[-1].outcome) == (ActionState.APPLIED, ActionOutcome.JOINED)
    manager.close()
    assert not journal.owned()


@pytest.mark.parametrize("p99_ms, under_quota, joins", [(9.8, 125.0, True), (2.6, 112.0, False)])
def test_a_step_under_which_the_victim_stays_far_above_its_slo_is_joined_by_the_next_one(
        tmp_path: Path, p99_ms: float, under_quota: float, joins: bool) -> None:
    """Issue 41, the VM lane's cpu-neighbor: the engine's quota on the BE pod took 14 % of the victim's wait
    away and its verdict came 5 ticks after it, the victim at 4-5x its 2 ms SLO all that time; the cpuset
    came after (+11.27 s). The real planner and manager over a fake host's files: 2 breach ticks at 4.9x
    its SLO under the quota being verified, and the cpuset off the victim's CPUs joins it, the two judged
    as one on the quota's baseline and on samples from the join on (both kept: the victim's wait fell once the
    cpuset was on; on the quota's own samples, 3 of 5 taken before the cpuset, the median was the quota's
    alone, -4 %, and both were undone: make bench-vm-mitigate's lane, 13:37 UTC). A victim near its SLO
    (1.3x) under the quota gets nothing before the verdict, as before."""
    from actuators.mitigate import RECORD_NOTE
    from detector.model import Evidence

    files, _proc, _cg = _starve_host(tmp_path)
    flood = FLOOD.cgroup.strip("/")
    now = [100.0]
    journal = Journal(tmp_path / "j")
    policy = ActuatorPolicy(dry_run=False)
    manager = ActuatorManager([SuppressActuator(files, journal)], journal, policy, registry=CollectorRegistry(),
                              audit_log=tmp_path / "audit.jsonl", clock=lambda: now[0])
    planner = MitigationPlanner(manager, lambda: [VICTIM, FLOOD], policy=policy, clock=lambda: now[0])
    planner.online_cpus = lambda: [0, 1, 2, 3]  # type: ignore[method-assign]
    manager.on_record.append(planner.note_record)
    inc = _neighbor()
    inc.victim_cpus = [3]
    inc.breach_signals = {neighbor_cpu.VERIFY_SIGNAL: 130.0}  # the victim's wait over its breach, ms/s
    signal = f"{VICTIM.cgroup}:{neighbor_cpu.VERIFY_SIGNAL}"
    manager.submit(inc.for_verification(Decision(
        ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.4), "engine", incident_id="inc-1",
        victim=VICTIM, victim_signal=neighbor_cpu.VERIFY_SIGNAL, code=neighbor_cpu.SUPPRESS)))
    manager.observe({signal: 130.0}, now[0])  # the tick it was applied on: its interval was before it
    now[0] += 1.0
    (quota,) = manager.records
    assert quota.state == ActionState.APPLIED and files.read_cpu_max(flood).quota_us is not None
    moved_on: list[int] = []  # the breach ticks under the quota with the hog off the victim's CPU
    for tick in range(1, policy.verify_intervals + 2):  # the verdict: 5 samples from the cpuset's tick on
        inc.evidence = [Evidence("runq_p99_ns", p99_ms * 1e6, 1.0, threshold=2e6)]  # this breach tick's
        planner(inc, "updated")
        if files.read_cpus(flood) == (0, 1, 2):
            moved_on.append(tick)
        # each tick's wait is its interval's, before that tick's step: the cpuset shows from the next one
        manager.observe({signal: 2.0 if moved_on and moved_on[0] < tick else under_quota}, now[0])
        now[0] += 1.0
    records = list({id(r): r for r in manager.records}.values())
    if not joins:
        assert records == [quota] and quota.state == ActionState.VERIFIED  # 130 -> 112 ms/s: +14 %
        assert files.read_cpus(flood) == (0, 1, 2, 3)
        manager.close()
        return
    _, cpuset = records
    assert cpuset.decision.code == neighbor_cpu.CPUSET_AWAY and cpuset.decision.joins == (neighbor_cpu.SUPPRESS,)
    assert moved_on[0] == 2  # the 2nd breach tick under the quota, not after its verdict (the 5th)
    assert quota.state == cpuset.state == ActionState.VERIFIED and quota.detail.endswith(f"(judged with {cpuset.action_id})")
    assert files.read_cpus(flood) == (0, 1, 2) and files.read_cpu_max(flood).quota_us is not None  # both kept
    said = " | ".join(e.note for e in inc.evidence)
    assert "stayed at 4.9x its SLO or more for 2 breach ticks" in said, said
    assert any(k.code == RECORD_NOTE and k.subject[-1] == "applied" for k in planner._notes[inc.incident_id])
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    steps = [(x["action_id"], x["state"]) for x in lines if x.get("event") == "action"]
    assert (cpuset.action_id, "applied") in steps and (cpuset.action_id, "verified") in steps
    manager.close()
    assert files.read_cpus(flood) == (0, 1, 2, 3) and files.read_cpu_max(flood).quota_us is None
