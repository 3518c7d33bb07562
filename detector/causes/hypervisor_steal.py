# SPDX-License-Identifier: Apache-2.0
"""hypervisor_steal: the hypervisor takes the victim's CPUs (``steal`` in /proc/stat, probes/steal.py).

On a cloud VM a vCPU is runnable but not running while the host runs something else; the task that
was on it makes no progress and whoever waits behind it waits longer, or a wakeup on an idle vCPU
waits for the vCPU itself. It looks like a noisy neighbour with no culprit on the node. No pod is
blamed and nothing is suppressed: the remedy is outside the node (another instance type or host,
dedicated tenancy, or fewer vCPUs than the host can give)."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict
from detector.model import Evidence

NAME = "hypervisor_steal"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)
SIGNAL = "steal_ms_per_s"  # the steal probe's signal (probes/steal.py): ms/s stolen on its CPUs, summed over the window

# Steal on its CPUs (weighted by where it ran) of at least 5 % of a CPU: what cloud monitoring calls
# significant steal. Below it, the few ms/s an oversubscribed-but-healthy VM shows (this project's CI
# VM: ~2 ms/s) never name the cause.
STEAL_MIN_MS_PER_S = 50.0
STEAL_EXPLAINS = 0.5  # stolen time is at least half the victim's runqueue wait (both ms/s)


def rule(ctx: CauseContext) -> Verdict | None:
    """Steal on its CPUs explains its wait: at least STEAL_MIN_MS_PER_S, at least half its runqueue wait,
    and more than what other cgroups ran for while it waited (else a neighbour is the better account),
    all three over the culprit window, the one the who-ran-instead share is summed over: one tick's
    steal against that tick's wait named the cause of a BE hog's incident (scenario bench) that opened
    in the second its hog started. A tick that names pods replaces a steal incident's cause
    (``yields_to_pods``)."""
    row = ctx.row
    if not ctx.runq_breach or ctx.window_s <= 0:
        return None
    steal = ctx.window_ns.get(SIGNAL, 0.0) / 1e6 / ctx.window_s
    if steal < STEAL_MIN_MS_PER_S:
        return None
    wait = ctx.total_wait_ns / 1e6 / ctx.window_s
    foreign = sum(ctx.foreign.values()) / 1e6 / ctx.window_s
    if steal < STEAL_EXPLAINS * wait or steal <= foreign:
        return None
    confidence = min(1.0, steal / wait) if wait > 0 else 1.0  # also its part of the wait
    cpus = sorted(c for c, w in row.cpu_weights.items() if w > 0.05)
    return Verdict(NAME, confidence, [], [
        Evidence(SIGNAL, round(steal, 2), ctx.window_s, threshold=STEAL_MIN_MS_PER_S,
                 note=f"the hypervisor ran something else on its CPUs {cpus} ({steal / 10:.1f} % of their time); "
                      f"runqueue wait {wait:.1f} ms/s, {foreign:.1f} ms/s of it behind other cgroups "
                      f"(over {ctx.window_s:.0f} s)"),
    ], share=confidence)


SPEC = CauseSpec(
    NAME, rule,
    title="the hypervisor taking its CPUs (steal)",
    advice="the hypervisor takes CPU time from this VM (steal): no pod on the node is at fault; move the "
           "workload to another node, use an instance type without CPU oversubscription (or dedicated "
           "tenancy), or ask the provider; suppressing pods here would not give the time back",
    blameless="the hypervisor ran something else on its CPUs (steal): no pod on the node is to blame.",
    yields_to_pods=True,
)
