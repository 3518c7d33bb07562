# SPDX-License-Identifier: Apache-2.0
"""What the node can still give batch (BE) pods: koordinator's batch allocatable, CPU and memory.

koord-manager (slo-controller, batch resource plugin) computes, per node and resource::

    Node(Batch).Alloc[usage]           := Node.Total - Node.Reserved - System.Used - sum(Pod(Prod/Mid).Used)
    Node(Batch).Alloc[request]         := Node.Total - Node.Reserved - System.Reserved - sum(Pod(Prod/Mid).Request)
    Node(Batch).Alloc[maxUsageRequest] := Node.Total - Node.Reserved - System.Used
                                          - sum(max(Pod(Prod/Mid).Request, Pod(Prod/Mid).Used))
    System.Used     = max(Node.Used - Pod(All).Used, Node.Anno.Reserved, Node.Kubelet.Reserved)
    System.Reserved = max(Node.Anno.Reserved, Node.Kubelet.Reserved)

- Node.Reserved is the colocation safety margin: Node.Total * (100 - reclaim threshold) / 100
  (``colocation-config`` ``cpuReclaimThresholdPercent`` / ``memoryReclaimThresholdPercent``).
- Node.Anno.Reserved: the node annotation ``node.koordinator.sh/reservation`` (its ``reservedCPUs``
  count, else ``resources.cpu``; ``resources.memory``), or the policy's ``colocation.reservedCpuCores`` /
  ``reservedMemoryBytes`` where the annotation is not readable (no apiserver access, standalone).
- Node.Kubelet.Reserved: the kubelet configuration (``/configz`` or its config file):
  ``reservedSystemCPUs`` (count) else ``kubeReserved.cpu + systemReserved.cpu``; memory
  ``kubeReserved + systemReserved + evictionHard[memory.available]`` (what capacity - allocatable is).
- Prod/Mid are the pods the detector calls latency-sensitive (SYSTEM, LSE, LSR, LS: the same QoS mapping,
  :data:`detector.workloads.LATENCY_SENSITIVE`); Batch is BE. A pod of unknown class counts as Prod/Mid
  (what it uses is not the batch tier's to give).
- Used: CPU over the interval from cpuacct and ``/proc/stat`` (busy = not idle, not iowait, as koordlet
  reads it); memory without page cache (usage - file) for pods, total - available for the node.

A result below zero is clamped to 0 (``negative`` says which): koord-manager publishes no negative
allocatable either. Pure arithmetic on :class:`ResourceTerms`, so a test can check every formula by
hand; :class:`BatchMeter` fills the terms from snapshots and pod metadata.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from detector.quantity import parse_quantity
from detector.workloads import WorkloadIndex
from probes.cgroupfiles import parse_cpu_list
from probes.host import HostPaths
from probes.memstat import read_node_memory

if TYPE_CHECKING:
    from probes.snapshot import NodeSnapshot  # its registry imports every probe module: the kubectl client must not

log = logging.getLogger("noisyneighbor.batch")

POLICIES = ("usage", "request", "maxUsageRequest")
RESERVATION_ANNOTATION = "node.koordinator.sh/reservation"
DEFAULT_EVICTION_HARD_MEMORY = 100 * 1024 * 1024  # the kubelet's memory.available default (100Mi)


class ReservationError(ValueError):
    """A kubelet config or reservation annotation that cannot be read (one line)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one source reserves: CPU cores and memory bytes (0: nothing)."""

    cpu_cores: float = 0.0
    memory_bytes: float = 0.0
    source: str = ""  # where it came from, for `diagnose`


@dataclass(frozen=True, slots=True)
class ResourceTerms:
    """Every term of the three formulas for one resource (cores or bytes)."""

    total: float
    node_reserved: float  # safety margin: total * (100 - reclaim threshold) / 100
    node_used: float
    pods_all_used: float
    anno_reserved: float
    kubelet_reserved: float
    prod_used: float  # sum over Prod/Mid pods
    prod_request: float
    prod_max_usage_request: float  # sum over Prod/Mid pods of max(request, used)

    @property
    def system_used(self) -> float:
        return max(self.node_used - self.pods_all_used, self.anno_reserved, self.kubelet_reserved)

    @property
    def system_reserved(self) -> float:
        return max(self.anno_reserved, self.kubelet_reserved)

    def raw(self, policy: str) -> float:
        """The formula's value, before clamping at 0."""
        base = self.total - self.node_reserved
        if policy == "usage":
            return base - self.system_used - self.prod_used
        if policy == "request":
            return base - self.system_reserved - self.prod_request
        if policy == "maxUsageRequest":
            return base - self.system_used - self.prod_max_usage_request
        raise ValueError(f"unknown batch allocatable policy {policy!r} ({', '.join(POLICIES)})")

    def allocatable(self, policy: str) -> float:
        return max(self.raw(policy), 0.0)


