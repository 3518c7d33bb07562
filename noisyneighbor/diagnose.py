# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor diagnose`: run the probes and the detector for a window, then print a report.

The report says who suffered (victims), why (cause), because of whom (ranked culprits), on what
evidence (numbers and windows), and what would help (the decisions the detector made, which this
command only prints: it never changes the node). ``--json`` gives the same as one document and
``--html FILE`` a self-contained page with inline SVG plots of the key series.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from detector.batch import BatchAllocatable
from detector.catalog import SIGNALS as CATALOG
from detector.causes import CAUSES, spec
from detector.counterfactual import cost_of, describe
from detector.decisions import Cause, Decision, LoggingSink, SuppressAmount, Target
from detector.model import Incident
from detector.runtime import Detector
from detector.workloads import key_of
from noisyneighbor.output import SCHEMA_VERSION, iso_utc
from probes.cgroupfiles import format_cpu_list
from probes.collect import NodeCollector
from probes.registry import PLUGINS

# What would help, per cause: from the cause declarations (detector/causes).
ADVICE: dict[Cause, str] = {s.cause: s.advice for s in CAUSES}


@dataclass(frozen=True)
class SignalUnit:
    """How a signal reads to a human: its name and the unit its raw value is shown in."""

    label: str  # what a human calls it
    unit: str
    scale: float  # raw value x scale = value in unit


# From the signal catalog (detector.catalog): one label and unit per signal, everywhere.
SIGNALS: dict[str, SignalUnit] = {s.name: SignalUnit(s.label, s.unit, s.scale) for s in CATALOG.values()}


def human_value(signal: str, value: float) -> str:
    """'59.9 ms' for runq_p99_ns=5.99e7; a signal without a known unit keeps its raw number."""
    unit = SIGNALS.get(signal)
    if unit is None:
        return f"{value:.4g}"
    return f"{value * unit.scale:.3g} {unit.unit}".replace(" %", "%")


@dataclass
class DiagnoseReport:
    started_at: float
    duration_s: float
    ticks: int
    probes: dict[str, str]
    incidents: list[Incident]
    decisions: list[Decision]
    top_workloads: list[dict[str, Any]]
    series: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    # Incidents the window ended in the middle of: the detector closes them on the way out, but the
    # contention was still going on, so the report must not read as if it had recovered.
    still_open: set[str] = field(default_factory=set)
    cpu_requests: dict[str, float] = field(default_factory=dict)  # pod display -> CPU request (cores)
    batch: BatchAllocatable | None = None  # what the node can still give BE pods (detector/batch.py)
    host: str = field(default_factory=lambda: os.uname().nodename)
    kernel: str = field(default_factory=lambda: os.uname().release)

    @property
    def ended_at(self) -> float:
        return self.started_at + self.duration_s

    def is_still_open(self, inc: Incident) -> bool:
        return inc.open or inc.incident_id in self.still_open

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "host": self.host,
            "kernel": self.kernel,
            "started_at": iso_utc(self.started_at),
            "ended_at": iso_utc(self.ended_at),
            "duration_s": round(self.duration_s, 3),
            "ticks": self.ticks,
            "probes": self.probes,
            "incidents": [self._incident_dict(i) for i in self.incidents],
            "suggested_actions": [
                {**d.to_dict(), "created_at": iso_utc(d.created_at)} for d in self.decisions
            ],
            "top_workloads": self.top_workloads,
            "cpu_requests": self.cpu_requests,
            "batch_allocatable": self.batch.to_dict() if self.batch is not None else None,
        }

    def _incident_dict(self, inc: Incident) -> dict[str, Any]:
        d = inc.to_dict()
        still_open = self.is_still_open(inc)
        d.update(
            started_at=iso_utc(inc.started_at),
            updated_at=iso_utc(inc.updated_at or None),
            ended_at=None if still_open else iso_utc(inc.ended_at),
            still_open=still_open,
            culprits=[c for c, obj in zip(d["culprits"], inc.culprits, strict=True) if not _is_root(obj.target)],
            evidence=[e for e, obj in zip(d["evidence"], inc.evidence, strict=True)
                      if not (still_open and obj.signal == "closed")],
            advice=ADVICE[inc.cause],
        )
        return d


def _is_root(target: Target) -> bool:
    """The root cgroup is everyone at once (host processes, kthreads): never a culprit a human can act on."""
    return target.cgroup in ("", "/") and not target.pod


