# SPDX-License-Identifier: Apache-2.0
"""Prometheus exporter: the latest NodeSnapshot, incidents and actions as metric families.

The agent loop calls :meth:`Exporter.update` once per tick and only keeps that tick; the series
are built from it when they are scraped (every 15 s, not every tick): that is where cgroup ids are
resolved to pod labels, vanished cgroups drop out and the per-cgroup cap is applied. Every family in
one scrape comes from the same tick.

Series budget (an idle pod: a pod cgroup and one container cgroup): the container's runqueue
histogram (17 buckets from ``min_bucket_seconds`` ~128 µs to ``max_bucket_seconds`` ~8.4 s, +Inf, sum,
count: 20), CPU usage and memory
usage of both cgroups (4; the CFS bandwidth counters and limits only where a quota or limit is set),
and on v2 nodes the pod's PSI totals (6). A pod with a listener in a namespace of its own adds its
fullest listener's fill (1), and its namespace's ListenOverflows once non-zero (1). PSI averages and the
node's per-CPU /proc/stat counters (node_exporter has both; ``rate()`` of the totals gives the
averages) are only exported with ``extra_node_series``.

Series budget per node (what does not belong to a cgroup): :data:`NODE_SERIES_BUDGET`, the same at
every CPU count. What grows with the node's CPUs is summed to node level by default: the runqueue
histogram of all tasks and the softirq histograms and counters per vector (:data:`PER_CPU_METRICS`).
``per_cpu_series`` adds their ``cpu`` label back (per CPU, and per CPU x vector: ~41 series a pair,
~26k softirq series at 64 CPUs); the detector reads per-CPU softirq time from the snapshot either way.

Everything the probes keep is cumulative, so it is published as it is: log2 histograms become real
Prometheus histograms (slot k of ``probes.hist`` holds [2^(k-1), 2^k) µs, so its upper bound in
seconds is the ``le`` of bucket k), BPF and /proc counters become ``_total`` counters and PSI
``total`` becomes ``noisyneighbor_psi_stall_seconds_total``. Metric names are the constants below;
``dashboards/generate.py`` imports them so dashboards and exporter cannot drift apart.

Every series carries a ``node`` label (the exporter runs once per node, and a DaemonSet scrape's
``instance`` is a pod IP that says nothing about the node).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import Literal, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from actuators.base import ActionRecord, ActionState
from detector.batch import BatchAllocatable
from detector.catalog import SLO_SIGNALS
from detector.cgroups import CgroupResolver, parse_cgroup_path
from detector.decisions import ActionKind, SuppressAmount, Target
from detector.model import Incident
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.collect import degraded_code
from probes.hist import HIST_SLOTS, LatencyHistogram, slot_bounds_us
from probes.host import HostPaths
from probes.registry import PLUGINS
from probes.snapshot import CpuTimes, NodeSnapshot

log = logging.getLogger(__name__)

# -- metric names (shared with dashboards/generate.py) ----------------------------------------------
LISTEN_OVERFLOWS = "noisyneighbor_listen_overflows_total"
LISTEN_QUEUE_FILL = "noisyneighbor_listen_queue_fill_ratio"
PSI_STALL = "noisyneighbor_psi_stall_seconds_total"
PSI_AVG = "noisyneighbor_psi_stall_avg_ratio"
CGROUP_PSI_STALL = "noisyneighbor_cgroup_psi_stall_seconds_total"
CGROUP_PSI_AVG = "noisyneighbor_cgroup_psi_stall_avg_ratio"
CGROUP_CPU_USAGE = "noisyneighbor_cgroup_cpu_usage_seconds_total"
CGROUP_CPU_THROTTLED = "noisyneighbor_cgroup_cpu_throttled_seconds_total"
CGROUP_CPU_PERIODS = "noisyneighbor_cgroup_cpu_periods_total"
CGROUP_CPU_THROTTLED_PERIODS = "noisyneighbor_cgroup_cpu_throttled_periods_total"
CGROUP_CPU_QUOTA = "noisyneighbor_cgroup_cpu_quota_cores"
CGROUP_MEMORY_USAGE = "noisyneighbor_cgroup_memory_usage_bytes"
CGROUP_MEMORY_LIMIT = "noisyneighbor_cgroup_memory_limit_bytes"
NODE_CPU = "noisyneighbor_node_cpu_seconds_total"
INCIDENTS_OPEN = "noisyneighbor_incidents_open"
INCIDENTS = "noisyneighbor_incidents_total"
INCIDENT_CONFIDENCE = "noisyneighbor_incident_confidence_ratio"
CULPRIT_SCORE = "noisyneighbor_incident_culprit_score"
INCIDENT_SLO_RATIO = "noisyneighbor_incident_slo_ratio"
CULPRIT_P99_WITHOUT = "noisyneighbor_incident_culprit_runq_p99_without_seconds"
MOVED_TOGETHER_P99_WITHOUT = "noisyneighbor_incident_moved_together_runq_p99_without_seconds"
SLO_SIGNAL_NAMES = frozenset(s.name for s in SLO_SIGNALS)
ACTIONS = "noisyneighbor_actions_total"
ACTION_ACTIVE = "noisyneighbor_action_active"
ACTION_SUPPRESS_CORES = "noisyneighbor_action_suppress_cores"
BATCH_ALLOCATABLE_CPU = "noisyneighbor_node_batch_allocatable_cpu_cores"
BATCH_ALLOCATABLE_MEMORY = "noisyneighbor_node_batch_allocatable_memory_bytes"
PROBE_UP = "noisyneighbor_probe_up"
PROBE_STATE = "noisyneighbor_probe_state"
AGENT_DEGRADED = "noisyneighbor_agent_degraded"
PROBE_DROPS = "noisyneighbor_probe_drops_total"
BPF_RUN_SECONDS = "noisyneighbor_bpf_program_run_seconds_total"
BPF_RUNS = "noisyneighbor_bpf_program_runs_total"
BPF_MAP_ENTRIES = "noisyneighbor_bpf_map_entries"
EXPORTER_CGROUPS = "noisyneighbor_exporter_cgroups"
EXPORTER_LAST_UPDATE = "noisyneighbor_exporter_last_update_timestamp_seconds"
SNAPSHOT_ERRORS = "noisyneighbor_snapshot_errors"

NODE_LABEL = "node"
# `container` is the container's name (as cAdvisor and kube-state-metrics have it, so series join on
# namespace/pod/container); `container_id` the runtime's id, first 12 hex digits.
CGROUP_LABELS = ("namespace", "pod", "pod_uid", "container", "container_id", "qos", "cgroup")
VICTIM_LABELS = ("victim_namespace", "victim_pod", "victim_qos", "victim_cgroup")
CULPRIT_LABELS = ("culprit_namespace", "culprit_pod", "culprit_qos", "culprit_cgroup")
TARGET_LABELS = ("target_namespace", "target_pod", "target_cgroup")
OVERFLOW_CGROUP = "_overflow"
PSI_WINDOWS = ("10", "60", "300")
CPU_MODES = tuple(f.name.removesuffix("_ns") for f in fields(CpuTimes))  # /proc/stat's, in its order
# Kubernetes QoS -> Koordinator class, as koordlet maps pods without a koordinator.sh/qosClass label.
KOORD_CLASS_OF_K8S_QOS = {"guaranteed": "LS", "burstable": "LS", "besteffort": "BE"}

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()  # after `node` (and after CGROUP_LABELS when per_cgroup)
    per_cgroup: bool = False
    per_cpu: bool = False  # its `cpu` label only with per_cpu_series (else summed over CPUs)
    per_cpu_labels: tuple[str, ...] = ("cpu",)  # with per_cpu: the labels dropped together (MetricSpec's)

    def lean_labels(self, values: tuple[str, ...]) -> tuple[str, ...]:
        """Own label values without those of ``per_cpu_labels`` (what a per_cpu metric is summed to)."""
        return tuple(v for name, v in zip(self.labels, values, strict=True) if name not in self.per_cpu_labels)

    @property
    def all_labels(self) -> tuple[str, ...]:
        return (NODE_LABEL, *(CGROUP_LABELS if self.per_cgroup else ()), *self.labels)


_DEFS = (
    MetricDef(LISTEN_OVERFLOWS, "counter", "TcpExt ListenOverflows of the pod's own network namespace (SYNs and "
              "handshake ACKs dropped because an accept queue was full), at the last listen-queue read (on "
              "connect trouble, else every 30 s); from its first overflow.", per_cgroup=True),
    MetricDef(LISTEN_QUEUE_FILL, "gauge", "The pod's fullest listener at the last listen-queue read: connections "
              "waiting for accept() / listen() backlog (above 1: full, new connections are dropped); pods with "
              "a listener only.", per_cgroup=True),
    MetricDef(PSI_STALL, "counter", "Node pressure stall time (/proc/pressure total).", ("resource", "kind")),
    MetricDef(PSI_AVG, "gauge", "Node pressure stall share over the kernel's 10/60/300 s windows (0..1).",
              ("resource", "kind", "window")),
    MetricDef(CGROUP_PSI_STALL, "counter", "Cgroup pressure stall time (v2 <resource>.pressure total).",
              ("resource", "kind"), per_cgroup=True),
    MetricDef(CGROUP_PSI_AVG, "gauge", "Cgroup pressure stall share over the kernel's 10/60/300 s windows (0..1).",
              ("resource", "kind", "window"), per_cgroup=True),
    MetricDef(CGROUP_CPU_USAGE, "counter", "CPU time used by the cgroup (hierarchical).", per_cgroup=True),
    MetricDef(CGROUP_CPU_THROTTLED, "counter", "Time the cgroup's runqueues spent throttled by its CFS quota.",
              per_cgroup=True),
    MetricDef(CGROUP_CPU_PERIODS, "counter", "CFS bandwidth periods in which the cgroup was runnable.", per_cgroup=True),
    MetricDef(CGROUP_CPU_THROTTLED_PERIODS, "counter", "CFS bandwidth periods in which the cgroup was throttled.",
              per_cgroup=True),
    MetricDef(CGROUP_CPU_QUOTA, "gauge", "CFS quota in CPUs (quota / period); absent when unlimited.", per_cgroup=True),
    MetricDef(CGROUP_MEMORY_USAGE, "gauge", "Memory charged to the cgroup.", per_cgroup=True),
    MetricDef(CGROUP_MEMORY_LIMIT, "gauge", "Memory limit of the cgroup; absent when unlimited.", per_cgroup=True),
    MetricDef(NODE_CPU, "counter", "CPU time per CPU and mode (/proc/stat).", ("cpu", "mode")),
    MetricDef(INCIDENTS_OPEN, "gauge", "Open incidents, by victim and cause.", (*VICTIM_LABELS, "cause")),
    MetricDef(INCIDENTS, "counter", "Incidents opened since the exporter started, by cause.", ("cause",)),
    MetricDef(INCIDENT_CONFIDENCE, "gauge", "Confidence (0..1) of each open incident's cause.",
              (*VICTIM_LABELS, "cause")),
    MetricDef(INCIDENT_SLO_RATIO, "gauge", "Per open incident, each breached signal's value over its SLO (>1: above "
              "it); signal is a name from the detector's signal catalog (detector/catalog.py).",
              (*VICTIM_LABELS, "cause", "signal")),
    MetricDef(CULPRIT_SCORE, "gauge", "Culprit score (0..1) per open incident: who ran instead, correlation, "
              "attribution combined.", (*VICTIM_LABELS, "cause", *CULPRIT_LABELS)),
    MetricDef(CULPRIT_P99_WITHOUT, "gauge", "Per open incident and culprit, the victim's runqueue p99 with that "
              "culprit's share of each wait taken out (the counterfactual; detector/counterfactual.py); for the top culprit "
              "of a cause that declares kernel work (CauseSpec.kernel_work) also that work's share.",
              (*VICTIM_LABELS, "cause", *CULPRIT_LABELS)),
    MetricDef(MOVED_TOGETHER_P99_WITHOUT, "gauge", "Per open incident whose step moved several culprits at once (BE "
              "hogs suppressed together), the victim's runqueue p99 without all of them; the incident JSON names them.",
              (*VICTIM_LABELS, "cause")),
    MetricDef(ACTIONS, "counter", "Actuator actions entering each state (planned, applied, verified, reverted, "
              "failed, refused), by kind.", ("kind", "state")),
    MetricDef(ACTION_ACTIVE, "gauge", "Actions in effect now (applied or verified, not reverted), by target.",
              ("kind", "state", *TARGET_LABELS)),
    MetricDef(ACTION_SUPPRESS_CORES, "gauge", "CPU cap (cores) of each suppress action in effect.",
              ("policy", *TARGET_LABELS)),
    MetricDef(BATCH_ALLOCATABLE_CPU, "gauge", "CPU the node can still give batch (BE) pods, by koordinator's "
              "formula (policy: usage, request, maxUsageRequest; detector/batch.py).", ("policy",)),
    MetricDef(BATCH_ALLOCATABLE_MEMORY, "gauge", "Memory the node can still give batch (BE) pods, by koordinator's "
              "formula (policy: usage, request, maxUsageRequest; detector/batch.py).", ("policy",)),
    MetricDef(PROBE_UP, "gauge", "1 while the probe collects (on or degraded), 0 when it is off.", ("probe",)),
    MetricDef(PROBE_STATE, "gauge", "The state each probe is in (on, degraded, off): one series per probe, always 1.",
              ("probe", "state")),
    MetricDef(AGENT_DEGRADED, "gauge", "1 while the agent is Ready but can measure nothing on this node, by code "
              "(no_btf: the kernel has no BTF and no --btf file was given, so no BPF probe can load); absent "
              "otherwise. /readyz says the same with the text.", ("code",)),
    MetricDef(PROBE_DROPS, "counter", "Events a BPF probe could not record, by reason.", ("probe", "reason")),
    MetricDef(BPF_RUN_SECONDS, "counter", "Kernel time in the agent's BPF programs (counted while the agent holds "
              "BPF_ENABLE_STATS, no sysctl needed).", ("program",)),
    MetricDef(BPF_RUNS, "counter", "Runs of the agent's BPF programs (counted while the agent holds BPF_ENABLE_STATS).",
              ("program",)),
    MetricDef(BPF_MAP_ENTRIES, "gauge", "Entries in each probe's per-cgroup kernel maps (bounded; entries of removed "
              "cgroups are deleted once they stay idle).", ("probe",)),
    MetricDef(EXPORTER_CGROUPS, "gauge", "Cgroups seen in the last update: exported with their own series, folded "
              "into the cgroup=\"_overflow\" series by the cap, or dropped as unresolved (removed).", ("state",)),
    MetricDef(EXPORTER_LAST_UPDATE, "gauge", "Wall time of the snapshot the metrics come from."),
    MetricDef(SNAPSHOT_ERRORS, "gauge", "Problems met while collecting the last snapshot (see the agent log)."),
)
# The metrics each probe plugin defines (probes.registry), in registry order, before the exporter's own.
_DEFS = (*(MetricDef(spec.name, spec.type, spec.help, spec.labels, spec.per_cgroup, spec.per_cpu,  # type: ignore[arg-type]
                     spec.per_cpu_labels) for plugin in PLUGINS for spec in plugin.metric_specs), *_DEFS)
_CGROUP_SERIES = tuple(plugin for plugin in PLUGINS if plugin.cgroup_series is not None)
_NODE_SERIES = tuple(plugin for plugin in PLUGINS if plugin.node_series is not None)
_SHARED_NODE_SERIES = tuple(plugin for plugin in PLUGINS if plugin.shared_node_series is not None)
METRICS: dict[str, MetricDef] = {d.name: d for d in _DEFS}

# Metrics whose series grow with the node's CPUs: their `cpu` label (and any other label that grows with
# them, MetricSpec.per_cpu_labels: an IRQ line of a multi-queue device) is only exported with
# per_cpu_series (otherwise they are summed over CPUs). /proc/stat per CPU (NODE_CPU) is behind
# extra_node_series. The plugins declare them (MetricSpec.per_cpu).
PER_CPU_METRICS = frozenset(d.name for d in _DEFS if d.per_cpu)
# Series without a cgroup label on one node, at any CPU count, without per_cpu_series or
# extra_node_series: ~565 on an idle node (softirq per vector 410, node reclaim 60, the node's runqueue
# histogram 20, probe and BPF program state ~50, PSI, allocstalls), the rest is room for open incidents
# and actions (~8 series each with culprits). tests/test_series_budget.py counts a real scrape against it.
NODE_SERIES_BUDGET = 800

# le of each log2 slot in seconds: slot k holds [2^(k-1), 2^k) µs; values are truncated to whole µs by the
# BPF side, so the slot's upper bound is the smallest le that contains all of them.
BUCKET_LES = tuple(floatToGoString(slot_bounds_us(i)[1] / 1e6) for i in range(HIST_SLOTS))


# Runqueue waits above this are counted in +Inf only: the last finite bucket's le is 8.39 s, not 2147 s.
DEFAULT_MAX_BUCKET_SECONDS = 10.0
# Waits below this share the first bucket (le 128 µs): an SLO on run-queue latency is in milliseconds, and
# seven more buckets per cgroup (1 µs .. 64 µs) would cost 7 series per pod (budget: 30 an idle pod).
DEFAULT_MIN_BUCKET_SECONDS = 100e-6


def top_slot_for(max_bucket_seconds: float) -> int:
    """The last histogram slot with its own bucket: the highest whose upper bound is <= the limit."""
    top = 0
    for slot in range(HIST_SLOTS):
        if slot_bounds_us(slot)[1] / 1e6 <= max_bucket_seconds:
            top = slot
    return top


def bottom_slot_for(min_bucket_seconds: float) -> int:
    """The first histogram slot with its own bucket: the lowest whose upper bound is >= the limit."""
    for slot in range(HIST_SLOTS):
        if slot_bounds_us(slot)[1] / 1e6 >= min_bucket_seconds:
            return slot
    return HIST_SLOTS - 1


def bucket_counts(hist: LatencyHistogram, top_slot: int = HIST_SLOTS - 1, bottom_slot: int = 0) -> list[tuple[int, int]]:
    """:func:`histogram_buckets` as integers: (slot, cumulative count clipped at the count) of each finite
    bucket, ``bottom_slot`` .. ``top_slot``. The one walk both the buckets and the scrape's text use."""
    slots, count = hist.slots, hist.count
    end = min(top_slot + 1, len(slots))
    seen = accumulate(slots[bottom_slot:end], initial=sum(slots[:bottom_slot]))
    next(seen)  # the slots below bottom_slot alone: in its bucket, not one of their own
    return [(slot, n if n < count else count) for slot, n in zip(range(bottom_slot, end), seen, strict=True)]


