# SPDX-License-Identifier: Apache-2.0
"""The actuator manager: the :class:`~detector.decisions.DecisionSink` that turns decisions into actions.

For every decision: route it to the actuator of its kind, check the limits, plan, then either log
the plan (dry-run) or apply it through the journal, and watch whether it helped.

Limits (actuators/limits.py; each refusal is an audit line with a one-line reason, never an exception to the caller):
- a kind disabled in :class:`detector.policy.ActuatorPolicy` is refused;
- only BE targets are suppressed/throttled; LS, LSR, LSE and SYSTEM are never touched, except by burst
  (which only ever gives CPU: it is refused for LSR, LSE and BE, like koordlet);
- at most ``max_changes_per_minute`` applied changes in any 60 s (``evictions_per_minute`` for evictions);
- per target, ``cooldown_seconds`` between changes, no change while the previous one is still being
  verified (except a step of the same incident that joins it, ``Decision.joins``: a different knob, applied
  on top and judged with it as one action), and twice the cooldown after a revert, so an action that did
  not help is not retried at once (the same victim's next, different step on it, the neighbour ladder's,
  is not held up by that block);
  the same step for the same victim is not retried for ``DID_NOT_HELP_MEMORY_S`` after it did not help,
  whichever incident asks (together with the actuators' own dead bands this is the hysteresis that keeps
  things from flapping). A refusal carries its code (``Refused.outcome``): WAIT for a limit that passes,
  TRIED_BEFORE for a step already judged, so the planner's ladder retries or moves on without reading words;
- floors are the actuators' (minimum quota, minimum cpus).

Verify/revert (PARTIES-style closed loop, which koordlet does not have): when a decision names a
victim and a signal (lower is better), the baseline is the signal over the victim's breach as the
detector measured it (``Decision.victim_before``: the median of its breach ticks), else the median of
the last ``verify_intervals`` observations before the change (which, for an action taken as a breach
opens, are mostly the quiet ticks before it); after it, the next ``verify_intervals`` observations are
collected and their median compared. An improvement of at least ``verify_min_improvement_percent``
keeps the action (VERIFIED); anything less reverts it (REVERTED, with both numbers in the audit line).
Without a victim signal, or with a baseline of 0 (that signal is not what breached), the action stays
APPLIED and its record says why.

``close()`` restores every changed file (journal), so a clean shutdown leaves the node as it was.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from actuators.base import ActionError, ActionOutcome, ActionRecord, ActionState, Actuator, Plan, Refused
from actuators.cgroupfile import CgroupFileError
from actuators.journal import Journal, JournalError
from actuators.limits import ActionLimits, InPlace, joins_verification, loop_of
from detector.decisions import ActionKind, BurstAmount, Decision, SuppressAmount
from detector.policy import ActuatorPolicy

log = logging.getLogger("noisyneighbor.actuators")

# "Recovered": the victim's signal at or below this share of its value before the action (the manager knows
# no quiet baseline; the bench judges recovery against one, 1.5x its quiet p99).
RECOVERY_SHARE = 0.5
SIGNAL_PRUNE_EVERY = 15  # observe() calls between looks for victim histories nobody feeds any more
# ...and how many calls without a value make one forgotten. A removed pod's history waited this long: at
# 300 (5 min), 5 minutes of pod churn left ~300 KiB of them (tracemalloc, bench/agent_footprint.py). A
# minute-old history is no "before" for an action anyway (verification compares a few ticks).
SIGNAL_HISTORY_IDLE_OBSERVES = 60

# The audit log follows the CLI's JSON conventions (noisyneighbor/output.py: SCHEMA_VERSION, iso_utc), spelled
# out here because actuators/ does not import noisyneighbor/ (docs/architecture.md); tests/test_actuator_framework
# checks that the two stay the same.
AUDIT_SCHEMA_VERSION = 1


def audit_time(t: float) -> str:
    """Epoch seconds -> '2026-11-23T20:35:07+00:00', the format of every time in the project's JSON."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


