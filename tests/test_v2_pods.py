# SPDX-License-Identifier: Apache-2.0
"""Pods as the kubelet and containerd lay them out, on the real kernel: this v1 hybrid host and the VM
lane's pure cgroup v2 (Debian 12's 6.1).

Both cgroup drivers (systemd: ``kubepods.slice/…/cri-containerd-<id>.scope``; cgroupfs:
``kubepods/<qos>/pod<uid>/<id>``), a sandbox (pause) container in every pod, a Guaranteed pod whose
container has its own cpuset (static CPU manager) while the pod keeps every CPU, a sidecar without a
limit (tests/kubelet_pods.py makes them, by hand: no systemd and no images in the VM). Checked: the
resolver and the workload index name pod, container and QoS class of each, the pause container is not
taken for an app container, the runqueue probe keys waits by the leaf container cgroup (whose id is
the task's) with the kernel's own run_delay, and an LS pod with BE spinners on its CPU gets a
``neighbor_cpu`` incident naming the BE pod.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from actuators.cgroupfile import CgroupFiles
from detector.cgroups import CgroupResolver
from detector.decisions import Cause
from detector.pods.model import pod_from_dict
from detector.workloads import WorkloadIndex
from probes.cgroupfiles import CPUSET_EFFECTIVE_CPUS
from probes.cgroupfs import discover
from testkit.scenario_support import LS_WORKER, Scenario
from testkit.timing import slowdown
from tests.ground_truth import SCHED_SWITCH_LOSS, missed_allowance
from tests.kubelet_pods import BE_NEIGHBOUR_SHARES, KPod, KubeletNode, pure_v2

pytestmark = [pytest.mark.root, pytest.mark.vm]

SPIN = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
VICTIM_CPU = (os.cpu_count() or 1) - 1


@pytest.fixture(params=["systemd", "cgroupfs"])
def node(request):
    n = KubeletNode(request.param)
    try:
        yield n
    finally:
        n.close()


def _three_pods(node: KubeletNode) -> tuple[KPod, KPod, KPod]:
    batch = node.pod("batch", [{"name": "job"}])
    api = node.pod("api", [
        {"name": "main", "requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        {"name": "sidecar", "requests": {"cpu": "50m"}},  # no limit: neither it nor the pod gets a quota
    ])
    render = node.pod("render", [{"name": "main", "requests": {"cpu": "1", "memory": "64Mi"},
                                  "limits": {"cpu": "1", "memory": "64Mi"}, "cpuset": str(VICTIM_CPU)}])
    return batch, api, render


def test_kubelet_pod_shapes_resolve_to_pod_container_and_qos(node):
    batch, api, render = _three_pods(node)
    assert (batch.qos, api.qos, render.qos) == ("besteffort", "burstable", "guaranteed")
    # every container has its task (the pause process in the sandbox), as on a node
    for pod in (batch, api, render):
        node.start(next(iter(pod.containers.values())), ["sleep", "60"])
    resolver = CgroupResolver(rescan_interval=0.0)
    layout = resolver.layout
    infos = {i.path: i for i in resolver.all(layout.cpu)}
    kube_root = node.kubepods.dirs["cpu"]
    kube_path = "/" + str(kube_root.relative_to(layout.cpu.mount))
    assert infos[kube_path].kind == "kubepods"
    for qos, cg in node.qos_levels.items():
        info = infos["/" + str(cg.dirs["cpu"].relative_to(layout.cpu.mount))]
        assert (info.kind, info.qos) == ("qos", qos), info
    index = WorkloadIndex(lambda: [pod_from_dict(node.kube_pod(p)) for p in (batch, api, render)])
    index.refresh()
    runtime = "containerd" if node.driver == "systemd" else None
    for pod in (batch, api, render):
        info = infos[pod.path]
        assert (info.kind, info.pod_uid, info.qos) == ("pod", pod.uid, pod.qos), info
        assert resolver.id_of(pod.path) == os.stat(pod.cgroup.dirs["cpu"]).st_ino
        for c in [*pod.containers.values(), pod.sandbox_container]:
            ci = infos[c.path]
            assert (ci.kind, ci.pod_uid, ci.container_id, ci.runtime, ci.qos) == \
                ("container", pod.uid, c.id, runtime, pod.qos), ci
            w = index.workload_of(c.path)
            assert (w.key, w.target.cgroup, w.target.qos) == (f"pod:{pod.uid}", pod.path, pod.koord_qos), w
        # the sandbox belongs to the pod but is none of its app containers
        assert index.container_of(pod.sandbox_container.path) is None
        for c in pod.containers.values():
            assert index.container_of(c.path)[0] == c.name
    files = CgroupFiles()
    api_main, sidecar = api.containers["main"], api.containers["sidecar"]
    assert files.read_cpu_max(api_main.path.lstrip("/")).cores == pytest.approx(0.5)
    assert files.read_cpu_max(sidecar.path.lstrip("/")).quota_us is None
    assert files.read_cpu_max(api.rel).quota_us is None  # a container without a limit: no pod quota
    assert files.read_cpu_max(render.rel).cores == pytest.approx(1.0)
    assert index.container_of(api_main.path) == ("main", pytest.approx(0.5))
    # static CPU manager: the container runs on its own CPU, the pod keeps every CPU
    h = layout.hierarchy_for("cpuset")
    version = h.version

    def effective(c_path: str) -> tuple[int, ...]:
        d = h.path_of(_in(c_path, node, "cpuset"))
        texts = [(d / n).read_text() for n in CPUSET_EFFECTIVE_CPUS.names(version)]
        return CPUSET_EFFECTIVE_CPUS.parse(version, *texts)

    assert effective(render.containers["main"].path) == (VICTIM_CPU,)
    every = effective(kube_path)
    assert effective(render.path) == effective(render.sandbox_container.path) == every
    assert len(every) == len(os.sched_getaffinity(0)) or len(every) > 1


def _in(cpu_path: str, node: KubeletNode, controller: str) -> str:
    """A cpu-hierarchy path of ours -> the same cgroup's path in another controller's hierarchy."""
    for cg in node._cgroups:
        if "/" + str(cg.dirs["cpu"].relative_to((cg.layout.hierarchy_for("cpu") or cg.layout.v2).mount)) == cpu_path:
            h = cg.layout.hierarchy_for(controller) or cg.layout.v2
            return str(cg.dirs[controller].relative_to(h.mount))
    raise KeyError(cpu_path)


def test_no_internal_processes_pods_hold_tasks_only_in_leaf_containers(node):
    if not pure_v2():
        pytest.skip("cgroup v1 hybrid host: the no-internal-processes rule is cgroup v2's (the VM lane runs this)")
    pod = node.pod("api", [{"name": "main", "requests": {"cpu": "100m"}}])
    pod_dir = pod.cgroup.dirs["cpu"]
    enabled = set((pod_dir / "cgroup.subtree_control").read_text().split())
    assert {"cpu", "cpuset", "memory", "pids"} <= enabled, enabled
    # the kubelet's and runc's layout: controllers enabled at every level down to the pod, tasks below
    d = pod_dir
    while d != discover().v2.mount:
        d = d.parent
        assert {"cpu", "memory"} <= set((d / "cgroup.subtree_control").read_text().split()), d
    with pytest.raises(OSError) as e:
        (pod_dir / "cgroup.procs").write_text(str(os.getpid()))
    assert e.value.errno == errno.EBUSY
    assert (pod.sandbox_container.cgroup.dirs["cpu"] / "cgroup.procs").read_text().split()
    assert not (pod_dir / "cgroup.procs").read_text().split()


def _schedstat(tids: list[int]) -> dict[int, tuple[int, int]]:
    out = {}
    for tid in tids:
        fields = Path(f"/proc/{tid}/task/{tid}/schedstat").read_text().split()
        out[tid] = (int(fields[1]), int(fields[2]))
    return out


def _stop_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        os.kill(pid, sig)
    if sig == signal.SIGSTOP:
        deadline = time.monotonic() + 10 * slowdown()
        while time.monotonic() < deadline:
            states = [Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] for p in pids]
            if all(s in "Tt" for s in states):
                time.sleep(0.05)
                return
            time.sleep(0.01)
        raise AssertionError(f"tasks did not stop: {pids}")


def test_runq_waits_are_keyed_by_the_leaf_container_under_nested_pods(node):
    from probes.runqlat import RunqLatProbe

    ls = node.pod("web", [{"name": "main", "requests": {"cpu": "500m"}}])
    be = node.pod("batch", [{"name": "job"}])
    main, job = ls.containers["main"], be.containers["job"]
    procs = [node.start(main, [sys.executable, "-c", SPIN, "120"], [VICTIM_CPU]) for _ in range(2)]
    procs += [node.start(job, [sys.executable, "-c", SPIN, "120"], [VICTIM_CPU]) for _ in range(2)]
    pids = [p.pid for p in procs]
    ids = {c.path: os.stat(c.cgroup.dirs["cpu"]).st_ino for c in (main, job, ls.sandbox_container)}
    pod_ids = {os.stat(p.cgroup.dirs["cpu"]).st_ino for p in (ls, be)}
    window = 3.0 * min(slowdown(), 4.0)
    with RunqLatProbe() as probe:
        time.sleep(0.5)
        _stop_all(pids, signal.SIGSTOP)
        t0, s0 = _schedstat(pids), probe.snapshot()
        _stop_all(pids, signal.SIGCONT)
        time.sleep(window)
        _stop_all(pids, signal.SIGSTOP)
        t1, s1 = _schedstat(pids), probe.snapshot()
        _stop_all(pids, signal.SIGCONT)
    # waits are keyed by the cgroup whose id the task has: the leaf container, never the pod above it
    assert not pod_ids & set(s1.per_cgroup), "a pod cgroup holds no task: its id must never key a wait"
    for c, mine in ((main, pids[:2]), (job, pids[2:])):
        truth_wait = sum(t1[p][0] - t0[p][0] for p in mine)
        truth_slices = sum(t1[p][1] - t0[p][1] for p in mine)
        got = s1.per_cgroup[ids[c.path]].delta(s0.per_cgroup.get(ids[c.path]))
        print(f"{c.path.rsplit('/', 1)[-1][:40]}: probe {got.sum_ns / 1e6:.1f} ms in {got.count} waits; "
              f"schedstat {truth_wait / 1e6:.1f} ms in {truth_slices} slices")
        assert truth_wait > 0.2 * window * 1e9, "the spinners did not contend: the test proves nothing"
        missed = max(0, truth_slices - got.count)
        assert missed <= missed_allowance(truth_slices, SCHED_SWITCH_LOSS)
        assert got.count <= 1.01 * truth_slices
        assert got.sum_ns <= 1.02 * truth_wait
        assert truth_wait - got.sum_ns <= 0.02 * truth_wait + missed * got.max_ns
    if s1.culprits_available:  # who ran instead: the pair is (LS container, BE container), leaf ids both
        pair = s1.culprits.get((ids[main.path], ids[job.path]))
        assert pair is not None and pair.delta(s0.culprits.get((ids[main.path], ids[job.path]))).wait_ns > 0
        assert not any(v in pod_ids or c in pod_ids for v, c in s1.culprits), "a pod id keyed a culprit pair"
    sandbox = s1.per_cgroup.get(ids[ls.sandbox_container.path])
    assert sandbox is None or sandbox.delta(s0.per_cgroup.get(ids[ls.sandbox_container.path])).count <= 2


@pytest.mark.smoke
@pytest.mark.slow
def test_neighbor_cpu_names_the_be_pod_on_kubelet_pods(node, make_cgroup):
    """An LS pod's worker and three BE spinners on its CPU (the shape that opened neighbor_cpu in the VM
    before): the incident's victim is the LS pod, its cause neighbor_cpu, its first culprit of ours the
    BE pod (by its pod cgroup, whatever container ran), never the LS pod's own sandbox."""
    from tests.test_detector_scenarios import _policy

    slow = slowdown()
    s = Scenario(make_cgroup, _policy(runq_p99_ms=2.0))
    affinity = os.sched_getaffinity(0)
    try:
        if len(affinity) > 1:
            os.sched_setaffinity(0, affinity - {VICTIM_CPU})  # the detector itself is no neighbour
        ls = node.pod("web", [{"name": "main", "requests": {"cpu": "500m"}}])
        be = node.pod("batch", [{"name": "job"}])
        # spinners that weigh 8 cores: they take the victim's CPU from it, not only other work on a loaded
        # host from both (at a BE pod's weight of 2 the node's own tasks were its neighbours, not the pod)
        node.weigh(be, BE_NEIGHBOUR_SHARES)
        for pod in (ls, be):
            s.kube.add_pod(node.kube_pod(pod))
            s.pods.append(pod)  # type: ignore[arg-type]  # Scenario reads .path only
        s._shield(ls.cgroup)
        # 4 ms of work every 20 ms: enough wall time per period for a TCG guest to show its waits too
        node.start(ls.containers["main"], [sys.executable, str(LS_WORKER), "--work-ms", "4", "--period-ms", "20",
                                           "--seconds", str(int(120 * slow))], [VICTIM_CPU])
        for _ in range(3):
            node.start(be.containers["job"], [sys.executable, "-c", SPIN, str(120 * slow)], [VICTIM_CPU])
        deadline = time.monotonic() + 30 * slow
        found = []
        while time.monotonic() < deadline and not found:
            s.run_for(2.0 * min(slow, 5.0), interval=1.0 * min(slow, 5.0))
            found = [i for i in s.incidents_for(ls) if i.cause == Cause.NEIGHBOR_CPU
                     and any(c.target.cgroup == be.path for c in i.culprits)]
        incidents = s.incidents_for(ls)
        assert found, [i.to_dict() for i in incidents]
        inc = found[-1]
        ours = [c.target.cgroup for c in inc.culprits if s.own(c.target.cgroup)]
        assert ours[0] == be.path, inc.to_dict()
        top = next(c for c in inc.culprits if c.target.cgroup == be.path)
        assert top.target.qos == "BE" and top.target.pod == "batch", inc.to_dict()
        assert inc.victim.pod == "web" and inc.victim.qos == "LS", inc.to_dict()
        assert all(ls.sandbox_container.id not in c.target.cgroup for c in inc.culprits), inc.to_dict()
    finally:
        s.close()
        os.sched_setaffinity(0, affinity)


