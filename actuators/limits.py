# SPDX-License-Identifier: Apache-2.0
"""The actuator manager's limits (actuators/manager.py): what it refuses before planning, with the
outcome code a refusal carries (``Refused.outcome``: WAIT for a limit that passes, TRIED_BEFORE for a
step already judged, IN_PLACE for one in effect), and the memory those limits keep: each target's last
change and the incident it served, the blocks after a revert, the steps that did not help a victim, the
changes of the last minute. The manager's other job, applying, verifying and reverting, is its own."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from actuators.base import ActionOutcome, Actuator, Refused
from detector.cgroups import parse_cgroup_path
from detector.decisions import DID_NOT_HELP_MEMORY_S, ActionKind, Decision, SuppressAmount
from detector.policy import ActuatorPolicy

NO_BURST_QOS = frozenset({"LSR", "LSE", "BE"})


@dataclass(frozen=True)
class InPlace:
    """The target's action in effect, as the limits see it."""

    decision: Decision
    state: str
    being_verified: bool


class ActionLimits:
    """The manager's checks and their memory, keyed by (kind, target cgroup)."""

    def __init__(self, policy: Callable[[], ActuatorPolicy]) -> None:
        self.policy = policy  # the manager's, read at each check
        self._last_change: dict[tuple[str, str], float] = {}
        self._last_incident: dict[tuple[str, str], str | None] = {}  # the incident of each key's last change
        self._blocked_until: dict[tuple[str, str], float] = {}
        # The reverted step each block is about: (victim, step) of its decision (_step_of).
        self._blocked_step: dict[tuple[str, str], tuple[str | None, str]] = {}
        # (key, victim, step) -> when it was judged "did not help": not retried within DID_NOT_HELP_MEMORY_S
        self._did_not_help: dict[tuple[tuple[str, str], str, str], float] = {}
        self._changes: deque[tuple[float, str]] = deque()  # (time, kind) of applied changes

    def applied(self, decision: Decision, kind: ActionKind, key: tuple[str, str], now: float) -> None:
        """An applied change: counted for the rate limit and the target's cooldown."""
        self._changes.append((now, str(kind)))
        self._last_change[key] = now
        self._last_incident[key] = decision.incident_id

    def did_not_help(self, decision: Decision, key: tuple[str, str], now: float) -> None:
        """A reverted action blocks its target for twice the cooldown, and its step for its victim for
        DID_NOT_HELP_MEMORY_S."""
        self._blocked_until[key] = now + 2 * self.policy().cooldown_seconds
        victim = _victim_of(decision)
        self._blocked_step[key] = (victim, _step_of(decision))
        if victim is not None:
            self._did_not_help = {k: t for k, t in self._did_not_help.items() if now - t < DID_NOT_HELP_MEMORY_S}
            self._did_not_help[(key, victim, _step_of(decision))] = now

    def check(
        self, decision: Decision, kind: ActionKind, key: tuple[str, str], actuator: Actuator | None,
        in_place: InPlace | None, now: float,
    ) -> None:
        """Refuse (raise Refused with its outcome code) what a limit forbids; return when it may be planned."""
        if actuator is None:
            raise Refused(f"no actuator for {kind}")
        enabled = {
            ActionKind.SUPPRESS: self.policy().suppress_enabled, ActionKind.EVICT: self.policy().evict_enabled,
            ActionKind.BURST: self.policy().burst_enabled, ActionKind.RESCTRL: self.policy().resctrl_enabled,
            ActionKind.MEMORY_SUPPRESS: self.policy().suppress_enabled,
        }.get(kind, False)
        if not enabled:
            raise Refused(f"{kind} is disabled by policy")
        qos = target_qos(decision)
        if kind == ActionKind.BURST:
            if qos in NO_BURST_QOS:
                raise Refused(f"burst is not for {qos} targets ({decision.target.display})")
            loop = loop_of(actuator)
            verdict = loop.verdict(decision.target.cgroup) if loop is not None else None
            if verdict and not decision.follow_up:
                raise Refused(f"{decision.target.display}: {verdict}")
        elif kind in (ActionKind.SUPPRESS, ActionKind.EVICT, ActionKind.MEMORY_SUPPRESS) and qos != "BE":
            raise Refused(f"{kind} only touches BE targets; {decision.target.display} is {qos or 'of unknown QoS'}")
        self._check_repeat(decision, key, in_place, now)
        if decision.follow_up:
            if kind != ActionKind.BURST:
                raise Refused(f"follow-up steps are for the burst loop only, not {kind}")
            return  # the loop's own pace; the rate limit is checked once the plan says which way it goes
        if in_place is not None and in_place.being_verified and not joins_verification(decision, in_place.decision):
            raise Refused(f"previous {kind} on {decision.target.display} is still being verified", ActionOutcome.WAIT,
                          float(self.policy().verify_intervals))
        last = self._last_change.get(key)
        # One incident's own next step on a target it already changed (the traffic cap after moving an
        # RT pod off the victim's CPUs) is its plan, not flapping: no cooldown. A step while the last
        # one is being verified was refused above, unless it joins it (judged with it: the manager's
        # _record_applied); another incident's change waits (WAIT: the ladder retries).
        same_incident = decision.incident_id is not None and self._last_incident.get(key) == decision.incident_id
        if last is not None and now - last < self.policy().cooldown_seconds and not same_incident:
            raise Refused(f"cooldown: last change to {decision.target.display} {now - last:.0f} s ago "
                          f"(< {self.policy().cooldown_seconds:g} s)", ActionOutcome.WAIT,
                          self.policy().cooldown_seconds - (now - last))
        if self.policy().dry_run:
            return  # dry-run changes nothing, so the rate limit does not apply
        self.check_rate(kind, now)

    def _check_repeat(self, decision: Decision, key: tuple[str, str], in_place: InPlace | None, now: float) -> None:
        """Refuse a step the target's last revert blocks, one that did not help the same victim lately, or
        one already in place for it."""
        victim, step = _victim_of(decision), _step_of(decision)
        blocked = self._blocked_until.get(key, 0.0)
        blocked_victim, blocked_step = self._blocked_step.get(key, (None, ""))
        # The same victim's next, different step on the target (the neighbour ladder's cpuset after a
        # quota that did not help, also from the victim's next incident) is not the reverted action again:
        # the block is for retrying that one.
        next_step = victim is not None and blocked_victim == victim and step != blocked_step
        if now < blocked and not next_step:
            raise Refused(f"{decision.target.display} was reverted recently: blocked for {blocked - now:.0f} s more",
                          ActionOutcome.WAIT, blocked - now)
        judged = self._did_not_help.get((key, victim or "", step))
        if victim is not None and judged is not None and now - judged < DID_NOT_HELP_MEMORY_S:
            who = decision.victim.display if decision.victim is not None else victim
            raise Refused(f"{step} on {decision.target.display} did not help {who} {now - judged:.0f} s ago: "
                          f"not retried for {DID_NOT_HELP_MEMORY_S - (now - judged):.0f} s more", ActionOutcome.TRIED_BEFORE)
        if in_place is not None and not decision.follow_up and in_place.decision.amount == decision.amount \
                and _victim_of(in_place.decision) == victim:
            # The victim's next incident asks for what its last one left in place (a step that helped stays
            # while the culprit runs): applied again it would be verified again, and undone if the victim,
            # better already, improved no further.
            raise Refused(f"{step} on {decision.target.display} is in place already ({in_place.state})",
                          ActionOutcome.IN_PLACE)

    def check_rate(self, kind: ActionKind, now: float) -> None:
        while self._changes and now - self._changes[0][0] >= 60.0:
            self._changes.popleft()
        if kind == ActionKind.EVICT:
            n = sum(1 for _, k in self._changes if k == str(ActionKind.EVICT))
            if n >= self.policy().evictions_per_minute:
                raise Refused(f"rate limit: {n} evictions in the last minute")
        if len(self._changes) >= self.policy().max_changes_per_minute:
            raise Refused(f"rate limit: {len(self._changes)} changes in the last minute")


