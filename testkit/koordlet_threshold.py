# SPDX-License-Identifier: Apache-2.0
"""koordlet's CPU-suppress threshold trigger, as the bench's koordlet scenario and the tests drive it:
node and cgroup CPU use sampled between two calls (/proc/stat and per-cgroup cpuacct), koordlet's
``be_allowed`` formula, and the tier-wide suppress decision. The agent itself never runs it (its
suppress decisions come from the mitigation planner), so it lives here, unshipped.

    be_allowed = capacity * threshold% - usage(non-BE pods) - usage(non-BE host apps)
                 - max(node_used - pods - host_apps, node_reserved)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from actuators.cgroupfile import CgroupFiles
from actuators.suppress import MIN_QUOTA_US, normalize_policy
from detector.decisions import ActionKind, Decision, SuppressAmount, Target
from detector.policy import ResourceThresholdStrategy
from probes.cpuacct import read_cgroup_cpu
from probes.procstat import ProcStatReader


@dataclass(frozen=True, slots=True)
class SuppressInputs:
    """CPU use over the last interval, in cores."""

    capacity_cores: float
    node_used_cores: float
    pods_used_cores: float  # all pods, BE included
    be_used_cores: float
    host_apps_used_cores: float = 0.0  # non-BE host applications with their own cgroups
    node_reserved_cores: float = 0.0

    @property
    def non_be_pods_cores(self) -> float:
        return max(0.0, self.pods_used_cores - self.be_used_cores)

    @property
    def system_cores(self) -> float:
        return max(self.node_used_cores - self.pods_used_cores - self.host_apps_used_cores, self.node_reserved_cores)


def be_allowed_cores(inputs: SuppressInputs, threshold_percent: float) -> float:
    """koordlet's formula; may be negative (then the floor applies)."""
    return (inputs.capacity_cores * threshold_percent / 100.0 - inputs.non_be_pods_cores
            - inputs.host_apps_used_cores - inputs.system_cores)


class CpuUsageSampler:
    """Node and cgroup CPU use between two calls of :meth:`sample`, as :class:`SuppressInputs`."""

    def __init__(
        self,
        files: CgroupFiles,
        pods_cgroup: str,
        be_cgroups: Sequence[str],
        host_app_cgroups: Sequence[str] = (),
        node_reserved_cores: float = 0.0,
    ) -> None:
        self.files = files
        self.pods_cgroup = pods_cgroup
        self.be_cgroups = list(be_cgroups)
        self.host_app_cgroups = list(host_app_cgroups)
        self.node_reserved_cores = node_reserved_cores
        self._proc_stat = ProcStatReader(files.paths)  # read at each sample: its interval is the caller's
        self._prev: tuple[tuple[int, int, int], dict[str, int]] | None = None

    def _usage_ns(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for cg in {self.pods_cgroup, *self.be_cgroups, *self.host_app_cgroups}:
            stat = read_cgroup_cpu(self.files.layout, cg)
            out[cg] = stat.usage_ns if stat is not None else 0
        return out

    def sample(self) -> SuppressInputs | None:
        """None on the first call (no interval yet) or when the node counters did not move."""
        node = self._proc_stat.node_ticks(read_now=True)
        usage = self._usage_ns()
        prev, self._prev = self._prev, (node, usage)
        if prev is None:
            return None
        (busy0, total0, _), usage0 = prev
        busy1, total1, ncpu = node
        if total1 <= total0 or ncpu == 0:
            return None
        # ticks summed over CPUs -> wall seconds of the interval = dticks / ncpu / USER_HZ; cores = ns / wall ns
        wall_ns = (total1 - total0) / ncpu / _user_hz() * 1e9

        def cores(names: Iterable[str]) -> float:
            return sum(max(0, usage[n] - usage0.get(n, usage[n])) for n in names) / wall_ns

        return SuppressInputs(
            capacity_cores=float(ncpu),
            node_used_cores=ncpu * (busy1 - busy0) / (total1 - total0),
            pods_used_cores=cores([self.pods_cgroup]),
            be_used_cores=cores(self.be_cgroups),
            host_apps_used_cores=cores(self.host_app_cgroups),
            node_reserved_cores=self.node_reserved_cores,
        )


def _user_hz() -> int:
    return os.sysconf("SC_CLK_TCK")


def threshold_suppress_decision(
    inputs: SuppressInputs, strategy: ResourceThresholdStrategy, be_cgroup: str, display: str | None = None
) -> Decision | None:
    """koordlet's threshold policy for the whole BE tier; None when disabled."""
    if not strategy.enable:
        return None
    allowed = be_allowed_cores(inputs, strategy.cpu_suppress_threshold_percent)
    policy = normalize_policy(strategy.cpu_suppress_policy)
    cores = max(allowed, MIN_QUOTA_US / 100_000 if policy == "cfsQuota" else float(strategy.cpu_suppress_min_cpus))
    reason = (f"node {inputs.node_used_cores:.2f}/{inputs.capacity_cores:.0f} cores used, threshold "
              f"{strategy.cpu_suppress_threshold_percent} %: BE allowed {allowed:.2f} cores (uses {inputs.be_used_cores:.2f})")
    target = Target(be_cgroup, qos="BE", pod=display)
    return Decision(ActionKind.SUPPRESS, target, SuppressAmount("cfs_quota" if policy == "cfsQuota" else "cpuset",
                                                                cpu_cores=cores), reason)