@dataclass(frozen=True, slots=True)
class PodUse:
    """One pod's terms: CPU in cores, memory in bytes; ``prod``: Prod/Mid (not BE)."""

    prod: bool
    cpu_used: float
    memory_used: float
    cpu_request: float = 0.0
    memory_request: float = 0.0


@dataclass(frozen=True)
class BatchAllocatable:
    cpu: ResourceTerms  # cores
    memory: ResourceTerms  # bytes
    window_s: float  # the CPU usage window
    sources: tuple[str, ...] = ()  # where the reservations came from

    def values(self) -> dict[str, dict[str, float]]:
        """{"cpu": {policy: cores}, "memory": {policy: bytes}}."""
        return {"cpu": {p: self.cpu.allocatable(p) for p in POLICIES},
                "memory": {p: self.memory.allocatable(p) for p in POLICIES}}

    def to_dict(self) -> dict[str, Any]:
        def terms(t: ResourceTerms) -> dict[str, float]:
            return {
                "total": t.total, "node_reserved": t.node_reserved, "node_used": t.node_used,
                "pods_all_used": t.pods_all_used, "anno_reserved": t.anno_reserved,
                "kubelet_reserved": t.kubelet_reserved, "system_used": t.system_used,
                "system_reserved": t.system_reserved, "prod_used": t.prod_used, "prod_request": t.prod_request,
                "prod_max_usage_request": t.prod_max_usage_request,
            }
        return {"allocatable": self.values(), "cpu_terms": terms(self.cpu), "memory_terms": terms(self.memory),
                "window_s": self.window_s, "sources": list(self.sources)}


def resource_terms(total: float, reclaim_threshold_percent: float, node_used: float, prod: list[bool],
                   used: list[float], request: list[float], anno_reserved: float,
                   kubelet_reserved: float) -> ResourceTerms:
    """One resource's terms from the node's figures and its pods' columns, one value per pod in the same
    order (``prod``: Prod/Mid, not BE; ``used`` and ``request`` in the resource's unit): columns, so the
    meter's 1,000 pods make no object each per measure."""
    prod_used = [u for u, p in zip(used, prod, strict=True) if p]
    prod_request = [r for r, p in zip(request, prod, strict=True) if p]
    return ResourceTerms(
        total=total,
        node_reserved=total * (100.0 - reclaim_threshold_percent) / 100.0,
        node_used=node_used,
        pods_all_used=sum(used),
        anno_reserved=anno_reserved,
        kubelet_reserved=kubelet_reserved,
        prod_used=sum(prod_used),
        prod_request=sum(prod_request),
        prod_max_usage_request=sum(map(max, prod_request, prod_used)),
    )


# -- reservation sources -----------------------------------------------------------------------------


def _quantity(raw: Any, where: str) -> float:
    try:
        return float(parse_quantity(raw))
    except ValueError:
        raise ReservationError(f"{where}: not a quantity: {raw!r}") from None


def _cpu_count(raw: Any, where: str) -> int:
    if not isinstance(raw, str):
        raise ReservationError(f"{where}: expected a CPU list like \"0-1\", got {raw!r}")
    try:
        return len(parse_cpu_list(raw))
    except ValueError:
        raise ReservationError(f"{where}: not a CPU list: {raw!r}") from None