class ActuatorMetrics:
    """Prometheus series of the manager, registered in the registry passed in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reverts = Counter(
            "noisyneighbor_actuator_reverts", "Actions reverted because the victim did not improve.", ["kind"],
            registry=registry)
        self.active = Gauge(
            "noisyneighbor_actuator_active_actions", "Applied actions currently in effect.", ["kind"], registry=registry)
        self.improvement = Gauge(
            "noisyneighbor_actuator_last_improvement_percent",
            "Victim signal improvement measured by the last verification.", ["kind"], registry=registry)
        self.be_suppress_cores = Gauge(
            "noisyneighbor_be_suppress_cpu_cores", "CPU cores BE is suppressed to (last plan).", ["policy"],
            registry=registry)
        self.journal_files = Gauge(
            "noisyneighbor_actuator_journal_owned_files", "Files changed by actuators and not yet restored.",
            registry=registry)


@dataclass
class _Verification:
    key: str
    baseline: float
    needed: int
    samples: list[float] = field(default_factory=list)


@dataclass
class _Active:
    record: ActionRecord
    actuator: Actuator
    verification: _Verification | None
    chain: list[Plan] = field(default_factory=list)  # earlier steps of a closed loop (follow-ups), oldest first
    # The records of earlier steps this one joined (Decision.joins), oldest first: judged with it, each
    # given its verdict in its own audit line.
    joined: list[ActionRecord] = field(default_factory=list)


class ActuatorManager:
    """Implements ``submit`` / ``observe`` / ``close``; thread-safe."""

    def __init__(
        self,
        actuators: Mapping[ActionKind, Actuator] | Iterable[Actuator],
        journal: Journal,
        policy: ActuatorPolicy | None = None,
        *,
        registry: CollectorRegistry | None = None,
        audit_log: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        reconcile: bool = True,
        reown: bool = False,
        keep_records: int = 1000,
    ) -> None:
        self.actuators: dict[ActionKind, Actuator] = (
            dict(actuators) if isinstance(actuators, Mapping) else {a.kind: a for a in actuators})
        self.journal = journal
        self.policy = policy or ActuatorPolicy()
        self.metrics = ActuatorMetrics(registry if registry is not None else CollectorRegistry())
        self.audit_path = Path(audit_log) if audit_log else None
        self._clock = clock
        self._lock = threading.RLock()
        self.records: deque[ActionRecord] = deque(maxlen=keep_records)
        self.planned: deque[Plan] = deque(maxlen=keep_records)  # dry-run output, newest last
        self._active: dict[tuple[str, str], _Active] = {}  # (kind, target cgroup) -> action in effect
        self.limits = ActionLimits(lambda: self.policy)
        # key -> its last verify_intervals values. Tuples, not deques: one per pod and signal, and a deque's
        # first block is ~600 bytes whatever its maxlen (3 MiB of the agent at 1,000 pods, tracemalloc).
        self._signals: dict[str, tuple[float, ...]] = {}
        self._signal_seen: dict[str, int] = {}  # key -> the observe() call that last carried it
        self._observed = 0
        # called with every finished record (the mitigation planner copies reverts/refusals into incidents)
        self.on_record: list[Callable[[ActionRecord], None]] = []
        if reconcile:
            report = journal.reconcile(reown=reown)
            if report.restored or report.failed or report.reowned:
                self._audit_raw({"event": "reconcile", "summary": report.summary(), "failed": report.failed})
        self.metrics.journal_files.set(len(journal.owned()))

    # -- DecisionSink -------------------------------------------------------------------------
    def submit(self, decision: Decision) -> None:
        with self._lock:
            try:
                self._submit(decision)
            except Exception as e:  # a sink never raises into the detector loop
                self._finish(ActionRecord(_new_id(), None, decision, ActionState.FAILED,
                                          f"internal error: {_one_line(e)}"))
                log.exception("actuator manager failed on a decision")

    def observe(self, signals: Mapping[str, float], now: float) -> None:
        with self._lock:
            window = max(1, self.policy.verify_intervals)
            self._observed += 1
            for key, value in signals.items():
                kept = self._signals.get(key, ())[1 - window:] if window > 1 else ()
                self._signals[key] = (*kept, float(value))
                self._signal_seen[key] = self._observed
            if self._observed % SIGNAL_PRUNE_EVERY == 0:
                self._prune_signals()
            for active in self._active.values():
                self._note_effect(active, signals)
            for target_key, active in list(self._active.items()):
                v = active.verification
                if v is None or v.key not in signals:
                    continue
                v.samples.append(float(signals[v.key]))
                if len(v.samples) >= v.needed:
                    self._judge(target_key, active, v)
            self._follow(now)

    def _note_effect(self, active: _Active, signals: Mapping[str, float]) -> None:
        d = active.record.decision
        if d.victim is None or not d.victim_signal:
            return
        key = f"{d.victim.cgroup}:{d.victim_signal}"
        if key not in signals:
            return
        eff = active.record.effect
        value = float(signals[key])
        eff["latest"] = value
        before = eff.get("before_action")
        bar = None if before is None else before * RECOVERY_SHARE
        if bar is not None and "action_to_recovery_s" not in eff and value <= bar and "applied_at" in eff:
            eff["action_to_recovery_s"] = round(self._clock() - eff["applied_at"], 3)

    def _follow(self, now: float) -> None:
        """One step of every actuator's closed loop (the burst loop): its decisions are follow-ups."""
        for actuator in list(self.actuators.values()):
            loop = loop_of(actuator)
            if loop is None:
                continue
            # Stepped every tick, with nothing tracked too: the burst loop judges the node's share pool over
            # its last ticks, and those before its first step count (actuators/burst.py, SHARE_POOL_INTERVALS).
            try:
                decisions = loop.step()
            except Exception:  # a loop that fails must not stop verification or the detector
                log.exception("actuator loop of %s failed", actuator.kind)
                continue
            for d in decisions:
                self.submit(d)

    def close(self) -> None:
        with self._lock:
            report = self.journal.restore_all()
            for record in (r for active in self._active.values() for r in [*active.joined, active.record]):
                record.state, record.detail = ActionState.REVERTED, "shutdown: originals restored"
                self._audit(record)
            self._active.clear()
            self._refresh_gauges()
            self._audit_raw({"event": "shutdown", "summary": report.summary(), "failed": report.failed})

    # -- internals ----------------------------------------------------------------------------
    def _submit(self, decision: Decision) -> None:
        action_id = _new_id()
        now = self._clock()
        kind = ActionKind(decision.kind)
        key = (str(kind), decision.target.cgroup.strip("/"))
        actuator = self.actuators.get(kind)
        previous_active = self._active.get(key)
        if decision.follow_up and previous_active is not None and _back_to_base(decision) \
                and actuator is not None and not self.policy.dry_run:
            self._end_chain(key, previous_active, decision.reason)
            return
        try:
            self.limits.check(decision, kind, key, actuator, _in_place(self._active.get(key)), now)
            assert actuator is not None
            plan = actuator.plan(decision)
            if decision.follow_up and not self.policy.dry_run and not _gives_back(plan, previous_active):
                self.limits.check_rate(kind, now)
        except Refused as e:
            record = ActionRecord(action_id, None, decision, ActionState.REFUSED, _one_line(e), outcome=e.outcome)
            if e.retry_in_s is not None:
                record.effect["retry_in_s"] = round(e.retry_in_s, 3)
            self._finish(record)
            return
        except (CgroupFileError, ValueError, OSError) as e:
            self._finish(ActionRecord(action_id, None, decision, ActionState.REFUSED, f"cannot plan: {_one_line(e)}"))
            return
        _note_plan(self.metrics, plan)
        if self.policy.dry_run:
            self.planned.append(plan)
            self._finish(ActionRecord(action_id, plan, decision, ActionState.PLANNED, "dry-run: nothing written"))
            return
        try:
            actuator.apply(plan)
        except (ActionError, JournalError, CgroupFileError) as e:
            self._finish(ActionRecord(action_id, plan, decision, ActionState.FAILED, _one_line(e)))
            return
        self._record_applied(decision, kind, key, actuator, plan, action_id, now)

    def _record_applied(self, decision: Decision, kind: ActionKind, key: tuple[str, str], actuator: Actuator,
                        plan: Plan, action_id: str, now: float) -> None:
        """An applied action: counted for the limits, put in place of the target's last, verified."""
        self.limits.applied(decision, kind, key, now)
        previous = self._active.pop(key, None)
        joined = previous is not None and previous.verification is not None \
            and joins_verification(decision, previous.record.decision)
        if previous is not None:
            previous.record.detail = f"{'judged with' if joined else 'superseded by'} {action_id}"
            self._audit(previous.record)
        record = ActionRecord(action_id, plan, decision, ActionState.APPLIED, "")
        if (decision.follow_up or joined) and previous is not None:
            self._active[key] = _carried_over(record, actuator, previous, joined)
        else:
            self._active[key] = _Active(record, actuator, self._start_verification(decision))
            v = self._active[key].verification
            record.effect.update({"applied_at": now,
                                  "decision_to_action_s": round(max(0.0, time.time() - decision.created_at), 3),
                                  **({"before_action": v.baseline} if v is not None else {})})
            loop = loop_of(actuator)
            scale = plan.details.get("scale")
            if loop is not None and isinstance(scale, (int, float)) and getattr(decision.amount, "quota_scale", None):
                loop.track(decision, float(scale))
        if self._active[key].verification is None and decision.victim_signal and not decision.follow_up:
            record.detail = _not_verified(decision)
        self._finish(record)

    def _end_chain(self, key: tuple[str, str], active: _Active, why: str) -> None:
        """A loop's step back to the base: undo every step through the journal (originals back exactly)."""
        try:
            _revert_all(active)
        except (ActionError, JournalError, CgroupFileError) as e:
            active.record.state, active.record.detail = ActionState.FAILED, f"revert failed: {_one_line(e)}; {why}"
            self._finish(active.record)
            return
        self._active.pop(key, None)
        active.record.state, active.record.detail = ActionState.REVERTED, why
        self._finish(active.record)

    def _prune_signals(self) -> None:
        """Forget the history of keys no tick has carried for a while: removed pods' victims would
        otherwise stay here forever, one history each, and pod churn would grow the agent without end.
        (A victim quiet that long has no "before" worth comparing with anyway.)"""
        horizon = self._observed - SIGNAL_HISTORY_IDLE_OBSERVES
        for key in [k for k, seen in self._signal_seen.items() if seen < horizon]:
            del self._signal_seen[key]
            self._signals.pop(key, None)

    def _start_verification(self, decision: Decision) -> _Verification | None:
        if decision.victim is None or not decision.victim_signal:
            return None
        key = f"{decision.victim.cgroup}:{decision.victim_signal}"
        needed = max(1, self.policy.verify_intervals)
        if decision.victim_before is not None:  # the detector's: the signal over the victim's breach
            baseline = decision.victim_before
        else:
            history = self._signals.get(key)
            if not history:
                return None
            baseline = statistics.median(history)
        # Nothing to improve on: a baseline of 0 would judge every action "did not help" and revert it.
        return _Verification(key, baseline, needed) if baseline > 0 else None

    def _judge(self, target_key: tuple[str, str], active: _Active, v: _Verification) -> None:
        after = statistics.median(v.samples)
        improvement = 100.0 * (v.baseline - after) / v.baseline if v.baseline > 0 else (0.0 if after >= 0 else 100.0)
        kind = str(active.record.decision.kind)
        self.metrics.improvement.labels(kind).set(improvement)
        numbers = (f"{v.key}: baseline {v.baseline:.4g} -> {after:.4g} over {len(v.samples)} intervals "
                   f"({improvement:+.1f} %, need {self.policy.verify_min_improvement_percent:g} %)")
        active.verification = None
        record = active.record
        record.effect.update({"after_action": after, "improvement_percent": round(improvement, 1)})
        if improvement >= self.policy.verify_min_improvement_percent:
            self._finish_judged(active, ActionState.VERIFIED, f"victim improved: {numbers}", ActionOutcome.IMPROVED)
            return
        try:
            _revert_all(active)
        except (ActionError, JournalError, CgroupFileError) as e:
            self._finish_judged(active, ActionState.FAILED, f"revert failed: {_one_line(e)}; {numbers}")
            return
        self._active.pop(target_key, None)
        loop = loop_of(active.actuator)
        if loop is not None:
            loop.forget(target_key[1])
        for step in [*active.joined, record]:  # each step judged with it is not retried either; its block: the last
            self.limits.did_not_help(step.decision, target_key, self._clock())
        self.metrics.reverts.labels(kind).inc()
        self._finish_judged(active, ActionState.REVERTED, f"did not help: {numbers}", ActionOutcome.DID_NOT_HELP)

    def _finish_judged(self, active: _Active, state: ActionState, detail: str,
                       outcome: ActionOutcome = ActionOutcome.NONE) -> None:
        """An action's verdict, and the same verdict for each step judged with it (each its own record)."""
        main = active.record
        for record in active.joined:
            record.effect.update({k: v for k, v in main.effect.items() if k in ("after_action", "improvement_percent")})
            record.state, record.detail, record.outcome = state, f"{detail} (judged with {main.action_id})", outcome
            self._finish(record)
        together = ", ".join(r.action_id for r in active.joined)
        main.state, main.outcome = state, outcome
        main.detail = f"{detail} (judged with {together})" if together else detail
        self._finish(main)

    def _finish(self, record: ActionRecord) -> None:
        self.records.append(record)
        for hook in self.on_record:
            try:
                hook(record)
            except Exception:  # a broken hook must not stop the manager
                log.exception("actuator record hook failed")
        self._refresh_gauges()
        self._audit(record)

    def _refresh_gauges(self) -> None:
        for kind in ActionKind:
            self.metrics.active.labels(str(kind)).set(sum(1 for k in self._active if k[0] == str(kind)))
        self.metrics.journal_files.set(len(self.journal.owned()))

    def _audit(self, record: ActionRecord) -> None:
        d = record.decision
        line = {
            "event": "action", "action_id": record.action_id, "state": str(record.state), "kind": str(d.kind),
            "target": d.target.cgroup, "target_display": d.target.display, "qos": d.target.qos,
            "incident_id": d.incident_id, "reason": d.reason, "detail": record.detail,
            "summary": record.plan.summary if record.plan else None,
            "writes": [{"path": w.path, "old": w.old, "new": w.new} for w in record.plan.writes] if record.plan else [],
            "details": dict(record.plan.details) if record.plan else {},
            "effect": {k: v for k, v in record.effect.items() if k != "applied_at"},
        }
        self._audit_raw(line)

    def _audit_raw(self, line: dict) -> None:
        line = {"schema_version": AUDIT_SCHEMA_VERSION, "ts": audit_time(time.time()), **line}
        text = json.dumps(line, sort_keys=True, default=str)
        level = logging.WARNING if line.get("state") in ("failed",) else logging.INFO
        log.log(level, "actuator %s", text)
        if self.audit_path is not None:
            try:
                self.audit_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.audit_path, "a", encoding="utf-8") as f:
                    f.write(text + "\n")
            except OSError as e:
                log.warning("cannot write audit log %s: %s", self.audit_path, e.strerror or e)

    # -- views --------------------------------------------------------------------------------
    def active_records(self) -> list[ActionRecord]:
        with self._lock:
            return [r for a in self._active.values() for r in [*a.joined, a.record]]  # steps judged together too


