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
from typing import Protocol


class ActionKind(StrEnum):
    SUPPRESS = "suppress"  # cap BE CPU (cfs quota or cpuset)
    EVICT = "evict"  # Kubernetes Eviction API on a pod
    BURST = "burst"  # cfs burst / quota scaling for a throttled LS pod
    RESCTRL = "resctrl"  # L3 CAT / MBA for a QoS group
    MEMORY_SUPPRESS = "memory_suppress"  # lower a BE pod's memory limit/high toward its usage


class Cause(StrEnum):
    """Why a victim suffers; the detector names exactly one per incident."""

    NEIGHBOR_CPU = "neighbor_cpu"  # other cgroups ran while it waited on its CPUs
    SELF_THROTTLING = "self_throttling"  # it hit its own cfs quota: never a neighbor's fault
    SELF_CONTENTION = "self_contention"  # its own threads outnumber the CPUs it may use: not a neighbor's fault
    SOFTIRQ = "softirq"  # softirq/IRQ work on the CPUs it runs on
    RECLAIM = "reclaim"  # memcg or global reclaim stalls in its allocations
    NETWORK_CONNECT = "network_connect"  # connect path: SYN drops, retransmits, listen overflow
    PSI_UNKNOWN = "psi_unknown"  # pressure without an attributable mechanism


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
    created_at: float = field(default_factory=time.time)
    # A step of a closed loop already acting on this target for this incident (the burst loop's next
    # quota scale): the manager lets it through the per-target cooldown and carries the first step's
    # verification over, so the loop moves at tick pace while the action is judged as one.
    follow_up: bool = False

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


# -- mitigation choices the engine's one-decision-per-incident rule does not make (issue 19) ----------

SOFTIRQ_TRAFFIC_MIN_PPS = 2000.0  # below this a pod's packets are not what keeps a CPU in NET_RX
SOFTIRQ_TRAFFIC_SHARE = 0.5  # the pod's netns must carry at least this share of the pods' packets


@dataclass(frozen=True, slots=True)
class PodTraffic:
    """Packets per second through a pod's own network namespace (all its interfaces but lo)."""

    target: Target
    packets_per_s: float
    cpu_cores: float = 0.0
    host_network: bool = False  # the pod shares the node's netns: its counters are the node's, not its own


def softirq_traffic_decision(
    victim: Target, incident_id: str | None, traffic: list[PodTraffic], *, min_cores: float = 0.02,
    victim_signal: str = "runq_p99_ns",
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
    own = [t for t in traffic if not t.host_network and t.target.cgroup != victim.cgroup]
    total = sum(t.packets_per_s for t in own)
    if not own or total <= 0:
        return None, "no pod's own traffic seen: NET_RX comes from the node's devices; advice: move IRQ/RPS " \
                     "steering off the victim's CPUs (the agent never changes node IRQ settings)"
    top = max(own, key=lambda t: t.packets_per_s)
    share = top.packets_per_s / total
    if top.packets_per_s < SOFTIRQ_TRAFFIC_MIN_PPS or share < SOFTIRQ_TRAFFIC_SHARE:
        return None, (f"no dominant pod traffic (top {top.target.display} {top.packets_per_s:.0f} pkt/s, "
                      f"{share:.0%} of pods'): advice: move IRQ/RPS steering off the victim's CPUs")
    if (top.target.qos or "").upper() != "BE":
        return None, (f"{top.target.display} sends {top.packets_per_s:.0f} pkt/s ({share:.0%}) but is "
                      f"{top.target.qos or 'of unknown QoS'}: not touched; advice: rate-limit it or move IRQ/RPS "
                      f"steering off the victim's CPUs")
    cap = round(max(min_cores, top.cpu_cores * SOFTIRQ_TRAFFIC_MIN_PPS / top.packets_per_s), 2)
    reason = (f"{top.target.display}'s own traffic, {top.packets_per_s:.0f} pkt/s ({share:.0%} of the pods'), keeps "
              f"NET_RX on {victim.display}'s CPUs: cfs quota {top.cpu_cores:.2f} -> {cap:.2f} cores (sends less)")
    return Decision(ActionKind.SUPPRESS, top.target, SuppressAmount("cfs_quota", cpu_cores=cap), reason,
                    incident_id=incident_id, victim=victim, victim_signal=victim_signal), reason
