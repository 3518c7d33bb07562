# SPDX-License-Identifier: Apache-2.0
"""The incident engine: per-tick workload signals in; incidents with cause, culprits and evidence out.

Per tick (``IncidentEngine.step``):

1. Signals for every workload are derived from two NodeSnapshots (``detector.signals``) and added
   to the time-series store; baselines learn only for workloads with no open incident and no
   current breach, so an incident never becomes the new normal.
2. A latency-sensitive workload *breaches* when a signal crosses its absolute SLO, or is k sigma
   above its own baseline while also at least half way to the SLO (so a quiet pod with a tight
   baseline does not page anyone over 200 µs). ``breach_seconds`` of consecutive breach opens an
   incident; ``clear_windows`` clean ticks in a row close it (hysteresis).
3. The cause is decided from evidence, in an order that protects neighbours from false blame:
   self-throttling (its own cfs quota explains most of its wait) first, then reclaim in its own
   allocations, then softirq on the CPUs it ran on, then neighbour CPU (who ran instead while it
   waited), then the connect path, else PSI-only "unknown".
4. Culprits are ranked by the share of the victim's wait during which they ran on its CPU (the
   runqlat victim x culprit matrix), blended with a CPI2-style correlation of their CPU use with the
   victim's latency; for global reclaim, by memory growth. The victim and idle time are never culprits.
5. Decisions for the actuators (suppress the top BE culprit, and with it the other BE culprits that
   ran while the victim waited; burst a self-throttled LS victim; evict a BE culprit of global
   reclaim) go to the DecisionSink when the incident opens or its cause or top culprit changes, each
   with the victim's signal over its breach as what its verification compares with. The actuators
   apply their own limits, cooldowns and verification.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from detector import causes
from detector.baseline import Baselines
from detector.catalog import BASELINE_SIGNALS, SLO_SIGNALS
from detector.counterfactual import Counterfactuals, with_kernel_work
from detector.decisions import (
    ActionKind,
    Cause,
    Decision,
    DecisionSink,
    LoggingSink,
    SuppressAmount,
    Target,
)
from detector.model import Culprit, CulpritCost, Evidence, Incident, TaskShare
from detector.policy import Policy
from detector.signals import CONTEXT_SIGNALS, IDLE, UNKNOWN, NodeSignals, WorkloadSignals
from detector.store import SignalStore
from detector.workloads import key_of

log = logging.getLogger(__name__)

CULPRIT_MIN_SCORE = 0.0  # a culprit must score above this (a zero score blames nobody)
CULPRIT_WINDOW_TICKS = 10  # who-ran-instead shares are summed over this many recent ticks
CONNECT_WINDOW_TICKS = 5  # connect failures/retransmits/p99 are judged over this many recent ticks
MAX_CULPRITS = 5
# A different cause decided on this many breach ticks in a row (and not taken at once: it was less sure
# than the first) closes the incident and opens one for it: a victim whose situation changed (its own
# sidecar began to spin after a neighbour) never keeps the first story for more than a few ticks.
CAUSE_CHANGE_TICKS = 3
CAUSE_CHANGED = "incident.cause_changed"  # the closed incident's finding: its successor has another cause
MAX_CLOSED_KEPT = 1000
# The victim signals the actuators verify an action with (Decision.victim_signal; lower is better):
# every cause's (CauseSpec.verify_signals).
VERIFY_SIGNALS = tuple(dict.fromkeys(name for s in causes.CAUSES for name in s.verify_signals))


@dataclass
class _VictimState:
    breach_ticks: int = 0
    clear_ticks: int = 0
    incident: Incident | None = None
    recent_ran_instead: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    recent_wait_ns: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    recent_own_wait_ns: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    recent_own_by_container: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    recent_steal_ns: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    # ns of its waits the node's kernel work ran in (softirq work, kernel threads: the node pair's cf_node_ns)
    recent_kernel_work_ns: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    # The verify signals of its breach ticks (the current breach, or the open incident's): what the
    # incident's actions are verified against (Incident.breach_signals).
    breach_signals: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    # Who ran instead of it on each of those breach ticks (workload keys): a step on a culprit is verified
    # against the breach ticks the culprit ran on, not ticks before it came (cpu-neighbor-shared after a
    # breach behind another pod: a cpuset judged against 4 ticks before the hog, "-20 %", was undone).
    breach_ran: deque = field(default_factory=lambda: deque(maxlen=CULPRIT_WINDOW_TICKS))
    # (cause, top culprit, within its request, BE culprits that may be moved) the last decisions were made for
    decided: tuple | None = None
    # Another cause than the open incident's, and the breach ticks in a row it was decided on.
    other_cause: tuple[Cause, int] | None = None
    incident_ticks: int = 0  # breach ticks of the open incident since it opened
    cpus: tuple[int, ...] = ()  # CPUs the victim ran on lately (weight > 5 %), for a cpuset suppress
    # (failed connects, SYN retransmits, connect p99 ns) per recent tick: connect trouble is sparse
    # (a client blocked 1-3 s in a SYN retry makes one event every few ticks), so it is judged over a window.
    recent_connect: deque = field(default_factory=lambda: deque(maxlen=CONNECT_WINDOW_TICKS))


@dataclass(frozen=True)
class Breach:
    signal: str
    value: float
    threshold: float
    baseline: float | None = None
    rule: str = "slo"  # "slo" | "k_sigma"


class IncidentEngine:
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
        self.cpu_request = cpu_request  # workload key -> its CPU request in cores (None: unknown)
        self.slo = self.policy.slo
        self.sink = sink or LoggingSink()
        self.store = store or SignalStore()
        self.baselines = baselines or Baselines(min_samples=self.slo.min_baseline_samples)
        self.on_incident = list(on_incident)
        self.clock = clock
        self.victims: dict[str, _VictimState] = {}
        self.closed: deque[Incident] = deque(maxlen=MAX_CLOSED_KEPT)
        self.ticks = 0
        self._breach_ticks_needed = max(1, math.ceil(self.slo.breach_seconds / max(self.policy.interval_seconds, 1e-3)))
        self._log_path = self.policy.incident_log
        # workload key -> Target as last seen: rows come only for workloads that moved, and a culprit
        # idle this tick is still named by its cgroup (forgotten with the workload when it goes)
        self.targets: dict[str, Target] = {}
        self._online_cpus: tuple[int, ...] = ()
        self._forgot_for: frozenset[str] | None = None  # the workload list the last forgetting was done for
        self.listen_join = None  # a detector.listen_join.ListenJoin when listen queues are read (the agent)
        self.counterfactual = Counterfactuals()  # each culprit's cost to each victim, per wait
        # The node's own processes outside any pod: its workload key (the root cgroup; tests name a cgroup
        # of their own, never touching the root) and its top commands (detector/node_tasks.py, wired by
        # detector/runtime.py: none without a host to read).
        self.node_key = causes.ROOT_CGROUP
        self.node_tasks: Callable[[str], tuple[TaskShare, ...]] = lambda key: ()

    # -- public ---------------------------------------------------------------------------------
    @property
    def open_incidents(self) -> list[Incident]:
        return [s.incident for s in self.victims.values() if s.incident is not None]

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
        state = self.victims.setdefault(key, _VictimState())
        total_wait_ns = row.runq_wait_ms_per_s * 1e6 * row.interval_s
        state.recent_ran_instead.append(dict(row.ran_instead_ns))
        state.recent_wait_ns.append(total_wait_ns)
        state.recent_own_wait_ns.append(row.own_wait_ns)
        state.recent_own_by_container.append(row.own_wait_by_container)
        state.recent_steal_ns.append(row.steal_ms_per_s * 1e6 * row.interval_s)
        state.recent_kernel_work_ns.append(row.cf_node_ns.get(self.node_key, 0.0))
        self.counterfactual.add(key, row.runq_hist, row.interval_s, row.cf_moves, row.ran_instead_ns,
                                row.cf_node_moves, row.cf_node_ns)
        dt = row.interval_s
        state.recent_connect.append((row.connect_failures_per_s * dt, row.syn_retransmits_per_s * dt,
                                     row.connect_p99_ns if row.connects else 0.0))
        breaches = self._breaches(key, row, state)
        state.cpus = tuple(sorted(c for c, w in row.cpu_weights.items() if w > 0.05))
        learning = state.incident is None and not breaches
        for name in BASELINE_SIGNALS:
            v = values.get((key, name), math.nan)
            if not math.isnan(v):
                self.baselines.update(key, name, v, learning=learning)
        if breaches:
            state.breach_ticks += 1
            state.clear_ticks = 0
            state.breach_signals.append(_verify_values(row))
            state.breach_ran.append(frozenset(k for k, ns in row.ran_instead_ns.items() if ns > 0))
        else:
            state.breach_ticks = 0
            state.clear_ticks += 1
            if state.incident is None:
                state.breach_signals.clear()  # a breach that opened nothing is not the next one's level
                state.breach_ran.clear()
        inc = state.incident
        if inc is None and breaches and state.breach_ticks >= self._breach_ticks_needed:
            return [self._open(key, row, state, breaches, signals, now)]
        if inc is not None and breaches:
            successor = self._update(inc, key, row, state, breaches, signals, now)
            return [inc] if successor is None else [inc, successor]
        if inc is not None and state.clear_ticks >= self.slo.clear_windows:
            self._close(state, now)
            return [inc]
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
        for key in [k for k in self.victims if k not in signals.workloads]:
            state = self.victims[key]
            if key not in present:
                del self.victims[key]
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
        return touched

    def close(self) -> None:
        now = self.clock()
        for state in self.victims.values():
            if state.incident is not None:
                self._close(state, now, note="agent stopped")

    # -- breach rules ---------------------------------------------------------------------------
    def _breaches(self, key: str, row: WorkloadSignals, state: _VictimState) -> list[Breach]:
        slo = self.slo
        out: list[Breach] = []

        window = list(state.recent_connect)
        for sig in SLO_SIGNALS:  # catalog order; each SLO's gate says whether this tick's reading counts
            value = sig.breach_value(row, window)
            threshold = sig.threshold(slo)
            if value is None or math.isnan(value) or threshold is None:
                continue
            if value > threshold:
                out.append(Breach(sig.name, value, threshold, self._baseline_value(key, sig.name)))
                continue
            if not sig.k_sigma or value < threshold / 2:
                continue
            score = self.baselines.score(key, sig.name, value)
            if score is not None and score > slo.k_sigma:
                out.append(Breach(sig.name, value, threshold, self._baseline_value(key, sig.name), rule="k_sigma"))
        failed = sum(f for f, _, _ in window)
        retransmits = sum(r for _, r, _ in window)
        # SYNs dropped (each retransmit is a second or more added to a connect) and connects given up,
        # or SYNs dropped again and again: the connect path is broken.
        if retransmits >= 2 or (retransmits >= 1 and failed >= 1):
            out.append(Breach("syn_retransmits_per_s", retransmits / (len(window) * row.interval_s), 0.0,
                              rule=f"{failed:.0f} failed, {retransmits:.0f} SYN retransmits in {len(window)} ticks"))
        return out

    def _baseline_value(self, key: str, signal: str) -> float | None:
        b = self.baselines.get(key, signal)
        return None if b is None or b.n < self.slo.min_baseline_samples else b.ewma

    # -- cause and culprits ---------------------------------------------------------------------
    def _diagnose(
        self, key: str, row: WorkloadSignals, state: _VictimState, breaches: list[Breach], signals: NodeSignals
    ) -> tuple[Cause, float, list[Culprit], list[Evidence], list[str]]:
        """The cause rules (``detector.causes``), ranked by the share of the wait each explains; the
        evidence is the breaches, the victim's context (wait, throttling, softirq, reclaim) and what the
        deciding rule used; the findings are the deciding rule's and every cause's context codes of this
        tick."""
        dt = row.interval_s
        ran, total_wait = self._recent_ran_instead(state)
        foreign = {k: v for k, v in ran.items() if k not in (IDLE, UNKNOWN, key)}
        ctx = causes.CauseContext(
            key=key, row=row, signals=signals, slo=self.slo, breached={b.signal for b in breaches},
            foreign=foreign, own_wait_ns=sum(state.recent_own_wait_ns), total_wait_ns=total_wait,
            own_by_container=_summed(state.recent_own_by_container), steal_ns=sum(state.recent_steal_ns),
            window_s=dt * len(state.recent_wait_ns), cpu_culprits=self._cpu_culprits,
            correlation_culprits=self._correlation_culprits, reclaim_culprits=self._reclaim_culprits,
            connect_servers=self._connect_servers, node_key=self.node_key,
            kernel_work_ns=sum(state.recent_kernel_work_ns),
        )
        verdict = causes.decide(ctx)
        culprits = verdict.culprits
        kernel_work = causes.spec(verdict.cause).kernel_work
        if kernel_work:
            culprits = with_kernel_work(culprits, lambda c: self.counterfactual.cost(key, key_of(c.target), True),
                                        kernel_work)
        evidence = [
            Evidence(b.signal, b.value, dt, threshold=b.threshold, baseline=b.baseline, note=b.rule) for b in breaches
        ]
        context = [Evidence("runq_wait_ms_per_s", row.runq_wait_ms_per_s, dt)]
        if row.throttled_ms_per_s is not None:
            quota = "no quota" if row.quota_cores is None else f"quota {row.quota_cores:.2f} cores"
            context.append(Evidence("throttled_ms_per_s", row.throttled_ms_per_s, dt,
                                    note=f"throttled ratio {row.throttled_ratio or 0:.2f}, {quota}"))
        if row.who_ran_instead_available:
            context.append(Evidence("who_ran_instead_foreign_share", ctx.foreign_share, ctx.window_s))
        for spec in CONTEXT_SIGNALS:  # the probe plugins' (SignalSpec.context_note)
            if value := getattr(row, spec.name):
                context.append(Evidence(spec.name, value, dt, note=spec.context_note(row)))  # type: ignore[misc]
        if row.reclaim_stall_ms_per_s:
            context.append(Evidence("reclaim_stall_ms_per_s", row.reclaim_stall_ms_per_s, dt,
                                    note=", ".join(f"{k} {v:.1f}" for k, v in sorted(row.reclaim_by_kind_ms_per_s.items()))))
        used = {e.signal for e in verdict.evidence}
        evidence += [e for e in context if e.signal not in used] + list(verdict.evidence)
        findings = [*verdict.findings, *(f for spec in causes.CAUSES if spec.context for f in spec.context(row))]
        return verdict.cause, verdict.confidence, culprits, evidence, findings

    def _kernel_work_cost(self, key: str, cause: Cause) -> CulpritCost | None:
        """The victim without the kernel work its cause declares (None: it declares none)."""
        return self.counterfactual.kernel_work_cost(key) if causes.spec(cause).kernel_work else None

    def _connect_servers(self, key: str) -> tuple[list[Culprit], list[Evidence]]:
        """The servers whose full accept queues a victim's connects went to (detector/listen_join.py)."""
        return self.listen_join.servers_for(key) if self.listen_join is not None else ([], [])

    @staticmethod
    def _recent_ran_instead(state: _VictimState) -> tuple[dict[str, float], float]:
        ran: dict[str, float] = defaultdict(float)
        for tick in state.recent_ran_instead:
            for k, v in tick.items():
                ran[k] += v
        return ran, sum(state.recent_wait_ns)

    def _cpu_culprits(self, key: str, foreign: dict[str, float], total_wait: float) -> list[Culprit]:
        if not foreign or total_wait <= 0:
            return []
        foreign_total = sum(foreign.values())
        culprits = []
        for ck, ns in foreign.items():
            share = ns / total_wait
            corr = self.store.correlation(ck, "cpu_cores", key, "runq_p99_ns", 60.0)
            score = 0.8 * (ns / foreign_total) + 0.2 * max(corr or 0.0, 0.0)
            cost = self.counterfactual.cost(key, ck)
            tasks = self.node_tasks(ck) if ck == self.node_key else ()
            culprits.append(self._judged(Culprit(
                self._target(ck), round(score, 4), who_ran_instead_share=round(share, 4),
                correlation=round(corr or 0.0, 4), cpu_cores=self._last(ck, "cpu_cores"),
                **({} if ck != self.node_key else {"tasks": tasks, "note": _node_note(share, tasks)}),
                **({} if cost is None else {
                    "victim_runq_p99_ns": round(cost.p99_ns), "runq_p99_without_ns": round(cost.p99_without_ns),
                    "victim_wait_ms_per_s": round(cost.wait_ms_per_s, 3),
                    "wait_ms_per_s_without": round(cost.wait_ms_per_s_without, 3)}))))
        return self._ranked(culprits)

    def _correlation_culprits(self, key: str, signals: NodeSignals) -> list[Culprit]:
        """No who-ran-instead matrix (tp_btf/raw_tp flavours): CPI2-style, suspects' CPU use vs victim latency."""
        culprits = []
        for ck, row in signals.workloads.items():
            if ck == key or row.cpu_cores is None or row.cpu_cores < 0.25:  # CPI2 ignores < 0.25 CPU
                continue
            if not set(row.cpu_weights) & set(signals.workloads[key].cpu_weights):
                continue
            corr = self.store.correlation(ck, "cpu_cores", key, "runq_p99_ns", 60.0) or 0.0
            score = min(1.0, row.cpu_cores) * (0.5 + 0.5 * max(corr, 0.0))
            culprits.append(self._judged(Culprit(self._target(ck), round(score, 4), correlation=round(corr, 4),
                                                 cpu_cores=round(row.cpu_cores, 4))))
        return self._ranked(culprits)

    def _judged(self, c: Culprit) -> Culprit:
        """The culprit with its CPU request and whether it used more than that (pods with a spec)."""
        key = key_of(c.target)
        request = self.cpu_request(key)
        if request is None:
            return c
        if request == 0 and c.who_ran_instead_share > 0:  # it asked for no CPU, and ran while the victim waited
            return replace(c, cpu_request_cores=0.0, above_request=True, note=f"above its request: it requests no CPU "
                           f"and ran {c.who_ran_instead_share:.0%} of the victim's wait")
        stats = self.store.stats(key, "cpu_cores", 10.0)
        if stats.empty or stats.last is None or math.isnan(stats.last):
            # A pod that just started has no CPU use measured yet (two reads of its cpu.stat): not
            # "within its request", which would rank it after every pod above theirs.
            return replace(c, cpu_request_cores=round(request, 4), note="CPU use not measured yet")
        above = c.cpu_cores > request
        note = f"above its request ({c.cpu_cores:.2f} of {request:.2f} cores)" if above \
            else f"busy within its request ({c.cpu_cores:.2f} of {request:.2f} cores)"
        return replace(c, cpu_request_cores=round(request, 4), above_request=above, note=note)

    @staticmethod
    def _ranked(culprits: list[Culprit]) -> list[Culprit]:
        """Culprits above their request (or whose request is unknown) first, each group by score; zero
        scores are never culprits. The node (its processes outside pods) is one when it ran instead, named
        with its top commands: a neighbour cause always names whom it blames (never acted on: not BE)."""
        kept = [c for c in culprits if c.score > CULPRIT_MIN_SCORE]
        kept.sort(key=lambda c: (c.above_request is False, -c.score, c.target.cgroup))
        return kept[:MAX_CULPRITS]

    def _reclaim_culprits(self, key: str, row: WorkloadSignals, signals: NodeSignals,
                          global_reclaim: bool | None = None) -> list[Culprit]:
        """Global reclaim: the pods by the memory they hold plus what they grew over the last minute (in
        bytes, so a small pod's small growth does not outrank the pod that fills the node); memcg reclaim
        is the pod's own. ``global_reclaim`` None: global when the victim stalled in direct (not memcg)
        reclaim.

        Growth alone misses the usual grower: once the node is full, kswapd takes its pages as fast as
        it charges new ones, so its usage is flat by the time reclaim hurts anyone (and memory.stat of
        an active pod is read every few ticks, so its first reading may already be on that plateau)."""
        if global_reclaim is None:
            global_reclaim = row.reclaim_by_kind_ms_per_s.get("direct", 0.0) > 0
        if not global_reclaim:
            return []
        growth: dict[str, float] = {}
        held: dict[str, float] = {}
        for ck in signals.workloads:
            if ck == key:
                continue
            w = self.store.window(ck, "memory_bytes", 60.0).values
            if len(w) == 0:
                continue
            held[ck] = max(float(w[-1]), 0.0)
            if len(w) >= 2 and w[-1] > w[0]:
                growth[ck] = float(w[-1] - w[0])
        weight = {ck: held[ck] + growth.get(ck, 0.0) for ck in held}
        total = sum(weight.values())
        culprits = []
        for ck in held:
            share = weight[ck] / total if total > 0 else 0.0
            culprits.append(Culprit(self._target(ck), round(share, 4), attribution=round(share, 4),
                                    cpu_cores=self._last(ck, "cpu_cores"),
                                    note=f"grew {growth.get(ck, 0.0) / 2**20:.0f} MiB in the last minute, "
                                         f"holds {held[ck] / 2**20:.0f} MiB"))
        kept = [c for c in culprits if c.target.cgroup != "/" and c.score > CULPRIT_MIN_SCORE]
        kept.sort(key=lambda c: (-c.score, c.target.cgroup))
        return kept[:MAX_CULPRITS]

    def _last(self, entity: str, signal: str) -> float:
        s = self.store.stats(entity, signal, 10.0)
        return 0.0 if s.empty or s.last is None or math.isnan(s.last) else round(float(s.last), 4)

    def _target(self, key: str) -> Target:
        return self.targets.get(key) or Target(key)

    # -- lifecycle ------------------------------------------------------------------------------
    def _open(self, key, row, state, breaches, signals, now, follows: str | None = None,
              incident_id: str | None = None) -> Incident:
        cause, confidence, culprits, evidence, findings = self._diagnose(key, row, state, breaches, signals)
        inc = Incident(
            incident_id=incident_id or _new_incident_id(),
            follows=follows,
            victim=row.workload.target,
            cause=cause,
            started_at=now,
            confidence=round(confidence, 3),
            signal=breaches[0].signal,
            culprits=culprits,
            evidence=evidence,
            updated_at=now,
            findings=findings,
            kernel_work_cost=self._kernel_work_cost(key, cause),
            breach_signals=_medians(state.breach_signals),
            victim_cpus=list(state.cpus),
        )
        state.incident = inc
        log.warning("incident %s opened: %s %s, culprits %s", inc.incident_id, inc.victim.display, cause,
                    [c.target.display for c in culprits[:3]])
        self._emit(inc, "opened")
        self._decide(inc, state)
        inc.moved_together_cost = self._moved_together_cost(key, inc)
        return inc

    def _update(self, inc, key, row, state, breaches, signals, now) -> Incident | None:
        """The open incident on a breach tick; its successor when its cause changed (None: it stands)."""
        cause, confidence, culprits, evidence, findings = self._diagnose(key, row, state, breaches, signals)
        # A cause seen with more confidence replaces the first guess; evidence is the latest window.
        # "The node's own processes ran instead" (neighbor_cpu naming no pod) is the weakest account:
        # it never replaces a cause that named the pods behind it (kswapd is a root-cgroup thread; once
        # the grower is capped, what remains is the node's usual noise, not a new cause).
        nodes_own = cause == Cause.NEIGHBOR_CPU and all(self._is_node(c) for c in culprits) \
            and any(not self._is_node(c) for c in inc.culprits)
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
                return self._change_cause(inc, key, row, state, breaches, signals, now, cause, why)
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
        inc.kernel_work_cost = self._kernel_work_cost(key, inc.cause)
        inc.breach_signals = _medians(state.breach_signals)
        inc.victim_cpus = list(state.cpus)
        inc.updated_at = now
        self._emit(inc, "updated")
        self._decide(inc, state)
        inc.moved_together_cost = self._moved_together_cost(key, inc)
        return None

    def _change_cause(self, inc, key, row, state, breaches, signals, now, cause: Cause, why: str) -> Incident:
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
        return self._open(key, row, state, breaches, signals, now, follows=inc.incident_id, incident_id=successor_id)

    def _close(self, state: _VictimState, now: float, note: str = "") -> None:
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
        if self._log_path and what != "updated":
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
    def _decide(self, inc: Incident, state: _VictimState) -> None:
        """The cause's step, when what it decides on changed: the top culprit, whether it is within its
        request, or the BE culprits that ran while the victim waited above their requests (a hog that
        starts on the victim's CPU after the step, or goes past its request, is moved the tick it is
        seen, not once the top changes). An incident submits a step on a pod once: what follows a step
        that did not help is the planner's ladder, not the same step again."""
        # The top culprit that may be acted on: the node's own processes are named, never moved.
        top = next((c for c in inc.culprits if not self._is_node(c)), None)
        movable = frozenset(c.target.cgroup for c in inc.culprits
                            if c.target.qos == "BE" and c.above_request is not False and c.who_ran_instead_share > 0)
        key = (inc.cause, top.target.cgroup if top else None, top is not None and top.above_request is False, movable)
        if key == state.decided:
            return
        state.decided = key
        spec = causes.spec(inc.cause)
        step = None if spec.act is None else spec.act(
            inc, top, causes.ActContext(self.policy, lambda culprit: self._suppress_amount(culprit, state),
                                        spec.verify_signal(inc)))
        done = set(inc.actions)
        decisions = [d for d in (step if isinstance(step, list) else [step] if step is not None else [])
                     if f"{d.kind}:{d.target.display}" not in done]
        for d in decisions:
            inc.actions.append(f"{d.kind}:{d.target.display}")
            self.sink.submit(inc.for_verification(self._since_culprit(d, state)))
        moved = [d.target for d in decisions if d.kind == ActionKind.SUPPRESS]
        if len(moved) > 1:
            inc.moved_together = moved

    @staticmethod
    def _since_culprit(d: Decision, state: _VictimState) -> Decision:
        """``d`` verified against the victim's signal over the breach ticks its target ran instead of it
        (the incident's breach level when it ran on none of them, or the decision watches another)."""
        ticks = [v for v, ran in zip(state.breach_signals, state.breach_ran, strict=False)
                 if key_of(d.target) in ran]
        before = _medians(ticks).get(d.victim_signal) if ticks and d.victim_before is None else None
        return d if before is None else replace(d, victim_before=before)

    def _is_node(self, c: Culprit) -> bool:
        return key_of(c.target) == self.node_key

    def _moved_together_cost(self, key: str, inc: Incident) -> CulpritCost | None:
        """The victim without all the culprits the incident's step moved together (None: fewer than two)."""
        if len(inc.moved_together) < 2:
            return None
        return self.counterfactual.cost_of_set(key, [key_of(t) for t in inc.moved_together])

    def _suppress_amount(self, culprit: Culprit, state: _VictimState) -> SuppressAmount:
        """cpuset policy: the culprit keeps every CPU but the victim's (isolation is what brings a p99
        back: a cfs quota only shortens the culprit's bursts, during which the victim waits as before).
        Where that would leave fewer CPUs than the floor, or the policy is cfsQuota: half its CPU use."""
        rt = self.policy.resource_threshold
        if rt.cpu_suppress_policy == "cpuset" and self._online_cpus and state.cpus:
            others = tuple(c for c in self._online_cpus if c not in state.cpus)
            if others and len(others) >= max(1, rt.cpu_suppress_min_cpus):
                return SuppressAmount(policy="cpuset", cpus=others)
        return SuppressAmount(policy="cfs_quota", cpu_cores=max(0.1, round((culprit.cpu_cores or 1.0) * 0.5, 2)))

    def signals_for_verify(self, signals: NodeSignals) -> dict[str, float]:
        """The verify signals of the victims an action may be being verified for, keyed as
        DecisionSink.observe expects: by the victim's cgroup (``Decision.victim``), not by its workload
        key (a pod's is "pod:<uid>"). Those are the victims in a breach or an incident, on the tick it
        closed and ``verify_intervals`` ticks after (a verification runs that long after its action, which
        came while the incident was open); the others have nothing being verified, so per-tick work
        follows the incidents, not the pod count (each decision carries its own baseline). A stall of 0
        is a value: a victim whose reclaim stopped after a cap must be seen to have improved."""
        # clean ticks in a row: clear_windows of them close the incident, then the verification's
        horizon = self.slo.clear_windows + max(1, self.policy.actuators.verify_intervals)
        out = {}
        for key, row in signals.workloads.items():
            state = self.victims.get(key)
            if state is None or (state.incident is None and state.clear_ticks > horizon):
                continue
            cgroup = row.workload.target.cgroup
            for name, value in _verify_values(row).items():
                out[f"{cgroup}:{name}"] = value
        return out


def _node_note(share: float, tasks: tuple[TaskShare, ...]) -> str:
    """How the node reads as a culprit: its share of the victim's wait and its top commands."""
    said = ", ".join(f"{t.comm} (pid {t.pid}) {t.cpu_share:.0%}" for t in tasks)
    return (f"the node's own processes outside pods ran {share:.0%} of its wait"
            + (f"; by their CPU time: {said}" if said else ""))


def _new_incident_id() -> str:
    return f"nn-{uuid.uuid4().hex[:12]}"


def _verify_values(row: WorkloadSignals) -> dict[str, float]:
    """The row's VERIFY_SIGNALS (a run-queue p99 only where it waited)."""
    return {name: float(getattr(row, name)) for name in VERIFY_SIGNALS if name != "runq_p99_ns" or row.runq_count}


def _medians(ticks: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each signal's median over the ticks that have it."""
    values: dict[str, list[float]] = defaultdict(list)
    for tick in ticks:
        for k, v in tick.items():
            values[k].append(v)
    return {k: statistics.median(v) for k, v in values.items()}


def _summed(ticks: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for tick in ticks:
        for k, v in tick.items():
            out[k] += v
    return dict(out)
