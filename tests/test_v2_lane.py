# SPDX-License-Identifier: Apache-2.0
"""The VM lane is what it says: the pinned kernel, a pure cgroup v2 hierarchy with the controllers a
kubelet needs enabled at the root, and the probes' view of it agreeing (scripts/vm/)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from probes.cgroupfs import discover

ROOT = Path(__file__).resolve().parent.parent
# What the kubelet checks for on a v2 node (and systemd enables on one).
KUBELET_CONTROLLERS = {"cpuset", "cpu", "io", "memory", "hugetlb", "pids"}


def _kernel_env() -> dict[str, str]:
    out = {}
    for line in (ROOT / "scripts/vm/kernel.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.strip().split("=", 1)
            out[key] = value
    return out


def test_the_kernel_is_pinned_in_one_place() -> None:
    env = _kernel_env()
    assert env["NN_VM_KERNEL_PKG"] == f"linux-image-{env['NN_VM_KERNEL_RELEASE']}"
    pinned = [p for p in (ROOT / "scripts").rglob("*") if p.is_file() and env["NN_VM_KERNEL_RELEASE"] in p.read_text()]
    assert pinned == [ROOT / "scripts/vm/kernel.env"], pinned


@pytest.mark.smoke
@pytest.mark.vm
def test_the_lane_is_the_pinned_kernel_on_pure_v2() -> None:
    if os.environ.get("NN_VM") != "1":
        pytest.skip("not in the VM lane (scripts/vm/run.sh sets NN_VM=1 in the guest)")
    assert platform.release() == _kernel_env()["NN_VM_KERNEL_RELEASE"]
    layout = discover()
    assert layout.v2 is not None and not layout.v1, layout
    mount = layout.v2.mount
    enabled = set((mount / "cgroup.subtree_control").read_text().split())
    assert enabled >= KUBELET_CONTROLLERS, enabled
    for controller in ("cpu", "memory", "cpuset"):
        assert layout.hierarchy_for(controller) == layout.v2
    # The command runs in the root cgroup, the one v2 cgroup that may hold tasks while its children
    # have controllers; the tests' own cgroups go below it.
    assert Path("/proc/self/cgroup").read_text().strip() == "0::/"
    assert (mount / "cpu.pressure").exists() and Path("/sys/kernel/btf/vmlinux").exists()
