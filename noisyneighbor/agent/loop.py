# SPDX-License-Identifier: Apache-2.0
"""The agent's loop: start-up wiring, one tick (``Agent.step``) at the interval, health, graceful stop."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry

from actuators.base import ActionRecord, Actuator
from actuators.cgroupfile import CgroupFiles
from actuators.journal import Journal
from actuators.manager import ActuatorManager
from actuators.mitigate import MitigationPlanner, NetnsTrafficSampler, requests_from
from detector.batch import apply_node
from detector.cgroups import CgroupResolver
from detector.model import Incident
from detector.pods import make_pod_source
from detector.policy import Policy
from detector.runtime import Detector
from noisyneighbor.agent.auth import RequestAuthorizer
from noisyneighbor.agent.build import build_actuators, build_exporter, build_journal
from noisyneighbor.agent.client_views import AgentTop
from noisyneighbor.agent.config import AgentConfig, parse_listen, policy_for
from noisyneighbor.agent.health import agent_health
from noisyneighbor.agent.http_server import metrics_body, start_http_server
from noisyneighbor.agent.incident_log import IncidentLog
from noisyneighbor.agent.listen import ListenQueues
from noisyneighbor.agent.logs import _one_line
from noisyneighbor.agent.wiring import (
    FreeMemoryReturner,
    _enable_bpf_stats,
    _event_poster,
    _fix_large_allocations_to_mmap,
    expected_runq_cgroups,
    raise_open_files_limit,
    read_own_node,
    settle_garbage_collector,
)
from noisyneighbor.exporter import Exporter
from noisyneighbor.sections import DeadCgroups
from probes.cgroupfs import CgroupLayout, discover
from probes.collect import NodeCollector
from probes.engine import use_btf_file
from probes.host import HostPaths
from probes.procstat import ProcStatReader
from probes.registry import PLUGINS
from probes.snapshot import NodeSnapshot

log = logging.getLogger("noisyneighbor.agent")


def open_node_readers(paths: HostPaths, loaded: Iterable[str]) -> dict[str, Any]:
    """The node readers of the probes that are not loaded (``ProbePlugin.node_reader``), by probe name: a
    loaded probe's own snapshot carries those readings, so the node is read once a tick either way."""
    loaded = set(loaded)
    return {p.name: p.node_reader(paths) for p in PLUGINS if p.node_reader is not None and p.name not in loaded}


def node_reader_health(readers: Mapping[str, Any]) -> dict[str, dict[str, str] | None]:
    """/healthz's word on each probe's node reader, under the probe's name: its state and reason, None
    while the probe is loaded (it reads the node itself) or the agent opened no node readers."""
    out: dict[str, dict[str, str] | None] = {}
    for plugin in PLUGINS:
        if plugin.node_reader is not None:
            reader = readers.get(plugin.name)
            out[plugin.name] = None if reader is None else {"state": reader.status.state, "reason": reader.status.reason}
    return out


