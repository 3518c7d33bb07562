# SPDX-License-Identifier: Apache-2.0
"""A pod's containers as the self causes need them: what the pod may use, and whose turn it was.

What a pod "may use" is not its pod cgroup's: the kubelet's static CPU manager pins each container's
cpuset while the pod cgroup keeps every CPU, and it puts a CFS quota on the pod cgroup only when
every container has a limit. So the pod may use the union of its containers' effective cpusets, and
the sum of their quotas where every container has one (else it is not bounded by quota).

The who-ran-instead matrix is per leaf cgroup, so the wait a pod spends behind its own tasks splits
by container: behind the waiting container's own threads, or behind a sibling (a busy sidecar).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from detector.cgroups import parse_cgroup_path
from probes.cpuacct import CgroupCpuStat

POD_ITSELF = "(pod cgroup)"  # tasks in the pod-level cgroup itself, not in a container


@dataclass(frozen=True, slots=True)
class MayUse:
    """What a pod's containers may use together."""

    cpus: tuple[int, ...] | None  # union of the containers' effective cpusets (None: none read)
    quota_cores: float | None  # sum of their quotas when every container has one, else None
    containers: int  # containers read

    @property
    def cpu_count(self) -> int | None:
        return len(self.cpus) if self.cpus else None


def containers_by_pod(paths: Iterable[str]) -> dict[str, list[str]]:
    """Pod UID -> its container cgroup paths, from a list of cgroup paths (one parse each)."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        ident = parse_cgroup_path(path)
        if ident.kind == "container" and ident.pod_uid is not None:
            out[ident.pod_uid].append(path)
    return dict(out)


def may_use(container_paths: Iterable[str], cpus: Mapping[str, tuple[int, ...]],
            cpu: Mapping[str, CgroupCpuStat]) -> MayUse:
    """Union of the containers' cpusets and the sum of their quotas (None unless every one has one)."""
    union: set[int] = set()
    quota = 0.0
    every_limited = True
    n = 0
    for path in container_paths:
        n += 1
        union.update(cpus.get(path, ()))
        stat = cpu.get(path)
        q = stat.quota_cores if stat is not None else None
        if q is None:
            every_limited = False
        else:
            quota += q
    return MayUse(tuple(sorted(union)) if union else None, quota if every_limited and n else None, n)


def largest_share(by_container: Mapping[str, float], total_ns: float, floor: float = 0.1) -> list[tuple[str, float]]:
    """(container, share of the wait) for containers behind which it waited at least ``floor`` of it, largest first."""
    if total_ns <= 0:
        return []
    ranked = sorted(((name, ns / total_ns) for name, ns in by_container.items()), key=lambda x: -x[1])
    return [(name, share) for name, share in ranked if share >= floor]
