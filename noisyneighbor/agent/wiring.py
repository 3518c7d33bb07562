# SPDX-License-Identifier: Apache-2.0
"""The parts the agent wires between probes, detector and actuators: pod-metadata labels for the exporter,
the ``--act-only`` scope around an actuator, and the optional Kubernetes and BPF-stats parts."""

from __future__ import annotations

import fnmatch
import gc
import logging
import os
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actuators.base import Actuator, Plan, Refused
from detector.batch import kubelet_max_pods, node_max_pods
from detector.decisions import Decision, Target
from detector.policy import Policy
from noisyneighbor.agent.logs import _one_line
from noisyneighbor.exporter import Labeler
from probes.cgroupfs import Hierarchy

log = logging.getLogger("noisyneighbor.agent")


@dataclass
class PodMetadataLabeler:
    """The exporter's default labels plus what pod metadata adds: pod name, namespace and QoS class.

    Series stay per cgroup (a container's cgroup keeps its own series); only the labels are filled in.
    Standalone workloads get their QoS class from the policy's globs through the detector's index.
    """

    inner: Labeler
    pod_of: Callable[[str], Any]  # pod uid -> PodInfo | None
    qos_of_path: Callable[[str], str | None] = lambda path: None

    def _named(self, target: Target | None) -> Target | None:
        if target is None:
            return None
        pod = self.pod_of(target.pod_uid) if target.pod_uid else None
        if pod is not None:
            return Target(target.cgroup, target.pod_uid, pod.namespace or None, pod.name, pod.qos_class or target.qos)
        if target.qos is None:
            qos = self.qos_of_path(target.cgroup)
            if qos:
                return Target(target.cgroup, target.pod_uid, target.namespace, target.pod, qos)
        return target

    def target_for_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> Target | None:
        return self._named(self.inner.target_for_id(cgroup_id, hierarchy))

    def target_for_path(self, cgroup_path: str) -> Target | None:
        return self._named(self.inner.target_for_path(cgroup_path))


