# SPDX-License-Identifier: Apache-2.0
"""hardirq: an interrupt storm on the victim's CPUs. Device interrupt handlers (a NIC's, a disk's) run
on whichever CPU the interrupt lands on, taking that time from the task there (probes/hardirq.py: per
CPU and IRQ line). The rule names the line and its device that took the most handler time on the
victim's CPUs; the plan is advice only: move the line's IRQ affinity off those CPUs. The agent never
changes node IRQ settings, and no pod is blamed (a pod's IO may raise the interrupts, but the probe
sees CPUs and lines, not who asked)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from detector.causes.base import VICTIM_SIGNAL, CauseContext, CauseSpec, Verdict
from detector.causes.plan import Note, NoteKey, PlanContext, PlanStep
from detector.model import Evidence

NAME = "hardirq"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)

SIGNAL = "hardirq_ms_per_s"  # the victim's handler time on its CPUs (probes/hardirq.py: exposure)
LINES = "hardirq_lines_by_cpu"  # NodeSignals: cpu -> that CPU's lines, most time first (probes/hardirq.py)
IRQ_LINE = "hardirq_irq_line"  # evidence: the line's number (value) and its device (note)
LINE_TIME = "hardirq_line_ms_per_s"  # evidence: that line's handler ms/s on the victim's CPUs

STORM = "hardirq.storm"  # finding: the incident's top line is said in its evidence
AFFINITY = "hardirq.affinity"  # the plan's advice (a note; no action exists for IRQ affinity)
NO_LINE = "hardirq.no_line"  # handler time without a line to name (its probe's lines not read)


def top_line(ctx: CauseContext) -> tuple[int, str, float, list[int]] | None:
    """(irq, device, ms/s on the victim's CPUs weighted like the signal, those CPUs it ran on) of the
    line with the most handler time where the victim ran; None when no line ran there."""
    by_cpu = getattr(ctx.signals, LINES, None) or {}
    weights = ctx.row.cpu_weights
    per_line: dict[int, list[Any]] = {}
    for cpu, w in weights.items():
        for load in by_cpu.get(cpu, ()):
            entry = per_line.setdefault(load.irq, [load.name, 0.0, []])
            entry[1] += w * load.ms_per_s
            entry[2].append(cpu)
    if not per_line:
        return None
    irq, (name, ms, cpus) = max(per_line.items(), key=lambda kv: kv[1][1])
    return irq, name, ms, sorted(cpus)


def rule(ctx: CauseContext) -> Verdict | None:
    """Handler time on its CPUs breached its SLO, or the run queue breached with handler time past it."""
    limit = ctx.slo.hardirq_ms_per_s
    row = ctx.row
    value = getattr(row, SIGNAL, 0.0) or 0.0
    if not (SIGNAL in ctx.breached or (ctx.runq_breach and value >= limit)):
        return None
    used = [Evidence(SIGNAL, round(value, 3), row.interval_s, threshold=limit, note=f"on CPUs {sorted(row.cpu_weights)}")]
    line = top_line(ctx)
    if line is not None:
        irq, name, ms, cpus = line
        used.append(Evidence(IRQ_LINE, float(irq), row.interval_s, note=name or "-"))
        used.append(Evidence(LINE_TIME, round(ms, 3), row.interval_s, note=f"IRQ {irq} on CPUs {cpus}"))
    confidence = min(1.0, value / (2 * limit)) if limit > 0 else 1.0  # an SLO of 0: any handler time breaches
    return Verdict(NAME, confidence, [], used, findings=(STORM,) if line else (), share=share(ctx))


def share(ctx: CauseContext) -> float:
    """Its part of the wait: the handler time on its CPUs over its run-queue wait, at most all of it.
    The run-queue probe does not time hard IRQs inside a wait (softirq work it does): a handler that ran
    while the victim waited and one that ran on top of the victim count alike, so this errs high.
    Breached on handler time alone (the run queue within its SLO), it is all that breached."""
    if not ctx.runq_breach:
        return 1.0
    wait = ctx.row.runq_wait_ms_per_s
    value = getattr(ctx.row, SIGNAL, 0.0) or 0.0
    return min(1.0, value / wait) if wait > 0 else 0.0


def plan(ctx: PlanContext) -> Iterator[PlanStep]:
    """Advice, once per line: the line's IRQ affinity away from the victim's CPUs (the rule's evidence
    names it by number; its device in the evidence's note)."""
    inc = ctx.incident
    line = next((e for e in inc.evidence if e.signal == IRQ_LINE), None)
    cpus = sorted(inc.victim_cpus)
    if line is None:
        yield Note(NoteKey(NO_LINE), SPEC.say(NO_LINE, victim=inc.victim.display))
        return
    irq = int(line.value)
    yield Note(NoteKey(AFFINITY, (str(irq),)), SPEC.say(
        AFFINITY, irq=irq, device=line.note or "-", victim=inc.victim.display,
        cpus=",".join(map(str, cpus)) or "?"))


SPEC = CauseSpec(
    NAME, rule,
    title="an interrupt storm on its CPUs",
    advice="device interrupts land on the victim's CPUs: set the IRQ line's affinity (/proc/irq/<n>/smp_affinity_list) "
           "to CPUs away from latency-sensitive pods, or move the device's queues",
    plan=plan,
    verify_signals=(VICTIM_SIGNAL, SIGNAL),
    messages={
        AFFINITY: "IRQ {irq} ({device}) handlers take {victim}'s CPUs {cpus}: advice: set /proc/irq/{irq}/"
                  "smp_affinity_list to CPUs away from them (the agent never changes node IRQ settings)",
        NO_LINE: "hard IRQ handler time on {victim}'s CPUs, no line named: advice: look at /proc/interrupts "
                 "for the lines on its CPUs",
    },
)