def histogram_buckets(hist: LatencyHistogram, top_slot: int = HIST_SLOTS - 1,
                      bottom_slot: int = 0) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets of a log2 histogram; +Inf is the exact count.

    Slots and count are per-CPU values read one after the other, so a slot may run ahead of the count
    by an event in flight: buckets are clipped to the count to stay monotonic. Slots above
    ``top_slot`` have no bucket of their own (their events are in +Inf); slots below ``bottom_slot``
    are counted in its bucket (buckets are cumulative: nothing is lost but the resolution below it).
    """
    out = [(BUCKET_LES[slot], float(n)) for slot, n in bucket_counts(hist, top_slot, bottom_slot)]
    out.append(("+Inf", float(hist.count)))
    return out


# -- labels ----------------------------------------------------------------------------------------


class Labeler(Protocol):
    """Maps what the probes report to the Target whose labels a cgroup's series carry.

    None means "not a cgroup (any more)": its series are dropped for this update.
    """

    def target_for_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> Target | None: ...

    def target_for_path(self, cgroup_path: str) -> Target | None: ...


class ResolverLabeler:
    """The default labeler: ids through :class:`CgroupResolver`, paths through ``parse_cgroup_path``.

    Knows pod UIDs and QoS from the path alone; pod names and namespaces need pod metadata, which an
    agent adds by wrapping this labeler.
    """

    def __init__(self, resolver: CgroupResolver) -> None:
        self.resolver = resolver

    def target_for_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> Target | None:
        info = self.resolver.resolve(cgroup_id, hierarchy)
        if info is None:
            return None
        # The resolver's index keeps a removed cgroup until its next walk; one lstat tells (and fixes
        # the index), so a cgroup that is gone loses its series at this update, not at some later walk.
        if self.resolver.id_of(info.path, hierarchy) != cgroup_id:
            return None
        return self.target_for_path(info.path)

    def target_for_path(self, cgroup_path: str) -> Target | None:
        ident = parse_cgroup_path(cgroup_path)
        return Target(cgroup=ident.path, pod_uid=ident.pod_uid, qos=KOORD_CLASS_OF_K8S_QOS.get(ident.qos or ""))


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """The cgroup labels of one cgroup's series (values in CGROUP_LABELS order)."""

    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    container: str = ""
    container_id: str = ""
    qos: str = ""
    cgroup: str = ""
    # Hashed once: a scrape looks each key up in several dicts and sets (the cgroups, the cap's, the label
    # texts'), and the generated __hash__ hashed the seven values again at each (~4 % of a scrape).
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.values()))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, target: Target, container_name: Callable[[str, str], str | None] | None = None) -> SeriesKey:
        """``container_name(pod_uid, container_id)``: the container's name from pod metadata, if known."""
        container_id = parse_cgroup_path(target.cgroup).container_id or ""
        name = ""
        if container_id and target.pod_uid and container_name is not None:
            name = container_name(target.pod_uid, container_id) or ""
        return cls(
            target.namespace or "", target.pod or "", target.pod_uid or "", name, container_id[:12],
            target.qos or "", _cgroup_label(target.cgroup),
        )

    def values(self) -> tuple[str, ...]:
        return (self.namespace, self.pod, self.pod_uid, self.container, self.container_id, self.qos, self.cgroup)


