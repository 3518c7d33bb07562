# SPDX-License-Identifier: Apache-2.0
"""Fake hosts (temp dirs laid out like /sys/fs/cgroup and /sys/devices) and small helpers for actuator tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from probes.host import HostPaths


def write_files(base: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def fake_v2_host(root: Path, cgroups: list[str], cpus: str = "0-3") -> HostPaths:
    """A pure v2 host: root has cgroup.controllers; each cgroup has cpu.max, cpu.max.burst, cpu.weight, ..."""
    cg = root / "sys/fs/cgroup"
    write_files(cg, {"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.procs": "", "cpuset.cpus.effective": cpus})
    for c in cgroups:
        write_files(cg / c, {
            "cpu.max": "max 100000\n", "cpu.max.burst": "0\n", "cpu.weight": "100\n", "cpu.stat": "usage_usec 0\n",
            "cgroup.threads": "", "cgroup.procs": "", "cpuset.cpus": "\n", "cpuset.mems": "\n",
            "cgroup.controllers": "cpuset cpu io memory pids\n",
        })
    return HostPaths.under(root)


def fake_v1_host(root: Path, cgroups: list[str], cpus: str = "0-3") -> HostPaths:
    cg = root / "sys/fs/cgroup"
    for hier in ("cpu", "cpuacct", "cpuset", "memory"):
        (cg / hier).mkdir(parents=True, exist_ok=True)
    for c in ["", *cgroups]:
        write_files(cg / "cpu" / c, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n", "cpu.cfs_burst_us": "0\n",
                                     "cpu.shares": "1024\n", "tasks": "", "cgroup.procs": "",
                                     "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n"})
        write_files(cg / "cpuacct" / c, {"cpuacct.usage": "0\n", "cpuacct.stat": "user 0\nsystem 0\n"})
        write_files(cg / "cpuset" / c, {"cpuset.cpus": f"{cpus}\n", "cpuset.mems": "0\n", "tasks": "", "cgroup.procs": ""})
    return HostPaths.under(root)


def fake_cpu_topology(root: Path, siblings: list[str], nodes: dict[int, str]) -> None:
    """siblings[i] = thread_siblings_list of cpu i; nodes = {node: cpulist}."""
    sysd = root / "sys/devices/system"
    write_files(sysd / "cpu", {"online": f"0-{len(siblings) - 1}\n"})
    for i, s in enumerate(siblings):
        write_files(sysd / f"cpu/cpu{i}/topology", {"thread_siblings_list": s + "\n"})
    for n, lst in nodes.items():
        write_files(sysd / f"node/node{n}", {"cpulist": lst + "\n"})


def tree_hashes(top: Path) -> dict[str, str]:
    """sha256 of every readable file under a cgroup directory (dry-run check)."""
    out: dict[str, str] = {}
    for dirpath, _, files in os.walk(top):
        for f in files:
            p = Path(dirpath) / f
            if f in ("cpu.stat", "cpuacct.usage", "cpuacct.stat", "cpuacct.usage_all", "cpuacct.usage_percpu",
                     "cpuacct.usage_user", "cpuacct.usage_sys", "cpuacct.usage_percpu_user", "cpuacct.usage_percpu_sys",
                     "cpu.stat.local", "cpuset.memory_pressure"):
                continue  # counters move on their own
            try:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                continue  # write-only or unreadable pseudo-files
    return out
