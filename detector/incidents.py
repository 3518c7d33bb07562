# SPDX-License-Identifier: Apache-2.0
"""The incident engine: per-tick workload signals in; incidents with cause, culprits and evidence out.

Per tick (``IncidentEngine.step``):

1. Signals for every workload are derived from two NodeSnapshots (``detector.signals``) and added
   to the time-series store; baselines learn only for workloads with no open incident and no
   current breach, so an incident never becomes the new normal.
2. A latency-sensitive workload *breaches* (``detector.incident_diagnosis.breaches``) when a signal
   crosses its absolute SLO, or is k sigma above its own baseline while also at least half way to the
   SLO. ``breach_seconds`` of consecutive breach opens an incident; ``clear_windows`` clean ticks in a
   row close it (hysteresis).
3. The cause is decided from evidence (``detector.incident_diagnosis.diagnose`` over ``detector.causes``),
   in an order that protects neighbours from false blame: self-throttling (its own cfs quota explains
   most of its wait) first, then reclaim in its own allocations, then softirq on the CPUs it ran on,
   then neighbour CPU (who ran instead while it waited), then the connect path, else PSI-only "unknown".
   A different cause decided on a few breach ticks in a row closes the incident and opens its successor.
4. Culprits are named and ranked by ``detector.incident_culprits.CulpritFinder``.
5. Decisions for the actuators go to the DecisionSink when the incident opens or its cause or top
   culprit changes (``detector.incident_steps``). The actuators apply their own limits, cooldowns and
   verification.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable

from detector import causes
from detector.baseline import Baselines
from detector.catalog import BASELINE_SIGNALS
from detector.counterfactual import Counterfactuals
from detector.decisions import Cause, DecisionSink, LoggingSink
from detector.incident_culprits import MAX_CULPRITS, CulpritFinder
from detector.incident_diagnosis import CULPRIT_WINDOW_TICKS, VictimState, breaches, diagnose, kernel_work_cost
from detector.incident_steps import decide, medians, moved_together_cost, signals_for_verify, verify_values
from detector.model import CLEAN, TRANSITIONS, Evidence, Incident
from detector.policy import Policy
from detector.signals import NodeSignals, WorkloadSignals
from detector.store import SignalStore
from detector.victims import Victims

__all__ = ["CAUSE_CHANGE_TICKS", "CULPRIT_WINDOW_TICKS", "MAX_CULPRITS", "IncidentEngine"]

log = logging.getLogger(__name__)

# A different cause decided on this many breach ticks in a row (and not taken at once: it was less sure
# than the first) closes the incident and opens one for it: a victim whose situation changed (its own
# sidecar began to spin after a neighbour) never keeps the first story for more than a few ticks.
CAUSE_CHANGE_TICKS = 3
CAUSE_CHANGED = "incident.cause_changed"  # the closed incident's finding: its successor has another cause
MAX_CLOSED_KEPT = 1000


class _FinderAttribute:
    """An engine attribute kept by its CulpritFinder (wired from outside: runtime.py, the agent, diagnose)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: IncidentEngine | None, owner: type | None = None):
        return self if engine is None else getattr(engine.culprit_finder, self.name)

    def __set__(self, engine: IncidentEngine, value) -> None:
        setattr(engine.culprit_finder, self.name, value)