OVERFLOW_KEY = SeriesKey(cgroup=OVERFLOW_CGROUP)


class CgroupKeys:
    """The labels (:class:`SeriesKey`) of each cgroup in a scrape, from the labeler.

    ``labels_token(pod_uid)``: an object that is the same (``is``) as long as that pod's labels are (the
    pod source's record of it). With it, a cgroup's key is kept from scrape to scrape and only made again
    when its pod's record changed (or, for an id, the cgroup at its path is another one now); without
    it every scrape labels every cgroup anew. Only the last scrape's cgroups are kept: removed ones leave
    nothing behind. A scrape is ``begin_scrape``, ``for_id`` / ``for_path`` per sample, ``end_scrape``.

    ``cgroups_token()``: the watched cgroups' listing, the same object (``is``) while no cgroup was listed
    or dropped (the agent's, refreshed from a walk when the pod list changes). With it, a kept id key
    whose cgroup is in the listing is checked at its path (one lstat) only at the first scrape after the
    listing changed, not at every scrape (an lstat per cgroup per scrape was 3.5 % of the agent at 1,000
    pods). The lateness this buys: a listed cgroup removed while its pod's record and the listing stay
    the same keeps its series until the listing changes (the pod list's next walk). Cgroups outside the
    listing are checked at every scrape, as without it.
    """

    def __init__(self, labeler: Labeler, container_name: Callable[[str, str], str | None] | None = None,
                 labels_token: Callable[[str], object] | None = None,
                 cgroups_token: Callable[[], Collection[str]] | None = None) -> None:
        self.labeler = labeler
        self.container_name = container_name
        self.labels_token = labels_token
        self.cgroups_token = cgroups_token
        self._listing: Collection[str] | None = None  # cgroups_token()'s at this scrape's start
        # Kept from the last scrape (with labels_token): path -> (token, key), and (id, mount) -> _KeptId.
        self._path_keys: dict[str, tuple[object, SeriesKey | None]] = {}
        self._id_keys: dict[tuple[int, object], _KeptId] = {}
        # This scrape's: every id and path asked for (None: not labelled), and those not labelled.
        self._ids: dict[tuple[int, object], SeriesKey | None] = {}
        self._paths: dict[str, SeriesKey | None] = {}
        self._unresolved: set[object] = set()

    def begin_scrape(self) -> None:
        self._ids, self._paths, self._unresolved = {}, {}, set()
        self._listing = self.cgroups_token() if self.cgroups_token is not None else None

    def end_scrape(self) -> int:
        """Keep only this scrape's cgroups; returns how many ids and paths could not be labelled."""
        self._id_keys = {k: v for k, v in self._id_keys.items() if k in self._ids}
        self._path_keys = {k: v for k, v in self._path_keys.items() if k in self._paths}
        return len(self._unresolved)

    def for_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> SeriesKey | None:
        cache_key = (cgroup_id, hierarchy.mount if hierarchy else None)
        if cache_key in self._ids:
            return self._ids[cache_key]
        kept = self._id_keys.get(cache_key) if self.labels_token is not None else None
        if kept is not None and self._id_key_current(cgroup_id, hierarchy, kept):
            key = self._ids[cache_key] = kept.key
            return key
        try:
            target = self.labeler.target_for_id(cgroup_id, hierarchy)
        except Exception as e:  # a labeler bug must cost one cgroup's series, not the tick
            log.debug("labeler failed on cgroup id %s: %s", cgroup_id, e)
            target = None
        key = self._ids[cache_key] = SeriesKey.of(target, self.container_name) if target is not None else None
        if key is None:
            self._unresolved.add((cgroup_id, hierarchy))
        elif self.labels_token is not None and target is not None and hierarchy is not None:
            # Kept with the cgroup it was found as: one lstat of its directory says it is still that
            # cgroup (a removed one loses its series at that scrape, as with the labeler's own check).
            self._id_keys[cache_key] = _KeptId(target.cgroup, self._token(target.pod_uid), key,
                                               self._listing_of(target.cgroup))
        return key

    def for_path(self, path: str) -> SeriesKey | None:
        if path in self._paths:
            return self._paths[path]
        kept = self._path_keys.get(path) if self.labels_token is not None else None
        if kept is not None and kept[1] is not None and kept[0] is self._token(kept[1].pod_uid):
            key = self._paths[path] = kept[1]
            return key
        try:
            target = self.labeler.target_for_path(path)
        except Exception as e:
            log.debug("labeler failed on cgroup %s: %s", path, e)
            target = None
        key = self._paths[path] = SeriesKey.of(target, self.container_name) if target is not None else None
        if key is None:
            self._unresolved.add(path)
        elif self.labels_token is not None:
            self._path_keys[path] = (self._token(key.pod_uid), key)
        return key

    def _token(self, pod_uid: str | None) -> object:
        assert self.labels_token is not None
        return self.labels_token(pod_uid) if pod_uid else None

    def _listing_of(self, cgroup: str) -> Collection[str] | None:
        """This scrape's listing if `cgroup` is in it (its removal changes the listing), else None."""
        listing = self._listing
        return listing if listing is not None and cgroup in listing else None

    def _id_key_current(self, cgroup_id: int, hierarchy: Hierarchy | None, kept: _KeptId) -> bool:
        if hierarchy is None or kept.key is None or kept.labels_token is not self._token(kept.key.pod_uid):
            return False  # (kept only for ids found under a hierarchy)
        if kept.checked_under is not None and kept.checked_under is self._listing:
            return True  # checked at its path since the listing last changed
        try:
            fs_dir = f"{os.fspath(hierarchy.mount).rstrip('/')}/{kept.cgroup.strip('/')}".rstrip("/")
            current = os.lstat(fs_dir).st_ino == cgroup_id
        except OSError:
            return False
        if current:
            kept.checked_under = self._listing_of(kept.cgroup)
        return current


