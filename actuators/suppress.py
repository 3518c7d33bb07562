# SPDX-License-Identifier: Apache-2.0
"""CPU suppress of best-effort cgroups: koordlet's formula and both of its policies.

koordlet (qosmanager ``cpusuppress``), every round::

    be_allowed = capacity * threshold% - usage(non-BE pods) - usage(non-BE host apps)
                 - max(node_used - pods - host_apps, node_reserved)

- ``cfsQuota`` policy: the BE cgroup's quota = cores * period, at least 2000 µs; a change smaller than
  1 % of node capacity is skipped (dead band); an increase is at most 10 % of node capacity per round.
- ``cpuset`` policy: never below ``cpu_suppress_min_cpus``; grow by at most ceil(10 % of CPUs) per
  round; LSE/reserved CPUs excluded; whole hyperthread-sibling groups first, spread across NUMA
  nodes; written as the union of old and new sets top-down, then the new set bottom-up, on the
  target and every cgroup below it (a v1 child's cpuset must stay inside its parent's).
- Restore: at shutdown the journal restores the original values.

koordlet's threshold trigger itself (its inputs from /proc/stat and cpuacct, the tier-wide decision) is
not the agent's: the bench's koordlet scenario and the tests take it from ``testkit.koordlet_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from actuators.base import FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupFiles, CgroupVanished
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, Decision, SuppressAmount
from detector.policy import ResourceThresholdStrategy
from probes.cgroupfiles import (
    CPU_BURST,
    CPUSET_CPUS,
    SYS_CPU_ONLINE,
    SYS_CPU_THREAD_SIBLINGS,
    SYS_NODE_CPULIST,
    format_cpu_list,
)
from probes.host import HostPaths

MIN_QUOTA_US = 2000
DEAD_BAND_FRACTION = 0.01  # of node capacity
MAX_GROWTH_FRACTION = 0.10  # of node capacity (quota) or of the CPU count (cpuset), per round


def normalize_policy(policy: str) -> str:
    """"cfsQuota" / "cfs_quota" -> "cfsQuota"; "cpuset" -> "cpuset"."""
    p = policy.replace("_", "").lower()
    if p == "cfsquota":
        return "cfsQuota"
    if p == "cpuset":
        return "cpuset"
    raise ValueError(f"unknown CPU suppress policy {policy!r} (cpuset or cfsQuota)")


# -- CPU topology -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuTopology:
    cpus: tuple[int, ...]  # online
    siblings: dict[int, tuple[int, ...]]  # cpu -> its hyperthread group (itself included)
    node_of: dict[int, int]  # cpu -> NUMA node (0 when unknown)

    @classmethod
    def read(cls, paths: HostPaths) -> CpuTopology:
        cpus = SYS_CPU_ONLINE.read_or_none(paths)
        if cpus is None:
            raise FileNotFoundError(f"{SYS_CPU_ONLINE.at(paths)} is missing")
        siblings: dict[int, tuple[int, ...]] = {}
        for c in cpus:
            group = SYS_CPU_THREAD_SIBLINGS.read_or_none(paths, cpu=c) or (c,)
            siblings[c] = tuple(x for x in group if x in cpus) or (c,)
        node_of = dict.fromkeys(cpus, 0)
        node_dir = SYS_NODE_CPULIST.at(paths, node=0).parent.parent
        if node_dir.is_dir():
            for d in sorted(node_dir.glob("node[0-9]*")):
                for c in SYS_NODE_CPULIST.read_or_none(paths, node=d.name[4:]) or ():
                    if c in node_of:
                        node_of[c] = int(d.name[4:])
        return cls(cpus, siblings, node_of)

    def pick(self, n: int, excluded: Iterable[int] = (), prefer: Iterable[int] = ()) -> tuple[int, ...]:
        """``n`` CPUs: whole sibling groups first, round-robin over NUMA nodes; CPUs in ``prefer`` first
        within that order so a shrinking set keeps what it had (fewer task migrations)."""
        excluded_set, prefer_set = set(excluded), set(prefer)
        usable = [c for c in self.cpus if c not in excluded_set]
        groups_by_node: dict[int, list[tuple[int, ...]]] = {}
        seen: set[int] = set()
        for c in usable:
            if c in seen:
                continue
            group = tuple(x for x in self.siblings.get(c, (c,)) if x in usable) or (c,)
            seen.update(group)
            groups_by_node.setdefault(self.node_of.get(c, 0), []).append(group)
        for groups in groups_by_node.values():
            # full groups before partial ones; groups already in use before new ones
            groups.sort(key=lambda g: (-len(g), -len(prefer_set & set(g)), g))
        chosen: list[int] = []
        nodes = sorted(groups_by_node)
        while len(chosen) < n and any(groups_by_node[k] for k in nodes):
            for k in nodes:
                if groups_by_node[k] and len(chosen) < n:
                    group = groups_by_node[k].pop(0)
                    chosen.extend(sorted(group, key=lambda x: (x not in prefer_set, x))[: n - len(chosen)])
        return tuple(sorted(chosen))


# -- the actuator -------------------------------------------------------------------------------


class SuppressActuator(JournaledFileActuator):
    kind = ActionKind.SUPPRESS

    def __init__(
        self,
        files: CgroupFiles,
        journal: Journal,
        strategy: ResourceThresholdStrategy | None = None,
        *,
        excluded_cpus: Iterable[int] = (),
        topology: CpuTopology | None = None,
    ) -> None:
        super().__init__(journal)
        self.files = files
        self.strategy = strategy or ResourceThresholdStrategy()
        self.excluded_cpus = frozenset(excluded_cpus)
        self._topology = topology

    @property
    def topology(self) -> CpuTopology:
        if self._topology is None:
            self._topology = CpuTopology.read(self.files.paths)
        return self._topology

    @property
    def capacity_cores(self) -> float:
        return float(len(self.topology.cpus))

    def plan(self, decision: Decision) -> Plan:
        amount = decision.amount
        if not isinstance(amount, SuppressAmount):
            raise Refused(f"suppress needs a SuppressAmount, got {type(amount).__name__}")
        cgroup = decision.target.cgroup.strip("/")
        try:
            policy = normalize_policy(amount.policy)
        except ValueError as e:
            raise Refused(str(e)) from None
        try:
            if policy == "cfsQuota":
                return self._plan_quota(decision, cgroup, amount)
            return self._plan_cpuset(decision, cgroup, amount)
        except CgroupVanished as e:
            raise Refused(f"target is gone: {e}") from None

    def _plan_quota(self, decision: Decision, cgroup: str, amount: SuppressAmount) -> Plan:
        if amount.cpu_cores is None:
            raise Refused("cfsQuota suppress needs cpu_cores")
        current = self.files.read_cpu_max(cgroup)
        period = current.period_us
        capacity_us = self.capacity_cores * period
        old_us = current.quota_us if current.quota_us is not None else capacity_us
        wanted_us = max(MIN_QUOTA_US, round(amount.cpu_cores * period))
        new_us = wanted_us
        note = ""
        if new_us > old_us:
            step = MAX_GROWTH_FRACTION * capacity_us
            if new_us - old_us > step:
                new_us, note = round(old_us + step), " (growth capped at 10 % of capacity per round)"
        if abs(new_us - old_us) < DEAD_BAND_FRACTION * capacity_us:
            raise Refused(f"quota change {old_us / period:.2f} -> {new_us / period:.2f} cores is below 1 % of capacity")
        if new_us >= capacity_us:
            new_q: int | None = None  # the whole node: no limit, as when suppress is off
        else:
            new_q = int(new_us)
        writes: list[FileWrite] = []
        burst = self._burst_or_none(cgroup)
        if burst is not None and new_q is not None and burst > new_q:
            writes.append(self.files.burst_write(cgroup, new_q))  # the kernel refuses quota < burst
        writes.extend(self.files.quota_writes(cgroup, new_q))
        old_txt = "unlimited" if current.quota_us is None else f"{current.quota_us / period:.2f}"
        new_cores = self.capacity_cores if new_q is None else new_q / period
        return Plan(
            decision,
            f"suppress {decision.target.display}: cfs quota {old_txt} -> {new_cores:.2f} cores{note}",
            tuple(writes),
            details={"policy": "cfsQuota", "cpu_cores": new_cores, "quota_us": -1 if new_q is None else new_q,
                     "period_us": period},
        )

    def _burst_or_none(self, cgroup: str) -> int | None:
        if not self.files.exists(CPU_BURST, cgroup):
            return None
        return self.files.read_burst_us(cgroup)

    def _plan_cpuset(self, decision: Decision, cgroup: str, amount: SuppressAmount) -> Plan:
        topo = self.topology
        usable = [c for c in topo.cpus if c not in self.excluded_cpus]
        floor = max(1, int(self.strategy.cpu_suppress_min_cpus if amount.floor_cpus is None else amount.floor_cpus))
        # A v2 cpuset.cpus is empty until someone sets it (the kubelet never does for a pod): then the
        # cgroup has its parent's CPUs, which the effective list says; it is not a cpuset of none.
        current = self.files.read_cpus(cgroup) or self.files.read_effective_cpus(cgroup)
        if amount.cpus:
            wanted_n = len(amount.cpus)
        elif amount.cpu_cores is not None:
            wanted_n = math.ceil(max(0.0, amount.cpu_cores) - 1e-9)
        else:
            raise Refused("cpuset suppress needs cpu_cores or cpus")
        n = min(len(usable), max(floor, wanted_n))
        note = " (floor)" if n > wanted_n else ""
        if n > len(current):
            step = math.ceil(MAX_GROWTH_FRACTION * len(topo.cpus))
            if n - len(current) > step:
                n, note = len(current) + step, " (growth capped per round)"
        if amount.cpus and len(amount.cpus) == n and not set(amount.cpus) & self.excluded_cpus:
            new = tuple(sorted(amount.cpus))
        else:
            new = topo.pick(n, self.excluded_cpus, prefer=current)
        if set(new) == set(current):
            raise Refused(f"cpuset of {decision.target.display} is already {format_cpu_list(new)}")
        writes = self.cpuset_writes(cgroup, new)
        return Plan(
            decision,
            f"suppress {decision.target.display}: cpuset {format_cpu_list(current)} -> {format_cpu_list(new)}{note}",
            tuple(writes),
            details={"policy": "cpuset", "cpu_cores": float(len(new)), "cpus": format_cpu_list(new)},
        )

    def cpuset_writes(self, cgroup: str, new: Sequence[int]) -> list[FileWrite]:
        """Union of old and new top-down, then new bottom-up, over the cgroup and everything below it."""
        tree = self.files.descendants(CPUSET_CPUS, cgroup)
        olds = {cg: self.files.read_cpus(cg) for cg in tree}
        writes: list[FileWrite] = []
        for cg in tree:
            union = set(olds[cg]) | set(new)
            if union != set(olds[cg]):
                writes.append(FileWrite(str(self.files.path(CPUSET_CPUS, cg)), format_cpu_list(olds[cg]),
                                        format_cpu_list(union)))
        for cg in reversed(tree):
            if set(new) != set(olds[cg]):
                old = format_cpu_list(set(olds[cg]) | set(new))
                writes.append(FileWrite(str(self.files.path(CPUSET_CPUS, cg)), old, format_cpu_list(new)))
        return writes
