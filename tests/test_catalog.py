# SPDX-License-Identifier: Apache-2.0
"""The signal catalog and the cause rules, without the kernel: what each reads and checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from detector import catalog, causes
from detector.decisions import Cause, Target
from detector.incidents import IncidentEngine
from detector.model import Culprit, Evidence, Incident
from detector.policy import PolicyError, SloThresholds, load_policy, parse_policy
from detector.signals import ContainerCpu, NodeSignals, WorkloadSignals
from detector.workloads import Workload

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "base" / "config.yaml"


# -- the catalog ------------------------------------------------------------------------------------


def test_every_slo_field_is_declared_once_with_its_signal_and_the_check_refuses_a_second():
    fields = [f.name for f in dataclasses.fields(SloThresholds)]
    assert fields[: len(catalog.SLO_SIGNALS)] == [s.slo.field for s in catalog.SLO_SIGNALS]
    assert fields[len(catalog.SLO_SIGNALS):] == [k.field for k in catalog.KNOBS]
    assert SloThresholds().softirq_ms_per_s == catalog.SIGNALS["softirq_ms_per_s"].slo.default
    twice = catalog.Signal("made_up_ms", "Made up", "ms", slo=catalog.Slo("runq_p99_ms", 1.0))
    with pytest.raises(catalog.CatalogError, match="runq_p99_ms"):
        catalog.check_catalog((*catalog.SIGNALS.values(), twice))
    with pytest.raises(catalog.CatalogError, match="twice"):
        catalog.check_catalog((*catalog.SIGNALS.values(), catalog.SIGNALS["runq_p99_ns"]))
    bad_default = catalog.Signal("made_up_ms", "Made up", "ms", slo=catalog.Slo("made_up_ms", 0.0, divides=True))
    with pytest.raises(catalog.CatalogError, match="must be > 0"):
        catalog.check_catalog((*catalog.SIGNALS.values(), bad_default))


def test_the_deployed_config_sets_every_slo_field_the_catalog_uses():
    slo = yaml.safe_load(CONFIG.read_text())["slo"]
    assert {s.slo_field for s in catalog.SLO_SIGNALS} <= set(slo)
    assert load_policy(CONFIG).slo == SloThresholds()  # the file is the defaults, written out


def test_softirq_slo_is_settable_and_range_checked_from_the_catalog():
    assert parse_policy("slo: {softirq_ms_per_s: 25}").slo.softirq_ms_per_s == 25.0
    assert catalog.SIGNALS["softirq_ms_per_s"].threshold(parse_policy("slo: {softirqMsPerS: 7}").slo) == 7.0
    with pytest.raises(PolicyError, match=r"softirq_ms_per_s: must be in 0\.\.1000"):
        parse_policy("slo: {softirq_ms_per_s: 5000}")


def test_thresholds_and_display_come_from_the_catalog():
    slo = SloThresholds(runq_p99_ms=3.0)
    assert catalog.SIGNALS["runq_p99_ns"].threshold(slo) == 3e6
    assert catalog.human_value("runq_p99_ns", 5.99e7) == "59.9 ms"
    assert catalog.human_value("throttled_ratio", 0.5) == "50%"
    assert catalog.SIGNALS["syn_retransmits_per_s"].threshold(slo) is None  # evidence only
    assert [s.name for s in catalog.SIGNALS.values() if s.k_sigma] == ["runq_p99_ns"]


# -- the cause rules --------------------------------------------------------------------------------


def _row(**kw) -> WorkloadSignals:
    row = WorkloadSignals(Workload("pod:v", Target("/kubepods.slice/v", "v", "default", "web", "LS")), 1.0)
    row.runq_count, row.runq_p99_ns, row.who_ran_instead_available = 500, 2e7, True
    for k, v in kw.items():
        setattr(row, k, v)
    return row


def _ctx(row: WorkloadSignals, own: float = 0.0, foreign: dict | None = None, total: float = 1e9,
         breached=("runq_p99_ns",)) -> causes.CauseContext:
    none = lambda *a: []  # noqa: E731
    return causes.CauseContext(
        key="pod:v", row=row, signals=NodeSignals(1.0, {"pod:v": row}), slo=SloThresholds(),
        breached=set(breached), foreign=foreign or {}, own_wait_ns=own, total_wait_ns=total, window_s=10.0,
        cpu_culprits=lambda k, f, t: [Culprit(Target(c), 0.5) for c in f], correlation_culprits=none,
        kernel_work_judges=causes.KERNEL_WORK_JUDGES,
    )


def test_self_throttling_fires_on_most_periods_throttled_with_little_foreign_wait():
    # Throttled time is a small part of the wait (its own threads wait behind each other), but it is
    # throttled in nearly every period and the wait is not behind other cgroups.
    row = _row(runq_wait_ms_per_s=7000.0, throttled_ms_per_s=200.0, throttled_ratio=0.97, quota_cores=0.8)
    v = causes.decide(_ctx(row, own=0.8e9, foreign={"pod:x": 0.1e9}))
    assert v.cause == Cause.SELF_THROTTLING and v.culprits == []
    # ... and not when most of the wait is behind a neighbour
    v = causes.decide(_ctx(row, own=0.1e9, foreign={"pod:x": 0.8e9}))
    assert v.cause == Cause.NEIGHBOR_CPU


def test_self_throttling_names_the_container_at_its_limit():
    main = ContainerCpu("main", "/kubepods.slice/v/cri-containerd-a", 0.2, 0.2, 0.98, 60.0, 0.2)
    side = ContainerCpu("sidecar", "/kubepods.slice/v/cri-containerd-b", 0.01, None, 0.0, 0.0)
    row = _row(runq_wait_ms_per_s=80.0, throttled_ms_per_s=0.0, throttled_ratio=0.0, quota_cores=None,
               containers={main.path: main, side.path: side})
    v = causes.decide(_ctx(row))
    assert v.cause == Cause.SELF_THROTTLING
    named = [e for e in v.evidence if e.signal == "container_throttled_ratio"]
    assert len(named) == 1 and "container main " in named[0].note and "quota 0.20 cores" in named[0].note


def test_self_contention_when_its_own_threads_fill_its_cpus():
    row = _row(runq_wait_ms_per_s=3000.0, throttled_ms_per_s=0.0, throttled_ratio=0.0, cpus_allowed=1, cpu_cores=0.95)
    v = causes.decide(_ctx(row, own=0.8e9, foreign={"pod:x": 0.1e9}))
    assert v.cause == Cause.SELF_CONTENTION and v.culprits == []
    assert any(e.signal == "who_ran_instead_own_share" and e.value == 0.8 for e in v.evidence)
    assert causes.RULES.index(causes.self_throttling.rule) < causes.RULES.index(causes.self_contention.rule) \
        < causes.RULES.index(causes.neighbor_cpu.rule)


def test_the_nodes_own_processes_are_a_neighbour_named_as_the_culprit():
    """Seen under CI load: the victim waited behind processes in the root cgroup (the load generator,
    system daemons). The cause is the CPU neighbour, not 'unknown', and the node is its culprit (issue 41:
    a neighbour cause that named no one)."""
    row = _row(runq_wait_ms_per_s=300.0, throttled_ms_per_s=0.0, throttled_ratio=0.0, cpu_cores=0.3)
    ctx = _ctx(row, own=0.01e9, foreign={"/": 0.9e9})
    ctx.cpu_culprits = lambda k, f, t: [Culprit(Target(c), 0.5) for c in f]  # the engine's: the root included
    v = causes.decide(ctx)
    assert v.cause == Cause.NEIGHBOR_CPU and [c.target.cgroup for c in v.culprits] == ["/"]
    node = [e for e in v.evidence if e.signal == "who_ran_instead_node_share"]
    assert len(node) == 1 and node[0].value == 0.9 and "outside pods" in node[0].note
    # A little root time with no pod culprit is not enough to name a neighbour.
    ctx = _ctx(row, own=0.01e9, foreign={"/": 0.1e9})
    ctx.cpu_culprits = lambda k, f, t: []
    assert causes.decide(ctx).cause == Cause.PSI_UNKNOWN


def test_every_rule_is_one_function_and_the_fallback_always_holds():
    row = _row(runq_count=0)
    assert causes.decide(_ctx(row, breached=("psi_io_some",))).cause == Cause.PSI_UNKNOWN
    assert all(callable(r) for r in causes.RULES) and causes.RULES[-1] is causes.psi_unknown.rule


# -- culprits against their requests ----------------------------------------------------------------


def test_culprits_above_their_request_rank_first_the_node_by_its_score_and_zero_never():
    requests = {"pod:a": 2.0, "pod:b": 0.1}
    engine = IncidentEngine(cpu_request=requests.get)
    within = Culprit(Target("/k/a", "a", "batch", "a", "BE"), 0.6, cpu_cores=0.5)
    above = Culprit(Target("/k/b", "b", "batch", "b", "BE"), 0.4, cpu_cores=0.5)
    root = Culprit(Target("/"), 0.9)
    zero = Culprit(Target("/k/z", "z", "batch", "z", "BE"), 0.0)
    # Not measured yet (a pod that just started): not judged within its request, so not ranked after
    # every pod above theirs (issue 39's soak: a new BE hog was cut from the list of five).
    unmeasured = engine.culprit_finder.judged(within)
    assert unmeasured.above_request is None and "not measured" in unmeasured.note
    engine.store.add(1.0, {("pod:a", "cpu_cores"): 0.5, ("pod:b", "cpu_cores"): 0.5})
    ranked = engine.culprit_finder.ranked([engine.culprit_finder.judged(c) for c in (within, above, root, zero)])
    assert [c.target.cgroup for c in ranked] == ["/", "/k/b", "/k/a"]  # the node: no request, so with those above
    assert ranked[1].above_request is True and ranked[1].cpu_request_cores == 0.1
    assert ranked[2].above_request is False and "busy within its request" in ranked[2].note
    # A pod that requests no CPU and ran while the victim waited is above its request, measured or not.
    requests["pod:n"] = 0.0
    new = engine.culprit_finder.judged(Culprit(Target("/k/n", "n", "batch", "n", "BE"), 0.9, who_ran_instead_share=0.9))
    assert new.above_request is True and "requests no CPU" in new.note


# -- the exporter's incident metrics ----------------------------------------------------------------


def test_exporter_labels_breached_signals_by_their_catalog_name():
    from prometheus_client import CollectorRegistry

    from noisyneighbor import exporter as ex
    from tests.test_exporter import _exporter, _scrape
    exp, registry = _exporter()
    assert isinstance(registry, CollectorRegistry)
    victim = Target("/kubepods.slice/kubepods-podA.slice", "a", "shop", "web", "LS")
    inc = Incident("i1", victim, Cause.SOFTIRQ, started_at=1.0, confidence=0.9, signal="softirq_ms_per_s",
                   evidence=[Evidence("softirq_ms_per_s", 150.0, 1.0, threshold=100.0),
                             Evidence("runq_wait_ms_per_s", 3.0, 1.0)])
    from probes.snapshot import NodeSnapshot
    exp.update(NodeSnapshot(monotonic_s=1.0, wall_s=100.0), [inc], [])
    got = {dict(k)["signal"]: v for (n, k), v in _scrape(registry).items() if n == ex.INCIDENT_SLO_RATIO}
    assert got == {"softirq_ms_per_s": 1.5}


def test_diagnose_text_names_the_cause_advice_and_request_judgement():
    from noisyneighbor.diagnose import ADVICE, DiagnoseReport, render_text

    assert set(ADVICE) == set(Cause)
    victim = Target("/kubepods.slice/v", "v", "shop", "web", "LS")
    within = Culprit(Target("/kubepods.slice/b", "b", "batch", "crunch", "BE"), 0.4, cpu_cores=0.5,
                     cpu_request_cores=2.0, above_request=False, note="busy within its request (0.50 of 2.00 cores)")
    incs = [
        Incident("i1", victim, Cause.SELF_CONTENTION, 1.0, 0.8, "runq_p99_ns",
                 evidence=[Evidence("who_ran_instead_own_share", 0.8, 10.0, threshold=0.5)]),
        Incident("i2", victim, Cause.NEIGHBOR_CPU, 1.0, 0.6, "runq_p99_ns", culprits=[within]),
    ]
    text = render_text(DiagnoseReport(0.0, 10.0, 10, {}, incs, [], []))
    assert "cause self_contention" in text and "Wait spent behind its own threads = 80%" in text
    assert "culprits: none (not a neighbour's doing)" in text
    assert "busy within its request (0.50 of 2.00 cores)" in text
    assert ADVICE[Cause.SELF_CONTENTION] in text