def run_diagnose(
    detector: Detector,
    collector: NodeCollector,
    duration_s: float,
    interval_s: float = 1.0,
    sleep=time.sleep,
    progress: Callable[[float, float, int], None] | None = None,
    pods: Callable[[], Any] | None = None,
) -> DiagnoseReport:
    """Collect and detect for ``duration_s``; the collector must be started.

    ``progress(elapsed_s, duration_s, incidents_so_far)`` is called after every tick (the CLI draws
    it on a terminal only)."""
    started = time.time()
    t0 = time.monotonic()
    ticks = 0
    # Batch allocatable over the whole window (the agent's is over 10 s or more).
    detector.batch.min_window_s = min(detector.batch.min_window_s, max(duration_s - 2.5 * interval_s, interval_s))
    detector.step(collector.collect())
    next_at = t0 + interval_s
    while time.monotonic() - t0 < duration_s:
        sleep(max(0.0, next_at - time.monotonic()))
        next_at += interval_s
        if detector.step(collector.collect()) is not None:
            ticks += 1
        if progress is not None:
            progress(time.monotonic() - t0, duration_s, len(detector.engine.all_incidents()))
    still_open = {i.incident_id for i in detector.engine.open_incidents}
    detector.close()
    incidents = sorted(detector.engine.all_incidents(), key=lambda i: i.started_at)
    sink = detector.sink
    decisions = list(sink.decisions) if isinstance(sink, LoggingSink) else []
    return DiagnoseReport(
        started_at=started,
        duration_s=time.monotonic() - t0,
        ticks=ticks,
        probes={name: st.line() for name, st in collector.status.items()},
        incidents=incidents,
        decisions=decisions,
        top_workloads=_top_workloads(detector),
        series=_series(detector, incidents, duration_s),
        still_open=still_open,
        cpu_requests=_cpu_requests(incidents, pods),
        batch=detector.batch_allocatable,
    )


def report_from_history(
    detector: Detector, window_s: float, ticks: int, probes: dict[str, str], *,
    decisions: list[Decision] | None = None, pods: Callable[[], Any] | None = None, host: str | None = None,
) -> DiagnoseReport:
    """The report over the last ``window_s`` of a detector that keeps running (the agent's ``/diagnose``):
    its incidents open in that window, from its own store; nothing is collected or closed here."""
    now = time.time()
    since = now - window_s
    incidents = sorted((i for i in detector.engine.all_incidents() if i.ended_at is None or i.ended_at >= since),
                       key=lambda i: i.started_at)
    report = DiagnoseReport(
        started_at=since, duration_s=window_s, ticks=ticks, probes=probes, incidents=incidents,
        decisions=[d for d in decisions or () if d.created_at >= since],
        top_workloads=_top_workloads(detector), series=_series(detector, incidents, window_s),
        still_open={i.incident_id for i in detector.engine.open_incidents}, cpu_requests=_cpu_requests(incidents, pods),
    )
    if host:
        report.host = host
    return report


def _top_workloads(detector: Detector, limit: int = 10) -> list[dict[str, Any]]:
    store = detector.engine.store
    window = 60.0
    rows = []
    for key in store.entities():
        st = store.stats(key, "runq_p99_ns", window)
        if st.n == 0:
            continue
        target = detector.engine.targets.get(key) or Target(key)
        cpu = store.stats(key, "cpu_cores", window)
        rows.append({
            "workload": target.display,
            "cgroup": key,
            "qos": target.qos,
            "runq_p99_ms_max": round(st.max / 1e6, 3),
            "runq_p99_ms_median": round(st.median / 1e6, 3),
            "cpu_cores_mean": None if cpu.n == 0 or math.isnan(cpu.mean) else round(cpu.mean, 3),
        })
    rows.sort(key=lambda r: -r["runq_p99_ms_max"])
    return rows[:limit]


# What the report plots for a victim: its CPU throttling (the detector's own, from the cgroup files) and
# each probe plugin's victim signals (ProbePlugin.victim_plots), in registry order.
VICTIM_SIGNALS: tuple[str, ...] = ("throttled_ratio", *(name for p in PLUGINS for name in p.victim_plots))
assert set(VICTIM_SIGNALS) <= CATALOG.keys()


