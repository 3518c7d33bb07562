# SPDX-License-Identifier: Apache-2.0
"""softirq: softirq/IRQ work on the CPUs the victim runs on. The engine suppresses the top BE culprit
(as for neighbor_cpu); the planner weighs the pods' own traffic (a BE pod carrying most of the packets
gets a cfs quota: it sends less) and real-time tasks on the victim's CPUs (a BE pod's are moved off
them). Anything else is advice: the agent never changes node IRQ settings."""

from __future__ import annotations

from collections.abc import Iterator

from detector.causes.base import VICTIM_SIGNAL, CauseContext, CauseSpec, Verdict
from detector.causes.neighbor_cpu import SUPPRESS as NEIGHBOR_SUPPRESS
from detector.causes.neighbor_cpu import suppress_top_be
from detector.causes.plan import Note, NoteKey, PlanContext, PlanStep, RtTasks, Submit, rank_first
from detector.decisions import ActionKind, Decision, PodTraffic, SuppressAmount, Target
from detector.model import Evidence

NAME = "softirq"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)


def rule(ctx: CauseContext) -> Verdict | None:
    limit = ctx.slo.softirq_ms_per_s
    row = ctx.row
    if not (ctx.breached & {"softirq_ms_per_s", "softirq_delay_p99_ns"}
            or (ctx.runq_breach and row.softirq_ms_per_s >= limit)):
        return None
    confidence = min(1.0, row.softirq_ms_per_s / (2 * limit))
    used = [Evidence("softirq_ms_per_s", row.softirq_ms_per_s, row.interval_s, threshold=limit,
                     note=f"on CPUs {sorted(row.cpu_weights)}")]
    if ctx.runq_breach and row.who_ran_instead_available:
        used.append(Evidence("who_ran_instead_kernel_work_share", round(ctx.kernel_work_share, 4), ctx.window_s,
                             note="softirq work (on top of tasks, and ksoftirqd) and kernel threads in its waits"))
    return Verdict(NAME, confidence, ctx.cpu_culprits(ctx.key, ctx.foreign, ctx.total_wait_ns), used,
                   share=share(ctx))


def busy(ctx: CauseContext) -> bool:
    """The node does softirq work on the victim's CPUs beyond the usual: softirq time there past its SLO
    (CauseSpec.kernel_work_busy)."""
    return ctx.row.softirq_ms_per_s >= ctx.slo.softirq_ms_per_s


def share(ctx: CauseContext) -> float:
    """Its part of the wait: the softirq work in the victim's waits, run on top of whichever task held
    the CPU or in ksoftirqd (the probe counts it with the other kernel threads' slices: while kswapd
    also runs, reclaim's rule claims the same part, and the declaration order puts reclaim first; the
    node's share counts when larger, see CauseContext.kernel_work_share).
    Breached on softirq time or delay alone (the run queue within its SLO), it is all that breached."""
    if not ctx.runq_breach:
        return 1.0
    return ctx.kernel_work_share if ctx.row.who_ran_instead_available else 0.0


SOFTIRQ_TRAFFIC_MIN_PPS = 2000.0  # below this a pod's packets are not what keeps a CPU in NET_RX
SOFTIRQ_TRAFFIC_SHARE = 0.5  # the pod's netns must carry at least this share of the pods' packets

NO_POD_TRAFFIC = "softirq.no_pod_traffic"
NO_DOMINANT_TRAFFIC = "softirq.no_dominant_traffic"
SOURCE_NOT_BE = "softirq.source_not_be"
OWN_TRAFFIC = "softirq.own_traffic"  # a BE pod's own traffic: quota-suppressed (a decision)
RT_TASKS = "softirq.rt_tasks"
RT_TASK = "softirq.rt_task"  # one entry of the RT_TASKS ranking
RT_NOT_BE = "softirq.rt_not_be"
RT_MOVE = "softirq.rt_move"  # a BE pod's RT tasks moved off the victim's CPUs (a decision)
# This incident's moves of a pod off the victim's CPUs that the same pod's traffic cap goes with
# (Decision.joins): the RT move, and the engine's first step (a cpuset where the node has CPUs to spare),
# which a softirq incident takes too, as did a neighbor_cpu one re-caused softirq in its first ticks.
MOVES_OFF_VICTIM_CPUS = (RT_MOVE, NEIGHBOR_SUPPRESS)