def kubelet_reservation(doc: Any, capacity_memory_bytes: float = 0.0, source: str = "kubelet config") -> Reservation:
    """Node.Kubelet.Reserved from a KubeletConfiguration (a config file's document, or ``/configz``'s
    ``{"kubeletconfig": {...}}``). ``capacity_memory_bytes`` resolves a percentage evictionHard."""
    if isinstance(doc, Mapping) and isinstance(doc.get("kubeletconfig"), Mapping):
        doc = doc["kubeletconfig"]
    if not isinstance(doc, Mapping):
        raise ReservationError(f"{source}: expected a KubeletConfiguration mapping")
    cpu = memory = 0.0
    for key in ("kubeReserved", "systemReserved"):
        section = doc.get(key) or {}
        if not isinstance(section, Mapping):
            raise ReservationError(f"{source}: {key}: expected a mapping")
        if "cpu" in section:
            cpu += _quantity(section["cpu"], f"{source}: {key}.cpu")
        if "memory" in section:
            memory += _quantity(section["memory"], f"{source}: {key}.memory")
    # The static CPU manager's reserved CPUs replace the cpu reservations (the kubelet requires them to agree).
    if doc.get("reservedSystemCPUs"):
        cpu = float(_cpu_count(doc["reservedSystemCPUs"], f"{source}: reservedSystemCPUs"))
    eviction = doc.get("evictionHard")
    if eviction is None:
        memory += DEFAULT_EVICTION_HARD_MEMORY
    elif isinstance(eviction, Mapping):
        # The kubelet's eviction signal memory.available (a signal name, not a cgroup file).
        signals = {tuple(str(k).split(".", 1)): v for k, v in eviction.items()}
        raw = signals.get(("memory", "available"))
        if isinstance(raw, str) and raw.endswith("%"):
            try:
                memory += capacity_memory_bytes * float(raw[:-1]) / 100.0
            except ValueError:
                raise ReservationError(f"{source}: evictionHard.memory.available: not a percentage: {raw!r}") from None
        elif raw is not None:
            memory += _quantity(raw, f"{source}: evictionHard.memory.available")
    else:
        raise ReservationError(f"{source}: evictionHard: expected a mapping")
    return Reservation(cpu, memory, source)


def _load_kubelet_config(path: str | Path) -> Any:
    """The kubelet's config file as a YAML document; None when there is no such file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ReservationError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ReservationError(f"{p}: not valid YAML") from None


def read_kubelet_config(path: str | Path, capacity_memory_bytes: float = 0.0) -> Reservation | None:
    """The kubelet's reservation from its config file; None when there is no such file."""
    doc = _load_kubelet_config(path)
    return None if doc is None else kubelet_reservation(doc, capacity_memory_bytes, source=str(path))


KUBELET_DEFAULT_MAX_PODS = 110  # the kubelet's maxPods where its configuration does not set it