def _series(detector: Detector, incidents: list[Incident], duration_s: float) -> dict:
    """Per incident: ``victim:<signal>`` and ``culprit:<display>`` (CPU cores) as (wall time, raw value).

    The store is indexed by monotonic time; the report's axes use the wall clock the text prints, so
    every point is shifted by the (current) wall-minus-monotonic offset."""
    store = detector.engine.store
    to_wall = time.time() - time.monotonic()
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    window = max(duration_s + 5, 10.0)
    for inc in incidents:
        plots: dict[str, list[tuple[float, float]]] = {}
        victim = key_of(inc.victim)
        for sig in VICTIM_SIGNALS:
            s = store.window(victim, sig, window)
            if len(s) and float(abs(s.values).sum()) > 0:
                plots[f"victim:{sig}"] = [(t + to_wall, v) for t, v in s.items()]
        for c in [c for c in inc.culprits if not _is_root(c.target)][:3]:
            s = store.window(key_of(c.target), "cpu_cores", window)
            if len(s):
                plots[f"culprit:{c.target.display}"] = [(t + to_wall, v) for t, v in s.items()]
        out[inc.incident_id] = plots
    return out


def _cpu_requests(incidents: list[Incident], pods: Callable[[], Any] | None) -> dict[str, float]:
    """Pod display name -> CPU request in cores (0: none), for the victims and culprits the pod source knows."""
    if pods is None:
        return {}
    by_uid = {p.uid: p for p in pods()}
    out: dict[str, float] = {}
    for inc in incidents:
        for target in (inc.victim, *(c.target for c in inc.culprits)):
            pod = by_uid.get(target.pod_uid or "")
            if pod is not None:
                out[target.display] = float(pod.cpu_request_cores or 0.0)
    return out


# -- rendering ---------------------------------------------------------------------------------