def loop_of(actuator: object) -> object | None:
    """An actuator's closed loop, also through a wrapper (the agent's --act-only ScopedActuator)."""
    loop = getattr(actuator, "loop", None)
    if loop is None and hasattr(actuator, "inner"):
        loop = getattr(actuator.inner, "loop", None)
    return loop


def joins_verification(decision: Decision, in_place: Decision) -> bool:
    """``decision`` goes with the target's step in place (Decision.joins): the same incident and victim
    asked for both, this one names that step's code, and it turns a different knob (the same knob again
    would replace the step being judged, not go with it)."""
    return (in_place.code is not None and in_place.code in decision.joins and decision.incident_id is not None
            and decision.incident_id == in_place.incident_id and _victim_of(decision) == _victim_of(in_place)
            and _step_of(decision) != _step_of(in_place))


def _victim_of(decision: Decision) -> str | None:
    """The victim cgroup a decision acts for (None: none named), the key of its ladder and its limits."""
    return decision.victim.cgroup.strip("/") if decision.victim is not None else None


def _step_of(decision: Decision) -> str:
    """What kind of step a decision is on its target: its kind, and for a CPU suppress its policy."""
    amount = decision.amount
    return f"{decision.kind}:{amount.policy}" if isinstance(amount, SuppressAmount) else str(decision.kind)


def target_qos(decision: Decision) -> str | None:
    """The target's koordinator class; without one, a path in the besteffort QoS cgroup counts as BE."""
    if decision.target.qos:
        return decision.target.qos.upper()
    if parse_cgroup_path(decision.target.cgroup).qos == "besteffort":
        return "BE"
    return None
