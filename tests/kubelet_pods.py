# SPDX-License-Identifier: Apache-2.0
"""Pods laid out as the kubelet and containerd make them, under our nn-test prefix, on v1 and v2.

Made by hand, the way the kubelet (pod and QoS cgroups) and runc under containerd (container cgroups)
lay them out, since the VM lane has no systemd (virtme-ng's own init) and no image to run:

- systemd driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/
  cri-containerd-<64 hex>.scope``, Guaranteed pods directly under ``kubepods.slice``;
- cgroupfs driver: ``kubepods/<qos>/pod<uid>/<64 hex>``, Guaranteed pods directly under ``kubepods``;
- every pod has its sandbox (pause) container's cgroup next to its app containers, with the
  smallest CPU weight and no quota, holding one sleeping task, as the pause process does;
- values as the kubelet derives them: weight from requests (v2: runc's shares -> weight conversion),
  ``cpu.max`` from limits (on the pod only when every container has one), memory limits, and a
  container's own ``cpuset.cpus`` (static CPU manager) while the pod keeps all CPUs;
- v2's no-internal-processes rule holds: controllers are enabled in every ancestor's
  ``cgroup.subtree_control`` (down to the pod), and tasks live only in the leaf container cgroups.

On this v1 hybrid host the same paths are made in each v1 hierarchy (cpu,cpuacct / cpuset / memory /
pids), as the kubelet does there, so the same test runs on both hierarchies. Container ids are
FakeKube's (``container_id_for``), so the kubelet ``/pods`` JSON of :meth:`KubeletNode.kube_pod`
names the app containers and not the sandbox, as the real kubelet's does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.cgroupfs import CgroupLayout, discover, self_cgroups
from probes.host import HostPaths
from testkit.fakekube import _quantity_value, container_id_for, make_pod
from testkit.sandbox import OwnedCgroup, shield
from testkit.timing import slowdown

POD_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
V2_CONTROLLERS = ("cpuset", "cpu", "io", "memory", "pids")
PERIOD_US = 100_000
# A BE pod that is a CPU neighbour, not a bystander: as much weight as a pod requesting 4 cores. Next to
# one burstable pod requesting 500m (its level's shares 512, as the kubelet sets them), the burstable
# level gets 1/9 of a CPU both share: 512 vs 4096 shares on v1, cpu.weight 20 vs 157 on v2. An LS
# worker that needs about 1/5 of it then waits on both hierarchies and schedulers, and still switches in
# often enough for a p99 (at 1/17, 8192 shares, it switched in 13 times a second on a loaded host: too few).
BE_NEIGHBOUR_SHARES = 4096


def in_vm_lane() -> bool:
    """This kernel runs in a virtme-ng guest (the VM lane): its whole cgroup hierarchy is ours."""
    try:
        return "virtme" in Path("/proc/cmdline").read_text()
    except OSError:
        return False


def pure_v2(layout: CgroupLayout | None = None) -> bool:
    layout = layout or discover()
    return layout.v2 is not None and not layout.v1


def enable_v2_root_controllers() -> None:
    """In the VM lane the guest starts with nothing enabled in the root's ``cgroup.subtree_control``;
    a systemd node has cpuset, cpu, io, memory and pids there. Never done outside the VM lane (there
    the root belongs to the machine), and only when this process sits in the root cgroup."""
    if not (in_vm_lane() and pure_v2()) or self_cgroups().get("", "/") != "/":
        return
    control = discover().v2.mount / "cgroup.subtree_control"
    enabled = set(control.read_text().split())
    for c in V2_CONTROLLERS:
        if c not in enabled:
            with contextlib.suppress(OSError):
                control.write_text(f"+{c}")


def shares_of(cores: float | None) -> int:
    """The kubelet's cpu.shares for a CPU request (MilliCPUToShares): at least 2."""
    if not cores:
        return 2
    return max(2, int(cores * 1024))


def shares_to_v2_weight(shares: int) -> int:
    """runc's (and the kubelet's) conversion of cpu.shares to cpu.weight on cgroup v2."""
    return 1 + ((shares - 2) * 9999) // 262142


def _cores(q: str | None) -> float | None:
    return _quantity_value(q)


@dataclass
class KContainer:
    name: str
    id: str
    cgroup: OwnedCgroup
    sandbox: bool = False

    @property
    def path(self) -> str:
        return _cpu_path(self.cgroup)


