# SPDX-License-Identifier: Apache-2.0
"""Labels and health series that let the exporter's metrics join the rest of a monitoring stack (issue 17).

cAdvisor and kube-state-metrics key containers by namespace/pod/container with `container` the
container's *name*; a probe that is off must read 0 in `noisyneighbor_probe_up` (alerts and
dashboards compare it with 1). Both are checked on the exporter alone, with a stub labeler and
snapshot: no probes, no root.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from detector.decisions import Target
from noisyneighbor import exporter as ex
from noisyneighbor.exporter import Exporter
from probes.cgroupfs import discover
from probes.cpuacct import CgroupCpuStat
from probes.engine import ProbeStatus
from probes.snapshot import NodeSnapshot

UID = "0a1b2c3d-0000-4000-8000-00000000000c"
CID = "c0ffee" * 10 + "abcd"  # 64 hex digits, as containerd names it
POD_CGROUP = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
CONTAINER_CGROUP = f"{POD_CGROUP}/cri-containerd-{CID}.scope"


class _PodLabeler:
    """Every path is the test pod, as the resolver and pod metadata would name it."""

    def target_for_id(self, cgroup_id, hierarchy):
        return None

    def target_for_path(self, cgroup_path: str) -> Target:
        return Target(cgroup_path, pod_uid=UID, namespace="shop", pod="web-7d9f", qos="BE")


def _scrape(registry: CollectorRegistry) -> list:
    return [s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples]


def test_container_label_is_the_container_name_and_the_id_is_apart():
    names = {(UID, CID): "nginx"}
    registry = CollectorRegistry()
    exp = Exporter(registry, _PodLabeler(), node="n1", layout=discover(),
                   container_name=lambda uid, cid: names.get((uid, cid)))
    stat = CgroupCpuStat(1, 10**9, None, None, 0, 0, 0, None, None, None, None)
    exp.update(NodeSnapshot(monotonic_s=1.0, wall_s=100.0, cgroup_cpu={CONTAINER_CGROUP: stat, POD_CGROUP: stat}))
    usage = {s.labels["cgroup"]: s.labels for s in _scrape(registry) if s.name == ex.CGROUP_CPU_USAGE}
    container = next(labels for cgroup, labels in usage.items() if "cri-containerd" in cgroup)
    assert (container["namespace"], container["pod"], container["container"]) == ("shop", "web-7d9f", "nginx")
    assert container["container_id"] == CID[:12]
    pod = next(labels for cgroup, labels in usage.items() if "cri-containerd" not in cgroup)
    assert pod["container"] == "" and pod["container_id"] == ""  # the pod cgroup is no container


def test_probe_up_reads_0_for_an_off_probe_and_its_state_is_a_label_of_its_own_series():
    registry = CollectorRegistry()
    exp = Exporter(registry, _PodLabeler(), node="n1", layout=discover())
    status = {"runqlat": ProbeStatus("runqlat", "on", attach_mode="tp_btf"),
              "softirq": ProbeStatus("softirq", "off", reason="BPF object missing"),
              "reclaim": ProbeStatus("reclaim", "degraded", reason="raw_tp only")}
    exp.update(NodeSnapshot(monotonic_s=1.0, wall_s=100.0, probe_status=status))
    samples = _scrape(registry)
    up = {s.labels["probe"]: s.value for s in samples if s.name == ex.PROBE_UP}
    assert up == {"runqlat": 1.0, "softirq": 0.0, "reclaim": 1.0}
    assert all("state" not in s.labels for s in samples if s.name == ex.PROBE_UP)
    state = {s.labels["probe"]: (s.labels["state"], s.value) for s in samples if s.name == ex.PROBE_STATE}
    assert state == {"runqlat": ("on", 1.0), "softirq": ("off", 1.0), "reclaim": ("degraded", 1.0)}


class _CountingLabeler:
    """The test pod by path, and by id a cgroup directory under a hierarchy of the test's own; counts calls."""

    def __init__(self, pods: dict[str, object], dirs: dict[int, str]) -> None:
        self.pods, self.dirs, self.calls = pods, dirs, 0

    def target_for_id(self, cgroup_id, hierarchy):
        self.calls += 1
        path = self.dirs.get(cgroup_id)
        return None if path is None else self.target_for_path(path)

    def target_for_path(self, cgroup_path: str) -> Target:
        self.calls += 1
        pod = self.pods[UID]
        return Target(cgroup_path, pod_uid=UID, namespace="shop", pod=pod.name, qos="BE")  # type: ignore[attr-defined]


