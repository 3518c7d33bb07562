# SPDX-License-Identifier: Apache-2.0
"""When the detector walks the cgroup hierarchy to list pod cgroups (issue 39: the walk's cost follows
the node's cgroups, so it runs when the pod list says something may be new, not every 30 s regardless).

On a hierarchy of the test's own (plain directories under tmp_path: the walk reads directory entries and
their inode numbers, as on cgroupfs), with a real resolver and a pod list the test changes: no root."""

from __future__ import annotations

import pytest

from detector import runtime
from detector.cgroups import CgroupResolver
from detector.pods.model import ContainerInfo, PodInfo
from detector.policy import Policy
from detector.runtime import Detector
from probes.cgroupfs import CgroupLayout, Hierarchy

UID = "0a1b2c3d-0000-4000-8000-00000000000c"
CID = "c0ffee" * 10 + "abcd"
QOS_DIR = "kubepods.slice/kubepods-besteffort.slice"
POD_DIR = f"{QOS_DIR}/kubepods-besteffort-pod{UID.replace('-', '_')}.slice"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(runtime.time, "monotonic", clock)
    (tmp_path / POD_DIR).mkdir(parents=True)
    layout = CgroupLayout(v2=Hierarchy(2, tmp_path, frozenset({"cpu", "memory", "cpuset"})))
    resolver = CgroupResolver(layout=layout, clock=clock)
    walks: list[float] = []
    walk = resolver._walk

    def counting_walk(h, known):
        walks.append(clock.now)
        return walk(h, known)

    monkeypatch.setattr(resolver, "_walk", counting_walk)
    pods = [PodInfo(UID, "shop", "web", "BE", containers=(ContainerInfo("main", container_id=CID),))]
    detector = Detector(Policy(), layout=layout, resolver=resolver, pods=lambda: pods)
    return detector, clock, walks, tmp_path


def test_the_max_age_walk_runs_only_while_a_named_cgroup_is_missing(node):
    detector, clock, walks, root = node
    detector.index.refresh()
    detector.cgroup_paths()
    first = len(walks)
    assert first >= 1  # the first listing walks
    assert not any("cri-containerd" in p for p in detector.cgroup_paths())
    # The pod list names a container whose cgroup was not there at that walk: the max-age walk finds it.
    (root / POD_DIR / f"cri-containerd-{CID}.scope").mkdir()
    clock.now += runtime.POD_LIST_MAX_AGE_S
    listed = detector.cgroup_paths()
    assert len(walks) == first + 1 and any(CID in p for p in listed), listed
    # Everything the pod list names is listed: later max ages do not walk, until the full-walk age.
    for _ in range(int(runtime.POD_LIST_FULL_WALK_S // runtime.POD_LIST_MAX_AGE_S) - 1):
        clock.now += runtime.POD_LIST_MAX_AGE_S
        detector.cgroup_paths()
    assert len(walks) == first + 1
    clock.now += runtime.POD_LIST_MAX_AGE_S
    detector.cgroup_paths()
    assert len(walks) == first + 2
