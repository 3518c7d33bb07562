# SPDX-License-Identifier: Apache-2.0
"""What the detector asks the actuators to do: the one contract between detector/ and actuators/.

Data flows one way (probes -> detector -> actuators): the detector builds :class:`Decision` objects
and hands them to a :class:`DecisionSink`; the actuators package implements a sink. With no
actuators wired the agent uses :class:`LoggingSink`, so every decision is still visible.

A decision names its target by cgroup path (relative to the hierarchy root, the same string the
resolver, ``/proc/<pid>/cgroup`` and ``probes.cgroupfs`` use, e.g. ``/kubepods.slice/kubepods-besteffort.slice``;
``Hierarchy.path_of`` accepts it with or without the leading slash) and,
when known, by pod. Amounts are typed per action kind so an actuator never guesses units.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class ActionKind(StrEnum):
    SUPPRESS = "suppress"  # cap BE CPU (cfs quota or cpuset)
    EVICT = "evict"  # Kubernetes Eviction API on a pod
    BURST = "burst"  # cfs burst / quota scaling for a throttled LS pod
    RESCTRL = "resctrl"  # L3 CAT / MBA for a QoS group
    MEMORY_SUPPRESS = "memory_suppress"  # lower a BE pod's memory limit/high toward its usage


# A step judged "did not help" a victim (reverted) is not taken again on the same target for the same victim
# for this long, by any incident of that victim: an incident that closes while its culprit still runs (the
# victim stopped breaching for a few ticks) and opens again continues its ladder, it does not start over.
DID_NOT_HELP_MEMORY_S = 300.0


@dataclass(frozen=True, slots=True)
class Target:
    """A cgroup, and the pod it belongs to when there is one."""

    cgroup: str  # path relative to the hierarchy root, "/a/b" ("/" is the root)
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    qos: str | None = None  # koordinator class: SYSTEM, LSE, LSR, LS, BE (or None when unknown)

    @property
    def display(self) -> str:
        if self.pod:
            return f"{self.namespace}/{self.pod}" if self.namespace else self.pod
        return self.cgroup or "/"


@dataclass(frozen=True, slots=True)
class SuppressAmount:
    """Cap the target's CPU to ``cpu_cores`` (cfs_quota policy) or to ``cpus`` (cpuset policy)."""

    policy: str  # "cfs_quota" | "cpuset"
    cpu_cores: float | None = None
    cpus: tuple[int, ...] | None = None
    # The fewest CPUs a cpuset may leave (None: the policy's cpu_suppress_min_cpus). The neighbour ladder's
    # cpuset step after a quota that did not help sets 1: on a small node the policy's floor of 2 CPUs is
    # every CPU, and a BE pod left one CPU away from the victim beats one evicted.
    floor_cpus: int | None = None


@dataclass(frozen=True, slots=True)
class EvictAmount:
    """Release at least this much; the actuator picks pods in culprit-score order to reach it."""

    reason: str  # "interference" | "cpu_satisfaction" | "memory_threshold"
    release_cpu_cores: float = 0.0
    release_memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class BurstAmount:
    """Let a throttled LS cgroup burst: ``burst_us`` of cfs burst and/or quota scaled by ``quota_scale``."""

    burst_us: int | None = None
    quota_scale: float | None = None


@dataclass(frozen=True, slots=True)
class ResctrlAmount:
    """Resctrl group settings: L3 ways as [start, end] percent of the mask, MBA percent."""

    group: str  # "LSR" | "LS" | "BE"
    l3_start_percent: int = 0
    l3_end_percent: int = 100
    mba_percent: int = 100


@dataclass(frozen=True, slots=True)
class MemorySuppressAmount:
    """Cap a BE cgroup's memory at ``usage * (1 + headroom)`` (v1 limit_in_bytes, v2 memory.high), never
    below ``floor_bytes``: its growth stops driving global reclaim, which then hits it first."""

    headroom: float = 0.0
    floor_bytes: int = 64 * 1024 * 1024
    # Also lower the cap by what the node's free memory lacks above kswapd's watermark, from the pod's
    # page cache (actuators/memory.py): a cap at usage alone leaves the node in reclaim.
    give_back_to_node: bool = True


Amount = SuppressAmount | EvictAmount | BurstAmount | ResctrlAmount | MemorySuppressAmount