def with_node_readings(snapshot: NodeSnapshot, readers: Mapping[str, Any]) -> NodeSnapshot:
    """The tick's snapshot with the node readers' readings of this tick (those that read anything)."""
    readings = {name: reading for name, reader in readers.items() if (reading := reader.snapshot()) is not None}
    return dataclasses.replace(snapshot, node_readings=readings) if readings else snapshot


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
        # /proc/stat once a tick: the collector reads it, the burst actuator's loop takes that reading
        self.proc_stat = ProcStatReader(self.paths)
        self.layout: CgroupLayout | None = None
        self.pod_source: Any = None
        self.collector: NodeCollector | None = None
        self.detector: Detector | None = None
        self.manager: ActuatorManager | None = None
        self.exporter: Exporter | None = None
        # The node readers of probes not loaded (ProbePlugin.node_reader: NVML for the GPU device metrics)
        self.node_readers: dict[str, Any] = {}
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
        self.listen: ListenQueues | None = None  # the pods' listen queues, joined to connect incidents
        self._stop = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()  # one tick at a time; stop waits for the running tick
        self.top = AgentTop(self)  # GET /top: top's frames from this agent's snapshots

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
        raise_open_files_limit()  # before the collector sizes its open files by the soft limit
        self.layout = discover(self.paths)
        # Unknown ids (a cgroup newer than the last walk) walk the hierarchy again at most every 5 s.
        resolver = CgroupResolver(self.paths, self.layout, rescan_interval=5.0)
        self.pod_source = make_pod_source(policy, self.paths)
        starter = getattr(self.pod_source, "start", None)
        if callable(starter):
            starter()  # kubelet: poll in the background so a slow kubelet never stalls a tick
        self._journal, resize = build_journal(self.config, policy, self.paths, self._given_actuators is not None)
        actuators = self._given_actuators if self._given_actuators is not None else build_actuators(
            self.config, policy, self.paths, self.layout, self._journal, resize, self.pod_source, self.proc_stat)
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
        node_object = read_own_node(policy)
        if node_object is not None:
            apply_node(self.detector.batch, node_object)
        self.exporter = build_exporter(self.config, policy, self.paths, self.layout, resolver, self.pod_source,
                                       self._qos_of_path, self._container_name, lambda: self._listed)
        self._run_stats = _enable_bpf_stats()
        _fix_large_allocations_to_mmap()
        self._free_memory = FreeMemoryReturner()
        self._resolver = resolver
        use_btf_file(self.config.btf)  # process-wide: the probes' engines relocate against it
        expected_cgroups, sized_by = expected_runq_cgroups(policy, node_object, self.paths.proc.parent)
        probe_options = {p.name: p.agent_options(self.config.probe_options.get(p.name, {}), policy, expected_cgroups,
                                                 run_counts_live=self._run_stats is not None) for p in PLUGINS}
        self.collector = NodeCollector(self.paths, self.layout, probes=self.config.probes,
                                       cgroup_paths=self._cgroup_paths, psi_paths=self.detector.psi_paths,
                                       probe_options=probe_options, proc_stat=self.proc_stat).start()
        _log_table_sizes(self.collector, sized_by)
        if self.config.node_readers:
            self.node_readers = open_node_readers(self.paths, self.collector.probes)
        self.listen = ListenQueues(str(self.paths.proc), self.layout, self.detector)
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
            snapshot = with_node_readings(snapshot, self.node_readers)
            # The tick's probe intervals, computed once for the listen join and the detector's build.
            probes = self.detector.probe_tick(snapshot)
            if self.listen is not None:
                snapshot = self.listen.attach(snapshot, probes)
            self.detector.step(snapshot, probes)
            self.exporter.update(snapshot, self.incidents(), self.actions(), batch=self.detector.batch_allocatable)
            self._note_snapshot(snapshot)
            self._free_memory.maybe_trim()
            self.top.expire()  # no client for a while: drop the frame's snapshots
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

    def _note_snapshot(self, snapshot: NodeSnapshot) -> None:
        for error in snapshot.errors:
            log.warning("tick: %s", error)

    def run(self) -> None:
        """Tick at the interval until :meth:`request_stop` (or a signal through it); then :meth:`stop`."""
        settle_garbage_collector()
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
            *((name, reader.close) for name, reader in self.node_readers.items()),
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
        """What /healthz and /readyz answer: liveness, readiness and why, and the node readers' states."""
        return {**agent_health(self), **node_reader_health(self.node_readers)}

    @property
    def stopped(self) -> bool:
        return self._stopped

    # -- HTTP -------------------------------------------------------------------------------------
    def metrics(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of a /metrics scrape: the exporter's series and the registry's."""
        return metrics_body(self.exporter, self.registry, accept)

    def _serve(self, host: str, port: int) -> None:
        authorizer = RequestAuthorizer(self.config.auth) if self.config.auth is not None else None
        self._server, self._server_thread = start_http_server(self, host, port, authorizer)

    def _shutdown_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _log_table_sizes(collector: NodeCollector, sized_by: str) -> None:
    """The probes' kernel table sizes at start (``table_use``: the run-queue probe's), and what sized them
    (issue 39: capacity from the node)."""
    for name, probe in collector.probes.items():
        tables = getattr(probe, "table_use", {})
        if tables:
            log.info("%s tables: %s slots (expected cgroups: %s)", name,
                     ", ".join(f"{table} {slots}" for table, (_, slots) in tables.items()), sized_by)