@dataclass
class KPod:
    name: str
    uid: str
    qos: str  # guaranteed | burstable | besteffort (Kubernetes QoS class)
    koord_qos: str  # LS | BE ... (the koordinator class FakeKube serves)
    cgroup: OwnedCgroup
    containers: dict[str, KContainer] = field(default_factory=dict)
    sandbox_container: KContainer | None = None
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The pod cgroup's path in the cpu hierarchy (the detector's workload key, the actuators' target)."""
        return _cpu_path(self.cgroup)

    @property
    def rel(self) -> str:
        return self.path.lstrip("/")


def _cpu_path(cg: OwnedCgroup) -> str:
    h = cg.layout.hierarchy_for("cpu") or cg.layout.v2
    return "/" + str(cg.dirs["cpu"].relative_to(h.mount))


class KubeletNode:
    """Pods of one kubelet driver; :meth:`close` stops their tasks and removes every cgroup it made."""

    def __init__(self, driver: str, paths: HostPaths | None = None) -> None:
        if driver not in ("systemd", "cgroupfs"):
            raise ValueError(f"unknown cgroup driver {driver!r}")
        self.driver = driver
        self.paths = paths or HostPaths()
        self.layout = discover(self.paths)
        self.v2 = pure_v2(self.layout)
        self.pods: list[KPod] = []
        self.procs: list[subprocess.Popen] = []
        self._cgroups: list[OwnedCgroup] = []
        if self.v2:
            enable_v2_root_controllers()
        # the QoS levels exist on every kubelet node, pods or not (besteffort with the smallest weight)
        self.kubepods = self._make(self._kubepods())
        self.qos_levels = {q: self._make(self.qos_path(q)) for q in ("burstable", "besteffort")}
        self._cpu_weight(self.qos_levels["besteffort"], 2)
        self._burstable_cores = 0.0  # what the burstable level's weight follows (the kubelet's QoS manager)
        self._cpu_weight(self.qos_levels["burstable"], shares_of(self._burstable_cores))
        # Our pods first on their CPUs against the rest of a shared machine (tests/conftest.py: shield):
        # a BestEffort pod at weight 2 would otherwise get next to nothing of a loaded CPU.
        self._unshield = shield(self.kubepods)

    # -- paths ----------------------------------------------------------------------------------
    def _kubepods(self) -> str:
        return "kubepods.slice" if self.driver == "systemd" else "kubepods"

    def qos_path(self, qos: str) -> str:
        if qos == "guaranteed":
            return self._kubepods()
        return f"kubepods.slice/kubepods-{qos}.slice" if self.driver == "systemd" else f"kubepods/{qos}"

    def pod_path(self, qos: str, uid: str) -> str:
        if self.driver == "systemd":
            slug = uid.replace("-", "_")
            name = f"kubepods-pod{slug}.slice" if qos == "guaranteed" else f"kubepods-{qos}-pod{slug}.slice"
            return f"{self.qos_path(qos)}/{name}"
        return f"{self.qos_path(qos)}/pod{uid}"

    def container_name(self, cid: str) -> str:
        return f"cri-containerd-{cid}.scope" if self.driver == "systemd" else cid

    # -- making pods ----------------------------------------------------------------------------
    def _make(self, rel: str) -> OwnedCgroup:
        cg = OwnedCgroup(rel, POD_CONTROLLERS if not self.v2 else ("cpu", "cpuset", "memory", "pids", "io"),
                         self.paths, self.layout).create()
        self._cgroups.append(cg)
        return cg

    def pod(self, name: str, containers: list[dict[str, Any]], koord_qos: str | None = None,
            make_containers: bool = True) -> KPod:
        """A pod of ``containers`` ({"name", "requests", "limits", "cpuset"}) with its sandbox container;
        ``make_containers=False``: the pod cgroup only, its containers left to a runtime (:class:`Runc`)."""
        uid = str(uuid.uuid4())
        qos = _k8s_qos(containers)
        koord = koord_qos or ("BE" if qos == "besteffort" else "LS")
        pod_cg = self._make(self.pod_path(qos, uid))
        cpu_limits = [_cores((c.get("limits") or {}).get("cpu")) for c in containers]
        mem_limits = [_quantity_value((c.get("limits") or {}).get("memory")) for c in containers]
        requests = sum(_cores((c.get("requests") or c.get("limits") or {}).get("cpu")) or 0.0 for c in containers)
        self._cpu_weight(pod_cg, shares_of(requests))
        if qos == "burstable":
            # The kubelet's QoS manager sets the burstable level's shares to the sum of its pods' CPU
            # requests: a burstable pod competes with the besteffort level at what its pods asked for.
            self._burstable_cores += requests
            self._cpu_weight(self.qos_levels["burstable"], shares_of(self._burstable_cores))
        if all(x is not None for x in cpu_limits):  # the kubelet caps the pod only when every container is
            self._cpu_max(pod_cg, sum(cpu_limits))  # type: ignore[arg-type]
        if all(x is not None for x in mem_limits):
            self._memory_max(pod_cg, int(sum(mem_limits)))  # type: ignore[arg-type]
        pod = KPod(name, uid, qos, koord, pod_cg, spec={"containers": containers})
        self.pods.append(pod)
        if not make_containers:
            return pod
        # the sandbox first, as containerd starts it before the app containers
        sandbox_id = hashlib.sha256(f"{uid}/sandbox".encode()).hexdigest()
        sb = self._make(f"{self.pod_path(qos, uid)}/{self.container_name(sandbox_id)}")
        self._cpu_weight(sb, 2)
        pod.sandbox_container = KContainer("POD", sandbox_id, sb, sandbox=True)
        for c in containers:
            cid = container_id_for(uid, c["name"])
            cg = self._make(f"{self.pod_path(qos, uid)}/{self.container_name(cid)}")
            req = _cores((c.get("requests") or c.get("limits") or {}).get("cpu"))
            self._cpu_weight(cg, shares_of(req))
            if (lim := _cores((c.get("limits") or {}).get("cpu"))) is not None:
                self._cpu_max(cg, lim)
            if (mem := _quantity_value((c.get("limits") or {}).get("memory"))) is not None:
                self._memory_max(cg, int(mem))
            if c.get("cpuset"):
                cg.write("cpuset", "cpuset.cpus", c["cpuset"])
            pod.containers[c["name"]] = KContainer(c["name"], cid, cg)
        # the pause process: one sleeping task in the sandbox container, for the pod's whole life
        self.start(pod.sandbox_container, ["sleep", "3600"])
        return pod

    def weigh(self, pod: KPod, shares: int) -> None:
        """Give a pod, its containers and its QoS level this CPU weight (as v1 shares), as a pod that requests
        that much would have: a BestEffort pod's own weight (2) lets every other task on a shared machine
        crowd out a test's spinners, and they would be no neighbour at all."""
        qos = self.qos_levels.get(pod.qos)
        for cg in [*([qos] if qos is not None else []), pod.cgroup, *(c.cgroup for c in pod.containers.values())]:
            self._cpu_weight(cg, shares)

    def kube_pod(self, pod: KPod, namespace: str = "default") -> dict[str, Any]:
        """The pod as the kubelet's /pods serves it (FakeKube's make_pod): app containers only."""
        containers = [{k: v for k, v in c.items() if k in ("name", "requests", "limits")}
                      for c in pod.spec["containers"]]
        return make_pod(pod.name, namespace, uid=pod.uid, qos_class=pod.koord_qos, containers=containers)

    # -- values as the kubelet writes them ------------------------------------------------------
    def _cpu_weight(self, cg: OwnedCgroup, shares: int) -> None:
        if self.v2:
            cg.write("cpu", "cpu.weight", str(shares_to_v2_weight(shares)))
        else:
            cg.write("cpu", "cpu.shares", str(shares))

    def _cpu_max(self, cg: OwnedCgroup, cores: float) -> None:
        quota = max(1000, int(cores * PERIOD_US))
        if self.v2:
            cg.write("cpu", "cpu.max", f"{quota} {PERIOD_US}")
        else:
            cg.write("cpu", "cpu.cfs_quota_us", str(quota))

    def _memory_max(self, cg: OwnedCgroup, limit: int) -> None:
        cg.write("memory", "memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))

    # -- tasks ----------------------------------------------------------------------------------
    def start(self, container: KContainer, argv: list[str], cpus: Iterable[int] | None = None,
              **kw: Any) -> subprocess.Popen:
        cpuset = set(cpus) if cpus is not None else None

        def preexec() -> None:
            container.cgroup.preexec()
            if cpuset is not None:
                os.sched_setaffinity(0, cpuset)

        kw.setdefault("stdout", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, preexec_fn=preexec, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self._unshield()
        for cg in reversed(self._cgroups):
            cg.remove()
        self._cgroups.clear()


def _k8s_qos(containers: list[dict[str, Any]]) -> str:
    """Kubernetes' QoS class of a pod spec: Guaranteed, Burstable or BestEffort."""
    if all(not c.get("requests") and not c.get("limits") for c in containers):
        return "besteffort"
    for c in containers:
        limits = c.get("limits") or {}
        requests = c.get("requests") or limits
        for res in ("cpu", "memory"):
            if res not in limits or _quantity_value(requests.get(res)) != _quantity_value(limits[res]):
                return "burstable"
    return "guaranteed"


class Runc:
    """Containers made by Debian's runc (what containerd's shim runs), cgroupfs driver: runc itself makes
    the container's cgroup below the pod the kubelet made, enables the controllers it needs in every
    ancestor's ``cgroup.subtree_control`` and writes the container's resources. A busybox rootfs,
    state under ``workdir``. :meth:`close` deletes every container (runc removes its cgroup)."""

    def __init__(self, node: KubeletNode, workdir: Path) -> None:
        import shutil

        runc, busybox = shutil.which("runc"), shutil.which("busybox")
        if runc is None or busybox is None:
            raise FileNotFoundError("runc and busybox are needed (scripts/setup.sh test installs them)")
        self.node, self.runc, self.workdir = node, runc, workdir
        self.state = workdir / "runc-state"
        self.rootfs = workdir / "rootfs"
        (self.rootfs / "bin").mkdir(parents=True, exist_ok=True)
        for d in ("proc", "dev", "sys", "tmp"):
            (self.rootfs / d).mkdir(exist_ok=True)
        shutil.copy2(busybox, self.rootfs / "bin/busybox")
        for applet in ("sh", "sleep"):
            link = self.rootfs / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
        self.ids: list[str] = []

    def _spec(self, bundle: Path) -> dict[str, Any]:
        import json

        subprocess.run([self.runc, "spec", "--bundle", str(bundle)], check=True, capture_output=True, timeout=60)
        return json.loads((bundle / "config.json").read_text())

    def run(self, pod: KPod, name: str, argv: list[str], *, cpu_shares: int = 2, cpu_quota_cores: float | None = None,
            cpus: str | None = None, memory_limit: int | None = None, sandbox: bool = False) -> KContainer:
        """``argv`` (in the busybox rootfs) as container ``name`` of ``pod``, detached."""
        import json

        cid = hashlib.sha256(f"{pod.uid}/sandbox".encode()).hexdigest() if sandbox else container_id_for(pod.uid, name)
        bundle = self.workdir / cid[:12]
        bundle.mkdir()
        spec = self._spec(bundle)
        spec["root"] = {"path": str(self.rootfs), "readonly": True}
        spec["process"].update(terminal=False, args=argv)
        cpu: dict[str, Any] = {"shares": cpu_shares}
        if cpu_quota_cores is not None:
            cpu.update(quota=int(cpu_quota_cores * PERIOD_US), period=PERIOD_US)
        if cpus is not None:
            cpu["cpus"] = cpus
        resources: dict[str, Any] = {"cpu": cpu}
        if memory_limit is not None:
            resources["memory"] = {"limit": memory_limit}
        # the network namespace stays the host's: nothing here needs its own, and none costs less to set up
        spec["linux"]["namespaces"] = [ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"]
        spec["linux"]["resources"] = resources
        # the cgroupfs driver's path: the pod's cgroup (made by the kubelet, here by us) / the container id
        spec["linux"]["cgroupsPath"] = f"{pod.path}/{cid}"
        (bundle / "config.json").write_text(json.dumps(spec))
        # Not a pipe for stderr: a detached container inherits runc's stdio, so it would hold the pipe open
        # and subprocess.run would wait for its EOF until the timeout (the container runs for its life).
        with (bundle / "runc.stderr").open("w+b") as err:
            done = subprocess.run([self.runc, "--root", str(self.state), "run", "--detach", "--bundle", str(bundle), cid],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  timeout=120 * slowdown())  # runc re-executes itself (runc init): slow under TCG
            if done.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"runc run {cid[:12]}: exit {done.returncode}: {err.read().decode(errors='replace')[-500:]}")
        self.ids.append(cid)
        h = self.node.layout.hierarchy_for("cpu") or self.node.layout.v2
        cg = OwnedCgroup.__new__(OwnedCgroup)  # a view of runc's cgroup: runc made it and removes it
        cg.paths, cg.layout, cg.prefix, cg.name = self.node.paths, self.node.layout, pod.cgroup.prefix, cid
        cg.dirs = {c: h.path_of(f"{pod.path}/{cid}") for c in ("cpu", "cpuset", "memory", "pids", "io")}
        cg._created = []
        container = KContainer("POD" if sandbox else name, cid, cg, sandbox=sandbox)
        if sandbox:
            pod.sandbox_container = container
        else:
            pod.containers[name] = container
        return container

    def pids(self, container: KContainer) -> list[int]:
        return [int(p) for p in (container.cgroup.dirs["cpu"] / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        for cid in reversed(self.ids):
            subprocess.run([self.runc, "--root", str(self.state), "delete", "--force", cid],
                           capture_output=True, timeout=120, check=False)
        self.ids.clear()
