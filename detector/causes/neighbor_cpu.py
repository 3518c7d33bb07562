# SPDX-License-Identifier: Apache-2.0
"""neighbor_cpu: other cgroups ran on the victim's CPUs while it waited. The engine suppresses the top
BE culprit above its request, and with it every other BE culprit above its request that ran on the
victim's CPUs while it waited; when that does not help the planner escalates (quota to its request,
then eviction when the policy allows it): the steps' codes and words are here."""

from __future__ import annotations

from detector.causes.base import ActContext, CauseContext, CauseSpec, Verdict
from detector.decisions import ActionKind, Cause, Decision
from detector.model import Culprit, Evidence, Incident

NEIGHBOR_SHARE = 0.3  # foreign cgroups ran for at least this share of its wait


def rule(ctx: CauseContext) -> Verdict | None:
    row = ctx.row
    if not ctx.runq_breach:
        return None
    if row.who_ran_instead_available:
        if ctx.foreign_share < NEIGHBOR_SHARE:
            return None
        # The node's own processes (the root cgroup: system daemons, kernel threads) are a culprit like any
        # other, named with their top commands: a neighbour cause always names whom it blames.
        culprits = ctx.cpu_culprits(ctx.key, ctx.foreign, ctx.total_wait_ns)
        confidence = ctx.foreign_share
    else:
        culprits = ctx.correlation_culprits(ctx.key, ctx.signals)
        confidence = 0.5 * culprits[0].score if culprits else 0.0
    if not culprits:
        return None
    used = [Evidence("who_ran_instead_foreign_share", round(ctx.foreign_share, 4), ctx.window_s,
                     threshold=NEIGHBOR_SHARE)] if row.who_ran_instead_available else []
    if row.who_ran_instead_available and ctx.node_share > 0:
        used.append(Evidence("who_ran_instead_node_share", round(ctx.node_share, 4), ctx.window_s,
                             note="the node's own processes outside pods (root cgroup) ran on its CPUs"))
    return Verdict(Cause.NEIGHBOR_CPU, min(1.0, confidence), culprits, used, share=share(ctx))


def share(ctx: CauseContext) -> float:
    """Its part of the wait: other cgroups' tasks' own time (the kernel work on top of their slices is
    softirq's or reclaim's), outside the time the victim sat throttled at its own limit (whoever ran
    then, its own limit held it back: self_throttling's part)."""
    if not ctx.row.who_ran_instead_available:
        return 0.0
    return max(0.0, ctx.foreign_tasks_share - ctx.throttle_share)


SUPPRESS = "neighbor_cpu.suppress"  # the engine's step: suppress the top BE culprit (and the others that ran with it)
QUOTA_TO_REQUEST = "neighbor_cpu.quota_to_request"  # isolation did not help: a cfs quota to its request
QUOTA_TO_REQUEST_NOTE = "neighbor_cpu.quota_to_request_note"
CPUSET_AWAY = "neighbor_cpu.cpuset_away"  # a quota did not help (enough): off the victim's CPUs
NO_OTHER_CPUS = "neighbor_cpu.no_other_cpus"  # the victim ran on every online CPU: no cpuset step
HELPED_NOT_ENOUGH = "neighbor_cpu.helped_not_enough"  # verified, yet the victim still breaches: next step on top
EVICT = "neighbor_cpu.evict"  # suppressing did not help: evict (evict_enabled)
EVICT_DISABLED = "neighbor_cpu.evict_disabled"
LADDER_CONTINUED = "neighbor_cpu.ladder_continued"  # the victim's next incident with the same culprit goes on
# What a neighbour step is verified on: the victim's wait per second. Every step (a quota, a cpuset, an
# eviction) is meant to take the culprit's slices out of the victim's waits, which the mean wait shows at
# once; a quota leaves the culprit's bursts (3 BE threads under a quota still run back to back), so the
# p99 barely moves (4.0 -> 3.9 ms) while the wait behind it halves, and judged on the p99 the only step
# taken was undone (issue 41). Whether the victim is back is the incident's to say: a step that helped
# while the victim still breaches is followed by the next one (actuators/mitigate.py).
VERIFY_SIGNAL = "runq_wait_ms_per_s"