def _note_plan(metrics: ActuatorMetrics, plan: Plan) -> None:
    """The BE suppress gauge: the cores a plan suppresses its target to."""
    amount = plan.decision.amount
    if isinstance(amount, SuppressAmount):
        cores = plan.details.get("cpu_cores", amount.cpu_cores if amount.cpu_cores is not None
                                 else len(amount.cpus or ()))
        policy = str(plan.details.get("policy", amount.policy))
        metrics.be_suppress_cores.labels(policy).set(float(cores))


def _carried_over(record: ActionRecord, actuator: Actuator, previous: _Active, joined: bool) -> _Active:
    """The target's next step, judged with the action in place as one action in steps: a closed loop's
    follow-up (the burst loop's next scale) or a step that joins it (Decision.joins). The first step's
    baseline judges them all, and a revert undoes every step. A step that joins starts a fresh verification
    on that baseline: the two are judged on what the victim did with both in place. Judged on the first
    step's samples, a step that joined two ticks into a 5-tick verification had 2 of the 5 samples, and the
    median was the first step's alone (the VM lane's cpuset on top of a quota: undone with it, 2026-11-29
    13:37 UTC)."""
    record.effect.update(previous.record.effect)
    verification = previous.verification
    if joined:
        record.outcome, record.detail = ActionOutcome.JOINED, _joined(previous.record)
        if verification is not None:
            verification = replace(verification, samples=[])
    return _Active(record, actuator, verification,
                   [*previous.chain, *([previous.record.plan] if previous.record.plan else [])],
                   [*previous.joined, previous.record] if joined else previous.joined)