@dataclass(frozen=True, slots=True)
class Decision:
    kind: ActionKind
    target: Target
    amount: Amount
    reason: str  # one human line: why this action, with the number that triggered it
    incident_id: str | None = None  # the incident it serves (None for koordlet-style threshold policies)
    victim: Target | None = None  # whose signal verify/revert watches
    victim_signal: str | None = None  # e.g. "runq_p99_ns"; lower is better
    # The victim's signal while it breached its SLO, as the detector measured it (Incident.breach_signals):
    # what verification compares the signal after the action with. None: the manager's recent history of
    # the signal (which, for an action taken as the breach opens, holds the quiet ticks before it).
    victim_before: float | None = None
    created_at: float = field(default_factory=time.time)
    # A step of a closed loop already acting on this target for this incident (the burst loop's next
    # quota scale): the manager lets it through the per-target cooldown and carries the first step's
    # verification over, so the loop moves at tick pace while the action is judged as one.
    follow_up: bool = False
    # The outcome code of the cause's step that made it (detector/causes: e.g. "softirq.own_traffic"):
    # what the planner keys on, never the reason's wording.
    code: str | None = None
    # The codes of this incident's steps on the same target that this one goes with: while such a step is
    # being verified the manager applies this one, a different knob, on top and judges the two as one action
    # (one verdict for both, a revert undoes both), instead of refusing it until that verdict is in
    # (actuators/limits.py joins_verification: same incident, same victim, another knob; the manager
    # restarts the samples at the join and keeps the first step's baseline). Empty, as for most steps: a
    # step waits for the verdict on the target's step in place. Two users: softirq's traffic cap
    # (detector/causes/softirq.py MOVES_OFF_VICTIM_CPUS) goes with a move of the same pod off the victim's
    # CPUs (the move leaves its own packets' NET_RX there; judged alone on softirq time it does not lower,
    # it was undone), and the neighbour ladder's cpuset goes with the quota under which the victim stays
    # at 2x its SLO or more (detector/causes/neighbor_cpu.py: waiting out the quota's verdict first put
    # the cpuset past 10 s in the VM lane).
    joins: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = str(self.kind)
        d["amount"] = {"type": type(self.amount).__name__, **asdict(self.amount)}
        return d


class DecisionSink(Protocol):
    """Where decisions go. The actuator manager implements this; so does :class:`LoggingSink`."""

    def submit(self, decision: Decision) -> None:
        """Take one decision. Must not raise on a refused decision: refusals are logged/recorded."""

    def observe(self, signals: Mapping[str, float], now: float) -> None:
        """Latest victim signals, keyed by ``f"{victim.cgroup}:{signal}"``, for verify/revert."""

    def close(self) -> None:
        """Shut down: restore everything that was changed."""


class LoggingSink:
    """No actuators wired: every decision is logged (JSON) and kept for the report, nothing is changed."""

    def __init__(self, logger: logging.Logger | None = None, keep: int = 1000) -> None:
        self._log = logger or logging.getLogger("noisyneighbor.decisions")
        self._keep = keep
        self.decisions: list[Decision] = []

    def submit(self, decision: Decision) -> None:
        self.decisions.append(decision)
        del self.decisions[: -self._keep]
        self._log.info("decision (not applied: no actuators) %s", json.dumps(decision.to_dict(), sort_keys=True))

    def observe(self, signals: Mapping[str, float], now: float) -> None:
        return None

    def close(self) -> None:
        return None


# -- what the mitigation planner weighs (actuators/mitigate.py; the choice: detector/causes/softirq.py) --


@dataclass(frozen=True, slots=True)
class PodTraffic:
    """Packets per second through a pod's own network namespace (all its interfaces but lo)."""

    target: Target
    packets_per_s: float
    cpu_cores: float = 0.0
    host_network: bool = False  # the pod shares the node's netns: its counters are the node's, not its own


def __getattr__(name: str) -> Any:
    """``Cause``, the enum of why a victim suffers, is built by the cause registry from its declarations
    (detector/causes/__init__.py: one member per cause module); it is offered here too, where the rest of
    the detector -> actuators contract is. Looked up on first use: the registry imports this module."""
    if name == "Cause":
        from detector.causes import Cause

        return Cause
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
