# SPDX-License-Identifier: Apache-2.0
"""One declaration per cause (detector/causes): the registry is complete, every reader takes its words
from it, and the planner keys on codes, never on wording: rewording every message changes no decision."""

from __future__ import annotations

import string
from collections.abc import Iterator

import pytest

from actuators.base import ActionOutcome, ActionRecord, ActionState
from actuators.mitigate import MitigationPlanner
from detector import causes
from detector.causes import reclaim, softirq
from detector.decisions import ActionKind, Cause, Decision, LoggingSink, PodTraffic, SuppressAmount, Target
from detector.incidents import IncidentEngine
from detector.model import Culprit, Evidence, Incident
from detector.policy import ActuatorPolicy, Policy
from detector.signals import WorkloadSignals
from detector.workloads import Workload

VICTIM = Target("/kubepods.slice/kubepods-burstable.slice/web", qos="LS", pod="web")
FLOOD = Target("/kubepods.slice/kubepods-besteffort.slice/flood", qos="BE", pod="flood")
BATCH = Target("/kubepods.slice/kubepods-besteffort.slice/batch", qos="BE", pod="batch")


def test_every_cause_is_declared_once_and_the_reports_read_the_declarations():
    from noisyneighbor.diagnose import ADVICE
    from noisyneighbor.report_html import CAUSES as TITLES

    assert [s.cause for s in causes.CAUSES] == list(causes.BY_CAUSE) and set(causes.BY_CAUSE) == set(Cause)
    assert tuple(s.rule for s in causes.CAUSES) == causes.RULES and causes.CAUSES[-1].cause == Cause.PSI_UNKNOWN
    for s in causes.CAUSES:
        assert ADVICE[s.cause] == s.advice and TITLES[s.cause] == s.title
        for code in s.messages:
            assert code.startswith(f"{s.cause}."), code  # a code names its cause
    assert {c for c, s in causes.BY_CAUSE.items() if s.blameless} == {Cause.SELF_THROTTLING, Cause.SELF_CONTENTION,
                                                                      Cause.HYPERVISOR_STEAL}
    with pytest.raises(RuntimeError, match="declared once"):
        causes.check_causes(causes.CAUSES[:-2] + causes.CAUSES[-1:])


def _reworded(template: str) -> str:
    """The same fields (and format specs) in entirely different words."""
    fields = [f"{{{name}{':' + spec if spec else ''}}}" for _, name, spec, _ in string.Formatter().parse(template)
              if name is not None]
    return "zz " + " / ".join(fields)


@pytest.fixture(params=[False, True], ids=["as-written", "reworded"])
def reword(request, monkeypatch) -> Iterator[bool]:
    if request.param:
        for s in causes.CAUSES:
            for code, template in list(s.messages.items()):
                monkeypatch.setitem(s.messages, code, _reworded(template))
    yield request.param


def _decisions(sink: LoggingSink) -> list[tuple]:
    return [(d.kind, d.target, d.amount, d.code, d.incident_id) for d in sink.decisions]


class _Sampler:
    def __init__(self, traffic: list[PodTraffic]) -> None:
        self.traffic = traffic

    def sample(self, targets) -> list[PodTraffic]:
        return self.traffic


def _planner_story() -> tuple[list[tuple], list[str], list[str]]:
    """Softirq from a BE pod's traffic (refused once, then retried), neighbour escalation after a suppress
    that did not help, global reclaim named by findings only: every planner branch that once read words."""
    now = [100.0]
    sink = LoggingSink()
    policy = ActuatorPolicy(dry_run=False, evict_enabled=True, cooldown_seconds=3.0)
    planner = MitigationPlanner(sink, lambda: [VICTIM, FLOOD], _Sampler([PodTraffic(FLOOD, 80_000, 0.8)]), policy,
                                request_of=lambda t: 0.5 if t == FLOOD else None, clock=lambda: now[0])
    sirq = Incident("inc-s", VICTIM, Cause.SOFTIRQ, 0.0, 0.8, "softirq_ms_per_s")
    planner(sirq, "opened")
    refused = sink.decisions[-1]
    planner.note_record(ActionRecord("r1", None, refused, ActionState.REFUSED, "words the manager may change"))
    now[0] += 1.0
    planner(sirq, "updated")  # refused traffic cap: tried again

    neighbour = Incident("inc-n", VICTIM, Cause.NEIGHBOR_CPU, 0.0, 0.8, "runq_p99_ns",
                         culprits=[Culprit(FLOOD, 0.9, who_ran_instead_share=0.8, cpu_cores=1.0)])
    cpuset = Decision(ActionKind.SUPPRESS, FLOOD, SuppressAmount("cpuset", cpus=(0,)), "engine", incident_id="inc-n",
                      victim=VICTIM)
    planner.note_record(ActionRecord("c1", None, cpuset, ActionState.APPLIED, "words"))
    planner.note_record(ActionRecord("c1", None, cpuset, ActionState.REVERTED, "any words at all",
                                     outcome=ActionOutcome.DID_NOT_HELP))
    now[0] += 1.0
    planner(neighbour, "updated")  # quota to its request
    planner.note_record(ActionRecord("q1", None, sink.decisions[-1], ActionState.APPLIED, "more words"))
    planner.note_record(ActionRecord("q1", None, sink.decisions[-1], ActionState.REVERTED, "still any words",
                                     outcome=ActionOutcome.DID_NOT_HELP))
    now[0] += 1.0
    planner(neighbour, "updated")  # evict

    # Reclaim with eviction on: the BE grower is evicted, though a grower of the node's own ranks above it.
    node_grower = Target("/system.slice/agent", qos="")
    evicted = Incident("inc-e", VICTIM, Cause.RECLAIM, 0.0, 0.8, "reclaim_stall_ms_per_s", findings=[reclaim.KSWAPD],
                       culprits=[Culprit(node_grower, 0.95, attribution=0.6), Culprit(BATCH, 0.9, attribution=0.4)])
    planner(evicted, "opened")
    # Reclaim with eviction off: capped.
    planner.policy = ActuatorPolicy(dry_run=False, evict_enabled=False)
    grown = Incident("inc-r", VICTIM, Cause.RECLAIM, 0.0, 0.8, "reclaim_stall_ms_per_s",
                     evidence=[Evidence("reclaim_stall_ms_per_s", 12.0, 1.0, note="no telling words here")],
                     findings=[reclaim.DIRECT])
    planner(grown, "opened")  # global: waits for a culprit instead of calling it the victim's own limit
    grown.culprits = [Culprit(BATCH, 0.9, attribution=0.9)]
    planner(grown, "updated")
    mine = Incident("inc-m", VICTIM, Cause.RECLAIM, 0.0, 0.8, "reclaim_stall_ms_per_s",
                    evidence=[Evidence("reclaim_stall_ms_per_s", 12.0, 1.0, note="direct 12.0")])
    planner(mine, "opened")  # no finding: memcg reclaim at its own limit, whatever a note says
    notes = [code for code in ("inc-s", "inc-n", "inc-r", "inc-m") for _ in planner.notes(code)]
    return _decisions(sink), notes, [d.reason for d in sink.decisions]


