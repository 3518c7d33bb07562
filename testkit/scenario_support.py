# SPDX-License-Identifier: Apache-2.0
"""Interference scenarios on the real kernel: test cgroups laid out as pods, served by a fake kubelet.

A scenario creates pod cgroups (kubepods tree under our nn-test prefix, so the resolver and the
workload index see real pod paths), registers the same pods with FakeKube's kubelet ``/pods`` (so
QoS classes come through the real KubeletPodSource), starts workloads pinned to CPUs inside them,
and runs the real collector + detector loop, recording every tick. Everything is torn down by the
``make_cgroup`` fixture and :meth:`Scenario.close`, even on failure.

The node is shared: other work (other test runs, CI load) runs on the victim's CPU too, and the
detector is right to see it. So the scenario's pods get a CPU weight at the root far above any other
task's or cgroup's there (``tests.conftest.shield``: the interference a scenario builds dominates
its CPU), and a scenario judges only incidents of its own pods, telling apart what its own pods did from
what the rest of the node did (:meth:`Scenario.explained_by_others`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from detector.decisions import Cause
from detector.model import Incident
from detector.pods import KubeletPodSource
from detector.policy import Policy
from detector.runtime import Detector
from probes.collect import NodeCollector
from testkit.fakekube import FakeKube, container_id_for, make_pod
from testkit.sandbox import OwnedCgroup, shield, write_cgroup_file

WORKLOADS = Path(__file__).parent / "workloads"
LS_WORKER = WORKLOADS / "ls_worker.py"
POD_CONTROLLERS = ("cpu", "cpuacct", "memory", "cpuset")

@dataclass
class PodCgroup:
    name: str
    uid: str
    qos_class: str
    cgroup: OwnedCgroup

    @property
    def path(self) -> str:
        """The pod cgroup's path relative to the cpu hierarchy root (the workload key)."""
        layout = self.cgroup.layout
        h = layout.hierarchy_for("cpu")
        return "/" + str(self.cgroup.dirs["cpu"].relative_to(h.mount))


@dataclass(frozen=True)
class IncidentView:
    """An open incident as it stood after one tick (the Incident object itself changes later)."""

    incident_id: str
    victim: str
    cause: Cause
    culprits: tuple[str, ...]  # cgroup paths, highest score first
    started_at: float
    updated_at: float  # the detector's clock at the tick that last opened or updated it
    evidence: dict[str, float]  # signal -> value, the latest window's

    @classmethod
    def of(cls, inc: Incident) -> IncidentView:
        return cls(inc.incident_id, inc.victim.cgroup, inc.cause, tuple(c.target.cgroup for c in inc.culprits),
                   inc.started_at, inc.updated_at, {e.signal: e.value for e in inc.evidence})

    def brief(self) -> str:
        """For assertion messages: cause and culprits by their last path component."""
        return f"{self.cause} @{self.updated_at:.1f} [{', '.join(c.rsplit('/', 1)[-1][-40:] for c in self.culprits)}]"


@dataclass
class TickRecord:
    t: float  # monotonic
    changed: list[Incident]
    open: list[IncidentView] = field(default_factory=list)  # the open incidents of the scenario's pods


