# SPDX-License-Identifier: Apache-2.0
"""The policy's records (:class:`Policy` and its sections), their one-line :class:`PolicyError`, and the
value rules beyond the type: ranges, choices and the spellings of a choice that mean the same."""

from __future__ import annotations

from dataclasses import dataclass, field

# The `slo:` section is declared with the signals it bounds (detector.catalog: default, unit, valid
# values, whether a rule divides by it); the catalog imports nothing of the policy.
from detector.catalog import SloThresholds


class PolicyError(ValueError):
    """Bad policy input. ``str(exc)`` is one line naming the file, the key path and the problem."""

    def __init__(self, message: str) -> None:
        # Keys and values come from the file and may hold line breaks (a YAML key "\n\n" is legal):
        # unprintable characters are escaped here, so the message stays one line whatever the input.
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------

CPU_SUPPRESS_POLICIES = ("cpuset", "cfsQuota")
# How a cfsQuota suppress lands (ours; actuators/resize.py): a cgroup write, the pod's in-place resize
# (pods/{name}/resize) where every container has a CPU limit else the cgroup write, or resize only.
CPU_SUPPRESS_VIA = ("cgroup", "resize", "resize-only")
CPU_BURST_POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")
POD_SOURCES = ("auto", "kubelet", "apiserver", "standalone")

# Range checks per field: (min, max); None means unbounded on that side. The `slo:` fields' ranges are
# declared in detector.catalog with the signals they bound.
_Range = tuple[float | None, float | None]
_PERCENT: _Range = (0, 100)


@dataclass(frozen=True, slots=True)
class ResourceThresholdStrategy:
    """Koordinator ``resource-threshold-config``: BE CPU suppress and BE eviction thresholds."""

    enable: bool = True
    cpu_suppress_threshold_percent: int = 65
    cpu_suppress_policy: str = "cpuset"  # "cpuset" | "cfsQuota"
    cpu_suppress_min_cpus: int = 2  # our extension: the cpuset floor koordlet hard-codes
    cpu_suppress_via: str = "cgroup"  # our extension: "cgroup" | "resize" | "resize-only" (CPU_SUPPRESS_VIA)
    memory_evict_threshold_percent: int = 70
    memory_evict_lower_percent: int | None = None  # None -> threshold - 2 (koordlet's default)
    cpu_evict_be_satisfaction_upper_percent: int = 90
    cpu_evict_be_satisfaction_lower_percent: int = 60
    cpu_evict_be_usage_threshold_percent: int = 90
    cpu_evict_time_window_seconds: int = 300
    cpu_evict_enabled: bool = False
    memory_evict_enabled: bool = False

    @property
    def memory_evict_lower(self) -> int:
        """The percent memory eviction stops at, with koordlet's default applied."""
        if self.memory_evict_lower_percent is not None:
            return self.memory_evict_lower_percent
        return max(0, self.memory_evict_threshold_percent - 2)


@dataclass(frozen=True, slots=True)
class CpuBurstStrategy:
    """Koordinator ``cpu-burst-config``."""

    policy: str = "none"  # none | cpuBurstOnly | cfsQuotaBurstOnly | auto
    cpu_burst_percent: int = 1000
    cfs_quota_burst_percent: int = 300
    cfs_quota_burst_period_seconds: int = -1  # -1: unlimited
    share_pool_threshold_percent: int = 50

    @property
    def cpu_burst_enabled(self) -> bool:
        return self.policy in ("cpuBurstOnly", "auto")

    @property
    def cfs_quota_burst_enabled(self) -> bool:
        return self.policy in ("cfsQuotaBurstOnly", "auto")


@dataclass(frozen=True, slots=True)
class ResctrlQos:
    """One QoS class's ``resctrlQOS``: L3 ways as a [start, end] percent range and MBA percent."""

    enable: bool = False
    cat_range_start_percent: int = 0
    cat_range_end_percent: int = 100
    mba_percent: int = 100


@dataclass(frozen=True, slots=True)
class ResourceQosStrategy:
    """Koordinator ``resource-qos-config``; only ``resctrlQOS`` is ours, per class LSR, LS and BE."""

    lsr: ResctrlQos = field(default_factory=ResctrlQos)
    ls: ResctrlQos = field(default_factory=ResctrlQos)
    be: ResctrlQos = field(default_factory=lambda: ResctrlQos(cat_range_end_percent=30))


@dataclass(frozen=True, slots=True)
class ColocationStrategy:
    """Koordinator ``colocation-config``: what batch allocatable (detector/batch.py) keeps back, plus the
    node's reservation where its ``node.koordinator.sh/reservation`` annotation cannot be read."""

    cpu_reclaim_threshold_percent: int = 60  # Node.Reserved = total * (100 - this) / 100
    memory_reclaim_threshold_percent: int = 65
    reserved_cpu_cores: float = 0.0  # Node.Anno.Reserved without the annotation (agent config)
    reserved_memory_bytes: int = 0
    kubelet_config_file: str | None = "/var/lib/kubelet/config.yaml"  # Node.Kubelet.Reserved, under the host root