EXPECTED = [
    (ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.02), softirq.OWN_TRAFFIC, "inc-s"),
    (ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.02), softirq.OWN_TRAFFIC, "inc-s"),
    (ActionKind.SUPPRESS, FLOOD, SuppressAmount("cfs_quota", cpu_cores=0.5), causes.neighbor_cpu.QUOTA_TO_REQUEST,
     "inc-n"),
    (ActionKind.EVICT, FLOOD, None, causes.neighbor_cpu.EVICT, "inc-n"),
    (ActionKind.EVICT, BATCH, None, reclaim.EVICT, "inc-e"),
    (ActionKind.MEMORY_SUPPRESS, BATCH, None, reclaim.CAP_GROWER, "inc-r"),
]


def test_rewording_every_message_changes_no_planner_decision(reword):
    decisions, notes, reasons = _planner_story()
    assert [(k, t, a if k == ActionKind.SUPPRESS else None, c, i) for k, t, a, c, i in decisions] == EXPECTED
    assert notes == ["inc-s", "inc-s", "inc-n", "inc-n", "inc-r", "inc-m"], notes  # said, in whichever words
    assert all(r.startswith("zz ") == reword for r in reasons), reasons


def _engine_decisions() -> list[tuple]:
    """The engine's own step per cause, through IncidentEngine._decide with every act declared."""
    sink = LoggingSink()
    policy = Policy(actuators=ActuatorPolicy(evict_enabled=True))
    engine = IncidentEngine(policy, sink=sink)
    from detector.incident_diagnosis import VictimState

    for n, cause in enumerate(Cause):
        victim = Target(f"/v{n}", qos="LS")
        culprit = Culprit(BATCH, 0.9, who_ran_instead_share=0.7, cpu_cores=1.0)
        inc = Incident(f"inc-{n}", victim, cause, 0.0, 0.8, "runq_p99_ns", culprits=[culprit])
        engine._decide(inc, VictimState())
    return _decisions(sink)


def test_rewording_every_message_changes_no_engine_decision(reword):
    got = _engine_decisions()
    assert [(k, c) for k, _, _, c, _ in got] == [
        (ActionKind.SUPPRESS, causes.neighbor_cpu.SUPPRESS),  # neighbor_cpu
        (ActionKind.BURST, causes.self_throttling.BURST),
        (ActionKind.SUPPRESS, causes.neighbor_cpu.SUPPRESS),  # softirq: the same step
    ]  # reclaim: the planner's step (evict or cap), not the engine's


def test_the_engine_records_direct_reclaim_as_a_finding_not_only_in_a_note():
    row = WorkloadSignals(Workload("pod:v", VICTIM), 1.0)
    row.reclaim_stall_ms_per_s, row.reclaim_by_kind_ms_per_s = 40.0, {"direct": 40.0}
    assert causes.reclaim.context(row) == (reclaim.DIRECT,)
    row.reclaim_by_kind_ms_per_s = {"memcg": 40.0}
    assert causes.reclaim.context(row) == ()
    inc = Incident("i", VICTIM, Cause.RECLAIM, 0.0, 0.5, "reclaim_stall_ms_per_s", findings=[reclaim.KSWAPD])
    assert reclaim.global_reclaim(inc) and not reclaim.global_reclaim(
        Incident("j", VICTIM, Cause.RECLAIM, 0.0, 0.5, "x", evidence=[Evidence("kswapd_pages_per_s", 1e5, 1.0)]))