@dataclass(slots=True)
class _KeptId:
    """A cgroup id's key kept from scrape to scrape: the cgroup it was found as (its directory under the
    hierarchy's mount, checked with one lstat), its pod's labels token, and the listing (cgroups_token)
    under which that check last held, if any."""

    cgroup: str
    labels_token: object
    key: SeriesKey | None
    checked_under: Collection[str] | None


def _cgroup_label(path: str) -> str:
    return "/" + path.strip("/")


def _target_values(target: Target) -> tuple[str, ...]:
    return (target.namespace or "", target.pod or "", target.qos or "", _cgroup_label(target.cgroup))


# -- state -----------------------------------------------------------------------------------------

# metric name -> values of the metric's own labels -> value
_Values = dict[str, dict[tuple[str, ...], float]]
_Hists = dict[str, dict[tuple[str, ...], LatencyHistogram]]


@dataclass(slots=True)
class _SeriesData:
    """What one label set (a cgroup, or the node) publishes."""

    counters: _Values = field(default_factory=dict)
    gauges: _Values = field(default_factory=dict)
    hists: _Hists = field(default_factory=dict)

    # Not table.setdefault(name, {}): that makes (and drops) an empty dict for every sample, and these run
    # once per sample of every cgroup in a scrape.
    def add_counter(self, name: str, labels: tuple[str, ...], value: float) -> None:
        series = self.counters.get(name)
        if series is None:
            self.counters[name] = {labels: 0.0 + value}
        else:
            series[labels] = series.get(labels, 0.0) + value

    def set_gauge(self, name: str, labels: tuple[str, ...], value: float) -> None:
        series = self.gauges.get(name)
        if series is None:
            self.gauges[name] = {labels: value}
        else:
            series[labels] = value

    def add_gauge(self, name: str, labels: tuple[str, ...], value: float) -> None:
        series = self.gauges.setdefault(name, {})
        series[labels] = series.get(labels, 0.0) + value

    def max_gauge(self, name: str, labels: tuple[str, ...], value: float) -> None:
        series = self.gauges.setdefault(name, {})
        series[labels] = max(value, series.get(labels, value))

    def add_hist(self, name: str, labels: tuple[str, ...], hist: LatencyHistogram) -> None:
        series = self.hists.get(name)
        if series is None:
            self.hists[name] = {labels: hist}
            return
        before = series.get(labels)
        series[labels] = hist if before is None else LatencyHistogram.merge((before, hist))

    def add(self, kind: str, name: str, labels: tuple[str, ...], value: object) -> None:
        """A plugin's sample by its metric's type: histograms and counters add up, a gauge is set."""
        if kind == "histogram":
            self.add_hist(name, labels, value)  # type: ignore[arg-type]
        elif kind == "counter":
            self.add_counter(name, labels, value)  # type: ignore[arg-type]
        else:
            self.set_gauge(name, labels, value)  # type: ignore[arg-type]

    def fold_into(self, other: _SeriesData) -> None:
        """Add this cgroup's counters and histograms to `other` (the overflow series). Gauges (quota,
        limits, PSI averages) do not add up and are left out."""
        for name, series in self.counters.items():
            for labels, value in series.items():
                other.add_counter(name, labels, value)
        for name, hists in self.hists.items():
            for labels, hist in hists.items():
                other.add_hist(name, labels, hist)