def test_runc_made_containers_in_a_kubelet_pod(tmp_path):
    """Debian's runc (what containerd's shim runs) makes the pause and app containers of a pod the kubelet
    laid out (cgroupfs driver): runc enables the controllers in the pod's subtree_control, writes the
    container's cpu.max, cpu.weight, cpuset and memory.max; the detector names them, the probe keys the
    app container's waits by runc's cgroup, and a suppress of the pod caps what runc's container gets."""
    import shutil

    from actuators.journal import Journal
    from actuators.suppress import SuppressActuator
    from detector.decisions import ActionKind, Decision, SuppressAmount, Target
    from detector.policy import ResourceThresholdStrategy
    from probes.cpuacct import read_cgroup_cpu
    from probes.runqlat import RunqLatProbe
    from tests.kubelet_pods import Runc, shares_to_v2_weight

    if not pure_v2():
        pytest.skip("cgroup v1 hybrid host: runc would put the container at one path in every v1 hierarchy, and "
                    "this process's memory cgroup is elsewhere (the VM lane's pure v2 runs this)")
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed (scripts/setup.sh test installs it)")
    node = KubeletNode("cgroupfs")
    runc = None
    try:
        runc = Runc(node, tmp_path)
        spec = [{"name": "main", "requests": {"cpu": "250m", "memory": "64Mi"},
                 "limits": {"cpu": "500m", "memory": "128Mi"}}]
        pod = node.pod("api", spec, make_containers=False)
        sandbox = runc.run(pod, "POD", ["sleep", "3600"], sandbox=True)
        main = runc.run(pod, "main", ["sh", "-c", "while :; do :; done"], cpu_shares=256, cpu_quota_cores=0.5,
                        cpus=str(VICTIM_CPU), memory_limit=128 << 20)
        d = main.cgroup.dirs["cpu"]
        assert (d / "cpu.max").read_text().split() == ["50000", "100000"]
        assert int((d / "cpu.weight").read_text()) == shares_to_v2_weight(256)
        assert (d / "cpuset.cpus").read_text().strip() == str(VICTIM_CPU)
        assert int((d / "memory.max").read_text()) == 128 << 20
        assert {"cpu", "cpuset", "memory"} <= set((pod.cgroup.dirs["cpu"] / "cgroup.subtree_control").read_text().split())
        assert runc.pids(sandbox) and runc.pids(main) and not (pod.cgroup.dirs["cpu"] / "cgroup.procs").read_text().split()
        resolver = CgroupResolver(rescan_interval=0.0)
        infos = {i.path: i for i in resolver.all(resolver.layout.cpu)}
        for c in (sandbox, main):
            ci = infos[c.path]
            assert (ci.kind, ci.pod_uid, ci.container_id, ci.qos) == ("container", pod.uid, c.id, "burstable"), ci
        index = WorkloadIndex(lambda: [pod_from_dict(node.kube_pod(pod))])
        index.refresh()
        assert index.container_of(sandbox.path) is None
        assert index.container_of(main.path) == ("main", pytest.approx(0.5))
        assert index.workload_of(main.path).target.cgroup == pod.path
        # a BE spinner of ours on its CPU: the app container waits, keyed by the cgroup runc made
        be = node.pod("batch", [{"name": "job"}])
        node.start(be.containers["job"], [sys.executable, "-c", SPIN, "600"], [VICTIM_CPU])
        window = 2.0 * min(slowdown(), 4.0)
        main_id = os.stat(d).st_ino
        with RunqLatProbe() as probe:
            time.sleep(0.5)
            s0, u0, t0 = probe.snapshot(), read_cgroup_cpu(discover(), main.path), time.monotonic()
            time.sleep(window)
            s1, u1, t1 = probe.snapshot(), read_cgroup_cpu(discover(), main.path), time.monotonic()
        got = s1.per_cgroup[main_id].delta(s0.per_cgroup.get(main_id))
        used = (u1.usage_ns - u0.usage_ns) / ((t1 - t0) * 1e9)
        print(f"runc container: {got.count} waits, {got.sum_ns / 1e6:.0f} ms; {used:.2f} cores under its 0.5 quota")
        assert got.count > 0 and got.sum_ns > 0
        assert used <= 0.5 * (1 + 2 * 0.1 / window) + 0.01
        # suppress the pod (its quota, above runc's container): the container gets at most that
        act = SuppressActuator(CgroupFiles(), Journal(tmp_path / "j"),
                               ResourceThresholdStrategy(cpu_suppress_policy="cfsQuota"))
        plan = act.plan(Decision(ActionKind.SUPPRESS, Target(pod.path, qos="BE"),
                                 SuppressAmount("cfs_quota", cpu_cores=0.2), "t"))
        before = (pod.cgroup.dirs["cpu"] / "cpu.max").read_text()
        act.apply(plan)
        time.sleep(0.3)
        a, ta = read_cgroup_cpu(discover(), main.path), time.monotonic()
        time.sleep(window)
        b, tb = read_cgroup_cpu(discover(), main.path), time.monotonic()
        capped = (b.usage_ns - a.usage_ns) / ((tb - ta) * 1e9)
        print(f"pod suppressed to 0.2 cores: runc container used {capped:.2f} cores")
        assert capped <= 0.2 * (1 + 2 * 0.1 / window) + 0.01
        act.revert(plan)
        assert (pod.cgroup.dirs["cpu"] / "cpu.max").read_text() == before
    finally:
        if runc is not None:
            runc.close()
        node.close()
