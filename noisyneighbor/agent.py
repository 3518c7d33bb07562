"""`noisyneighbor agent`: the per-node daemon. Probes -> detector -> actuators, exported over HTTP.

One tick (``Agent.step``): the collector reads every probe and cgroup file into a NodeSnapshot, the
detector turns it into signals and incidents (decisions go to the actuator manager, which plans them
in dry-run or applies them through the journal), the exporter takes the snapshot, incidents and action
records, and incidents are posted as Kubernetes Events when in a cluster. ``run`` repeats that at the
interval; one failing tick is logged on one line and the loop goes on.

HTTP (one small threaded server on ``--listen``; port 0 picks a free port, see ``Agent.address``):
``/metrics`` (the Prometheus registry), ``/healthz`` (200 while the loop ticks, 503 once no tick has
completed for 3 intervals) and ``/readyz`` (200 once the first tick is done and at least one probe is
on; the JSON body lists each probe's state and reason, the pod source status and the actuator mode).

``stop`` is graceful and idempotent: the manager restores every file an actuator changed (journal),
probes are detached, the server stops. A policy that does not load raises before anything is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from actuators.base import ActionRecord, Actuator, Plan, Refused
from actuators.burst import BurstActuator
from actuators.cgroupfile import CgroupFiles
from actuators.journal import DEFAULT_JOURNAL_DIR, Journal
from actuators.manager import ActuatorManager
from actuators.memory import MemorySuppressActuator
from actuators.mitigate import MitigationPlanner, NetnsTrafficSampler, requests_from
from actuators.resctrl import KernelResctrlFs, ResctrlActuator, ResctrlFileIO, resctrl_root
from actuators.suppress import SuppressActuator
from detector.cgroups import CgroupResolver
from detector.decisions import Decision, Target
from detector.listen_join import ListenJoin
from detector.model import Incident
from detector.pods import make_pod_source
from detector.policy import POD_SOURCES, Policy, load_policy
from detector.runtime import Detector
from noisyneighbor.exporter import Exporter, Labeler, ResolverLabeler, render_text
from noisyneighbor.output import SCHEMA_VERSION, iso_utc
from noisyneighbor.sections import DeadCgroups
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.collect import BPF_PROBES, NodeCollector
from probes.engine import check_btf_file, use_btf_file
from probes.gpu import GpuCollector
from probes.host import HostPaths
from probes.listenq import ListenReport, ListenWatch
from probes.snapshot import NodeSnapshot
from probes.tcpconnect import TcpConnectSnapshot

log = logging.getLogger("noisyneighbor.agent")

DEFAULT_LISTEN = "0.0.0.0:9717"
# /healthz turns 503 when no tick completed for this many intervals (a stuck loop, not a slow one).
STALE_INTERVALS = 3


class AgentConfigError(ValueError):
    """A bad agent setting (flag or config); ``str(exc)`` is one line. Raised before anything starts."""


@dataclass
class AgentConfig:
    """What the command line (or an in-process driver such as the scenario bench) sets.

    ``None`` means "what the policy file says" for the fields the policy also has.
    """

    config_path: str | None = None
    node_name: str | None = None
    host_root: str | None = None
    listen: str | None = DEFAULT_LISTEN  # None: no HTTP server (in-process use)
    dry_run: bool | None = None
    journal_dir: str = str(DEFAULT_JOURNAL_DIR)
    audit_log: str | None = None
    incident_log: str | None = None
    interval_s: float | None = None
    probes: tuple[str, ...] = BPF_PROBES
    max_cgroups: int = 2000
    max_bucket_seconds: float = 10.0  # runqueue histograms: the last finite bucket's bound
    extra_node_series: bool = False  # PSI averages and /proc/stat per CPU: node_exporter has them
    pod_source: str | None = None  # auto | kubelet | apiserver | standalone
    ls_cgroups: tuple[str, ...] = ()  # added to the policy's standalone globs
    be_cgroups: tuple[str, ...] = ()
    gpu: bool = True
    # Actuators only touch cgroups matching one of these globs (fnmatch on the path without leading
    # slash); empty: no restriction. Tests and benches use it so an enforcing agent on a shared node
    # can only change cgroups they created.
    act_only: tuple[str, ...] = ()
    btf: str | None = None  # BTF of this kernel when it has no /sys/kernel/btf/vmlinux (--btf)

    def validate(self) -> None:
        unknown = set(self.probes) - set(BPF_PROBES)
        if unknown:
            raise AgentConfigError(f"unknown probe(s) {', '.join(sorted(unknown))}; known: {', '.join(BPF_PROBES)}")
        if self.interval_s is not None and not 0.01 <= self.interval_s <= 3600:
            raise AgentConfigError(f"interval must be between 0.01 and 3600 s, got {self.interval_s:g}")
        if self.max_cgroups < 1:
            raise AgentConfigError(f"max cgroups must be at least 1, got {self.max_cgroups}")
        if not self.max_bucket_seconds > 0:
            raise AgentConfigError(f"bucket max must be positive, got {self.max_bucket_seconds:g} s")
        if self.pod_source is not None and self.pod_source not in POD_SOURCES:
            raise AgentConfigError(f"pod source must be one of {', '.join(POD_SOURCES)}, got {self.pod_source!r}")
        if self.listen is not None:
            parse_listen(self.listen)
        if self.btf is not None:
            try:
                check_btf_file(self.btf)
            except ValueError as e:
                raise AgentConfigError(str(e)) from None


def parse_listen(text: str) -> tuple[str, int]:
    """'0.0.0.0:9717' / ':9717' / '[::1]:0' -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise AgentConfigError(f"listen address must be HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def policy_for(config: AgentConfig, policy: Policy | None = None) -> Policy:
    """The policy file (or ``policy``) with the command line's overrides applied."""
    base = policy if policy is not None else load_policy(config.config_path)
    changes: dict[str, Any] = {}
    if config.node_name:
        changes["node_name"] = config.node_name
    if config.interval_s is not None:
        changes["interval_seconds"] = config.interval_s
    if config.incident_log is not None:
        changes["incident_log"] = config.incident_log
    if config.pod_source is not None:
        changes["pod_source"] = config.pod_source
    if config.ls_cgroups:
        changes["ls_cgroups"] = (*base.ls_cgroups, *config.ls_cgroups)
    if config.be_cgroups:
        changes["be_cgroups"] = (*base.be_cgroups, *config.be_cgroups)
    if config.dry_run is not None:
        changes["actuators"] = dataclasses.replace(base.actuators, dry_run=config.dry_run)
    return dataclasses.replace(base, **changes) if changes else base


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


@dataclass
class TickStats:
    ticks: int = 0  # completed ticks (the first one only sets the detector's baseline)
    failures: int = 0
    last_tick_monotonic: float | None = None
    last_tick_seconds: float = 0.0  # how long the last tick took
    last_error: str = ""
    started_monotonic: float = field(default_factory=time.monotonic)


class Agent:
    """The node agent. ``start`` -> ``run`` (or ``step`` by hand) -> ``stop``."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        policy: Policy | None = None,
        registry: CollectorRegistry | None = None,
        actuators: Iterable[Actuator] | None = None,
    ) -> None:
        self.config = config
        self._given_policy = policy
        self._given_actuators = list(actuators) if actuators is not None else None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.policy: Policy | None = None
        self.paths = HostPaths.under(config.host_root) if config.host_root else HostPaths()
        self.layout: CgroupLayout | None = None
        self.pod_source: Any = None
        self.collector: NodeCollector | None = None
        self.detector: Detector | None = None
        self.manager: ActuatorManager | None = None
        self.exporter: Exporter | None = None
        self.gpu: GpuCollector | None = None
        self.planner: MitigationPlanner | None = None
        self.events: Any = None
        self.stats = TickStats()
        self._run_stats: Any = None
        self._journal: Journal | None = None
        self._resolver: CgroupResolver | None = None
        self._dead: dict[str, DeadCgroups] = {}
        self._extra_paths: list[str] = []
        self._listed_from: frozenset[str] | None = None
        self._listed: frozenset[str] = frozenset()
        self._server: ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None
        self.listen_watch: ListenWatch | None = None
        self.listen_join: ListenJoin | None = None
        self._listen_report: ListenReport | None = None
        self._listen_errors: set[str] = set()
        self._prev_tcp: TcpConnectSnapshot | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()  # one tick at a time; stop waits for the running tick

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def interval_s(self) -> float:
        return self.policy.interval_seconds if self.policy is not None else (self.config.interval_s or 1.0)

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) the HTTP server listens on, once started (the real port when 0 was asked)."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Agent:
        """Load everything; on any failure what was started is closed again and the error raised."""
        self.config.validate()
        # The policy first: a bad file must fail before any probe, file or socket is touched.
        self.policy = policy_for(self.config, self._given_policy)
        try:
            self._start()
        except BaseException:
            self._close_parts()
            raise
        acts = self.policy.actuators
        log.info(
            "agent started: node %s, interval %.2f s, probes %s, pods %s, actuators %s, listen %s",
            self.exporter.node if self.exporter else "?", self.interval_s,
            ", ".join(st.line() for st in self.collector.status.values()) if self.collector else "-",
            self.pod_source.status if self.pod_source is not None else "-",
            "dry-run" if acts.dry_run else "enforcing",
            f"{self.address[0]}:{self.address[1]}" if self.address else "off",
        )
        return self

    def _start(self) -> None:
        policy = self.policy
        assert policy is not None
        self.layout = discover(self.paths)
        # Unknown ids (a cgroup newer than the last walk) walk the hierarchy again at most every 5 s.
        resolver = CgroupResolver(self.paths, self.layout, rescan_interval=5.0)
        self.pod_source = make_pod_source(policy, self.paths)
        starter = getattr(self.pod_source, "start", None)
        if callable(starter):
            starter()  # kubelet: poll in the background so a slow kubelet never stalls a tick
        actuators = self._build_actuators(policy)
        assert self._journal is not None
        self.manager = ActuatorManager(
            actuators, self._journal, policy.actuators,
            registry=self.registry, audit_log=self.config.audit_log,
        )
        self.events = _event_poster(policy)
        hooks = [self._post_event] if self.events is not None else []
        if policy.incident_log:
            hooks.append(IncidentLog(policy.incident_log).write)
        # The agent writes the incident log itself (IncidentLog: the CLI's JSON conventions), so the
        # engine's own epoch-stamped writer is off.
        self.detector = Detector(dataclasses.replace(policy, incident_log=None), self.paths, self.layout, resolver,
                                 pods=self.pod_source.pods, sink=self.manager, on_incident=hooks)
        labeler = PodMetadataLabeler(ResolverLabeler(resolver), self.pod_source.get, self._qos_of_path)
        # Not in self.registry: /metrics writes the exporter's series directly (render_text) and
        # adds the registry's (actuator metrics); OpenMetrics scrapes get both through one registry.
        self.exporter = Exporter(None, labeler, paths=self.paths, layout=self.layout,
                                 node=policy.node_name or os.environ.get("NODE_NAME") or None,
                                 max_cgroups=self.config.max_cgroups,
                                 max_bucket_seconds=self.config.max_bucket_seconds,
                                 extra_node_series=self.config.extra_node_series,
                                 container_name=self._container_name)
        self._run_stats = _enable_bpf_stats()
        self._resolver = resolver
        use_btf_file(self.config.btf)  # process-wide: the probes' engines relocate against it
        self.collector = NodeCollector(self.paths, self.layout, probes=self.config.probes,
                                       cgroup_paths=self._cgroup_paths, psi_paths=self.detector.psi_paths).start()
        if self.config.gpu:
            self.gpu = GpuCollector(self.paths)
        # Listen queues (probes/listenq.py): read on connect trouble or on a slow cadence, joined to the
        # connect incidents of the clients (detector/listen_join.py) and exported per pod.
        self.listen_watch = ListenWatch(str(self.paths.proc), self._cgroup_dir)
        self.listen_join = ListenJoin(self._workload_of_id, self._target_of_owner,
                                      slow_ns=policy.slo.connect_p99_ms * 1e6)
        self.detector.engine.listen_join = self.listen_join
        # Per-cause mitigation beyond the engine's one decision (actuators/mitigate.py): softirq from a
        # pod's traffic, RT tasks starving the victim's CPUs, BE-driven reclaim, the neighbour escalation;
        # through the same manager, so dry-run, --act-only, the journal and verify/revert hold.
        self.planner = MitigationPlanner(
            self.manager, self.detector.pod_targets, NetnsTrafficSampler(CgroupFiles(self.paths, self.layout)),
            policy.actuators, request_of=requests_from(self.pod_source.pods))
        self.detector.engine.on_incident.append(self.planner)
        self.manager.on_record.append(self.planner.note_record)
        if self.config.listen is not None:
            self._serve(*parse_listen(self.config.listen))

    def _build_actuators(self, policy: Policy) -> list[Actuator]:
        # One journal for cgroup and resctrl files, so a crash leaves one file to reconcile from.
        io = ResctrlFileIO(resctrl_root(self.paths), KernelResctrlFs())
        self._journal = Journal(self.config.journal_dir, read=io.read, write=io.write)
        if self._given_actuators is not None:
            return self._given_actuators
        files = CgroupFiles(self.paths, self.layout)
        actuators: list[Actuator] = [
            SuppressActuator(files, self._journal, policy.resource_threshold),
            BurstActuator(files, self._journal, policy.cpu_burst),
            MemorySuppressActuator(files, self._journal),
        ]
        if policy.actuators.resctrl_enabled:
            actuators.append(ResctrlActuator(self.paths, journal=self._journal))
        if policy.actuators.evict_enabled:
            evict = _evict_actuator(policy, self.pod_source)
            if evict is not None:
                actuators.append(evict)
        if self.config.act_only:
            actuators = [ScopedActuator(a, self.config.act_only) for a in actuators]
        return actuators

    def _cgroup_paths(self) -> frozenset[str]:
        """The detector's cgroups (workloads and pods) plus the QoS-level and container cgroups.

        The detector needs only workload roots; the exporter also publishes the BestEffort QoS level
        (where koordlet-style suppress caps land) and each container (per-container quota, throttling
        and memory panels). Listed from the resolver's index, refreshed like the detector's pod list.
        """
        assert self.detector is not None
        workloads = self.detector.cgroup_paths()
        if workloads is not self._listed_from:
            # The detector listed pods again (from a fresh walk): the resolver's index has their containers.
            hierarchy = self.layout.hierarchy_for("cpu") if self.layout is not None else None
            self._extra_paths = [info.path for info in self._resolver.all(hierarchy)
                                 if info.kind in ("kubepods", "qos", "container")]
            # The same frozenset until either list changes: the collector then skips its listing work.
            self._listed_from = workloads
            self._listed = frozenset((*workloads, *self._extra_paths))
        return self._listed

    def _container_name(self, pod_uid: str, container_id: str) -> str | None:
        pod = self.pod_source.get(pod_uid) if self.pod_source is not None else None
        container = pod.container(container_id) if pod is not None else None
        return container.name if container is not None else None

    def _qos_of_path(self, cgroup: str) -> str | None:
        if self.detector is None:
            return None
        return self.detector.index.workload_of(cgroup).target.qos

    def _post_event(self, incident: Incident, what: str) -> None:
        if self.events is not None and what in ("opened", "closed", "updated"):
            self.events.post(incident)

    # -- ticks ------------------------------------------------------------------------------------
    def step(self) -> None:
        """One tick: collect -> detect (-> decide -> act) -> export."""
        assert self.collector is not None and self.detector is not None and self.exporter is not None, "not started"
        with self._lock:
            if self._stopped:
                return
            t0 = time.monotonic()
            snapshot = self.collector.collect()
            self._forget_dead_cgroups()
            if self.gpu is not None and self.gpu.status.state == "on":
                snapshot = dataclasses.replace(snapshot, gpus=self.gpu.collect())
            snapshot = self._listen_queues(snapshot)
            self.detector.step(snapshot)
            self.exporter.update(snapshot, self.incidents(), self.actions())
            self._note_snapshot(snapshot)
            now = time.monotonic()
            self.stats.ticks += 1
            self.stats.last_tick_monotonic = now
            self.stats.last_tick_seconds = now - t0

    def _forget_dead_cgroups(self) -> None:
        """Pod churn must not fill the probes' bounded kernel maps: removed cgroups that stay idle are
        deleted from them (the same DeadCgroups rule `top` uses), from the per-cgroup activity the
        collector already worked out this tick."""
        if self.collector is None or self._resolver is None:
            return
        for name, (before, now, changed) in self.collector.activity_change.items():
            probe = self.collector.probes.get(name)
            forget = getattr(probe, "forget", None)
            if forget is None:
                continue
            dead = self._dead.get(name)
            if dead is None:
                dead = self._dead[name] = DeadCgroups(forget, self._resolver, probe.hierarchy)
            dead.update(before, now, changed)

    def _listen_queues(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """Read the pods' listen queues when this tick's connects had trouble (failed, SYN retransmitted,
        slow) or the slow cadence is due; every snapshot carries the last read."""
        if self.listen_watch is None or self.listen_join is None or self.detector is None:
            return snapshot
        errors: list[str] = []
        try:
            trouble = self.listen_join.observe_tcp(self._prev_tcp, snapshot.tcp)
            self._prev_tcp = snapshot.tcp
            reason = self.listen_watch.due(trouble)
            if reason is not None:
                index = self.detector.index
                owners = [p for p in self.detector.cgroup_paths() if p != "/" and index.is_workload_root(p)]
                report = self.listen_watch.read(owners, reason)
                errors = list(report.errors)
                self._listen_report = report
                self.listen_join.observe_report(report)
        except Exception as e:  # listen queues are extra evidence: never worth the tick's detection
            self._prev_tcp = snapshot.tcp
            errors = [f"listenq: {type(e).__name__}: {_one_line(e)}"]
        for error in errors:
            why = error.split(" (netns ", 1)[0]
            if why not in self._listen_errors:  # once per reason: a missing capability fails every netns
                self._listen_errors.add(why)
                log.warning("%s (the first; each reason is logged once)", error)
        if self._listen_report is None:
            return snapshot
        return dataclasses.replace(snapshot, listen=self._listen_report)

    def _cgroup_dir(self, path: str):
        hierarchy = self.layout.hierarchy_for("cpu") if self.layout is not None else None
        return hierarchy.path_of(path) if hierarchy is not None else None

    def _workload_of_id(self, cgroup_id: int) -> str | None:
        """The workload key of a tcpconnect cgroup id (keyed like runqlat: the cpu hierarchy)."""
        if self.detector is None:
            return None
        w = self.detector.ids.workload_of(cgroup_id, self.detector.builder.cpu_h)
        return w.key if w is not None else None

    def _target_of_owner(self, path: str) -> Target:
        assert self.detector is not None
        return self.detector.index.workload_of(path).target

    def _note_snapshot(self, snapshot: NodeSnapshot) -> None:
        for error in snapshot.errors:
            log.warning("tick: %s", error)

    def run(self) -> None:
        """Tick at the interval until :meth:`request_stop` (or a signal through it); then :meth:`stop`."""
        try:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    self.step()
                except Exception as e:  # one bad tick must not end the agent
                    self.stats.failures += 1
                    self.stats.last_error = _one_line(e)
                    log.error("tick failed (%d so far): %s: %s", self.stats.failures, type(e).__name__,
                              self.stats.last_error)
                next_at += self.interval_s
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind (slow tick or suspended): do not burst to catch up
                    next_at, delay = time.monotonic(), 0.0
                self._stop.wait(delay)
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask ``run`` to end after the current tick; safe from a signal handler."""
        self._stop.set()

    def stop(self) -> None:
        """Restore actuator changes, detach probes, stop the server. Idempotent."""
        self._stop.set()
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._close_parts()
        log.info("agent stopped after %d ticks (%d failed)", self.stats.ticks, self.stats.failures)

    def _close_parts(self) -> None:
        steps: list[tuple[str, Callable[[], object] | None]] = [
            ("detector", self.detector.close if self.detector else None),
            ("actuators", self.manager.close if self.manager else None),
            ("events", getattr(self.events, "flush", None)),
            ("probes", self.collector.close if self.collector else None),
            ("gpu", getattr(self.gpu, "close", None)),
            ("pod source", getattr(self.pod_source, "close", None)),
            ("bpf stats", getattr(self._run_stats, "close", None)),
            ("http", self._shutdown_server),
        ]
        for what, close in steps:
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # keep going: the other parts must still be released
                log.error("stopping %s failed: %s", what, _one_line(e))

    # -- views ------------------------------------------------------------------------------------
    def incidents(self) -> list[Incident]:
        return self.detector.engine.all_incidents() if self.detector is not None else []

    def actions(self) -> list[ActionRecord]:
        return list(self.manager.records) if self.manager is not None else []

    def health(self) -> dict[str, Any]:
        """What /healthz and /readyz answer: liveness, readiness and why."""
        now = time.monotonic()
        last = self.stats.last_tick_monotonic
        age = None if last is None else now - last
        limit = STALE_INTERVALS * self.interval_s + max(self.stats.last_tick_seconds, 0.0)
        # Before the first tick (start-up loads the BPF objects) the clock runs from the start instead.
        since = now - self.stats.started_monotonic if age is None else age
        live = since <= limit + (30.0 if age is None else 0.0)
        probes = {}
        if self.collector is not None:
            probes = {name: {"state": st.state, "reason": st.reason, "attach_mode": st.attach_mode}
                      for name, st in self.collector.status.items()}
        ready = self.stats.ticks >= 1 and any(p["state"] == "on" for p in probes.values()) and not self._stopped
        pods = self.pod_source.status if self.pod_source is not None else None
        acts = self.policy.actuators if self.policy is not None else None
        return {
            "schema_version": SCHEMA_VERSION,
            "live": bool(live and not self._stopped),
            "ready": bool(ready),
            "ticks": self.stats.ticks,
            "failed_ticks": self.stats.failures,
            "last_error": self.stats.last_error,
            "last_tick_age_seconds": None if age is None else round(age, 3),
            "interval_seconds": self.interval_s,
            "probes": probes,
            "gpu": None if self.gpu is None else {"state": self.gpu.status.state, "reason": self.gpu.status.reason},
            "pod_source": None if pods is None else {"source": pods.source, "ok": pods.ok, "reason": pods.reason,
                                                      "pods": pods.pods},
            "actuators": None if acts is None or self.manager is None else {
                "mode": "dry-run" if acts.dry_run else "enforcing",
                "kinds": sorted(str(k) for k in self.manager.actuators),
                "active": len(self.manager.active_records()),
                "journal": str(self.manager.journal.directory),
            },
            "open_incidents": len(self.detector.engine.open_incidents) if self.detector is not None else 0,
            "listen_queues": None if self.listen_watch is None else {
                "reads": self.listen_watch.reads,
                "last_reason": self._listen_report.reason if self._listen_report else None,
                "namespaces": len(self._listen_report.namespaces) if self._listen_report else 0,
                "errors": sorted(self._listen_errors)[-5:],
            },
        }

    # -- HTTP -------------------------------------------------------------------------------------
    def metrics(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of a /metrics scrape: the exporter's series and the registry's."""
        encoder, content_type = choose_encoder(accept)
        if self.exporter is None:
            return encoder(self.registry), content_type
        if content_type.startswith("text/plain"):
            return render_text(self.exporter) + encoder(self.registry), content_type
        both = CollectorRegistry(auto_describe=False)
        both.register(self.exporter)
        both.register(_RegistryCollector(self.registry))
        return encoder(both), content_type

    def _serve(self, host: str, port: int) -> None:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._send(200, *agent.metrics(self.headers.get("Accept", "")))
                    elif path in ("/healthz", "/readyz"):
                        health = agent.health()
                        ok = health["live"] if path == "/healthz" else health["ready"]
                        body = json.dumps(health, sort_keys=True).encode() + b"\n"
                        self._send(200 if ok else 503, body, "application/json")
                    else:
                        self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")
                except Exception as e:  # a scrape must never take the server down
                    log.error("HTTP %s failed: %s", path, _one_line(e))
                    with contextlib.suppress(Exception):
                        self._send(500, f"{_one_line(e)}\n".encode(), "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
                return None

        server_class = _DualStackServer if ":" in host else ThreadingHTTPServer
        try:
            self._server = server_class((host, port), Handler)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self._server.daemon_threads = True
        self._server_thread = threading.Thread(target=self._server.serve_forever, name="agent-http", daemon=True)
        self._server_thread.start()

    def _shutdown_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class IncidentLog:
    """The agent's incident log: one JSON line per incident opened or closed, in the shape and time
    format of every other JSON the CLI writes (``schema_version``; ISO 8601 UTC times, ``ended_at``
    null while open), so one parser reads the log, ``diagnose --json`` and ``top --json``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def record(inc: Incident, event: str) -> dict[str, Any]:
        d = inc.to_dict()
        d.update(
            started_at=iso_utc(inc.started_at),
            updated_at=iso_utc(inc.updated_at or None),
            ended_at=iso_utc(inc.ended_at),
        )
        return {"schema_version": SCHEMA_VERSION, "event": event, **d}

    def write(self, inc: Incident, event: str) -> None:
        if event == "updated":  # every tick of an open incident: the log keeps the transitions
            return
        try:
            line = json.dumps(self.record(inc, event), sort_keys=True, default=str)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            log.error("incident log %s: %s", self.path, e.strerror or e)


class _RegistryCollector:
    """A registry's families as one collector (to scrape two registries as one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()


class _DualStackServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6


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


def _evict_actuator(policy: Policy, pod_source: Any) -> Actuator | None:
    api = _in_cluster_client()
    if api is None:
        log.warning("eviction is enabled but there is no in-cluster apiserver access: evict actuator off")
        return None
    from actuators.evict import EvictActuator

    return EvictActuator(api, pod_source.pods, policy=policy.actuators)


def _enable_bpf_stats() -> Any | None:
    """Hold BPF_ENABLE_STATS so the run-time metrics are real; without it they stay 0 (logged once)."""
    from probes.libbpf import RunTimeStats

    try:
        return RunTimeStats()
    except (OSError, RuntimeError) as e:
        log.warning("BPF run-time stats unavailable (%s): bpf_program_run_seconds stays 0", _one_line(e))
        return None


# -- logging ------------------------------------------------------------------------------------------


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = _one_line(record.exc_info[1]) if record.exc_info[1] else ""
        return json.dumps(line, default=str)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