def kubelet_max_pods(path: str | Path) -> int | None:
    """The pods the kubelet may run (its configuration's ``maxPods``, the kubelet's default where the
    file does not set it); None when there is no such file or it cannot be read as one."""
    try:
        doc = _load_kubelet_config(path)
    except ReservationError:
        return None
    if isinstance(doc, Mapping) and isinstance(doc.get("kubeletconfig"), Mapping):
        doc = doc["kubeletconfig"]
    if not isinstance(doc, Mapping):
        return None
    value = doc.get("maxPods", KUBELET_DEFAULT_MAX_PODS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def node_max_pods(node: Mapping[str, Any]) -> int | None:
    """The pods the node object says it holds (``status.capacity.pods``: the kubelet's maxPods)."""
    raw = ((node.get("status") or {}).get("capacity") or {}).get("pods") if isinstance(node, Mapping) else None
    try:
        pods = int(str(raw))
    except ValueError:
        return None
    return pods if pods > 0 else None


def annotation_reservation(annotations: Mapping[str, str], source: str = RESERVATION_ANNOTATION) -> Reservation | None:
    """Node.Anno.Reserved from the node's ``node.koordinator.sh/reservation`` annotation; None without one."""
    raw = annotations.get(RESERVATION_ANNOTATION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        raise ReservationError(f"{source}: not valid JSON") from None
    if not isinstance(doc, Mapping):
        raise ReservationError(f"{source}: expected a JSON object")
    resources = doc.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ReservationError(f"{source}: resources: expected a mapping")
    cpu = _quantity(resources["cpu"], f"{source}: resources.cpu") if "cpu" in resources else 0.0
    if doc.get("reservedCPUs"):
        cpu = float(_cpu_count(doc["reservedCPUs"], f"{source}: reservedCPUs"))
    memory = _quantity(resources["memory"], f"{source}: resources.memory") if "memory" in resources else 0.0
    return Reservation(cpu, memory, source)


# -- the meter ------------------------------------------------------------------------------------------


@dataclass
class _PodUses:
    """What :meth:`BatchMeter.pod_uses` keeps for one listing of the pods and one set of pod records."""

    listed: object  # BatchMeter.pods_of's rows they were made for
    records: object  # the index's pod records they were made with
    requests: Mapping[str, tuple[object, float, float]]  # pod path -> (record, CPU, memory requested)
    # pod path -> (the CPU and memory readings they were made from, its CPU seconds (None: no CPU reading),
    # its terms)
    by_path: dict[str, tuple[object, object, float | None, PodUse]] = field(default_factory=dict)


@dataclass
class BatchMeter:
    """Batch allocatable from two readings of the node (``measure``), with the reservations it was given.

    ``anno`` falls back to the policy's reservation; ``kubelet`` is what the kubelet config says (None:
    not known, 0). ``min_window_s``: the CPU usage window is at least this long (koord-manager averages
    over minutes; one second of usage is noise)."""

    cpu_reclaim_threshold_percent: float = 60.0
    memory_reclaim_threshold_percent: float = 65.0
    anno: Reservation | None = None
    kubelet: Reservation | None = None
    min_window_s: float = 10.0
    last: BatchAllocatable | None = None
    _start: tuple[float, float, dict[str, float]] | None = field(default=None, repr=False)
    # pod path -> (its pod record, its CPU and memory requests): a record's requests are summed over its
    # containers once, not on every measure (the same record object: the same requests)
    _requests: dict[str, tuple[object, float, float]] = field(default_factory=dict, repr=False)
    # (the pod paths listed, the index's pods version, each path's (workload key, prod?)): made again when
    # either changes, so a due measure does not ask the index about every pod again
    _pods_of: tuple[object, int, list[tuple[str, str, bool]]] | None = field(default=None, repr=False)
    _uses: _PodUses | None = field(default=None, repr=False)  # what pod_uses keeps between measures

    def pods_of(self, pod_paths: Iterable[str], index: WorkloadIndex) -> list[tuple[str, str, bool]]:
        """(pod path, its workload key, whether it is Prod/Mid) for the listed pod paths."""
        made = self._pods_of
        if made is None or made[0] is not pod_paths or made[1] != index.pods_version:
            rows = []
            for path in pod_paths:
                w = index.workload_of(path)
                rows.append((path, w.key, w.target.qos != "BE"))
            made = self._pods_of = (pod_paths, index.pods_version, rows)
        return made[2]

    def pod_uses(self, snapshot: NodeSnapshot, index: WorkloadIndex,
                 pod_paths: Iterable[str]) -> tuple[dict[str, float], dict[str, PodUse]]:
        """The listed pods' CPU seconds (by workload key, those with a CPU reading) and their terms (their CPU
        use 0: ``measure`` makes it from the seconds), in the listed order. Each path's are kept between
        measures: made again only when its cgroup's CPU or memory reading is another object (the collector
        keeps an idle cgroup's reading, and most pods are idle between two measures), all of them when the
        pod paths or the pod records changed."""
        listed = self.pods_of(pod_paths, index)
        records = index.records
        kept = self._uses
        if kept is None or kept.listed is not listed or kept.records is not records:
            requests = self.pod_requests((path, index.pod_of(key)) for path, key, _ in listed)
            kept = self._uses = _PodUses(listed, records, requests)
        by_path, requests = kept.by_path, kept.requests
        cgroup_cpu, cgroup_mem = snapshot.cgroup_cpu, snapshot.cgroup_mem
        cpu_s: dict[str, float] = {}
        pods: dict[str, PodUse] = {}
        for path, key, prod in listed:
            cpu, m = cgroup_cpu.get(path), cgroup_mem.get(path)
            made = by_path.get(path)
            if made is None or made[0] is not cpu or made[1] is not m:
                if made is not None and made[1] is m:
                    use = made[3]  # only its CPU reading moved: its terms stand
                else:
                    mem_used = 0.0
                    if m is not None and m.usage_bytes is not None:
                        mem_used = float(max(m.usage_bytes - (m.file_bytes or 0), 0))  # without page cache
                    _, cpu_request, memory_request = requests[path]
                    use = PodUse(prod=prod, cpu_used=0.0, memory_used=mem_used,
                                 cpu_request=cpu_request, memory_request=memory_request)
                made = by_path[path] = (cpu, m, None if cpu is None else cpu.usage_ns / 1e9, use)
            # Where two listed paths are one workload, the later one's stand (the listing's order).
            if made[2] is not None:
                cpu_s[key] = made[2]
            pods[key] = made[3]
        return cpu_s, pods

    def due(self, now_s: float) -> bool:
        """Whether a measure at ``now_s`` computes (the first reading, or the window is long enough)."""
        return self._start is None or now_s - self._start[0] >= self.min_window_s

    def pod_requests(self, records: Iterable[tuple[str, object]]) -> Mapping[str, tuple[object, float, float]]:
        """Each pod path's (its record, CPU cores, memory bytes requested) from (path, pod record) pairs (a
        None record: no requests known), summed over its containers once per record object; only the pods
        given are kept for the next call. The mapping returned is the one kept (no copy per call)."""
        before, kept = self._requests, {}
        for path, info in records:
            known = before.get(path)
            if known is None or known[0] is not info:
                known = (info, float(getattr(info, "cpu_request_cores", 0.0) or 0.0),
                         float(getattr(info, "memory_request_bytes", 0) or 0))
            kept[path] = known
        self._requests = kept
        return kept

    def measure(
        self, now_s: float, node_busy_s: float, ncpu: int, memory_total: float, memory_used: float,
        pod_cpu_s: Mapping[str, float], pods: Mapping[str, PodUse],
    ) -> BatchAllocatable | None:
        """Feed cumulative CPU seconds (node busy, per pod key) and the current memory figures.
        ``pods``' cpu_used is ignored (filled from the CPU seconds over the window). Returns a new result
        once the window is long enough (else the last one)."""
        if self._start is None:
            self._start = (now_s, node_busy_s, dict(pod_cpu_s))
            return self.last
        t0, busy0, cpu0 = self._start
        window = now_s - t0
        if window < self.min_window_s or window <= 0:
            return self.last
        self._start = (now_s, node_busy_s, dict(pod_cpu_s))
        cpu_used = [max(pod_cpu_s.get(key, 0.0) - cpu0.get(key, pod_cpu_s.get(key, 0.0)), 0.0) / window
                    for key in pods]
        uses = pods.values()
        prod = [p.prod for p in uses]
        anno, kubelet = self.anno or Reservation(), self.kubelet or Reservation()
        cpu = resource_terms(float(ncpu), self.cpu_reclaim_threshold_percent, max(node_busy_s - busy0, 0.0) / window,
                             prod, cpu_used, [p.cpu_request for p in uses], anno.cpu_cores, kubelet.cpu_cores)
        mem = resource_terms(memory_total, self.memory_reclaim_threshold_percent, memory_used, prod,
                             [p.memory_used for p in uses], [p.memory_request for p in uses], anno.memory_bytes,
                             kubelet.memory_bytes)
        sources = tuple(r.source for r in (self.anno, self.kubelet) if r is not None and r.source)
        self.last = BatchAllocatable(cpu, mem, window, sources)
        return self.last


def meter_for(policy: Any, paths: HostPaths) -> BatchMeter:
    """A meter with the policy's thresholds and reservation, and the kubelet config's (under the host
    root); a config that cannot be read is logged in one line and counts as no reservation."""
    colo = policy.colocation
    anno = None
    if colo.reserved_cpu_cores or colo.reserved_memory_bytes:
        anno = Reservation(colo.reserved_cpu_cores, float(colo.reserved_memory_bytes), "policy colocation.reserved*")
    kubelet = None
    if colo.kubelet_config_file:
        host_root = paths.proc.parent
        try:
            kubelet = read_kubelet_config(host_root / colo.kubelet_config_file.lstrip("/"), _memory_total(paths))
        except ReservationError as e:
            log.warning("batch allocatable: no kubelet reservation: %s", e)
    return BatchMeter(colo.cpu_reclaim_threshold_percent, colo.memory_reclaim_threshold_percent, anno, kubelet)


def _memory_total(paths: HostPaths) -> float:
    mem = read_node_memory(paths)
    return float(mem.managed_pages * PAGE_SIZE) if mem is not None else 0.0


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _available_pages(mem: Any) -> int:
    """What can be allocated without swapping, like the kernel's MemAvailable (si_mem_available): free
    above the high watermarks plus the page cache reclaim may drop (slab left out)."""
    return max(mem.free_pages - mem.wmark_high_pages + mem.file_pages
               - min(mem.file_pages // 2, mem.wmark_low_pages), 0)


def measure_snapshot(meter: BatchMeter, snapshot: NodeSnapshot, index: WorkloadIndex, pod_paths: Iterable[str],
                     paths: HostPaths) -> BatchAllocatable | None:
    """Feed the meter one snapshot: the node's CPU and memory, and each pod's use and requests (pods
    keyed by workload, its class from the detector's index)."""
    if snapshot.node_cpu is None or not snapshot.node_cpu_per_cpu:
        return meter.last
    if not meter.due(snapshot.monotonic_s):
        return meter.last  # nothing to compute yet: skip the memory and per-pod reads
    mem = read_node_memory(paths)
    total = float(mem.managed_pages * PAGE_SIZE) if mem is not None else 0.0
    used = max(total - _available_pages(mem) * PAGE_SIZE, 0.0) if mem is not None else 0.0
    cpu_s, pods = meter.pod_uses(snapshot, index, pod_paths)
    return meter.measure(snapshot.monotonic_s, snapshot.node_cpu.busy_ns / 1e9, len(snapshot.node_cpu_per_cpu),
                         total, used, cpu_s, pods)


def node_object_reservations(node: Mapping[str, Any]) -> tuple[Reservation | None, Reservation | None]:
    """(Node.Anno.Reserved, Node.Kubelet.Reserved) from a v1 Node object (a dict as the API returns it):
    the reservation annotation, and capacity - allocatable (the kubelet's reserved plus its hard
    eviction threshold, which is what koord-manager takes)."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "node")
    anno = annotation_reservation(meta.get("annotations") or {}, source=f"node {name} {RESERVATION_ANNOTATION}")
    status = node.get("status") or {}
    capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
    kubelet = None
    if capacity and allocatable:
        where = f"node {name} status"
        cpu = memory = 0.0
        if "cpu" in capacity and "cpu" in allocatable:
            cpu = (_quantity(capacity["cpu"], f"{where}.capacity.cpu")
                   - _quantity(allocatable["cpu"], f"{where}.allocatable.cpu"))
        if "memory" in capacity and "memory" in allocatable:
            memory = (_quantity(capacity["memory"], f"{where}.capacity.memory")
                      - _quantity(allocatable["memory"], f"{where}.allocatable.memory"))
        kubelet = Reservation(max(cpu, 0.0), max(memory, 0.0), f"node {name} capacity - allocatable")
    return anno, kubelet


def apply_node(meter: BatchMeter, node: Mapping[str, Any]) -> None:
    """Take the node object's reservations where it has them (they win over the policy and the file)."""
    try:
        anno, kubelet = node_object_reservations(node)
    except ReservationError as e:
        log.warning("batch allocatable: node reservation ignored: %s", e)
        return
    if anno is not None:
        meter.anno = anno
    if kubelet is not None:
        meter.kubelet = kubelet