class _PodRecord:
    def __init__(self, name: str) -> None:
        self.name = name


def test_kept_labels_follow_the_pod_record_and_the_cgroup_at_the_id(tmp_path):
    """Labels are kept from scrape to scrape only while the pod source hands out the same record of the
    pod, and (by id) while the directory at the cgroup's path is still that cgroup."""
    from probes.cgroupfs import Hierarchy

    pods: dict[str, object] = {UID: _PodRecord("web-1")}
    hierarchy = Hierarchy(2, tmp_path, frozenset({"cpu"}))
    cgroup_dir = tmp_path / POD_CGROUP.lstrip("/")
    cgroup_dir.mkdir(parents=True)
    cgroup_id = cgroup_dir.stat().st_ino
    labeler = _CountingLabeler(pods, {cgroup_id: POD_CGROUP})
    keys = Exporter(None, labeler, node="n1", layout=discover(), labels_token=pods.get).keys

    def scrape() -> tuple[str | None, str | None]:
        keys.begin_scrape()
        by_id = keys.for_id(cgroup_id, hierarchy)
        by_path = keys.for_path(CONTAINER_CGROUP)
        keys.end_scrape()
        return (by_id.pod if by_id else None), (by_path.pod if by_path else None)

    assert scrape() == ("web-1", "web-1")
    calls = labeler.calls
    assert scrape() == ("web-1", "web-1")
    assert labeler.calls == calls  # the same record, the same cgroup: nothing labelled again
    pods[UID] = _PodRecord("web-2")  # the source's new record of the pod (a change)
    assert scrape() == ("web-2", "web-2")
    cgroup_dir.rmdir()  # the cgroup removed: its id has no series at the next scrape
    labeler.dirs.clear()
    assert scrape() == (None, "web-2")


def test_a_kept_id_key_is_checked_at_its_path_once_per_change_of_the_listing(tmp_path):
    """With the watched cgroups' listing (cgroups_token), a listed cgroup's kept key is not checked at its
    path each scrape: the stated lateness is that a listed cgroup removed under an unchanged listing
    keeps its series until the listing changes; at the first scrape after it changes, the removal shows.
    A cgroup outside the listing is still checked at every scrape."""
    from probes.cgroupfs import Hierarchy

    pods: dict[str, object] = {UID: _PodRecord("web-1")}
    hierarchy = Hierarchy(2, tmp_path, frozenset({"cpu"}))
    other = "/system.slice/cron.service"
    dirs = {}
    for path in (POD_CGROUP, other):
        (tmp_path / path.lstrip("/")).mkdir(parents=True)
        dirs[(tmp_path / path.lstrip("/")).stat().st_ino] = path
    pod_id, other_id = list(dirs)
    listing = [frozenset({POD_CGROUP})]
    labeler = _CountingLabeler(pods, dirs)
    keys = Exporter(None, labeler, node="n1", layout=discover(), labels_token=pods.get,
                    cgroups_token=lambda: listing[0]).keys

    def scrape() -> tuple[str | None, str | None]:
        keys.begin_scrape()
        found = keys.for_id(pod_id, hierarchy), keys.for_id(other_id, hierarchy)
        keys.end_scrape()
        return tuple(k.cgroup if k else None for k in found)  # type: ignore[return-value]

    assert scrape() == (POD_CGROUP, other)
    assert scrape() == (POD_CGROUP, other)
    (tmp_path / POD_CGROUP.lstrip("/")).rmdir()
    (tmp_path / other.lstrip("/")).rmdir()
    labeler.dirs.clear()
    assert scrape() == (POD_CGROUP, None)  # the listed one: late until the listing changes
    listing[0] = frozenset()  # the next walk: the pod's cgroups are gone from the listing
    assert scrape() == (None, None)