@dataclass(frozen=True)
class _State:
    node: _SeriesData
    cgroups: dict[SeriesKey, _SeriesData]


@dataclass
class _ActionSeen:
    kind: str
    state: ActionState
    target: Target
    suppress: SuppressAmount | None


class _EventCounts:
    """What must see every tick, not only the scraped one: incidents opened and actions entering each state
    are counted once per id (the last ``remember`` ids of each are remembered), and the open incidents'
    and active actions' gauges."""

    def __init__(self, remember: int) -> None:
        self.remember = remember
        self._incidents_seen: OrderedDict[str, None] = OrderedDict()
        self._incident_counts: Counter[str] = Counter()
        self._actions_seen: OrderedDict[str, _ActionSeen] = OrderedDict()
        self._action_counts: Counter[tuple[str, str]] = Counter()

    def incident_series(self, incidents: list[Incident], node: _SeriesData) -> None:
        for inc in incidents:
            if inc.incident_id not in self._incidents_seen:
                self._incident_counts[str(inc.cause)] += 1
            self._incidents_seen[inc.incident_id] = None
            self._incidents_seen.move_to_end(inc.incident_id)
            if not inc.open:
                continue
            victim = _target_values(inc.victim)
            cause = str(inc.cause)
            node.add_gauge(INCIDENTS_OPEN, (*victim, cause), 1.0)
            node.set_gauge(INCIDENT_CONFIDENCE, (*victim, cause), inc.confidence)
            for e in inc.evidence:  # the breaches: catalogued SLO signals compared with their bound
                if e.signal in SLO_SIGNAL_NAMES and e.threshold and e.threshold > 0:
                    node.max_gauge(INCIDENT_SLO_RATIO, (*victim, cause, e.signal), e.value / e.threshold)
            for culprit in inc.culprits:
                labels = (*victim, cause, *_target_values(culprit.target))
                node.max_gauge(CULPRIT_SCORE, labels, culprit.score)
                if culprit.runq_p99_without_ns is not None:
                    node.set_gauge(CULPRIT_P99_WITHOUT, labels, culprit.runq_p99_without_ns / 1e9)
            if inc.moved_together_cost is not None:
                node.set_gauge(MOVED_TOGETHER_P99_WITHOUT, (*victim, cause), inc.moved_together_cost.p99_without_ns / 1e9)
        while len(self._incidents_seen) > self.remember:
            self._incidents_seen.popitem(last=False)
        for cause, count in self._incident_counts.items():
            node.add_counter(INCIDENTS, (cause,), float(count))

    def action_series(self, actions: list[ActionRecord], node: _SeriesData) -> None:
        for record in actions:
            kind = str(record.decision.kind)
            seen = self._actions_seen.get(record.action_id)
            if seen is None or seen.state != record.state:
                self._action_counts[(kind, str(record.state))] += 1
            amount = record.decision.amount
            suppress = amount if isinstance(amount, SuppressAmount) else None
            self._actions_seen[record.action_id] = _ActionSeen(kind, record.state, record.decision.target, suppress)
            self._actions_seen.move_to_end(record.action_id)
        while len(self._actions_seen) > self.remember:
            self._actions_seen.popitem(last=False)
        for (kind, state), count in self._action_counts.items():
            node.add_counter(ACTIONS, (kind, state), float(count))
        for seen in self._actions_seen.values():
            if seen.state not in (ActionState.APPLIED, ActionState.VERIFIED):
                continue
            target = (seen.target.namespace or "", seen.target.pod or "", _cgroup_label(seen.target.cgroup))
            node.add_gauge(ACTION_ACTIVE, (seen.kind, str(seen.state), *target), 1.0)
            if seen.kind == ActionKind.SUPPRESS and seen.suppress is not None and seen.suppress.cpu_cores is not None:
                node.set_gauge(ACTION_SUPPRESS_CORES, (seen.suppress.policy, *target), seen.suppress.cpu_cores)



def _check_sizes(max_cgroups: int, max_bucket_seconds: float, min_bucket_seconds: float) -> None:
    """The exporter's size settings, each refused with one line."""
    if max_cgroups < 1:
        raise ValueError(f"max_cgroups must be at least 1, got {max_cgroups}")
    if not max_bucket_seconds > 0:
        raise ValueError(f"max_bucket_seconds must be positive, got {max_bucket_seconds}")
    if not 0 <= min_bucket_seconds < max_bucket_seconds:
        raise ValueError(f"min_bucket_seconds must be >= 0 and below max_bucket_seconds, got {min_bucket_seconds}")