@dataclass
class Scenario:
    make_cgroup: Callable[..., OwnedCgroup]
    policy: Policy = field(default_factory=Policy)
    kube: FakeKube = field(default_factory=lambda: FakeKube(node_name="node-1"))
    procs: list[subprocess.Popen] = field(default_factory=list)
    pods: list[PodCgroup] = field(default_factory=list)
    ticks: list[TickRecord] = field(default_factory=list)
    _unshield: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.kube.start()
        self.source = KubeletPodSource(self.kube.url, refresh_interval=0.5, timeout=2.0)
        self.detector = Detector(self.policy, pods=self.source.pods, clock=time.monotonic)
        self.collector = NodeCollector(cgroup_paths=self.detector.cgroup_paths,
                                       psi_paths=self.detector.psi_paths).start()

    # -- pods and workloads ---------------------------------------------------------------------
    def pod(self, name: str, qos_class: str, shares: int | None = None, memory_limit: int | None = None,
            cpu_quota_cores: float | None = None, cpu_period_us: int | None = None) -> PodCgroup:
        uid = str(uuid.uuid4())
        k8s = "besteffort" if qos_class == "BE" else "burstable"
        cg = self.make_cgroup(
            f"kubepods.slice/kubepods-{k8s}.slice/kubepods-{k8s}-pod{uid.replace('-', '_')}.slice",
            controllers=POD_CONTROLLERS,
        )
        if shares is not None:
            cg.write("cpu", "cpu.shares", str(shares))
        if cpu_quota_cores is not None:
            period = cpu_period_us or 100_000
            if cpu_period_us is not None:
                cg.write("cpu", "cpu.cfs_period_us", str(period))
            cg.write("cpu", "cpu.cfs_quota_us", str(int(cpu_quota_cores * period)))
        if memory_limit is not None:
            cg.write("memory", "memory.limit_in_bytes", str(memory_limit))
        requests = {} if qos_class == "BE" else {"cpu": "500m", "memory": "256Mi"}
        self.kube.add_pod(make_pod(name, uid=uid, qos_class=qos_class, requests=requests))
        pod = PodCgroup(name, uid, qos_class, cg)
        self.pods.append(pod)
        self._shield(cg)
        return pod

    def k8s_pod(self, name: str, qos_class: str, containers: list[dict], shares: int | None = None,
                cpuset: str | None = None, pod_quota_cores: float | None = None,
                ) -> tuple[PodCgroup, dict[str, PodCgroup]]:
        """A pod laid out as the kubelet does: a pod cgroup with one ``cri-containerd-<id>.scope`` per
        container, each container's CFS quota from its own CPU limit (the pod's only when asked: the
        kubelet sets it when every container has a limit), and the same pod (``containers`` as
        :func:`make_pod` takes them) served by FakeKube. ``shares`` is written on the pod and on every
        level above it up to our nn-test prefix (all created by this process), so the pod weighs what
        its request says against the machine's other tasks, not only against its siblings."""
        uid = str(uuid.uuid4())
        k8s = "besteffort" if qos_class == "BE" else "burstable"
        pod_rel = f"kubepods.slice/kubepods-{k8s}.slice/kubepods-{k8s}-pod{uid.replace('-', '_')}.slice"
        pod_cg = self.make_cgroup(pod_rel, controllers=POD_CONTROLLERS)
        if shares is not None:
            d = pod_cg.dirs["cpu"]
            while True:
                write_cgroup_file(d, "cpu.shares", str(shares))  # cpu.weight on v2
                if d.name == pod_cg.prefix:
                    break
                d = d.parent
        if cpuset is not None:
            pod_cg.write("cpuset", "cpuset.cpus", cpuset)
        if pod_quota_cores is not None:
            pod_cg.write("cpu", "cpu.cfs_quota_us", str(int(pod_quota_cores * 100_000)))
        by_name: dict[str, PodCgroup] = {}
        for c in containers:
            cg = self.make_cgroup(f"{pod_rel}/cri-containerd-{container_id_for(uid, c['name'])}.scope",
                                  controllers=POD_CONTROLLERS)
            limit = (c.get("limits") or {}).get("cpu")
            if limit is not None:
                cores = int(limit[:-1]) / 1000 if limit.endswith("m") else float(limit)
                cg.write("cpu", "cpu.cfs_quota_us", str(int(cores * 100_000)))
            by_name[c["name"]] = PodCgroup(f"{name}/{c['name']}", uid, qos_class, cg)
        self.kube.add_pod(make_pod(name, uid=uid, qos_class=qos_class, containers=containers))
        pod = PodCgroup(name, uid, qos_class, pod_cg)
        self.pods.append(pod)
        self._shield(pod_cg)
        return pod, by_name

    def _shield(self, cg: OwnedCgroup) -> None:
        """The scenario's pods first on their CPUs against the rest of the node (conftest.shield);
        undone by close()."""
        if self._unshield is None:
            self._unshield = shield(cg)

    def spawn(self, pod: PodCgroup, argv: list[str], cpus: Iterable[int] | None = None, **kw) -> subprocess.Popen:
        cpuset = set(cpus) if cpus is not None else None

        def preexec() -> None:
            pod.cgroup.preexec()
            if cpuset is not None:
                os.sched_setaffinity(0, cpuset)

        proc = subprocess.Popen(argv, preexec_fn=preexec, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, **kw)
        self.procs.append(proc)
        return proc

    def ls_worker(self, pod: PodCgroup, cpus: Iterable[int], seconds: float, work_ms: float = 1.5,
                  period_ms: float = 5.0) -> subprocess.Popen:
        return self.spawn(pod, [sys.executable, str(LS_WORKER), "--work-ms", str(work_ms),
                                "--period-ms", str(period_ms), "--seconds", str(seconds)], cpus)

    def hog(self, pod: PodCgroup, cpus: Iterable[int], seconds: float) -> subprocess.Popen:
        code = f"import time\nend=time.monotonic()+{seconds}\nwhile time.monotonic()<end: pass\n"
        return self.spawn(pod, [sys.executable, "-c", code], cpus)

    # -- the detector loop ----------------------------------------------------------------------
    def run_for(self, seconds: float, interval: float = 1.0) -> None:
        """Run collector + detector ticks in this thread for ``seconds``."""
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < end:
            next_at += interval
            tick = self.detector.step(self.collector.collect())
            if tick is not None:
                views = [IncidentView.of(i) for i in self.detector.engine.open_incidents if self.own(i.victim.cgroup)]
                self.ticks.append(TickRecord(time.monotonic(), list(tick.changed), views))
            time.sleep(max(0.0, next_at - time.monotonic()))

    def incidents(self) -> list[Incident]:
        return self.detector.engine.all_incidents()

    def incidents_for(self, pod: PodCgroup) -> list[Incident]:
        return [i for i in self.incidents() if i.victim.cgroup == pod.path]

    def own(self, cgroup: str) -> bool:
        """Whether a cgroup path is one of this scenario's pods (or below one)."""
        return any(cgroup == p.path or cgroup.startswith(p.path + "/") for p in self.pods)

    def views(self, pod: PodCgroup | None = None, after: float | None = None) -> list[IncidentView]:
        """Every tick's view of the open incidents of `pod` (default: of every pod of the scenario),
        in tick order; `after`: only ticks that ended after that monotonic time."""
        return [v for r in self.ticks if after is None or r.t > after
                for v in r.open if pod is None or v.victim == pod.path]

    def explained_by_others(self, view: IncidentView) -> bool:
        """The incident blames the node's other work, none of the scenario's pods: CPU neighbours
        that are all outside the scenario, or softirq work on the victim's CPUs (no scenario pod
        makes any). What the rest of a shared node does is not the scenario's ground truth."""
        if any(self.own(c) for c in view.culprits):
            return False
        # NEIGHBOR_CPU with no culprit: the node's own processes (root cgroup) ran instead.
        return view.cause in (Cause.NEIGHBOR_CPU, Cause.SOFTIRQ)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.collector.close()
        self.source.close()
        self.kube.stop()
        if self._unshield is not None:
            self._unshield()
            self._unshield = None


def scenario_harness(make_cgroup: Callable[..., OwnedCgroup], victim_cpu: int,
                     default_policy: Callable[[], Policy]) -> Iterator[Callable[..., Scenario]]:
    """Body of the ``scenario`` fixtures: a factory of Scenarios, closed at teardown, with this process
    (collector and detector run in it, in the root cgroup) kept off the victim's CPU, where it would
    be a real neighbour and the detector would name it (seen in full runs, where this process is
    larger and its ticks longer)."""
    affinity = os.sched_getaffinity(0)
    if len(affinity) > 1:
        os.sched_setaffinity(0, affinity - {victim_cpu})
    made: list[Scenario] = []

    def factory(policy: Policy | None = None) -> Scenario:
        s = Scenario(make_cgroup, policy or default_policy())
        made.append(s)
        return s

    try:
        yield factory
    finally:
        for s in made:
            s.close()
        os.sched_setaffinity(0, affinity)
