# SPDX-License-Identifier: Apache-2.0
"""Batch allocatable (detector/batch.py): koordinator's three formulas against hand-computed values, the
reservation sources (kubelet config, node annotation and status, policy), Prod/Mid vs Batch from the
detector's QoS mapping, and the exported series."""

from __future__ import annotations

import json

import pytest

from detector.batch import (
    BatchMeter,
    PodUse,
    Reservation,
    ReservationError,
    annotation_reservation,
    kubelet_reservation,
    measure_snapshot,
    meter_for,
    node_object_reservations,
    resource_terms,
)
from detector.policy import Policy, parse_policy
from detector.workloads import WorkloadIndex
from probes.cpuacct import CgroupCpuStat
from probes.host import HostPaths
from probes.snapshot import CpuTimes, NodeSnapshot

GIB = 1024**3

# Two Prod/Mid pods and one BE pod. CPU in cores, memory in GiB.
PODS = [
    PodUse(prod=True, cpu_used=1.5, memory_used=6 * GIB, cpu_request=2.0, memory_request=8 * GIB),
    PodUse(prod=True, cpu_used=1.0, memory_used=2 * GIB, cpu_request=0.5, memory_request=1 * GIB),
    PodUse(prod=False, cpu_used=1.5, memory_used=4 * GIB, cpu_request=0.0, memory_request=0),
]
ANNO = Reservation(0.5, 1 * GIB, "annotation")
KUBELET = Reservation(1.0, 2 * GIB, "kubelet")


def terms_from(total, threshold, node_used, pods, resource, anno, kubelet):
    """One resource's terms over these pods: their columns for that resource, as the meter hands them."""
    cpu = resource == "cpu"
    return resource_terms(total, threshold, node_used, [p.prod for p in pods],
                          [p.cpu_used if cpu else p.memory_used for p in pods],
                          [p.cpu_request if cpu else p.memory_request for p in pods],
                          anno.cpu_cores if cpu else anno.memory_bytes, kubelet.cpu_cores if cpu else kubelet.memory_bytes)


def test_cpu_formulas_equal_hand_computed_values():
    t = terms_from(8.0, 60, 5.6, PODS, "cpu", ANNO, KUBELET)
    # Node.Reserved = 8 * 40 % = 3.2; System.Used = max(5.6 - 4.0, 0.5, 1.0) = 1.6; System.Reserved = 1.0
    assert t.node_reserved == pytest.approx(3.2)
    assert t.system_used == pytest.approx(1.6)
    assert t.system_reserved == pytest.approx(1.0)
    assert t.allocatable("usage") == pytest.approx(8 - 3.2 - 1.6 - (1.5 + 1.0))  # 0.7
    assert t.allocatable("request") == pytest.approx(8 - 3.2 - 1.0 - (2.0 + 0.5))  # 1.3
    assert t.allocatable("maxUsageRequest") == pytest.approx(8 - 3.2 - 1.6 - (2.0 + 1.0))  # 0.2


def test_memory_formulas_equal_hand_computed_values():
    t = terms_from(32.0 * GIB, 65, 20.0 * GIB, PODS, "memory", ANNO, KUBELET)
    # Node.Reserved = 32 * 35 % = 11.2; System.Used = max(20 - 12, 1, 2) = 8; System.Reserved = 2
    assert t.allocatable("usage") / GIB == pytest.approx(32 - 11.2 - 8 - (6 + 2))  # 4.8
    assert t.allocatable("request") / GIB == pytest.approx(32 - 11.2 - 2 - (8 + 1))  # 9.8
    assert t.allocatable("maxUsageRequest") / GIB == pytest.approx(32 - 11.2 - 8 - (8 + 2))  # 2.8


def test_reservations_win_over_measured_system_use_and_results_clamp_at_zero():
    # Node.Used - Pod(All).Used = 0.1 is below the kubelet's 1.0: System.Used is the reservation.
    t = terms_from(4.0, 100, 4.1, PODS, "cpu", ANNO, KUBELET)
    assert t.system_used == pytest.approx(1.0)
    assert t.raw("usage") == pytest.approx(4 - 0 - 1.0 - 2.5)
    busy = terms_from(2.0, 60, 2.0, PODS, "cpu", ANNO, KUBELET)
    assert busy.raw("usage") < 0 and busy.allocatable("usage") == 0.0
    with pytest.raises(ValueError, match="unknown batch allocatable policy"):
        busy.allocatable("average")