class Exporter:
    """Holds the latest state; registers itself as a collector in `registry`.

    `max_cgroups` caps the cgroups that get their own series; the rest are summed into
    ``cgroup="_overflow"``. Cgroups that already had series keep them, so a burst of new cgroups
    does not reshuffle which ones are visible.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        labeler: Labeler | None = None,
        *,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        node: str | None = None,
        max_cgroups: int = 2000,
        remember_ids: int = 10000,
        max_bucket_seconds: float = DEFAULT_MAX_BUCKET_SECONDS,
        min_bucket_seconds: float = DEFAULT_MIN_BUCKET_SECONDS,
        extra_node_series: bool = False,
        container_name: Callable[[str, str], str | None] | None = None,
        per_cpu_series: bool = False,
        labels_token: Callable[[str], object] | None = None,
        cgroups_token: Callable[[], Collection[str]] | None = None,
    ) -> None:
        """``extra_node_series``: also PSI averages (node and cgroups) and /proc/stat per CPU and mode,
        which node_exporter already has; ``container_name(pod_uid, container_id)`` names containers;
        ``per_cpu_series``: :data:`PER_CPU_METRICS` per CPU, not summed over the node's CPUs.
        ``labels_token(pod_uid)``: keep each cgroup's labels from scrape to scrape while that pod's record is
        the same object (:class:`CgroupKeys`); ``cgroups_token()``: the watched cgroups' listing, the same
        object while none came or went (:class:`CgroupKeys`: a kept key is not checked at each scrape)."""
        _check_sizes(max_cgroups, max_bucket_seconds, min_bucket_seconds)
        self.top_slot = top_slot_for(max_bucket_seconds)
        # render_text's last scrape, per label set: its label text and per metric (its values, their text,
        # encoded: a counter's or gauge's lines, a histogram's numbers)
        self.cgroup_text: dict[SeriesKey, _LabelSetText] = {}  # render_text's, of each cgroup of the last scrape
        self.node_text = _LabelSetText("")  # render_text's of the node's series
        self.own_label_text: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}  # _own_label_text's
        self.bottom_slot = min(bottom_slot_for(min_bucket_seconds), self.top_slot)
        self.extra_node_series = extra_node_series
        self.per_cpu_series = per_cpu_series
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)
        self.labeler: Labeler = labeler or ResolverLabeler(CgroupResolver(self.paths, self.layout))
        # The hierarchies whose ids key the BPF maps, chosen as probes.base.BpfProbe._key_by does.
        self.hierarchies = {plugin.id_controller: self.layout.hierarchy_for(plugin.id_controller) or self.layout.v2
                            for plugin in PLUGINS}
        self.cpu_hierarchy = self.layout.hierarchy_for("cpu") or self.layout.v2
        self.node = node or socket.gethostname()
        self.max_cgroups = max_cgroups
        self.remember_ids = remember_ids
        self.keys = CgroupKeys(self.labeler, container_name, labels_token, cgroups_token)
        self._pending: tuple[NodeSnapshot, _SeriesData] | None = None  # the latest tick, not built yet
        self._built: _State | None = None
        self._update_lock = threading.Lock()
        self._exported: set[SeriesKey] = set()
        # (cgroups, those exported before, the order chosen from them) of the last scrape over the cap
        self._cap_order: tuple[set[SeriesKey], set[SeriesKey], list[SeriesKey]] | None = None
        self._events = _EventCounts(remember_ids)
        if registry is not None:
            registry.register(self)

    # -- update (agent loop) -------------------------------------------------------------------
    def update(
        self, snapshot: NodeSnapshot, incidents: Iterable[Incident] = (), actions: Iterable[ActionRecord] = (),
        batch: BatchAllocatable | None = None,
    ) -> None:
        """Take one tick. Never raises for odd input: what cannot be labelled is dropped and counted.

        Only the bookkeeping that must see every tick (incident and action counts) happens here; the
        series are built from the latest tick when they are scraped (every 15 s, not every second),
        so an agent ticking at 1 Hz does no per-cgroup exporter work between scrapes.
        """
        with self._update_lock:
            node = _SeriesData()
            self._events.incident_series(list(incidents), node)
            self._events.action_series(list(actions), node)
            if batch is not None:
                for resource, metric in (("cpu", BATCH_ALLOCATABLE_CPU), ("memory", BATCH_ALLOCATABLE_MEMORY)):
                    for policy, value in batch.values()[resource].items():
                        node.set_gauge(metric, (policy,), value)
            self._pending = (snapshot, node)
            self._built = None

    def state(self) -> _State:
        """The series of the latest tick, built on the first call after it (a scrape)."""
        with self._update_lock:
            if self._built is None and self._pending is not None:
                self._built = self._build(*self._pending)
            return self._built if self._built is not None else _State(_SeriesData(), {})

    def _build(self, snapshot: NodeSnapshot, tick_node: _SeriesData) -> _State:
        node = _SeriesData(dict(tick_node.counters), dict(tick_node.gauges), dict(tick_node.hists))
        raw: dict[SeriesKey, _SeriesData] = {}
        unresolved = self._cgroup_series(snapshot, raw)
        self._node_series(snapshot, node)
        cgroups, overflowed = self._apply_cap(raw)
        node.set_gauge(EXPORTER_CGROUPS, ("exported",), float(len(cgroups) - (OVERFLOW_KEY in cgroups)))
        node.set_gauge(EXPORTER_CGROUPS, ("overflow",), float(overflowed))
        node.set_gauge(EXPORTER_CGROUPS, ("unresolved",), float(unresolved))
        node.set_gauge(EXPORTER_LAST_UPDATE, (), float(snapshot.wall_s))
        node.set_gauge(SNAPSHOT_ERRORS, (), float(len(snapshot.errors)))
        return _State(node, cgroups)

    def _cgroup_series(self, snap: NodeSnapshot, out: dict[SeriesKey, _SeriesData]) -> int:
        """Fill `out` per cgroup; returns how many ids/paths could not be labelled."""
        keys = self.keys
        keys.begin_scrape()

        # Not out.setdefault(key, _SeriesData()): that makes a _SeriesData for every sample, and dropping
        # them was 7 % of the agent's CPU at 1,000 pods.
        def data_of(key: SeriesKey | None) -> _SeriesData | None:
            if key is None:
                return None
            data = out.get(key)
            if data is None:
                data = out[key] = _SeriesData()
            return data

        def by_path(path: str) -> _SeriesData | None:
            return data_of(keys.for_path(path))

        for plugin in _CGROUP_SERIES:
            probe_snap = snap.probe(plugin.name)
            if probe_snap is None:
                continue
            hierarchy = self.hierarchies[plugin.id_controller]
            for metric, cgroup, labels, value in plugin.cgroup_series(probe_snap):  # type: ignore[misc]
                data = data_of(keys.for_path(cgroup) if isinstance(cgroup, str) else keys.for_id(cgroup, hierarchy))
                if data is not None:
                    data.add(METRICS[metric].type, metric, labels, value)
        if snap.listen is not None:
            self._listen_series(snap, by_path)
        for path, cpu in snap.cgroup_cpu.items():
            if (data := by_path(path)) is not None:
                data.add_counter(CGROUP_CPU_USAGE, (), cpu.usage_ns / 1e9)
                quota = cpu.quota_cores
                if quota is not None or cpu.nr_periods:  # bandwidth counters mean nothing without a quota
                    data.add_counter(CGROUP_CPU_THROTTLED, (), cpu.throttled_ns / 1e9)
                    data.add_counter(CGROUP_CPU_PERIODS, (), float(cpu.nr_periods))
                    data.add_counter(CGROUP_CPU_THROTTLED_PERIODS, (), float(cpu.nr_throttled))
                if quota is not None:
                    data.set_gauge(CGROUP_CPU_QUOTA, (), quota)
        for path, mem in snap.cgroup_mem.items():
            if (data := by_path(path)) is not None:
                if mem.usage_bytes is not None:
                    data.set_gauge(CGROUP_MEMORY_USAGE, (), float(mem.usage_bytes))
                if mem.limit_bytes is not None:
                    data.set_gauge(CGROUP_MEMORY_LIMIT, (), float(mem.limit_bytes))
        avg = CGROUP_PSI_AVG if self.extra_node_series else None
        for path, readings in snap.cgroup_psi.items():
            if parse_cgroup_path(path).kind == "container" and not self.extra_node_series:
                continue  # a pod's PSI is the victim signal; its containers' would double the series
            if (data := by_path(path)) is not None:
                for reading in readings.values():
                    _add_psi(data, reading, CGROUP_PSI_STALL, avg)
        return keys.end_scrape()

    @staticmethod
    def _listen_series(snap: NodeSnapshot, by_path: Callable[[str], _SeriesData | None]) -> None:
        """Per pod: its fullest listener, and its namespace's ListenOverflows. A namespace shared with the
        node or other pods (hostNetwork) has counters no pod owns: only listeners whose owner was found
        (their socket among a pod's open files) are published there."""
        assert snap.listen is not None
        for reading in snap.listen.namespaces.values():
            fills: dict[str, float] = {}
            for listener in reading.snapshot.listeners:
                owner = reading.owner_of(listener)
                if owner is not None:
                    fills[owner] = max(fills.get(owner, 0.0), listener.fill)
            overflows = reading.snapshot.counters.listen_overflows
            if not reading.shared and reading.owners and overflows \
                    and (data := by_path(reading.owners[0])) is not None:
                data.add_counter(LISTEN_OVERFLOWS, (), float(overflows))
            for owner, fill in fills.items():
                if (data := by_path(owner)) is not None:
                    data.max_gauge(LISTEN_QUEUE_FILL, (), fill)

    def _apply_cap(self, raw: dict[SeriesKey, _SeriesData]) -> tuple[dict[SeriesKey, _SeriesData], int]:
        if len(raw) <= self.max_cgroups:
            self._exported = set(raw)
            return raw, 0
        # Stable choice: cgroups that already have series first, then pods, then by path. The order is a
        # function of the cgroups and of those already exported: when neither changed since the last
        # scrape (a steady node over the cap), it is the last one (sorting ~3,000 keys with a key
        # function was a twentieth of the agent's CPU at 1,000 pods).
        memo = self._cap_order
        if memo is not None and memo[1] == self._exported and memo[0] == raw.keys():
            order = memo[2]
        else:
            order = sorted(raw, key=lambda k: (k not in self._exported, not k.pod_uid, k.cgroup, k.values()))
            self._cap_order = (set(raw), self._exported, order)
        kept = {k: raw[k] for k in order[: self.max_cgroups]}
        overflow = _SeriesData()
        for k in order[self.max_cgroups :]:
            raw[k].fold_into(overflow)
        self._exported = set(kept)
        kept[OVERFLOW_KEY] = overflow
        return kept, len(order) - self.max_cgroups

    def _node_series(self, snap: NodeSnapshot, node: _SeriesData) -> None:
        for plugin in _NODE_SERIES:
            # The probe's snapshot, else (not loaded) its node reader's reading: the node's own series.
            probe_snap = snap.probe(plugin.name)
            if probe_snap is None:
                probe_snap = snap.node_readings.get(plugin.name)
            if probe_snap is not None:
                for metric, labels, value in plugin.node_series(probe_snap):  # type: ignore[misc]
                    d = METRICS[metric]
                    if d.per_cpu and not self.per_cpu_series:  # summed over CPUs: the cpu label goes
                        labels = d.lean_labels(labels)
                    node.add(d.type, metric, labels, value)
        for plugin in _SHARED_NODE_SERIES:  # from the node's /proc readings, the probe loaded or not
            for metric, labels, value in plugin.shared_node_series(snap):  # type: ignore[misc]
                node.add(METRICS[metric].type, metric, labels, value)
        if snap.node_psi is not None:
            for reading in snap.node_psi.readings.values():
                _add_psi(node, reading, PSI_STALL, PSI_AVG if self.extra_node_series else None)
        for cpu, times in snap.node_cpu_per_cpu.items() if self.extra_node_series else ():
            for mode in CPU_MODES:
                node.add_counter(NODE_CPU, (str(cpu), mode), getattr(times, f"{mode}_ns") / 1e9)
        for name, status in snap.probe_status.items():
            node.set_gauge(PROBE_UP, (name,), 0.0 if status.state == "off" else 1.0)
            node.set_gauge(PROBE_STATE, (name, status.state), 1.0)
        degraded = degraded_code(snap.probe_status)
        if degraded is not None:
            node.set_gauge(AGENT_DEGRADED, (str(degraded),), 1.0)
        for plugin in PLUGINS:
            probe_snap = snap.probe(plugin.name)
            if probe_snap is None:
                continue
            for reason, count in getattr(probe_snap, "drops", {}).items():
                node.add_counter(PROBE_DROPS, (plugin.name, reason), float(count))
            if plugin.map_entries is not None:
                node.set_gauge(BPF_MAP_ENTRIES, (plugin.name,), float(plugin.map_entries(probe_snap)))
        for prog in snap.bpf_programs:
            node.add_counter(BPF_RUN_SECONDS, (prog.name,), prog.run_time_ns / 1e9)
            node.add_counter(BPF_RUNS, (prog.name,), float(prog.run_count))

    # -- scrape --------------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []  # families vary with the state; nothing to check for duplicates at registration

    def label_names(self, d: MetricDef) -> tuple[str, ...]:
        """``d``'s own labels as exported: without ``cpu`` (and its other per_cpu_labels) for PER_CPU_METRICS
        unless per_cpu_series."""
        if d.name in PER_CPU_METRICS and not self.per_cpu_series:
            return tuple(name for name in d.labels if name not in d.per_cpu_labels)
        return d.labels

    def collect(self) -> Iterator[Metric]:
        state = self.state()
        node_label = (self.node,)
        for d in _DEFS:
            family = _new_family(d, self.label_names(d))
            if d.per_cgroup:
                for key, data in state.cgroups.items():
                    _fill(family, d, (*node_label, *key.values()), data, self.top_slot, self.bottom_slot)
            else:
                _fill(family, d, node_label, state.node, self.top_slot, self.bottom_slot)
            if family.samples:
                yield family


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(names: tuple[str, ...], values: Iterable[str]) -> str:
    return ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))