class ScopedActuator:
    """An actuator that refuses (one line, audited by the manager) targets outside a set of cgroup globs."""

    def __init__(self, inner: Actuator, globs: Iterable[str]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.globs = tuple(g.strip("/") for g in globs)

    def plan(self, decision: Decision) -> Plan:
        cgroup = decision.target.cgroup.strip("/")
        if not any(fnmatch.fnmatchcase(cgroup, g) for g in self.globs):
            raise Refused(f"{decision.target.display} is outside the agent's --act-only scope")
        return self.inner.plan(decision)

    def apply(self, plan: Plan) -> None:
        self.inner.apply(plan)

    def revert(self, plan: Plan) -> None:
        self.inner.revert(plan)


# -- optional Kubernetes parts ---------------------------------------------------------------------


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class _InClusterClient:
    """The in-cluster ApiClient, built at its first use (the first Event or eviction): importing the
    generated client costs ~19 MiB of RSS, a fifth of the agent at 300 pods, and a node without
    incidents never calls the apiserver. A config that fails then fails that call (logged by it)."""

    def __init__(self) -> None:
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            from kubernetes import client, config

            config.load_incluster_config()
            self._client = client.ApiClient()
        return getattr(self._client, name)


def _in_cluster_client() -> Any | None:
    # What load_incluster_config() needs, checked now without importing it: the service host and
    # the service account's token.
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    if not os.path.exists(SERVICE_ACCOUNT_TOKEN):
        log.warning("in-cluster Kubernetes client unavailable: no service account token at %s", SERVICE_ACCOUNT_TOKEN)
        return None
    return _InClusterClient()


def _event_poster(policy: Policy) -> Any | None:
    api = _in_cluster_client()
    if api is None:
        return None
    from detector.kube_events import IncidentEventPoster

    return IncidentEventPoster(api, node_name=policy.node_name or os.environ.get("NODE_NAME"))


def read_own_node(policy: Policy, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """This node's v1 Node object from the apiserver (batch allocatable's reservations: its annotation
    and capacity - allocatable), with the service account's token over plain HTTPS: the generated
    client would cost ~19 MiB of RSS for one GET. None outside a cluster or on any error (logged)."""
    name = policy.node_name or os.environ.get("NODE_NAME")
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not name or not host or not os.path.exists(SERVICE_ACCOUNT_TOKEN):
        return None
    import json
    import ssl
    import urllib.parse
    import urllib.request

    try:
        with open(SERVICE_ACCOUNT_TOKEN, encoding="utf-8") as f:
            token = f.read().strip()
        ca = os.path.join(os.path.dirname(SERVICE_ACCOUNT_TOKEN), "ca.crt")
        context = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        req = urllib.request.Request(f"https://{netloc}/api/v1/nodes/{urllib.parse.quote(name)}",
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            node = json.loads(resp.read())
        return node if isinstance(node, dict) else None
    except Exception as e:  # the apiserver must never stop the agent from starting
        log.warning("cannot read node %s for batch allocatable: %s", name, _one_line(e))
        return None


class JournalIO:
    """``read``/``write`` of the agent's one journal: in-place resize entries (``k8s-resize://...``)
    through the apiserver, everything else (cgroup and resctrl files) through the file IO."""

    def __init__(self, files: Any, resize: Any | None) -> None:
        self.files = files
        self.resize = resize

    def _resize_io(self, path: str) -> Any | None:
        from actuators.resize import PREFIX

        if not str(path).startswith(PREFIX):
            return None
        if self.resize is None:
            from actuators.cgroupfile import CgroupWriteError

            raise CgroupWriteError(f"{path}: an in-place resize entry, and the agent has no apiserver access")
        return self.resize

    def read(self, path: str) -> str:
        io = self._resize_io(path)
        return io.read(path) if io is not None else self.files.read(path)

    def write(self, path: str, value: str) -> None:
        io = self._resize_io(path)
        (io or self.files).write(path, value)


# A kubelet pod's cgroups where tasks run (the run-queue table's keys): its pause container and, allowing
# for a sidecar, two app containers.
CGROUPS_PER_POD = 3


def expected_runq_cgroups(policy: Policy, node: dict[str, Any] | None, host_root: Path) -> tuple[int, str]:
    """The cgroups the run-queue table must make room for on this node, and where the count came from:
    the pods the node may run (the node object's ``status.capacity.pods``, else the kubelet
    configuration's ``maxPods``) times CGROUPS_PER_POD; 0 where neither is known (the probe then sizes
    its table from the cgroups it finds at start)."""
    pods, source = (node_max_pods(node), "the node's capacity.pods") if node is not None else (None, "")
    config = policy.colocation.kubelet_config_file
    if pods is None and config:
        pods, source = kubelet_max_pods(host_root / config.lstrip("/")), f"maxPods in {config}"
    if pods is None:
        return 0, "no pod capacity known: sized from the cgroups at start"
    return pods * CGROUPS_PER_POD, f"{pods} pods ({source}) x {CGROUPS_PER_POD} cgroups"


def resize_io(policy: Policy) -> Any | None:
    """The apiserver side of in-place resize when the policy asks for it (``cpuSuppressVia``)."""
    if policy.resource_threshold.cpu_suppress_via == "cgroup":
        return None
    api = _in_cluster_client()
    if api is None:
        log.warning("cpuSuppressVia %s needs in-cluster apiserver access, which this agent has not",
                    policy.resource_threshold.cpu_suppress_via)
        return None
    from actuators.resize import ResizeIO

    return ResizeIO(api)


def suppress_actuator(policy: Policy, files: Any, journal: Any, resize: Any | None) -> Actuator | None:
    """BE CPU suppress as the policy says: cgroup writes, or (cfsQuota) the pod's in-place resize with
    the cgroup write where a pod cannot be resized ("resize"), or resize only ("resize-only": without
    apiserver access there is then no CPU suppress at all, and the log says so)."""
    from actuators.suppress import SuppressActuator

    cgroup = SuppressActuator(files, journal, policy.resource_threshold)
    via = policy.resource_threshold.cpu_suppress_via
    if via == "cgroup":
        return cgroup
    if resize is None:
        if via == "resize-only":
            log.warning("cpuSuppressVia resize-only without apiserver access: BE CPU suppress is off")
            return None
        return cgroup
    from actuators.resize import ResizeSuppressActuator

    return ResizeSuppressActuator(journal, resize, fallback=cgroup, mode=via)


def _evict_actuator(policy: Policy, pod_source: Any) -> Actuator | None:
    api = _in_cluster_client()
    if api is None:
        log.warning("eviction is enabled but there is no in-cluster apiserver access: evict actuator off")
        return None
    from actuators.evict import EvictActuator

    evictor = EvictActuator(api, pod_source.pods, policy=policy.actuators)
    evictor.prepare()
    return evictor


M_MMAP_THRESHOLD = -3  # glibc's mallopt() parameter number (malloc.h)
LARGE_ALLOCATION_BYTES = 128 * 1024


def _fix_large_allocations_to_mmap() -> bool:
    """Fix glibc's mmap threshold at its default (128 KiB). Left dynamic, glibc raises it to the size
    of the largest mmapped block freed so far (the kubelet's pod list, the /metrics body: up to a few
    MiB), after which those per-tick buffers come from the heap, which fragments and is not given
    back: the agent's RSS grew 4 MiB of heap under pod churn (bench/agent_footprint.py's RSS split).
    Fixed, each such buffer is its own mapping, unmapped when freed. False where there is no glibc."""
    mallopt = _libc_function("mallopt")  # musl has none: nothing to fix
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES))


class FreeMemoryReturner:
    """Gives the heap's free pages back to the kernel once in a while (glibc ``malloc_trim``).

    Pod churn frees what removed pods held (store rows, readings, series) in among what live pods still
    hold: glibc keeps those free pages mapped, in the main heap and in each thread's arena, so the agent's
    RSS stayed several MiB above its steady value after churn (bench/agent_footprint.py's RSS split:
    heap and other anonymous maps). ``malloc_trim(0)`` releases every whole free page of every arena;
    a fraction of a millisecond, at most once per ``every_s``. Does nothing where there is no glibc."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last = clock()
        self.trims = 0
        self._trim = _libc_function("malloc_trim")

    def maybe_trim(self, every_s: float | None = None) -> bool:
        """Trim when ``every_s`` (default: the returner's) passed since the last trim; True when it trimmed."""
        now = self._clock()
        if self._trim is None or now - self._last < (self.every_s if every_s is None else every_s):
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True


def _libc_function(name: str) -> Any | None:
    """glibc's function ``name``, or None (musl, no libc found)."""
    import ctypes
    import ctypes.util

    libc_name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(libc_name), name) if libc_name else None
    except (OSError, AttributeError):
        return None


def _enable_bpf_stats() -> Any | None:
    """Hold BPF_ENABLE_STATS so the run-time metrics are real; without it they stay 0 (logged once)."""
    from probes.libbpf import RunTimeStats

    try:
        return RunTimeStats()
    except (OSError, RuntimeError) as e:
        log.warning("BPF run-time stats unavailable (%s): bpf_program_run_seconds stays 0", _one_line(e))
        return None


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as Go's runtime does at start, and log both once.

    The collector keeps each busy cgroup's usage files open (probes.host.HotFiles, at most half the soft
    limit): under a runtime that gives containers a soft limit of 1,024, 1,000 pods' files would not stay
    open and every read would pay an open and a close. Returns (soft, hard) as they are after, or None if
    they could not be read; a failure to raise is a one-line warning, never a failure of the agent."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError) as e:
        log.warning("open files limit (RLIMIT_NOFILE) unreadable: %s", _one_line(e))
        return None
    if soft == hard:
        log.info("open files limit (RLIMIT_NOFILE): soft %s, hard %s", _limit_text(soft), _limit_text(hard))
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        log.warning("open files limit (RLIMIT_NOFILE) not raised: soft %s, hard %s: %s",
                    _limit_text(soft), _limit_text(hard), _one_line(e))
        return soft, hard
    log.info("open files limit (RLIMIT_NOFILE): soft %s raised to the hard limit %s", _limit_text(soft), _limit_text(hard))
    return hard, hard


def _limit_text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


GC_YOUNG_ALLOCATIONS = 20_000  # the young generation's collection threshold (Python's default: 700)
GC_MIDDLE_COLLECTIONS = 20  # young collections per middle one (default 10)


def settle_garbage_collector() -> None:
    """Before the agent's first tick. What start made and keeps for good (modules, classes, the probes, the
    policy: ~40k objects) is moved out of the collector's reach: a full collection walked it all again each
    time (24 ms for the imports alone here), for objects that are never garbage.

    Ticks and scrapes allocate many objects that their reference counts free within the tick; at the
    default threshold (700) the young collection runs dozens of times a scrape at 1,000 pods, each scanning
    objects about to be freed anyway, and the older generations follow (in-process, a 1,000-pod scrape's build
    took 22-30 ms with them and 18 ms with these). Collected every GC_YOUNG_ALLOCATIONS allocations instead, fewer
    survivors are scanned; what it delays is only the freeing of reference cycles."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, GC_MIDDLE_COLLECTIONS, gc.get_threshold()[2])
