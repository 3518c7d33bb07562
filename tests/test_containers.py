"""detector/containers.py and the container split of a pod's own wait, on real cgroups laid out as the
kubelet's static CPU manager does: each container pinned by its own cpuset, the pod cgroup on every CPU.

- a two-container pod whose busy sidecar fills the CPU its app is pinned to: the wait behind the pod's
  own tasks is the sidecar's, and the pod may use 1 CPU (the union of its containers' cpusets), not
  the pod cgroup's 2;
- the arithmetic of "may use" (union of cpusets, sum of quotas only where every container has one).
"""

from __future__ import annotations

import pytest

from detector.containers import POD_ITSELF, containers_by_pod, largest_share, may_use
from probes.cpuacct import CgroupCpuStat
from tests.scenario_support import scenario_harness
from tests.test_detector_scenarios import VICTIM_CPU, _policy


def _cpu(quota_us: int | None) -> CgroupCpuStat:
    return CgroupCpuStat(1, 0, None, None, 0, 0, 0, None, None, quota_us, 100_000)


POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice"
APP = f"{POD}/cri-containerd-{'a' * 64}.scope"
SIDECAR = f"{POD}/cri-containerd-{'b' * 64}.scope"


def test_may_use_is_the_union_of_container_cpusets_and_the_sum_of_quotas_when_all_have_one():
    by_pod = containers_by_pod([POD, APP, SIDECAR, "/system.slice/sshd.service"])
    assert by_pod == {"1a2b3c4d-0000-1111-2222-333344445555": [APP, SIDECAR]}
    cpus = {POD: (0, 1, 2, 3), APP: (2,), SIDECAR: (2, 3)}
    both = may_use([APP, SIDECAR], cpus, {APP: _cpu(50_000), SIDECAR: _cpu(150_000)})
    assert both.cpus == (2, 3) and both.cpu_count == 2 and both.quota_cores == pytest.approx(2.0)
    one_unlimited = may_use([APP, SIDECAR], cpus, {APP: _cpu(50_000), SIDECAR: _cpu(None)})
    assert one_unlimited.quota_cores is None  # the kubelet sets no pod quota then: not bounded by quota
    assert may_use([], cpus, {}).cpus is None and may_use([], cpus, {}).quota_cores is None
    assert largest_share({"sidecar": 8.0, "app": 1.5, POD_ITSELF: 0.5}, 10.0) == [("sidecar", 0.8), ("app", 0.15)]


@pytest.fixture
def scenario(make_cgroup):
    yield from scenario_harness(make_cgroup, VICTIM_CPU, _policy)


@pytest.mark.root
@pytest.mark.slow
def test_busy_sidecar_pinned_with_the_app_is_named_and_may_use_counts_the_pinned_cpus(scenario):
    s = scenario(_policy(runq_p99_ms=2.0))
    pod, containers = s.k8s_pod("web", "LS", [
        {"name": "app", "requests": {"cpu": "1"}},
        {"name": "log-shipper", "requests": {"cpu": "100m"}},  # unlimited: no pod quota either
    ], shares=16384)
    # The static CPU manager's layout: each container pinned, the pod cgroup keeps every CPU.
    for c in containers.values():
        c.cgroup.write("cpuset", "cpuset.cpus", str(VICTIM_CPU))
    assert pod.cgroup.read("cpuset", "cpuset.cpus").strip() != str(VICTIM_CPU)
    s.ls_worker(containers["app"], [VICTIM_CPU], seconds=20)
    s.hog(containers["log-shipper"], [VICTIM_CPU], seconds=20)  # the shipper's two busy threads
    s.hog(containers["log-shipper"], [VICTIM_CPU], seconds=20)
    behind: dict[str, float] = {}
    may = []
    for _ in range(8):
        s.run_for(1)
        row = s.detector.last.workloads.get(f"pod:{pod.uid}") if s.detector.last else None
        if row is None:
            continue
        for name, ns in row.own_wait_by_container.items():
            behind[name] = behind.get(name, 0.0) + ns
        if row.may_use is not None:
            may.append(row.may_use)
    assert behind, "the app waited behind its own pod's tasks"
    top = max(behind, key=behind.__getitem__)
    assert top == "log-shipper", behind  # behind the sidecar, not its own threads
    assert may and all(m.cpus == (VICTIM_CPU,) and m.cpu_count == 1 for m in may), may
    assert all(m.quota_cores is None for m in may)
    incidents = s.incidents_for(pod)
    assert incidents, "the app waits behind its sidecar on the one CPU they may use: it breaches its SLO"
    for inc in incidents:
        assert str(inc.cause) == "self_contention", inc.to_dict()
        named = [e.container for e in inc.evidence if e.signal == "who_ran_instead_container_share"]
        assert named[:1] == ["log-shipper"], inc.to_dict()  # the sidecar first
        own = next(e for e in inc.evidence if e.signal == "who_ran_instead_own_share")
        assert " of 1.00 it may use (its containers' cpusets: 1 CPU" in own.note, own.note
        assert inc.to_dict()["evidence"][-len(named)]["container"] == named[0]