def softirq_traffic_decision(
    victim: Target, incident_id: str | None, traffic: list[PodTraffic], *, min_cores: float = 0.02,
    victim_signal: str = VICTIM_SIGNAL,
) -> tuple[Decision | None, str]:
    """Softirq on the victim's CPUs: when one pod's own traffic carries most of the packets, suppress it.

    Returns (decision or None, one line saying why). Only a BE pod is ever named in a decision; a non-BE
    source, a host-network pod (its counters are the node's) or traffic nobody dominates gives advice
    only: the node's IRQ/RPS placement (move it off the victim's CPUs), never a change to it.
    A cfs quota, not a cpuset: the packets are processed on the CPU the steering picks, wherever the
    sender runs, so only sending less (less CPU for the sender) takes NET_RX off the victim's CPU. The
    quota is the share of its CPU that sends no more than SOFTIRQ_TRAFFIC_MIN_PPS (what is harmless by
    the same rule that names it), at least ``min_cores``: a fifth of its CPU, as before, still sent a
    fifth of the flood, and the victim stayed at 1.7x its quiet p99 (make bench, softirq-netrx).
    """
    decision, note = _traffic_verdict(victim, incident_id, traffic, min_cores=min_cores, victim_signal=victim_signal)
    return decision, note.text


def _traffic_verdict(
    victim: Target, incident_id: str | None, traffic: list[PodTraffic], *, min_cores: float = 0.02,
    victim_signal: str = VICTIM_SIGNAL,
) -> tuple[Decision | None, Note]:
    """:func:`softirq_traffic_decision`, its note keyed by its outcome code."""
    own = _pods_traffic(victim, traffic)
    total = sum(t.packets_per_s for t in own)
    if not own or total <= 0:
        return None, _note(NO_POD_TRAFFIC)
    top = max(own, key=lambda t: t.packets_per_s)
    share = top.packets_per_s / total
    said = {"pod": top.target.display, "pps": top.packets_per_s, "share": share}
    if top.packets_per_s < SOFTIRQ_TRAFFIC_MIN_PPS or share < SOFTIRQ_TRAFFIC_SHARE:
        return None, _note(NO_DOMINANT_TRAFFIC, **said)
    if (top.target.qos or "").upper() != "BE":
        return None, _note(SOURCE_NOT_BE, qos=top.target.qos or "of unknown QoS", **said)
    cap = round(max(min_cores, top.cpu_cores * SOFTIRQ_TRAFFIC_MIN_PPS / top.packets_per_s), 2)
    note = _note(OWN_TRAFFIC, victim=victim.display, cpu=top.cpu_cores, cap=cap, **said)
    return Decision(ActionKind.SUPPRESS, top.target, SuppressAmount("cfs_quota", cpu_cores=cap), note.text,
                    incident_id=incident_id, victim=victim, victim_signal=victim_signal, code=OWN_TRAFFIC,
                    joins=MOVES_OFF_VICTIM_CPUS), note


def _note(code: str, *subject: str, **fields: object) -> Note:
    return Note(NoteKey(code, subject), SPEC.say(code, **fields))


def _pods_traffic(victim: Target, traffic: list[PodTraffic]) -> list[PodTraffic]:
    """The pods' own traffic: a host-network pod's counters are the node's, and the victim's is its own."""
    return [t for t in traffic if not t.host_network and t.target.cgroup != victim.cgroup]


def traffic_share(victim: Target, traffic: list[PodTraffic], target: Target) -> float:
    """``target``'s share of the packets the pods' own traffic carried (0: none)."""
    own = _pods_traffic(victim, traffic)
    total = sum(t.packets_per_s for t in own)
    return sum(t.packets_per_s for t in own if t.target.cgroup == target.cgroup) / total if total > 0 else 0.0


RT_STEP = "rt"  # one RT move per incident, whatever came of it
TRAFFIC_STEP = "traffic"  # one traffic cap per incident (again when refused)


def plan(ctx: PlanContext) -> Iterator[PlanStep]:
    """RT tasks on the victim's CPUs (a BE pod's are moved off them, once per incident; the ranking puts
    the top BE one first in the culprits every tick) and the pods' own traffic, sampled from the same tick
    (a BE pod carrying most of it gets a cfs quota, once per incident, as soon as its rate is known). The
    two are different harms: the move takes the RT tasks off the victim's CPUs, and leaves there the
    NET_RX of the pod's own packets (processed where the steering puts them, wherever the sender runs),
    which only sending less takes away. So when the sender is the pod this incident moved, its quota
    joins the move (Decision.joins, MOVES_OFF_VICTIM_CPUS; the manager checks it is the same pod and
    incident): applied while the move is being verified, the two judged as one step. Before, the quota
    waited out the move's verification (make bench's softirq-starve at 08:42: the move at +4.0 s, the
    quota at +7.7 s, the victim at 3.9x its quiet p99 over the recovery window), and the move alone,
    judged on the softirq time it does not lower, could be undone as "did not help", its RT task back on
    the victim's CPU. A victim that is not a known pod: nothing to weigh."""
    inc = ctx.incident
    candidates = list(ctx.candidates())
    victim = inc.victim.cgroup.strip("/")
    if victim not in {t.cgroup.strip("/") for t in candidates}:
        return
    first = not ctx.done(RT_STEP)
    ctx.mark(RT_STEP)
    rt = ctx.host.rt_tasks(inc, candidates, fresh=first)
    steps = _rt_plan(ctx, rt, act=first) if rt is not None else []
    yield from steps
    sender = ctx.kept(TRAFFIC_STEP)
    if sender is not None and not any(isinstance(s, Submit) for s in steps):
        # The traffic is sampled once, the engine's ranking is made again every tick: the sender found
        # stays the incident's first culprit for as long as it lives, costed by this tick's kernel work.
        rank_first(inc, sender.target, sender.attribution, SPEC.kernel_work)
    if ctx.done(TRAFFIC_STEP):
        return  # acted (or refused) once: no more sampling of every pod's traffic for it
    traffic = ctx.host.sample_traffic(candidates)  # the first sample of an incident gives no rates yet
    if not traffic:
        return
    decision, note = _traffic_verdict(inc.victim, inc.incident_id, traffic, victim_signal=ctx.verify_signal)
    yield note
    if decision is None:
        return
    # The sender is the culprit, though it never ran on the victim's CPUs: its packets' kernel work did.
    ctx.keep(TRAFFIC_STEP, rank_first(inc, decision.target, traffic_share(inc.victim, traffic, decision.target),
                                      SPEC.kernel_work))
    if not ctx.policy.suppress_enabled:
        return
    ctx.mark(TRAFFIC_STEP)
    yield Submit(decision)