class IncidentEngine:
    """Victims' breaches into incidents: opened, updated, re-caused and closed, with their culprits and steps."""

    targets = _FinderAttribute()  # workload key -> Target as last seen
    node_tasks = _FinderAttribute()  # the node's top commands (detector/node_tasks.py)
    culprit_hooks = _FinderAttribute()  # a cause's NAME -> its own culprit finder (causes.base.CulpritHook)
    cpu_request = _FinderAttribute()  # workload key -> its CPU request in cores (None: unknown)
    node_key = _FinderAttribute()  # the node's own processes' workload key (the root cgroup)

    def __init__(
        self,
        policy: Policy | None = None,
        sink: DecisionSink | None = None,
        store: SignalStore | None = None,
        baselines: Baselines | None = None,
        on_incident: Iterable[Callable[[Incident, str], None]] = (),
        clock: Callable[[], float] = time.time,
        cpu_request: Callable[[str], float | None] = lambda key: None,
    ) -> None:
        self.policy = policy or Policy()
        self.slo = self.policy.slo
        self.sink = sink or LoggingSink()
        self.store = store or SignalStore()
        self.baselines = baselines or Baselines(min_samples=self.slo.min_baseline_samples)
        self.on_incident = list(on_incident)
        self.clock = clock
        self.victim_book = Victims()
        self.victims: dict[str, VictimState] = self.victim_book.states  # (the same dict, never replaced)
        self.closed: deque[Incident] = deque(maxlen=MAX_CLOSED_KEPT)
        self.ticks = 0
        self._breach_ticks_needed = max(1, math.ceil(self.slo.breach_seconds / max(self.policy.interval_seconds, 1e-3)))
        self._log_path = self.policy.incident_log
        self._online_cpus: tuple[int, ...] = ()
        self._forgot_for: frozenset[str] | None = None  # the workload list the last forgetting was done for
        self.counterfactual = Counterfactuals()  # each culprit's cost to each victim, per wait
        self.culprit_finder = CulpritFinder(self.store, self.counterfactual, cpu_request)

    # -- public ---------------------------------------------------------------------------------
    @property
    def open_incidents(self) -> list[Incident]:
        return [s.incident for s in self.victim_book.open_states()]  # type: ignore[misc]

    def all_incidents(self) -> list[Incident]:
        return [*self.closed, *self.open_incidents]

    def step(self, signals: NodeSignals, ts: float | None = None) -> list[Incident]:
        """One tick. Returns the incidents opened, updated or closed in it.

        ``ts`` is the tick's monotonic time for the store (default: now); incidents are stamped with
        ``clock()`` (wall time, for humans and Kubernetes Events).
        """
        now = self.clock()
        self.ticks += 1
        values = self._record(signals, time.monotonic() if ts is None else ts)
        touched: list[Incident] = []
        for key, row in signals.workloads.items():
            if row.workload.latency_sensitive:
                touched.extend(self._victim_tick(key, row, values, signals, now))
                self.victim_book.settled(key, self.victims[key])
        present = signals.workloads.keys() if signals.present is None else signals.present
        self._forget_gone(signals, present)
        touched.extend(self._quiet_victims(signals, present, now))
        return touched

    def _record(self, signals: NodeSignals, store_ts: float) -> dict[tuple[str, str], float]:
        """The tick's values into the store; the targets and online CPUs as last seen."""
        values: dict[tuple[str, str], float] = {}
        for key, row in signals.workloads.items():
            for name, v in row.as_store_values().items():
                values[(key, name)] = v
            if row.memory_usage_bytes is not None:
                values[(key, "memory_bytes")] = float(row.memory_usage_bytes)
        self.store.add(store_ts, values)
        if signals.present is None:
            self.targets = {k: r.workload.target for k, r in signals.workloads.items()}
        else:
            self.targets.update((k, r.workload.target) for k, r in signals.workloads.items())
        self._online_cpus = signals.online_cpus
        return values

    def _victim_tick(self, key: str, row: WorkloadSignals, values: dict[tuple[str, str], float],
                     signals: NodeSignals, now: float) -> list[Incident]:
        """One latency-sensitive workload's tick: its windows, breaches and baselines; the incidents it
        opened, updated or closed (two when its cause changed: the closed one and its successor)."""
        state = self.victim_book.state(key)
        state.add_tick(row, self.node_key)
        self.counterfactual.add(key, row.runq_hist, row.interval_s, row.cf_moves, row.ran_instead_ns,
                                row.cf_node_moves, row.cf_node_ns)
        found = breaches(key, row, state, self.slo, self.baselines)
        state.cpus = tuple(sorted(c for c, w in row.cpu_weights.items() if w > 0.05))
        learning = state.incident is None and not found
        for name in BASELINE_SIGNALS:
            v = values.get((key, name), math.nan)
            if not math.isnan(v):
                self.baselines.update(key, name, v, learning=learning)
        if found:
            state.breach_ticks += 1
            state.clear_ticks = 0
            state.breach_signals.append(verify_values(row))
            state.breach_ran.append(frozenset(k for k, ns in row.ran_instead_ns.items() if ns > 0))
        else:
            state.breach_ticks = 0
            state.clear_ticks += 1
            if state.incident is None:
                state.breach_signals.clear()  # a breach that opened nothing is not the next one's level
                state.breach_ran.clear()
        inc = state.incident
        if inc is None and found and state.breach_ticks >= self._breach_ticks_needed:
            return [self._open(key, row, state, found, signals, now)]
        if inc is not None and found:
            successor = self._update(inc, key, row, state, found, signals, now)
            return [inc] if successor is None else [inc, successor]
        if inc is not None and state.clear_ticks >= self.slo.clear_windows:
            self._close(state, now)
            return [inc]
        if inc is not None:
            self._emit(inc, CLEAN)  # one of its clear windows: still open, nothing changed in it
        return []

    def _forget_gone(self, signals: NodeSignals, present) -> None:
        """The workload list changed: what is gone leaves the store and the baselines now, not when its
        samples age out (pod churn must leave nothing behind)."""
        if signals.present is None or signals.present is self._forgot_for:
            return
        self._forgot_for = signals.present
        for entity in self.store.entities():
            if entity not in present:
                self.store.forget(entity)
        for entity in self.baselines.entities():
            if entity not in present:
                self.baselines.forget(entity)
        self.targets = {k: t for k, t in self.targets.items() if k in present}

    def _quiet_victims(self, signals: NodeSignals, present, now: float) -> list[Incident]:
        """Victims without a row this tick: gone (their incident ends, their state is freed) or idle (a
        clean tick, nothing to learn)."""
        touched: list[Incident] = []
        for key in self.victim_book.quiet(signals.workloads, signals.present):
            state = self.victims[key]
            if key not in present:
                self.victim_book.drop(key)
                self.counterfactual.forget(key)
                if state.incident is not None:
                    inc = state.incident
                    self._close(state, now, note="victim gone")
                    touched.append(inc)
                continue
            if state.breach_ticks or state.incident is not None:
                state.breach_ticks = 0
                state.clear_ticks += 1
                if state.incident is not None and state.clear_ticks >= self.slo.clear_windows:
                    inc = state.incident
                    self._close(state, now)
                    touched.append(inc)
                elif state.incident is not None:
                    self._emit(state.incident, CLEAN)
                self.victim_book.settled(key, state)
        return touched

    def close(self) -> None:
        now = self.clock()
        for state in self.victims.values():
            if state.incident is not None:
                self._close(state, now, note="agent stopped")

    # -- lifecycle ------------------------------------------------------------------------------
    def _open(self, key, row, state, found, signals, now, follows: str | None = None,
              incident_id: str | None = None) -> Incident:
        # A successor is diagnosed as its predecessor was re-evaluated (gone culprits out of the shares), so
        # it opens with the cause decided; a fresh incident over the whole window.
        cause, confidence, culprits, evidence, findings = diagnose(key, row, state, found, signals, self.slo,
                                                                  self.culprit_finder, current=follows is not None)
        inc = Incident(
            incident_id=incident_id or _new_incident_id(),
            follows=follows,
            victim=row.workload.target,
            cause=cause,
            started_at=now,
            confidence=round(confidence, 3),
            signal=found[0].signal,
            culprits=culprits,
            evidence=evidence,
            updated_at=now,
            findings=findings,
            kernel_work_cost=kernel_work_cost(key, cause, self.culprit_finder),
            breach_signals=medians(state.breach_signals),
            victim_cpus=list(state.cpus),
        )
        state.incident = inc
        self.victim_book.opened(key, state)
        log.warning("incident %s opened: %s %s, culprits %s", inc.incident_id, inc.victim.display, cause,
                    [c.target.display for c in culprits[:3]])
        self._emit(inc, "opened")
        self._decide(inc, state)
        inc.moved_together_cost = moved_together_cost(key, inc, self.culprit_finder)
        return inc

    def _update(self, inc, key, row, state, found, signals, now) -> Incident | None:
        """The open incident on a breach tick; its successor when its cause changed (None: it stands). The
        cause is re-evaluated on what explains the wait now: a culprit gone for GONE_AFTER_TICKS no longer
        counts in the causes' shares (detector/incident_diagnosis.py)."""
        cause, confidence, culprits, evidence, findings = diagnose(key, row, state, found, signals, self.slo,
                                                                  self.culprit_finder, current=True)
        # A cause seen with more confidence replaces the first guess; evidence is the latest window.
        # "The node's own processes ran instead" (neighbor_cpu naming no pod) is the weakest account:
        # it never replaces a cause that named the pods behind it (kswapd is a root-cgroup thread; once
        # the grower is capped, what remains is the node's usual noise, not a new cause).
        nodes_own = cause == Cause.NEIGHBOR_CPU and all(self.culprit_finder.is_node(c) for c in culprits) \
            and any(not self.culprit_finder.is_node(c) for c in inc.culprits)
        # A cause declared to yield (CauseSpec.yields_to_pods: steal) gives way to one that names pods.
        yields = bool(culprits) and causes.spec(inc.cause).yields_to_pods
        takes_over = (confidence > inc.confidence and not nodes_own) or yields
        state.incident_ticks += 1
        if cause != inc.cause and not (takes_over and state.incident_ticks <= CAUSE_CHANGE_TICKS):
            # The first cause stands, with its culprits (another rule's culprits are not its own), until
            # the other cause is surer, or is decided on CAUSE_CHANGE_TICKS ticks in a row; then it is a
            # new incident. Only in an incident's first ticks (its windows still filling) does a surer
            # cause refine the first guess in place.
            seen = state.other_cause[1] + 1 if state.other_cause and state.other_cause[0] == cause else 1
            state.other_cause = (cause, seen)
            if takes_over or (seen >= CAUSE_CHANGE_TICKS and not nodes_own):
                why = f"surer: confidence {confidence:.2f} > {inc.confidence:.2f}" if takes_over \
                    else f"decided {seen} ticks in a row"
                return self._change_cause(inc, key, row, state, found, signals, now, cause, why)
        else:
            state.other_cause = None
            # A rule that names no culprit this tick does not clear the ones named before for the same
            # cause (the global-reclaim grower shrinks once capped, and is still who it was); a new
            # cause never inherits another rule's culprits (they would be acted on for the wrong cause).
            if culprits or cause != inc.cause:
                inc.culprits = culprits
            inc.confidence = round(confidence, 3)
            inc.cause = cause
        inc.evidence = evidence
        inc.findings = findings
        inc.kernel_work_cost = kernel_work_cost(key, inc.cause, self.culprit_finder)
        inc.breach_signals = medians(state.breach_signals)
        inc.victim_cpus = list(state.cpus)
        inc.updated_at = now
        self._emit(inc, "updated")
        self._decide(inc, state)
        inc.moved_together_cost = moved_together_cost(key, inc, self.culprit_finder)
        return None

    def _change_cause(self, inc, key, row, state, found, signals, now, cause: Cause, why: str) -> Incident:
        """Close ``inc`` saying what its cause became, and open its successor for the new cause on the same
        breach (its breach level, for verifying the successor's actions, carries over)."""
        successor_id = _new_incident_id()
        inc.superseded_by = successor_id
        if CAUSE_CHANGED not in inc.findings:
            inc.findings.append(CAUSE_CHANGED)
        breach_signals = list(state.breach_signals)
        breach_ran = list(state.breach_ran)
        log.warning("incident %s: cause %s -> %s (%s)", inc.incident_id, inc.cause, cause, why)
        self._close(state, now, note=f"cause changed: {inc.cause} -> {cause} ({why}), continued in {successor_id}")
        state.breach_signals.extend(breach_signals)
        state.breach_ran.extend(breach_ran)
        state.other_cause = None
        return self._open(key, row, state, found, signals, now, follows=inc.incident_id, incident_id=successor_id)

    def _close(self, state: VictimState, now: float, note: str = "") -> None:
        inc = state.incident
        if inc is None:
            return
        inc.ended_at = now
        inc.updated_at = now
        if note:
            inc.evidence.append(Evidence("closed", 0.0, 0.0, note=note))
        state.incident = None
        state.decided = None
        state.other_cause = None
        state.incident_ticks = 0
        state.breach_signals.clear()
        state.breach_ran.clear()
        self.closed.append(inc)
        log.warning("incident %s closed after %.1f s", inc.incident_id, now - inc.started_at)
        self._emit(inc, "closed")

    def _emit(self, inc: Incident, what: str) -> None:
        if self._log_path and what in TRANSITIONS:
            try:
                line = json.dumps({"event": what, **inc.to_dict()}, sort_keys=True, default=str)
                with open(self._log_path, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
            except OSError as e:
                log.error("incident log %s: %s", self._log_path, e.strerror or e)
        for hook in self.on_incident:
            try:
                hook(inc, what)
            except Exception as e:  # a broken hook (Kubernetes Events) must not stop detection
                log.error("incident hook %s failed: %s", getattr(hook, "__name__", hook), e)

    # -- decisions ------------------------------------------------------------------------------
    def _decide(self, inc: Incident, state: VictimState) -> None:
        """The cause's step for the sink when what it decides on changed (detector/incident_steps.py)."""
        decide(inc, state, self.policy, self.sink, self.culprit_finder, self._online_cpus)

    def signals_for_verify(self, signals: NodeSignals) -> dict[str, float]:
        """The verify signals of the victims an action may be being verified for (incident_steps.py)."""
        return signals_for_verify(signals, self.victims, self.slo.clear_windows, self.policy.actuators.verify_intervals)


def _new_incident_id() -> str:
    return f"nn-{uuid.uuid4().hex[:12]}"