@dataclass(frozen=True, slots=True)
class ActuatorPolicy:
    """What actuators may do and how fast; dry-run by default, so installing changes nothing."""

    dry_run: bool = True
    max_changes_per_minute: int = 6
    verify_intervals: int = 5
    verify_min_improvement_percent: float = 10.0
    cooldown_seconds: float = 20.0
    suppress_enabled: bool = True
    evict_enabled: bool = False
    burst_enabled: bool = True
    resctrl_enabled: bool = False
    evictions_per_minute: int = 2
    cpu_evict_cooldown_seconds: float = 20.0
    memory_evict_cooldown_seconds: float = 4.0


_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True)
class Policy:
    slo: SloThresholds = field(default_factory=SloThresholds)
    resource_threshold: ResourceThresholdStrategy = field(default_factory=ResourceThresholdStrategy)
    cpu_burst: CpuBurstStrategy = field(default_factory=CpuBurstStrategy)
    resource_qos: ResourceQosStrategy = field(default_factory=ResourceQosStrategy)
    actuators: ActuatorPolicy = field(default_factory=ActuatorPolicy)
    colocation: ColocationStrategy = field(default_factory=ColocationStrategy)
    node_name: str | None = None
    interval_seconds: float = 1.0
    pod_source: str = "auto"  # auto | kubelet | apiserver | standalone
    # ${HOST_IP}: the node's IP (DaemonSet env from status.hostIP); in a pod 127.0.0.1 is the pod's own
    # loopback. The default applies outside a pod (a systemd agent on the node). See detector.pods.
    kubelet_url: str = "https://${HOST_IP:-127.0.0.1}:10250"
    kubelet_token_file: str | None = f"{_SA_DIR}/token"
    kubelet_ca_file: str | None = f"{_SA_DIR}/ca.crt"
    kubelet_insecure_skip_verify: bool = False
    kubelet_read_only_port: int | None = None  # e.g. 10255; plain HTTP, no auth, when set
    # A pod gone from the pod list stays resolvable (its series and incidents keep its name) this long,
    # so the last samples of a pod that just ended are still named; then its series go.
    pod_vanish_grace_seconds: float = 60.0
    # A who-ran-instead pair that stopped moving gives its kernel slot back after this long (its totals
    # are kept: probes/runqlat.py PAIR_QUIET_S). Shorter frees slots sooner on a node with heavy churn;
    # the soak bench (bench/soak.py) shortens it and the grace above to compress hours into minutes.
    runq_pair_quiet_seconds: float = 60.0
    incident_log: str | None = None
    # Standalone mode (no Kubernetes): cgroup path globs (fnmatch, relative to the hierarchy root,
    # no leading slash) naming latency-sensitive and best-effort cgroups. Tuples: Policy is frozen.
    ls_cgroups: tuple[str, ...] = ()
    be_cgroups: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Validation rules beyond the type
# --------------------------------------------------------------------------------------------

_RANGES: dict[type, dict[str, _Range]] = {
    ResourceThresholdStrategy: {
        "cpu_suppress_threshold_percent": _PERCENT,
        "cpu_suppress_min_cpus": (0, None),
        "memory_evict_threshold_percent": _PERCENT,
        "memory_evict_lower_percent": _PERCENT,
        "cpu_evict_be_satisfaction_upper_percent": _PERCENT,
        "cpu_evict_be_satisfaction_lower_percent": _PERCENT,
        "cpu_evict_be_usage_threshold_percent": _PERCENT,
        "cpu_evict_time_window_seconds": (1, None),
    },
    CpuBurstStrategy: {
        "cpu_burst_percent": (0, None),
        "cfs_quota_burst_percent": (100, None),  # a quota scaled below its base is not a burst
        "cfs_quota_burst_period_seconds": (-1, None),
        "share_pool_threshold_percent": _PERCENT,
    },
    ResctrlQos: {
        "cat_range_start_percent": _PERCENT,
        "cat_range_end_percent": _PERCENT,
        "mba_percent": (1, 100),
    },
    ColocationStrategy: {
        "cpu_reclaim_threshold_percent": _PERCENT,
        "memory_reclaim_threshold_percent": _PERCENT,
        "reserved_cpu_cores": (0, None),
        "reserved_memory_bytes": (0, None),
    },
    ActuatorPolicy: {
        "max_changes_per_minute": (0, None),
        "verify_intervals": (1, None),
        "verify_min_improvement_percent": _PERCENT,
        "cooldown_seconds": (0, None),
        "evictions_per_minute": (0, None),
        "cpu_evict_cooldown_seconds": (0, None),
        "memory_evict_cooldown_seconds": (0, None),
    },
    Policy: {
        "interval_seconds": (0.01, 3600),
        "kubelet_read_only_port": (1, 65535),
        "pod_vanish_grace_seconds": (0, 86400),
        "runq_pair_quiet_seconds": (1, 86400),
    },
}

_CHOICES: dict[type, dict[str, tuple[str, ...]]] = {
    ResourceThresholdStrategy: {"cpu_suppress_policy": CPU_SUPPRESS_POLICIES, "cpu_suppress_via": CPU_SUPPRESS_VIA},
    CpuBurstStrategy: {"policy": CPU_BURST_POLICIES},
    Policy: {"pod_source": POD_SOURCES},
}

# Spellings of a choice that mean the same (our decisions use "cfs_quota").
_CHOICE_ALIASES = {"cfs_quota": "cfsQuota", "cfsquota": "cfsQuota"}