def _joined(previous: ActionRecord) -> str:
    """What a step that joins the target's step being verified says when applied."""
    what = previous.plan.summary if previous.plan else str(previous.decision.kind)
    return f"on top of {previous.action_id} ({what}) while that was being verified: the two judged as one action"


def _revert_all(active: _Active) -> None:
    """Undo an action in effect, every step of a loop's chain, newest first."""
    for plan in reversed([*active.chain, *([active.record.plan] if active.record.plan else [])]):
        active.actuator.revert(plan)


def _back_to_base(decision: Decision) -> bool:
    amount = decision.amount
    return isinstance(amount, BurstAmount) and amount.burst_us is None and amount.quota_scale is not None \
        and amount.quota_scale <= 1.0 + 1e-9


def _gives_back(plan: Plan, previous: _Active | None) -> bool:
    """A follow-up step that lowers the quota gives CPU back: never held up by the rate limit."""
    if previous is None or previous.record.plan is None:
        return False
    new, old = plan.details.get("quota_us"), previous.record.plan.details.get("quota_us")
    return isinstance(new, (int, float)) and isinstance(old, (int, float)) and new < old


def _in_place(active: _Active | None) -> InPlace | None:
    """What the target's action in effect is, for the repeat check (None: nothing in effect)."""
    if active is None:
        return None
    return InPlace(active.record.decision, str(active.record.state), active.verification is not None)


def _not_verified(decision: Decision) -> str:
    """Why an action with a victim signal has no verification."""
    if decision.victim_before == 0:
        return f"the victim's {decision.victim_signal} was 0 over its breach: not verified"
    return "no baseline for the victim signal yet: not verified"


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
