# SPDX-License-Identifier: Apache-2.0
"""Eviction actuator: BE pods out through the Kubernetes Eviction API, PDB-aware, never a raw kill.

Koordlet stops containers through the runtime and so ignores PodDisruptionBudgets (its issue
#1757); we POST a policy/v1 ``Eviction`` (``CoreV1Api.create_namespaced_pod_eviction``), which the
apiserver refuses with 429 while a PDB would be violated. That is the only API call this module
makes; pods and usage come from callables the agent already has (its pod source and probes).

Victims, best first: the incident's culprit score (higher first), then the
``koordinator.sh/eviction-priority`` annotation (lower first; pods without it after those with it),
then spec priority (lower first), then usage (higher first: CPU, or memory for memory evictions).
Only BE pods are candidates unless the decision's target names another QoS class or one pod.

How much to evict (:class:`~detector.decisions.EvictAmount`): pods are taken in order until their
release reaches the target. Pods still terminating (``deletionTimestamp`` set) count against the
target first, so a slow-terminating pod is not "replaced" by another eviction every round
(koordinator PR #3137: over-eviction). A pod's release is its CPU request for ``cpu_satisfaction``
(koordlet's unit), its memory usage for ``memory_threshold`` and its CPU usage for
``interference``; an ``interference`` decision with no amount evicts the top candidate only.

Limits: a per-node rate limit (``evictions_per_minute`` pods in any 60 s) and a cooldown per trigger
after an eviction (CPU 20 s, memory 4 s, koordlet's defaults); the clock is injectable. A 429 is
recorded and the next candidate is tried; the PDB-blocked pod is skipped by later plans for
``pdb_backoff_seconds``. A 404 means the pod is already gone (recorded, not counted).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actuators.base import ActionError, ApiCall, Plan, Refused
from detector.decisions import ActionKind, Decision, EvictAmount, Target
from detector.pods import PodInfo
from detector.policy import ActuatorPolicy

log = logging.getLogger("noisyneighbor.actuators.evict")

REASONS = ("interference", "cpu_satisfaction", "memory_threshold")
_NO_EVICTION_PRIORITY = math.inf  # pods without the annotation go after annotated ones


# -- records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodUsage:
    cpu_cores: float = 0.0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: PodInfo
    score: float
    usage: PodUsage
    release: float  # in the unit of the decision's reason (cores or bytes)


@dataclass(frozen=True, slots=True)
class EvictionAttempt:
    pod: str  # namespace/name
    uid: str
    outcome: str  # evicted | pdb_blocked | gone | error | rate_limited | already_terminating | not_reverted
    code: int | None
    message: str
    at: float


@dataclass(slots=True)
class _PlanDetail:
    reason: str
    target: float  # total release asked for
    releasing: float  # counted from pods already terminating
    candidates: list[Candidate] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    released: float = 0.0


def _fmt(amount: float, reason: str) -> str:
    return f"{amount / 2**20:.0f} MiB" if reason == "memory_threshold" else f"{amount:.2f} cores"


# -- the actuator -----------------------------------------------------------------------------


class EvictActuator:
    kind = ActionKind.EVICT

    def __init__(
        self,
        api_client: object,
        pods: Callable[[], Iterable[PodInfo]],
        usage: Callable[[PodInfo], PodUsage] | Mapping[str, PodUsage] | None = None,
        policy: ActuatorPolicy | None = None,
        *,
        scores: Callable[[Decision], Mapping[str, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pdb_backoff_seconds: float = 30.0,
        request_timeout_seconds: float = 10.0,
        keep_attempts: int = 1000,
    ) -> None:
        self._api_client = api_client
        self.pods = pods
        self._usage = usage
        self.policy = policy or ActuatorPolicy()
        self.scores = scores or (lambda decision: {})
        self.clock = clock
        self.pdb_backoff_seconds = pdb_backoff_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.attempts: deque[EvictionAttempt] = deque(maxlen=keep_attempts)
        self._evicted_at: deque[float] = deque()  # per-node rate limit window
        self._last_eviction: dict[str, float] = {}  # trigger reason -> time of its last eviction
        self._pdb_blocked: dict[str, float] = {}  # pod uid -> until
        self._details: dict[int, _PlanDetail] = {}

    # -- helpers -------------------------------------------------------------------------------
    @functools.cached_property
    def core(self) -> Any:
        """CoreV1Api, built by :meth:`prepare` or at the first eviction: the generated client costs ~19 MiB
        of RSS, which a node that never evicts never needs to pay."""
        from kubernetes import client

        return client.CoreV1Api(self._api_client)

    def prepare(self) -> None:
        """Load the client now, where eviction is enabled. Loaded at the first eviction instead, its
        modules were read from disk while the node was short of memory, which is when evictions for
        global reclaim happen: in the scenario bench (--evict), the first eviction of a run came 10 s late,
        and every later run's at once."""
        from kubernetes.client import V1Eviction  # noqa: F401  (_evict's model)
        from kubernetes.client.exceptions import ApiException  # noqa: F401

        _ = self.core

    def usage_of(self, pod: PodInfo) -> PodUsage:
        if self._usage is None:
            return PodUsage()
        if isinstance(self._usage, Mapping):
            return self._usage.get(pod.uid, PodUsage())
        return self._usage(pod)

    def cooldown_seconds(self, reason: str) -> float:
        if reason == "memory_threshold":
            return self.policy.memory_evict_cooldown_seconds
        return self.policy.cpu_evict_cooldown_seconds

    def _budget(self, now: float) -> int:
        while self._evicted_at and now - self._evicted_at[0] >= 60.0:
            self._evicted_at.popleft()
        return max(0, self.policy.evictions_per_minute - len(self._evicted_at))

    def _release_of(self, pod: PodInfo, usage: PodUsage, reason: str) -> float:
        if reason == "cpu_satisfaction":
            return pod.cpu_request_cores
        if reason == "memory_threshold":
            return float(usage.memory_bytes or pod.memory_request_bytes)
        return usage.cpu_cores

    def _sort_key(self, c: Candidate, reason: str) -> tuple[float, float, float, float]:
        eviction_priority = c.pod.eviction_priority
        by_usage = c.usage.memory_bytes if reason == "memory_threshold" else c.usage.cpu_cores
        return (-c.score, _NO_EVICTION_PRIORITY if eviction_priority is None else eviction_priority,
                c.pod.priority or 0, -by_usage)

    def _allowed(self, pod: PodInfo, target: Target) -> bool:
        if target.pod_uid:
            return pod.uid == target.pod_uid
        wanted = target.qos if target.qos and target.qos != "BE" else "BE"
        return pod.qos_class == wanted

    # -- plan ----------------------------------------------------------------------------------
    def plan(self, decision: Decision) -> Plan:
        amount = decision.amount
        if decision.kind != ActionKind.EVICT or not isinstance(amount, EvictAmount):
            raise Refused(f"evict: cannot carry out a {decision.kind} decision")
        reason = amount.reason
        if reason not in REASONS:
            raise Refused(f"evict: unknown reason {reason!r} (one of {', '.join(REASONS)})")
        now = self.clock()
        last = self._last_eviction.get(reason)
        cooldown = self.cooldown_seconds(reason)
        if last is not None and now - last < cooldown:
            raise Refused(f"evict: {reason} cooldown, last eviction {now - last:.1f} s ago (< {cooldown:g} s)")
        budget = self._budget(now)
        if budget == 0:
            raise Refused(f"evict: rate limit, {self.policy.evictions_per_minute} pod(s) evicted in the last minute")
        target = amount.release_memory_bytes if reason == "memory_threshold" else amount.release_cpu_cores
        if target < 0 or math.isnan(target):
            raise Refused(f"evict: bad release amount {target!r}")
        scores = self.scores(decision)
        pods = [p for p in self.pods() if self._allowed(p, decision.target)]
        terminating = [p for p in pods if p.terminating]
        releasing = sum(self._release_of(p, self.usage_of(p), reason) for p in terminating)
        self._pdb_blocked = {uid: until for uid, until in self._pdb_blocked.items() if until > now}
        candidates = [Candidate(p, float(scores.get(p.uid, 0.0)), u, self._release_of(p, u, reason))
                      for p in pods if not p.terminating and p.uid not in self._pdb_blocked
                      for u in (self.usage_of(p),)]
        candidates.sort(key=lambda c: self._sort_key(c, reason))
        if target > 0 and releasing >= target:
            raise Refused(f"evict: {len(terminating)} terminating pod(s) already release {_fmt(releasing, reason)} "
                          f">= {_fmt(target, reason)}")
        if not candidates:
            blocked = len([p for p in pods if p.uid in self._pdb_blocked])
            raise Refused(f"evict: no {decision.target.qos or 'BE'} pod to evict"
                          + (f" ({blocked} blocked by a PodDisruptionBudget recently)" if blocked else ""))
        picks: list[Candidate] = []
        released = releasing
        for c in candidates:
            if len(picks) >= budget or (target > 0 and released >= target) or (target == 0 and picks):
                break
            picks.append(c)
            released += c.release
        detail = _PlanDetail(reason, float(target), releasing, candidates)
        calls = tuple(self._call(c.pod) for c in picks)
        names = ", ".join(f"{c.pod.display} (score {c.score:.2f}, {_fmt(c.release, reason)})" for c in picks)
        summary = (f"evict {len(picks)} pod(s) for {reason}, target {_fmt(target, reason)}"
                   + (f", {len(terminating)} terminating already release {_fmt(releasing, reason)}" if terminating else "")
                   + f": {names}")
        plan = Plan(decision=decision, summary=summary, calls=calls, reversible=False)
        self._details[id(plan)] = detail
        return plan

    @staticmethod
    def _call(pod: PodInfo) -> ApiCall:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.name, "namespace": pod.namespace}}
        return ApiCall("POST", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction", body)

    # -- apply ---------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        """Evict in ranked order until the release target is met; a 429 moves on to the next candidate.

        Raises :class:`ActionError` only when no pod at all could be evicted.
        """
        detail = self._details.pop(id(plan), None)
        if detail is None:
            raise ActionError("evict: this plan was not made by this actuator")
        current = {p.uid: p for p in self.pods()}
        problems: list[str] = []
        released = detail.releasing
        for c in detail.candidates:
            if detail.target > 0 and released >= detail.target:
                break
            if detail.target == 0 and detail.evicted:
                break
            now = self.clock()
            pod = current.get(c.pod.uid)
            if pod is None:
                self._record(c.pod, "gone", None, "no longer on the node", now)
                continue
            if pod.terminating:
                self._record(pod, "already_terminating", None, "terminating since planning", now)
                released += c.release
                continue
            if self._budget(now) == 0:
                self._record(pod, "rate_limited", None, f"{self.policy.evictions_per_minute}/min reached", now)
                problems.append("rate limit reached")
                break
            code, message = self._evict(pod)
            now = self.clock()
            if code in (200, 201):
                self._record(pod, "evicted", code, message, now)
                self._evicted_at.append(now)
                self._last_eviction[detail.reason] = now
                detail.evicted.append(pod.display)
                released += c.release
            elif code == 429:
                self._record(pod, "pdb_blocked", code, message, now)
                self._pdb_blocked[pod.uid] = now + self.pdb_backoff_seconds
                problems.append(f"{pod.display}: 429 {message}")
            elif code == 404:
                self._record(pod, "gone", code, message, now)
            else:
                self._record(pod, "error", code, message, now)
                problems.append(f"{pod.display}: {code or 'no response'} {message}")
                if code is None:
                    break  # the apiserver is unreachable: do not walk the whole list
        detail.released = released
        if not detail.evicted and (detail.target == 0 or released < detail.target):
            raise ActionError("evict: no pod evicted" + (f" ({'; '.join(problems)})" if problems else ""))
        if detail.target > 0 and released < detail.target:
            log.warning("evict: released %s of %s for %s (%s)", _fmt(released, detail.reason),
                        _fmt(detail.target, detail.reason), detail.reason, "; ".join(problems) or "no more candidates")

    def _evict(self, pod: PodInfo) -> tuple[int | None, str]:
        from kubernetes import client  # at the first eviction: see `core`
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(
            api_version="policy/v1", kind="Eviction",
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            # Raw response: the apiserver answers with a Status, not an Eviction object.
            response = self.core.create_namespaced_pod_eviction(
                pod.name, pod.namespace, body, _preload_content=False, _request_timeout=self.request_timeout_seconds)
            return int(getattr(response, "status", 201)), "evicted"
        except ApiException as e:
            return int(e.status or 0) or None, _status_message(e)
        except Exception as e:  # connection refused, TLS, timeout: one line, never a traceback
            return None, " ".join(str(e).split())[:200] or type(e).__name__

    def _record(self, pod: PodInfo, outcome: str, code: int | None, message: str, now: float) -> None:
        attempt = EvictionAttempt(pod.display, pod.uid, outcome, code, message, now)
        self.attempts.append(attempt)
        log.info("eviction %s: %s (%s) %s", outcome, pod.display, code, message)

    # -- revert --------------------------------------------------------------------------------
    def revert(self, plan: Plan) -> None:
        """An eviction cannot be undone: recorded, nothing else (the plan says ``reversible=False``)."""
        now = self.clock()
        for call in plan.calls:
            meta = call.body.get("metadata", {})
            self.attempts.append(EvictionAttempt(f"{meta.get('namespace', '')}/{meta.get('name', '')}", "",
                                                 "not_reverted", None, "an eviction cannot be undone", now))
        log.info("evict: revert requested for '%s': evictions cannot be undone", plan.summary)


def _status_message(e: Exception) -> str:
    import json

    body = getattr(e, "body", None)
    try:
        doc = json.loads(body) if body else {}
    except (TypeError, ValueError):
        doc = {}
    message = doc.get("message") if isinstance(doc, dict) else None
    return " ".join(str(message or getattr(e, "reason", "") or e).split())[:300]