def test_kubelet_config_reservation():
    doc = {"kubeReserved": {"cpu": "500m", "memory": "1Gi"}, "systemReserved": {"cpu": "250m", "memory": "512Mi"},
           "evictionHard": {"memory.available": "200Mi"}}
    r = kubelet_reservation(doc)
    assert r.cpu_cores == pytest.approx(0.75)
    assert r.memory_bytes == (1024 + 512 + 200) * 1024**2
    # /configz wraps it; reservedSystemCPUs replaces the cpu reservation; evictionHard in percent; the
    # kubelet's default hard eviction (100Mi) when the file sets none.
    pinned = kubelet_reservation({"kubeletconfig": {**doc, "reservedSystemCPUs": "0-1,4",
                                                     "evictionHard": {"memory.available": "5%"}}}, 10 * GIB)
    assert pinned.cpu_cores == 3.0
    assert pinned.memory_bytes == pytest.approx((1024 + 512) * 1024**2 + 0.5 * GIB)
    assert kubelet_reservation({}).memory_bytes == 100 * 1024**2
    with pytest.raises(ReservationError, match=r"kubeReserved.cpu: not a quantity: 'lots'"):
        kubelet_reservation({"kubeReserved": {"cpu": "lots"}})


def test_node_annotation_and_status_reservations():
    anno = {"node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "1500m", "memory": "2Gi"}})}
    r = annotation_reservation(anno)
    assert r is not None and (r.cpu_cores, r.memory_bytes) == (1.5, 2 * GIB)
    pinned = annotation_reservation({"node.koordinator.sh/reservation": '{"reservedCPUs": "2-3"}'})
    assert pinned is not None and pinned.cpu_cores == 2.0
    assert annotation_reservation({}) is None
    with pytest.raises(ReservationError, match="not valid JSON"):
        annotation_reservation({"node.koordinator.sh/reservation": "{cpu"})
    node = {"metadata": {"name": "n1", "annotations": anno},
            "status": {"capacity": {"cpu": "8", "memory": "32Gi"}, "allocatable": {"cpu": "7500m", "memory": "30Gi"}}}
    a, k = node_object_reservations(node)
    assert a is not None and a.cpu_cores == 1.5
    assert k is not None and (k.cpu_cores, k.memory_bytes) == (0.5, 2 * GIB)


def test_colocation_config_from_a_koordinator_configmap_and_ours():
    cm = {"kind": "ConfigMap", "data": {"colocation-config": json.dumps(
        {"enable": True, "cpuReclaimThresholdPercent": 70, "memoryReclaimThresholdPercent": 80,
         "memoryCalculatePolicy": "usage", "degradeTimeMinutes": 15})}}
    policy = parse_policy(json.dumps(cm))
    assert (policy.colocation.cpu_reclaim_threshold_percent, policy.colocation.memory_reclaim_threshold_percent) == (70, 80)
    ours = parse_policy("colocation: {reservedCpuCores: 1.5, reservedMemoryBytes: 1073741824}")
    assert ours.colocation.reserved_cpu_cores == 1.5
    with pytest.raises(ValueError, match="cpuReclaimThresholdPercent"):
        parse_policy('colocation-config: {cpuReclaimThresholdPercent: 170}')


def test_meter_reads_the_kubelet_config_under_the_host_root(tmp_path):
    cfg = tmp_path / "var/lib/kubelet/config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("kind: KubeletConfiguration\nkubeReserved: {cpu: 200m, memory: 256Mi}\nevictionHard: {}\n")
    meter = meter_for(Policy(), HostPaths.under(tmp_path))
    assert meter.kubelet is not None and meter.kubelet.cpu_cores == pytest.approx(0.2)
    assert meter.kubelet.memory_bytes == 256 * 1024**2
    cfg.write_text("kubeReserved: [1, 2]\n")
    assert meter_for(Policy(), HostPaths.under(tmp_path)).kubelet is None  # logged, not raised


def _cpu(usage_s: float) -> CgroupCpuStat:
    return CgroupCpuStat(2, int(usage_s * 1e9), None, None, 0, 0, 0, None, None, None, None)


def _node(busy_s: float) -> CpuTimes:
    return CpuTimes(int(busy_s * 1e9), 0, 0, 10**12, 0, 0, 0, 0)


def test_prod_and_batch_follow_the_detectors_qos_mapping():
    """Standalone LS/BE globs, as the detector classifies workloads: LS use counts as Prod/Mid, BE not."""
    index = WorkloadIndex(ls_globs=["/ls-*"], be_globs=["/be-*"])
    paths = HostPaths()
    meter = BatchMeter(cpu_reclaim_threshold_percent=100, memory_reclaim_threshold_percent=100, min_window_s=1.0)
    per_cpu = {0: _node(0), 1: _node(0)}
    first = NodeSnapshot(monotonic_s=100.0, wall_s=0.0, node_cpu=_node(0.0), node_cpu_per_cpu=per_cpu,
                         cgroup_cpu={"/ls-web": _cpu(0.0), "/be-batch": _cpu(0.0)})
    assert measure_snapshot(meter, first, index, ["/ls-web", "/be-batch"], paths) is None
    # 2 s later: the node was busy 3 CPU-seconds, the LS workload 1.0 s, the BE one 1.6 s.
    second = NodeSnapshot(monotonic_s=102.0, wall_s=2.0, node_cpu=_node(3.0), node_cpu_per_cpu=per_cpu,
                          cgroup_cpu={"/ls-web": _cpu(1.0), "/be-batch": _cpu(1.6)})
    result = measure_snapshot(meter, second, index, ["/ls-web", "/be-batch"], paths)
    assert result is not None and result.window_s == pytest.approx(2.0)
    assert result.cpu.node_used == pytest.approx(1.5)
    assert result.cpu.pods_all_used == pytest.approx(1.3)
    assert result.cpu.prod_used == pytest.approx(0.5)
    # usage: 2 - 0 - max(1.5 - 1.3, 0, 0) - 0.5
    assert result.values()["cpu"]["usage"] == pytest.approx(2 - 0.2 - 0.5)
    assert result.memory.total > 0  # this host's zone counters


def test_exported_per_policy():
    from noisyneighbor.exporter import Exporter, render_text

    meter = BatchMeter(min_window_s=1.0)
    meter.measure(0.0, 0.0, 4, 8.0 * GIB, 0.0, {}, {})
    result = meter.measure(2.0, 2.0, 4, 8.0 * GIB, 2.0 * GIB, {}, {})
    assert result is not None
    exporter = Exporter(None, node="n1")
    exporter.update(NodeSnapshot(monotonic_s=2.0, wall_s=2.0), batch=result)
    text = render_text(exporter).decode()
    cpu = 4 - 4 * 0.4 - 1.0  # 4 cores, 40 % margin, 1 core used by the system
    assert f'noisyneighbor_node_batch_allocatable_cpu_cores{{node="n1",policy="usage"}} {cpu}' in text
    assert 'noisyneighbor_node_batch_allocatable_memory_bytes{node="n1",policy="maxUsageRequest"}' in text
    assert 'noisyneighbor_node_batch_allocatable_cpu_cores{node="n1",policy="request"} 2.4' in text


def test_the_pods_a_node_may_run_from_its_object_or_the_kubelet_config(tmp_path):
    """What sizes the run-queue tables (issue 39): the node object's capacity.pods, else the kubelet
    configuration's maxPods (the kubelet's 110 where unset), else nothing known."""
    from detector.batch import KUBELET_DEFAULT_MAX_PODS, kubelet_max_pods, node_max_pods
    from noisyneighbor.agent.wiring import CGROUPS_PER_POD, expected_runq_cgroups

    assert node_max_pods({"status": {"capacity": {"cpu": "2", "pods": "250"}}}) == 250
    assert node_max_pods({"status": {"capacity": {"cpu": "2"}}}) is None
    assert node_max_pods({"status": {"capacity": {"pods": "many"}}}) is None
    config = tmp_path / "var/lib/kubelet/config.yaml"
    assert kubelet_max_pods(config) is None
    config.parent.mkdir(parents=True)
    config.write_text("kind: KubeletConfiguration\nmaxPods: 500\n")
    assert kubelet_max_pods(config) == 500
    config.write_text(json.dumps({"kubeletconfig": {"kubeReserved": {"cpu": "1"}}}))
    assert kubelet_max_pods(config) == KUBELET_DEFAULT_MAX_PODS
    config.write_text("maxPods: [")
    assert kubelet_max_pods(config) is None
    config.write_text("maxPods: -3\n")
    assert kubelet_max_pods(config) is None

    policy = Policy()
    config.write_text("maxPods: 500\n")
    assert expected_runq_cgroups(policy, {"status": {"capacity": {"pods": "250"}}}, tmp_path)[0] == 250 * CGROUPS_PER_POD
    n, why = expected_runq_cgroups(policy, None, tmp_path)
    assert n == 500 * CGROUPS_PER_POD and "maxPods" in why
    config.unlink()
    assert expected_runq_cgroups(policy, None, tmp_path)[0] == 0