@dataclass(slots=True)
class _LabelSetText:
    """One label set's text (a cgroup's, or the node's), kept from scrape to scrape while it has series:
    its label text, made once, and per metric (and own labels, for a histogram) the values of its last
    scrape with their text, so that what did not change since is not formatted again. Held by the label
    set, not in one dict keyed by (metric, label text): those keys were made and hashed for every series
    of every scrape. A metric the label set no longer has keeps its last entry until the label set goes
    (a few at most: one per metric and label values it had); an entry is only reused for values equal
    to its own, so an old one is never wrong."""

    prefix: str
    lines: dict[object, tuple[object, bytes | tuple[bytes, ...]]] = field(default_factory=dict)


def _by_metric(cgroup_texts: list[tuple[_LabelSetText, _SeriesData]]) -> dict[str, list[tuple[_LabelSetText, _SeriesData]]]:
    """Per metric, the cgroups that have it, in cgroup order: a scrape looks for a metric only where it
    is (21 per-cgroup metrics x every cgroup was most of a scrape's loop, most of them absent)."""
    by_metric: dict[str, list[tuple[_LabelSetText, _SeriesData]]] = {}
    for text, data in cgroup_texts:
        for table in (data.hists, data.counters, data.gauges):
            for name in table:
                have = by_metric.get(name)
                if have is None:
                    by_metric[name] = [(text, data)]
                elif have[-1][1] is not data:  # a name in two of its tables is listed once
                    have.append((text, data))
    return by_metric


def _cgroup_texts(exporter: Exporter, state: _State, node_prefix: str) -> list[tuple[_LabelSetText, _SeriesData]]:
    """Each cgroup's text with its series. A cgroup's labels are the same scrape after scrape (its key
    holds them all): the text is made once and kept for the cgroups of this scrape only."""
    last, kept = exporter.cgroup_text, {}
    out: list[tuple[_LabelSetText, _SeriesData]] = []
    for key, data in state.cgroups.items():
        text = last.get(key)
        if text is None:
            text = _LabelSetText(f"{node_prefix},{_label_text(CGROUP_LABELS, key.values())}")
        kept[key] = text
        out.append((text, data))
    exporter.cgroup_text = kept
    return out


OWN_LABEL_TEXTS = 4096  # labels of many values (a device, a CPU) would just miss


def _own_label_text(exporter: Exporter, names: tuple[str, ...], labels: tuple[str, ...]) -> str:
    """A metric's own labels' text: they take few values (a resource and a kind, a direction), so the text
    is made once, not once per cgroup and scrape (kept by the exporter; past OWN_LABEL_TEXTS, made anew)."""
    text = exporter.own_label_text.get((names, labels))
    if text is None:
        text = _label_text(names, labels)
        if len(exporter.own_label_text) < OWN_LABEL_TEXTS:
            exporter.own_label_text[(names, labels)] = text
    return text