def _rt_plan(ctx: PlanContext, rt: RtTasks, act: bool) -> list[PlanStep]:
    """Rank pods with RT tasks allowed on the victim's CPUs (every tick: the top BE one is put first in the
    incident's culprits, as the engine's who-ran-instead ranking can miss it); with ``act``, move it off
    those CPUs. A non-BE pod with RT tasks is named, never touched."""
    inc = ctx.incident
    if not rt.ranked:
        return []
    cpus = sorted(rt.victim_cpus)
    ranking = ", ".join(SPEC.say(RT_TASK, pod=t.display, qos=t.qos or "?", cpu_s=s) for s, t in rt.ranked)
    steps: list[PlanStep] = [Note(NoteKey(RT_TASKS, tuple(map(str, cpus))), SPEC.say(RT_TASKS, cpus=cpus,
                                                                                      ranking=ranking))]
    top = next((t for _, t in rt.ranked if (t.qos or "").upper() == "BE"), None)
    if top is None:
        return [*steps, _note(RT_NOT_BE)]
    rank_first(inc, top, next(x for x, t in rt.ranked if t is top) / sum(x for x, _ in rt.ranked))
    others = tuple(c for c in ctx.host.online_cpus() if c not in rt.victim_cpus)
    if not act or not others:
        return steps
    return [*steps, Submit(Decision(
        ActionKind.SUPPRESS, top, SuppressAmount("cpuset", cpus=others),
        SPEC.say(RT_MOVE, pod=top.display, victim=inc.victim.display, cpus=",".join(map(str, others))),
        incident_id=inc.incident_id, victim=inc.victim, victim_signal=ctx.verify_signal, code=RT_MOVE))]


SPEC = CauseSpec(
    NAME, rule,
    title="softirq work on its CPUs",
    advice="softirq work lands on the victim's CPUs: steer IRQs/RPS away from them or move the traffic source",
    act=suppress_top_be,
    plan=plan,
    # A refused traffic cap (the RT isolation of the same pod still being verified) is tried again.
    retry_when_refused={OWN_TRAFFIC: TRAFFIC_STEP},
    kernel_work="softirq work",
    kernel_work_busy=busy,
    # Its actions are judged on what broke the SLO: softirq time on the victim's CPUs, or how late its
    # softirqs ran; a run-queue p99 where it breached on that (or on PSI).
    verify_signals=(VICTIM_SIGNAL, "softirq_ms_per_s", "softirq_delay_p99_ns"),
    messages={
        NO_POD_TRAFFIC: "no pod's own traffic seen: NET_RX comes from the node's devices; advice: move IRQ/RPS "
                        "steering off the victim's CPUs (the agent never changes node IRQ settings)",
        NO_DOMINANT_TRAFFIC: "no dominant pod traffic (top {pod} {pps:.0f} pkt/s, {share:.0%} of pods'): advice: move "
                             "IRQ/RPS steering off the victim's CPUs",
        SOURCE_NOT_BE: "{pod} sends {pps:.0f} pkt/s ({share:.0%}) but is {qos}: not touched; advice: rate-limit it or "
                       "move IRQ/RPS steering off the victim's CPUs",
        OWN_TRAFFIC: "{pod}'s own traffic, {pps:.0f} pkt/s ({share:.0%} of the pods'), keeps NET_RX on {victim}'s "
                     "CPUs: cfs quota {cpu:.2f} -> {cap:.2f} cores (sends less)",
        RT_TASKS: "real-time tasks on the victim's CPUs {cpus}: {ranking}",
        RT_TASK: "{pod} ({qos}, {cpu_s:.1f} CPU s)",
        RT_NOT_BE: "no BE pod among them: not touched (advice: lower their RT priority or budget)",
        RT_MOVE: "{pod} runs real-time tasks on {victim}'s CPUs (softirq starvation): move it to CPUs {cpus}",
    },
)
