"""`noisyneighbor diagnose`: run the probes and the detector for a window, then print a report.

The report says who suffered (victims), why (cause), because of whom (ranked culprits), on what
evidence (numbers and windows), and what would help (the decisions the detector made, which this
command only prints: it never changes the node). ``--json`` gives the same as one document and
``--html FILE`` a self-contained page with inline SVG plots of the key series.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from detector.decisions import Cause, Decision, LoggingSink, Target
from detector.model import Incident
from detector.runtime import Detector
from detector.workloads import key_of
from probes.collect import NodeCollector

ADVICE: dict[Cause, str] = {
    Cause.NEIGHBOR_CPU: "suppress or move the top culprit (BE CPU quota / cpuset), or give the victim dedicated CPUs",
    Cause.SELF_THROTTLING: "the victim hits its own CPU limit: raise the limit or enable CPU burst; no neighbour is at fault",
    Cause.SOFTIRQ: "softirq work lands on the victim's CPUs: steer IRQs/RPS away from them or move the traffic source",
    Cause.RECLAIM: "the victim stalls in memory reclaim: raise its memory limit, or evict the BE pod growing its memory",
    Cause.NETWORK_CONNECT: "connects stall (SYN drops/retransmits): check the server's accept backlog and ListenOverflows",
    Cause.PSI_UNKNOWN: "pressure without an attributable mechanism: check IO and node-level pressure",
}


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "ticks": self.ticks,
            "probes": self.probes,
            "incidents": [
                {**i.to_dict(), "advice": ADVICE[i.cause]} for i in self.incidents
            ],
            "suggested_actions": [d.to_dict() for d in self.decisions],
            "top_workloads": self.top_workloads,
        }


def run_diagnose(
    detector: Detector,
    collector: NodeCollector,
    duration_s: float,
    interval_s: float = 1.0,
    sleep=time.sleep,
) -> DiagnoseReport:
    """Collect and detect for ``duration_s``; the collector must be started."""
    started = time.time()
    t0 = time.monotonic()
    ticks = 0
    detector.step(collector.collect())
    next_at = t0 + interval_s
    while time.monotonic() - t0 < duration_s:
        sleep(max(0.0, next_at - time.monotonic()))
        next_at += interval_s
        if detector.step(collector.collect()) is not None:
            ticks += 1
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
    )


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


def _series(detector: Detector, incidents: list[Incident], duration_s: float) -> dict:
    store = detector.engine.store
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    window = max(duration_s + 5, 10.0)
    for inc in incidents:
        plots: dict[str, list[tuple[float, float]]] = {}
        victim = key_of(inc.victim)
        for sig in ("runq_p99_ns", "runq_wait_ms_per_s", "throttled_ratio", "softirq_ms_per_s", "reclaim_stall_ms_per_s"):
            s = store.window(victim, sig, window)
            if len(s) and float(abs(s.values).sum()) > 0:
                plots[f"victim {sig}"] = s.items()
        for c in inc.culprits[:3]:
            s = store.window(key_of(c.target), "cpu_cores", window)
            if len(s):
                plots[f"culprit {c.target.display} cpu_cores"] = s.items()
        out[inc.incident_id] = plots
    return out


# -- rendering ---------------------------------------------------------------------------------


def _ts(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def render_text(report: DiagnoseReport) -> str:
    lines = [
        f"noisyneighbor diagnose: {report.duration_s:.0f} s, {report.ticks} intervals, "
        f"{len(report.incidents)} incident(s)",
        "probes: " + "; ".join(report.probes.values()),
        "",
    ]
    if not report.incidents:
        lines.append("No interference incidents: no latency-sensitive workload broke its SLO.")
    for inc in report.incidents:
        state = "open" if inc.open else f"ended {_ts(inc.ended_at)}"
        lines.append(
            f"INCIDENT {inc.incident_id}  victim {inc.victim.display} ({inc.victim.qos or '?'})  "
            f"cause {inc.cause}  confidence {inc.confidence:.2f}  started {_ts(inc.started_at)}  {state}"
        )
        if inc.culprits:
            lines.append("  culprits (ranked):")
            for rank, c in enumerate(inc.culprits, 1):
                lines.append(
                    f"    {rank}. {c.target.display} ({c.target.qos or '?'})  score {c.score:.2f}  "
                    f"ran during {c.who_ran_instead_share:.0%} of the victim's wait  "
                    f"cpu {c.cpu_cores:.2f} cores  correlation {c.correlation:+.2f}"
                )
        else:
            lines.append("  culprits: none (not a neighbour's doing)" if inc.cause == Cause.SELF_THROTTLING
                         else "  culprits: none attributed")
        lines.append("  evidence:")
        for e in inc.evidence:
            bound = f" (threshold {e.threshold:g})" if e.threshold is not None else ""
            base = f" (baseline {e.baseline:g})" if e.baseline is not None else ""
            note = f"  [{e.note}]" if e.note else ""
            lines.append(f"    {e.signal} = {e.value:.4g} over {e.window_s:.0f} s{bound}{base}{note}")
        lines.append(f"  advice: {ADVICE[inc.cause]}")
        lines.append("")
    if report.decisions:
        lines.append("Suggested actions (not applied by diagnose):")
        for d in report.decisions:
            lines.append(f"  - {d.kind} {d.target.display}: {d.reason}")
        lines.append("")
    if report.top_workloads:
        lines.append("Workloads by worst runqueue p99 (ms):")
        for r in report.top_workloads:
            lines.append(
                f"  {r['runq_p99_ms_max']:9.3f} max {r['runq_p99_ms_median']:9.3f} median  "
                f"{r['workload']} ({r['qos'] or '-'})  cpu {r['cpu_cores_mean']}"
            )
    return "\n".join(lines).rstrip() + "\n"


def _svg(points: list[tuple[float, float]], width: int = 640, height: int = 140) -> str:
    if not points:
        return ""
    t0 = points[0][0]
    xs = [t - t0 for t, _ in points]
    ys = [v for _, v in points]
    xmax = max(max(xs), 1e-9)
    ymin, ymax = min(0.0, min(ys)), max(ys) or 1.0
    span = (ymax - ymin) or 1.0

    def px(x: float, y: float) -> str:
        return f"{40 + x / xmax * (width - 50):.1f},{height - 20 - (y - ymin) / span * (height - 30):.1f}"

    path = " ".join(px(x, y) for x, y in zip(xs, ys, strict=True))
    return (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect x="40" y="10" width="{width - 50}" height="{height - 30}" fill="none" stroke="#ccc"/>'
        f'<polyline fill="none" stroke="#c0392b" stroke-width="1.5" points="{path}"/>'
        f'<text x="2" y="16" font-size="10">{ymax:.3g}</text><text x="2" y="{height - 20}" font-size="10">{ymin:.3g}</text>'
        f'<text x="40" y="{height - 4}" font-size="10">0 s</text>'
        f'<text x="{width - 40}" y="{height - 4}" font-size="10">{xmax:.0f} s</text></svg>'
    )


def render_html(report: DiagnoseReport) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>noisyneighbor diagnose</title>",
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em}"
        "h2{border-bottom:1px solid #ddd}</style></head><body>",
        "<h1>noisyneighbor diagnose</h1>",
        f"<pre>{esc(render_text(report))}</pre>",
    ]
    for inc in report.incidents:
        parts.append(f"<h2>{esc(inc.incident_id)}: {esc(inc.victim.display)} — {esc(str(inc.cause))}</h2>")
        for name, points in report.series.get(inc.incident_id, {}).items():
            parts.append(f"<h3>{esc(name)}</h3>{_svg(points)}")
    parts.append(f"<script type='application/json' id='report'>{esc(json.dumps(report.to_dict(), default=str))}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)