def clock_time(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def fmt_num(value: float | None, fmt: str = "{:.2f}", missing: str = "-") -> str:
    """A number for humans: never Python's None or nan."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return fmt.format(value)


def note_text(text: str) -> str:
    """Detector notes are built with f-strings, so an unset value arrives as the word None: say what it means."""
    text = re.sub(r"\bquota None\b", "no CPU quota", text)
    return re.sub(r"\bNone\b", "n/a", text)


def state_line(report: DiagnoseReport, inc: Incident) -> str:
    if report.is_still_open(inc):
        return f"still open at the end of the window ({clock_time(report.ended_at)})"
    return f"closed {clock_time(inc.ended_at)}"


def request_text(report: DiagnoseReport, target: Target) -> str:
    """'1.50', 'none' (a pod without a CPU request) or '?' (not a pod the source knows)."""
    request = report.cpu_requests.get(target.display)
    return "?" if request is None else f"{request:.2f}" if request > 0 else "none"


def request_note(report: DiagnoseReport, target: Target) -> str:
    text = request_text(report, target)
    return "" if text == "?" else f" (request {text})"


def culprits_of(inc: Incident) -> list:
    return [c for c in inc.culprits if not _is_root(c.target)]


def evidence_of(report: DiagnoseReport, inc: Incident) -> list:
    """The numbers behind the incident; the "closed" marker only when it really closed."""
    return [e for e in inc.evidence if not (e.signal == "closed" and report.is_still_open(inc))]


def describe_amount(d: Decision) -> str:
    """What the action would set, in the units an operator types."""
    a = d.amount
    if isinstance(a, SuppressAmount):
        if a.policy == "cpuset" and a.cpus:
            return f"to CPUs {format_cpu_list(a.cpus)} (cpuset)"
        if a.cpu_cores is not None:
            return f"to {a.cpu_cores:.2f} CPU cores (CFS quota)"
        return f"({a.policy})"
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in vars_of(a).items() if v not in (None, 0, 0.0, "")]
    return f"({', '.join(parts)})" if parts else ""


def vars_of(amount: Any) -> dict[str, Any]:
    return {name: getattr(amount, name) for name in amount.__dataclass_fields__}


def _culprit_lines(report: DiagnoseReport, inc: Incident) -> list[str]:
    """The incident's ranked culprits, each with its cost to the victim, and those moved together's."""
    culprits = culprits_of(inc)
    if not culprits:
        return ["  culprits: none (not a neighbour's doing)" if spec(inc.cause).blameless else "  culprits: none attributed"]
    lines = ["  culprits (ranked):"]
    for rank, c in enumerate(culprits, 1):
        lines.append(
            f"    {rank}. {c.target.display} ({c.target.qos or '?'})  score {c.score:.2f}  "
            f"ran during {c.who_ran_instead_share:.0%} of the victim's wait  "
            f"cpu {fmt_num(c.cpu_cores)} cores{request_note(report, c.target)}  correlation {c.correlation:+.2f}"
            + (f"  {c.note}" if c.note else "")
        )
        if c.runq_p99_without_ns is not None:
            lines.append(f"       {describe(c.target.display, inc.victim.display, cost_of(c), c.without_kernel_work)}")
    if inc.moved_together_cost is not None:
        said = describe(inc.moved_together_names, inc.victim.display, inc.moved_together_cost, together=len(inc.moved_together))
        lines.append(f"  moved together: {said}")
    return lines


def render_text(report: DiagnoseReport) -> str:
    lines = [
        f"noisyneighbor diagnose on {report.host} (kernel {report.kernel}): "
        f"{clock_time(report.started_at)} to {clock_time(report.ended_at)}, {report.duration_s:.0f} s, "
        f"{report.ticks} intervals, {len(report.incidents)} incident(s)",
        "probes: " + "; ".join(report.probes.values()),
        "",
    ]
    if not report.incidents:
        lines.append("No interference incidents: no latency-sensitive workload broke its SLO.")
    for inc in report.incidents:
        lines.append(
            f"INCIDENT {inc.incident_id}  victim {inc.victim.display} ({inc.victim.qos or '?'})  "
            f"cause {inc.cause}  confidence {inc.confidence:.2f}  started {clock_time(inc.started_at)}  "
            f"{state_line(report, inc)}"
        )
        if inc.follows:  # the same breach, told anew: its cause changed (detector/incidents.py)
            lines.append(f"  follows {inc.follows}: the victim kept breaching, the cause changed to {inc.cause}")
        lines.extend(_culprit_lines(report, inc))
        lines.append("  evidence:")
        for e in evidence_of(report, inc):
            if e.signal == "closed":
                lines.append(f"    closed: {note_text(e.note)}")
                continue
            bound = f" (threshold {human_value(e.signal, e.threshold)})" if e.threshold is not None else ""
            base = f" (baseline {human_value(e.signal, e.baseline)})" if e.baseline is not None else ""
            note = f"  [{note_text(e.note)}]" if e.note else ""
            label = SIGNALS[e.signal].label if e.signal in SIGNALS else e.signal
            value = fmt_num(e.value, "{}") if math.isnan(e.value) else human_value(e.signal, e.value)
            lines.append(f"    {label} = {value} over {e.window_s:.0f} s{bound}{base}{note}")
        lines.append(f"  advice: {ADVICE[inc.cause]}")
        lines.append("")
    if report.decisions:
        lines.append("Suggested actions (not applied by diagnose):")
        for d in report.decisions:
            lines.append(f"  - {d.kind} {d.target.display} {describe_amount(d)}: {d.reason}".replace("  :", ":"))
        lines.append("")
    lines.extend(batch_lines(report.batch))
    if report.top_workloads:
        lines.append("Workloads by worst runqueue p99 (ms):")
        for r in report.top_workloads:
            lines.append(
                f"  {r['runq_p99_ms_max']:9.3f} max {r['runq_p99_ms_median']:9.3f} median  "
                f"{r['workload']} ({r['qos'] or '-'})  cpu {fmt_num(r['cpu_cores_mean'], '{:.3f}')}"
            )
    return "\n".join(lines).rstrip() + "\n"


def batch_lines(batch: BatchAllocatable | None) -> list[str]:
    """Batch allocatable per policy, with the terms it came from."""
    if batch is None:
        return []
    values = batch.values()
    gib = 1024 ** 3
    lines = [f"Batch allocatable (koordinator's formulas over {batch.window_s:.0f} s; policy: cpu cores / memory GiB):"]
    for policy in values["cpu"]:
        lines.append(f"  {policy:>16}: {values['cpu'][policy]:.2f} cores  {values['memory'][policy] / gib:.2f} GiB")
    c, m = batch.cpu, batch.memory
    lines.append(f"  cpu: total {c.total:.2f}, safety margin {c.node_reserved:.2f}, system used {c.system_used:.2f}, "
                 f"system reserved {c.system_reserved:.2f}, Prod/Mid used {c.prod_used:.2f} / requested {c.prod_request:.2f}")
    lines.append(f"  memory GiB: total {m.total / gib:.2f}, safety margin {m.node_reserved / gib:.2f}, system used "
                 f"{m.system_used / gib:.2f}, system reserved {m.system_reserved / gib:.2f}, Prod/Mid used "
                 f"{m.prod_used / gib:.2f} / requested {m.prod_request / gib:.2f}")
    lines.append(f"  reservations from: {', '.join(batch.sources) or 'none found (kubelet config, node annotation, policy)'}")
    lines.append("")
    return lines


def embed_json(data: Any) -> str:
    """JSON for a <script type="application/json"> block: not HTML-escaped (the block is raw text, so
    &quot; would stay in the JSON), but no '<', '>' or '&' either, so a string holding "</script>"
    cannot end the block. The \\u escapes decode to the same characters in any JSON parser."""
    text = json.dumps(data, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