def suppress_top_be(inc: Incident, top: Culprit | None, ctx: ActContext) -> Decision | None:
    """Suppress the top culprit when it is BE and not busy within its own request (neighbor_cpu and
    softirq both take this step). A BE pod within its request uses what it was promised; the ranking
    puts those above their request first, so a top within its request means none is above it yet
    (seen the tick a hog starts: its CPU use not measured past its request yet). A top that shares no
    CPU with the victim (a sender the planner named from its traffic) is left to the planner."""
    if top is None or top.target.qos != "BE" or top.above_request is False or not ctx.policy.actuators.suppress_enabled:
        return None
    if top.attribution and not top.who_ran_instead_share and not top.correlation:
        # Named from its traffic (the softirq planner's sender, already given a quota): it never ran on
        # the victim's CPUs, so moving it off them changes nothing.
        return None
    return Decision(ActionKind.SUPPRESS, top.target, ctx.suppress_amount(top),
                    reason=SPEC.say(SUPPRESS, culprit=top.target.display, share=top.who_ran_instead_share,
                                    victim=inc.victim.display),
                    incident_id=inc.incident_id, victim=inc.victim, victim_signal=ctx.victim_signal, code=SUPPRESS)


def suppress_be_culprits(inc: Incident, top: Culprit | None, ctx: ActContext) -> list[Decision]:
    """The top culprit's step (:func:`suppress_top_be`), and the same step for every other BE culprit
    that ran on the victim's CPUs while it waited, however little (the engine drops a step this
    incident already took on a pod, IncidentEngine._decide). Moved one at a time, the next hog takes
    the first one's place: with two on the victim's CPU, the one that had lengthened few of its waits
    (the p99 without it within 0.1 ms of the p99) took them all once the other was moved (the p99 back
    at 2.8-3.6 ms until the second was moved 7 s later), and the verification judged the first move
    "did not help" and undid it (docs/benchmarks.md, cpu-neighbor-two)."""
    first = suppress_top_be(inc, top, ctx)
    if first is None:
        return []
    others = (suppress_top_be(inc, c, ctx) for c in inc.culprits if c is not top and c.who_ran_instead_share > 0.0)
    return [first, *(d for d in others if d is not None)]


SPEC = CauseSpec(
    Cause.NEIGHBOR_CPU, rule,
    title="neighbours' CPU use",
    advice="suppress or move the top culprit (BE CPU quota / cpuset), or give the victim dedicated CPUs",
    act=suppress_be_culprits,
    messages={
        SUPPRESS: "{culprit} ran {share:.0%} of {victim}'s runqueue wait",
        QUOTA_TO_REQUEST_NOTE: "isolation did not help: {culprit} uses {cpu:.2f} cores, above its {request:.2f}-core "
                               "request: quota to its request",
        QUOTA_TO_REQUEST: "{culprit} above its request ({cpu:.2f} > {request:.2f} cores) after isolation did not help: "
                          "cfs quota to its request",
        EVICT_DISABLED: "suppressing {culprit} did not help; eviction is disabled by policy (evict_enabled): "
                        "nothing more is done",
        EVICT: "suppressing {culprit} did not help {victim} within the verify window: evict",
        CPUSET_AWAY: "{culprit}: the quota did not give {victim} its latency back: cpuset off its CPUs {victim_cpus} "
                     "to CPUs {cpus}",
        NO_OTHER_CPUS: "{culprit} cannot be moved off {victim}'s CPUs: {victim} ran on every online CPU {victim_cpus}",
        LADDER_CONTINUED: "{culprit}: the ladder of {victim}'s incident {incident} goes on (tried: {tried}); a step "
                          "that did not help is not taken again within {memory_s:.0f} s",
        HELPED_NOT_ENOUGH: "{step} on {culprit} helped, yet {victim} still breached its SLO in {ticks} ticks after: "
                           "the next step goes on top of it",
    },
    verify_signals=(VERIFY_SIGNAL,),
)