def render_text(exporter: Exporter, tail: bytes = b"") -> bytes:
    """The exporter's series in the Prometheus text format (0.0.4), written directly, then ``tail``.

    What ``generate_latest`` prints for :meth:`Exporter.collect`, at a fraction of its cost: it
    validates and escapes every label name of every sample; here each cgroup's label text is made
    once per scrape and the rest is joins. A scrape of 300 pods is ~10k samples. One join of byte
    pieces (~4 MB at 1,000 pods): joining each metric's lines, then the metrics, then encoding and
    adding the tail (the registry's series) made four buffers that size, most of a scrape's time."""
    state = exporter.state()
    out: list[bytes] = []
    # A histogram's lines are most of a scrape, and most cgroups' histograms did not change since the
    # last one (the probe hands the same object again): their numbers' text is reused (the lines, their
    # labels repeated on each of ~20, are joined again: kept whole they were 2.6 MiB of RSS at 300 pods,
    # made again they are ~2 ms a scrape at 300 pods). So is a cgroup's lines of a
    # counter or gauge whose values are equal to the last scrape's (an idle cgroup's: formatting them
    # again was most of a scrape at 1,000 pods). Only this scrape's lines are kept for the next, so
    # removed cgroups leave nothing behind (_LabelSetText).
    node_prefix = f'{NODE_LABEL}="{_escape(exporter.node)}"'
    by_metric = _by_metric(_cgroup_texts(exporter, state, node_prefix))
    if exporter.node_text.prefix != node_prefix:
        exporter.node_text = _LabelSetText(node_prefix)
    node_source = [(exporter.node_text, state.node)]
    for d in _DEFS:
        out.append(b"")  # its HELP and TYPE lines, once it has a series
        start = len(out)
        names = exporter.label_names(d)
        sources = by_metric.get(d.name, ()) if d.per_cgroup else node_source
        if d.type == "histogram":
            _hist_lines(exporter, d.name, names, sources, out)
        else:
            _value_lines(exporter, d, names, sources, out)
        if len(out) > start:
            help_text = d.help.replace("\\", "\\\\").replace("\n", "\\n")
            out[start - 1] = f"# HELP {d.name} {help_text}\n# TYPE {d.name} {d.type}\n".encode()
        else:
            del out[start - 1]  # no series: no header
    out.append(tail)
    return b"".join(out)


_Sources = Iterable[tuple[_LabelSetText, _SeriesData]]


def _hist_lines(exporter: Exporter, name: str, names: tuple[str, ...], sources: _Sources, out: list[bytes]) -> None:
    """render_text's lines of one histogram metric: the numbers of a histogram that is the same object as
    at the last scrape are reused."""
    for text, data in sources:
        for labels, hist in data.hists.get(name, {}).items():
            slot = (name, labels) if labels else name
            cached = text.lines.get(slot)
            if cached is not None and cached[0] is hist:
                numbers = cached[1]
            else:
                numbers = _hist_numbers(hist, exporter.top_slot, exporter.bottom_slot)
            text.lines[slot] = (hist, numbers)
            head = f"{text.prefix},{_own_label_text(exporter, names, labels)}" if labels else text.prefix
            out.append(_hist_text(name, head, numbers))  # type: ignore[arg-type]


def _value_lines(exporter: Exporter, d: MetricDef, names: tuple[str, ...], sources: _Sources, out: list[bytes]) -> None:
    """render_text's lines of one counter or gauge metric: a label set's lines are reused while its values
    equal the last scrape's."""
    name = d.name
    for text, data in sources:
        values = (data.counters if d.type == "counter" else data.gauges).get(name)
        if not values:
            continue
        cached = text.lines.get(name)
        if cached is not None and cached[0] == values:
            lines = cached[1]
        else:
            prefix = text.prefix
            lines = b"".join(  # line by line: no second, text copy of a cgroup's lines to free
                f"{name}{{{prefix},{_own_label_text(exporter, names, labels)}}} {floatToGoString(value)}\n".encode()
                if labels else f"{name}{{{prefix}}} {floatToGoString(value)}\n".encode()
                for labels, value in values.items())
        text.lines[name] = (values, lines)
        out.append(lines)  # type: ignore[arg-type]


_BUCKET_LES_BYTES = tuple(le.encode() for le in BUCKET_LES)
_INF_LE = b"+Inf"
_GO_INTEGRAL_BELOW = 1_000_000  # floatToGoString writes n.0 for these; from 1e6 on, an exponent (1e+06)


def _count_text(n: int) -> bytes:
    """``floatToGoString(float(n)).encode()`` of a count, without the float and its repr for the counts
    a histogram holds (0 up to a million: "n.0"); the rest through floatToGoString itself."""
    return b"%d.0" % n if 0 <= n < _GO_INTEGRAL_BELOW else floatToGoString(n).encode()


_HistNumbers = tuple[tuple[bytes, ...], bytes, bytes]


def _hist_numbers(hist: LatencyHistogram, top_slot: int, bottom_slot: int) -> _HistNumbers:
    """A histogram's text less its names and labels: each bucket's line after ``le="`` (its le and count,
    +Inf's last), then its count and its sum. The text of :func:`histogram_buckets`'s buckets, made from
    the integers (each float went through floatToGoString: most of the scrape's histogram work)."""
    count, les = hist.count, _BUCKET_LES_BYTES
    tails = [b'%s"} %s\n' % (les[slot], _count_text(n)) for slot, n in bucket_counts(hist, top_slot, bottom_slot)]
    tails.append(b'%s"} %s\n' % (_INF_LE, _count_text(count)))
    return tuple(tails), _count_text(count), floatToGoString(hist.sum_ns / 1e9).encode()


def _hist_text(name: str, head: str, numbers: _HistNumbers) -> bytes:
    """A histogram's lines, each ending in a newline, from its label text (``head``) and :func:`_hist_numbers`:
    the bucket lines are one join of their tails with their common start (not a line object each).
    Made as bytes: encoding the text made a second copy of every histogram's lines in the scrape thread's
    malloc arena, freed in among the kept ones (its RSS grew by about the scrape's size)."""
    tails, count, total = numbers
    bucket = f'{name}_bucket{{{head},le="'.encode()
    name_b, head_b = name.encode(), head.encode()
    return b"%s%s%s_count{%s} %s\n%s_sum{%s} %s\n" % (bucket, bucket.join(tails), name_b, head_b, count,
                                                       name_b, head_b, total)


def _add_psi(data: _SeriesData, reading: object, stall_name: str, avg_name: str | None) -> None:
    for kind in ("some", "full"):
        line = getattr(reading, kind)
        if line is None:
            continue
        resource = reading.resource  # type: ignore[attr-defined]
        data.add_counter(stall_name, (resource, kind), line.total_us / 1e6)
        if avg_name is None:
            continue
        for window, avg in zip(PSI_WINDOWS, (line.avg10, line.avg60, line.avg300), strict=True):
            data.set_gauge(avg_name, (resource, kind, window), avg / 100.0)


def _new_family(d: MetricDef, own_labels: tuple[str, ...]) -> Metric:
    labels = list(d.all_labels[: len(d.all_labels) - len(d.labels)] + own_labels)
    if d.type == "counter":
        return CounterMetricFamily(d.name, d.help, labels=labels)
    if d.type == "gauge":
        return GaugeMetricFamily(d.name, d.help, labels=labels)
    return HistogramMetricFamily(d.name, d.help, labels=labels)


def _fill(family: Metric, d: MetricDef, prefix: tuple[str, ...], data: _SeriesData, top_slot: int,
          bottom_slot: int) -> None:
    if d.type == "histogram":
        for labels, hist in data.hists.get(d.name, {}).items():
            family.add_metric([*prefix, *labels], histogram_buckets(hist, top_slot, bottom_slot), hist.sum_ns / 1e9)  # type: ignore[attr-defined]
        return
    source = data.counters if d.type == "counter" else data.gauges
    for labels, value in source.get(d.name, {}).items():
        family.add_metric([*prefix, *labels], value)  # type: ignore[attr-defined]
