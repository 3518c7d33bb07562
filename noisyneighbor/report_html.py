# SPDX-License-Identifier: Apache-2.0
"""The diagnose report as one self-contained HTML page, written to read like an incident summary.

A header (host, kernel, window, probes), then one card per incident: victim, cause, state, ranked
culprits with their share of the victim's wait and CPU against request, the evidence that broke the
SLO with its threshold, and the advice with the amounts the detector would set. Under each card the
plots: the victim's run-queue p99 against the top culprit's CPU on one chart, with the SLO line and the
incident window shaded, then the victim's other signals. Times are the wall clock the text uses. The
report's JSON is embedded as ``<script type="application/json" id="report">`` for tools.
"""

from __future__ import annotations

import time
from html import escape

from detector.causes import CAUSES as CAUSE_SPECS
from detector.causes import spec
from detector.decisions import Cause
from detector.model import Incident
from noisyneighbor.diagnose import (
    ADVICE,
    SIGNALS,
    DiagnoseReport,
    SignalUnit,
    clock_time,
    culprits_of,
    describe_amount,
    embed_json,
    evidence_of,
    fmt_num,
    note_text,
    request_text,
    state_line,
)
from noisyneighbor.svgchart import PALETTE, Chart, Line, render

# "<victim> suffers from <title>", per cause: from the cause declarations (detector/causes).
CAUSES: dict[Cause, str] = {s.cause: s.title for s in CAUSE_SPECS}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f4f5f7;color:#1c1e21}
main{max-width:840px;margin:0 auto;padding:24px}
header{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:16px 20px;margin-bottom:20px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:17px;margin:0 0 6px}h3{font-size:14px;margin:14px 0 6px;color:#444}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
dl.meta dt{color:#666}dl.meta dd{margin:0;overflow-wrap:anywhere}
.card{background:#fff;border:1px solid #dde1e6;border-left:5px solid #c0392b;border-radius:8px;padding:16px 20px;
margin-bottom:20px}
.card.closed{border-left-color:#7f8c8d}
.state{display:inline-block;font-size:12px;padding:1px 8px;border-radius:10px;background:#fdecea;color:#922b21}
.closed .state{background:#eceff1;color:#455a64}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #eee;vertical-align:top;overflow-wrap:anywhere}th{color:#555;font-weight:600;
overflow-wrap:normal}th.num{white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.advice{background:#eef6ee;border-radius:6px;padding:8px 12px;margin-top:10px;overflow-wrap:anywhere}
.advice ul{margin:4px 0 0;padding-left:20px}
figure{margin:12px 0}figcaption{font-weight:600;font-size:13px;margin-bottom:2px;overflow-wrap:anywhere}
h2,p{overflow-wrap:anywhere}
svg.chart{max-width:100%;height:auto;font-family:inherit}
.legend{font-size:12px;color:#444}.key{display:inline-block;max-width:100%;margin-right:14px;overflow-wrap:anywhere}
.key svg{vertical-align:middle;margin-right:4px}
.swatch{display:inline-block;width:14px;height:10px;background:#f5b7b1;opacity:.7;margin-right:4px;vertical-align:middle}
.muted{color:#666}
"""


def render_html(report: DiagnoseReport) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>noisyneighbor diagnose: {escape(report.host)} {escape(clock_time(report.started_at))}</title>",
        f"<style>{CSS}</style></head><body><main>",
        _header(report),
    ]
    if not report.incidents:
        parts.append("<section class='card closed'><h2>No interference incidents</h2>"
                     "<p>No latency-sensitive workload broke its SLO in this window.</p></section>")
    for inc in report.incidents:
        parts.append(_card(report, inc))
    parts.append(_workloads(report))
    parts.append(f"<script type='application/json' id='report'>{embed_json(report.to_dict())}</script>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _header(report: DiagnoseReport) -> str:
    probes = "".join(f"<div>{escape(line)}</div>" for line in report.probes.values())
    day = time.strftime("%Y-%m-%d", time.localtime(report.started_at))
    return (
        "<header><h1>noisyneighbor diagnose</h1><dl class='meta'>"
        f"<dt>host</dt><dd>{escape(report.host)}</dd>"
        f"<dt>kernel</dt><dd>{escape(report.kernel)}</dd>"
        f"<dt>window</dt><dd>{day} {clock_time(report.started_at)} to {clock_time(report.ended_at)} "
        f"({report.duration_s:.0f} s, {report.ticks} intervals)</dd>"
        f"<dt>probes</dt><dd>{probes}</dd>"
        f"<dt>incidents</dt><dd>{len(report.incidents)}</dd>"
        "</dl></header>"
    )


def _lineage(inc: Incident) -> list[str]:
    """The incidents before and after this one on the same breach (its cause changed)."""
    out = []
    if inc.follows:
        out.append(f"<p>Follows <a href='#{escape(inc.follows)}'>{escape(inc.follows)}</a>: the victim kept "
                   f"breaching and the cause changed.</p>")
    if inc.superseded_by:
        out.append(f"<p>Continued in <a href='#{escape(inc.superseded_by)}'>{escape(inc.superseded_by)}</a>: "
                   f"its cause changed.</p>")
    return out


def _card(report: DiagnoseReport, inc: Incident) -> str:
    still_open = report.is_still_open(inc)
    victim = inc.victim
    request = report.cpu_requests.get(victim.display)  # None: not a pod the source knows; 0: no request
    out = [
        f"<section class='card{'' if still_open else ' closed'}' id='{escape(inc.incident_id)}'>",
        f"<h2>{escape(victim.display)} <span class='muted'>({escape(victim.qos or 'unknown class')})</span> "
        f"suffers from {escape(CAUSES.get(inc.cause, str(inc.cause)))}</h2>",
        f"<p><span class='state'>{escape(state_line(report, inc))}</span> started {clock_time(inc.started_at)}, "
        f"confidence {inc.confidence:.2f}, incident {escape(inc.incident_id)}"
        + (f", CPU request {request:.2f} cores" if request else "") + "</p>",
    ]
    out.extend(_lineage(inc))
    culprits = culprits_of(inc)
    if culprits:
        out.append("<h3>Culprits</h3><table><tr><th>#</th><th>workload</th><th>class</th>"
                   "<th class='num'>wait share</th><th class='num'>CPU cores</th>"
                   "<th class='num'>request</th><th class='num'>score</th>"
                   "<th class='num'>victim's runq p99 without it</th></tr>")
        for rank, c in enumerate(culprits, 1):
            out.append(
                f"<tr><td>{rank}</td><td>{escape(c.target.display)}</td><td>{escape(c.target.qos or '-')}</td>"
                f"<td class='num'>{c.who_ran_instead_share:.0%}</td><td class='num'>{fmt_num(c.cpu_cores)}</td>"
                f"<td class='num'>{request_text(report, c.target)}</td><td class='num'>{c.score:.2f}</td>"
                f"<td class='num'>{_without(c)}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>No culprit: " + (spec(inc.cause).blameless or "none could be attributed.") + "</p>")
    out.append("<h3>Evidence</h3><table><tr><th>signal</th><th class='num'>value</th><th class='num'>threshold</th>"
               "<th class='num'>over</th><th>note</th></tr>")
    for e in evidence_of(report, inc):
        if e.signal == "closed":
            out.append(f"<tr><td>closed</td><td></td><td></td><td></td><td>{escape(note_text(e.note))}</td></tr>")
            continue
        unit = SIGNALS.get(e.signal, SignalUnit(e.signal, "", 1.0))
        breached = e.threshold is not None and e.value > e.threshold
        value = f"{e.value * unit.scale:.3g} {unit.unit}"
        threshold = f"{e.threshold * unit.scale:.3g} {unit.unit}" if e.threshold is not None else ""
        out.append(
            f"<tr><td>{escape(unit.label)}</td><td class='num'>{'<b>' if breached else ''}{escape(value)}"
            f"{'</b>' if breached else ''}</td><td class='num'>{escape(threshold)}</td>"
            f"<td class='num'>{e.window_s:.0f} s</td><td>{escape(note_text(e.note))}</td></tr>"
        )
    out.append("</table>")
    actions = [d for d in report.decisions if d.incident_id == inc.incident_id]
    out.append(f"<div class='advice'><b>Advice.</b> {escape(ADVICE[inc.cause])}")
    if actions:
        out.append("<ul>" + "".join(
            f"<li>{escape(str(d.kind))} {escape(d.target.display)} {escape(describe_amount(d))}: "
            f"{escape(d.reason)} <span class='muted'>(suggested, not applied)</span></li>" for d in actions
        ) + "</ul>")
    out.append("</div>")
    out.extend(_plots(report, inc))
    out.append("</section>")
    return "".join(out)


def _without(c) -> str:
    if c.runq_p99_without_ns is None or c.victim_runq_p99_ns is None:
        return "-"
    also = f" (and its {c.without_kernel_work} work)" if c.without_kernel_work else ""
    return escape(f"{c.victim_runq_p99_ns / 1e6:.1f} \u2192 {c.runq_p99_without_ns / 1e6:.1f} ms{also}")


def _plots(report: DiagnoseReport, inc: Incident) -> list[str]:
    series = report.series.get(inc.incident_id, {})
    t_range = (report.started_at, report.ended_at)
    window = [(inc.started_at, report.ended_at if report.is_still_open(inc) else (inc.ended_at or report.ended_at),
               "incident")]
    thresholds = {e.signal: e.threshold for e in inc.evidence if e.threshold is not None}
    culprit_keys = [k for k in series if k.startswith("culprit:")]
    charts: list[Chart] = []
    victim_signals = [k.removeprefix("victim:") for k in series if k.startswith("victim:")]
    # The headline chart: the breached signal (run-queue p99 when present) against the top culprit's CPU.
    lead = inc.signal if inc.signal in victim_signals else ("runq_p99_ns" if "runq_p99_ns" in victim_signals else None)
    for sig in ([lead] if lead else []) + [s for s in victim_signals if s != lead]:
        unit = SIGNALS.get(sig, SignalUnit(sig, "", 1.0))
        victim_line = Line(f"{inc.victim.display} {unit.label.lower()}",
                           [(t, v * unit.scale) for t, v in series[f"victim:{sig}"]], PALETTE[0])
        threshold = thresholds.get(sig)
        chart = Chart(unit.label, unit.unit, [victim_line], shaded=window, t_range=t_range,
                      threshold=None if threshold is None else threshold * unit.scale)
        if sig == lead and culprit_keys:
            top = culprit_keys[0]
            chart.title = f"{unit.label} of {inc.victim.display} vs CPU of {top.removeprefix('culprit:')}"
            chart.right = Line(f"{top.removeprefix('culprit:')} CPU", series[top], PALETTE[1], dashed=True)
            chart.right_unit = "cores"
        costed = next((c for c in culprits_of(inc) if c.runq_p99_without_ns is not None), None)
        if sig == "runq_p99_ns" and costed is not None:
            # The counterfactual on the plot: where the p99 would be without the top culprit that has one
            # (a reclaim incident's kernel work is costed on its top BE grower, not on a grower above it).
            c = costed
            end = window[0][1]
            v = c.runq_p99_without_ns * unit.scale  # type: ignore[operator]
            also = f" and its {c.without_kernel_work} work" if c.without_kernel_work else ""
            chart.lines.append(Line(f"p99 without {c.target.display}{also}", [(inc.started_at, v), (end, v)], PALETTE[2],
                                    dashed=True))
        if sig == "runq_p99_ns" and inc.moved_together_cost is not None:
            v = inc.moved_together_cost.p99_without_ns * unit.scale
            chart.lines.append(Line(f"p99 without {inc.moved_together_names}", [(inc.started_at, v), (window[0][1], v)],
                                    PALETTE[3], dashed=True))
        charts.append(chart)
    if len(culprit_keys) > 1:
        charts.append(Chart("CPU of the culprits", "cores", [
            Line(k.removeprefix("culprit:"), series[k], PALETTE[(i + 1) % len(PALETTE)])
            for i, k in enumerate(culprit_keys)
        ], shaded=window, t_range=t_range))
    return [render(c) for c in charts]


def _workloads(report: DiagnoseReport) -> str:
    if not report.top_workloads:
        return ""
    rows = "".join(
        f"<tr><td>{escape(r['workload'])}</td><td>{escape(r['qos'] or '-')}</td>"
        f"<td class='num'>{r['runq_p99_ms_max']:.3f}</td><td class='num'>{r['runq_p99_ms_median']:.3f}</td>"
        f"<td class='num'>{fmt_num(r['cpu_cores_mean'], '{:.3f}')}</td></tr>"
        for r in report.top_workloads
    )
    return ("<section class='card closed'><h2>Workloads by worst run-queue wait p99</h2><table><tr><th>workload</th>"
            "<th>class</th><th class='num'>max (ms)</th><th class='num'>median (ms)</th><th class='num'>CPU (cores)</th>"
            f"</tr>{rows}</table></section>")
