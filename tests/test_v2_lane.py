# SPDX-License-Identifier: Apache-2.0
"""The VM lane is what it says: the pinned kernel, a pure cgroup v2 hierarchy with the controllers a
kubelet needs enabled at the root, and the probes' view of it agreeing (scripts/vm/)."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes.cgroupfs import discover
from testkit.procfiles import read_proc_softirqs

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


def _runner():
    spec = importlib.util.spec_from_file_location("nn_vm_run", ROOT / "scripts/vm/run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runner_keeps_tcg_to_one_host_thread_unless_told(monkeypatch, tmp_path) -> None:
    runner = _runner()
    monkeypatch.delenv("NN_VM_TCG_THREAD", raising=False)
    args, command = runner.parse(["--", "true"])
    assert args.tcg_thread == "single" and command == ["true"]
    options = runner.qemu_options(tmp_path, kvm=False, tcg_thread=args.tcg_thread)
    assert options[options.index("-accel") + 1] == "tcg,thread=single", options
    assert "-accel" not in runner.qemu_options(tmp_path, kvm=True, tcg_thread="single")
    monkeypatch.setenv("NN_VM_TCG_THREAD", "multi")
    assert runner.parse(["--", "true"])[0].tcg_thread == "multi"


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


# Loopback UDP from one CPU: every datagram is a NET_RX softirq on that CPU.
# NET_RX softirqs on one CPU until killed (testkit/workloads/loopback_udp.py)
SENDER = ROOT / "testkit/workloads/loopback_udp.py"
SWITCHES = 300


@pytest.mark.smoke
@pytest.mark.vm
def test_the_guest_lives_through_its_kernel_rewriting_a_tracepoint_site_that_both_cpus_run() -> None:
    """Every probe attach or close switches a tracepoint, and the kernel rewrites the tracepoint's jump-label
    site in place (an int3 first). Here the softirq_exit site, run by both CPUs taking NET_RX softirqs, is
    switched SWITCHES times. Under qemu 7.2's multi-threaded TCG the guest livelocked in every try, twice
    within 20 switches (both vCPUs at the site, as CI's VM smoke hung); the lane runs single-threaded TCG
    (scripts/vm/run.py). A hung guest fails the run through the runner's --idle-timeout."""
    if os.environ.get("NN_VM") != "1":
        pytest.skip("not in the VM lane: tracefs settings here belong to the machine")
    enable = Path("/sys/kernel/tracing/events/irq/softirq_exit/enable")
    assert enable.exists(), "tracefs with the irq:softirq_exit event (the lane's guest mounts it)"
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, cpus
    before = read_proc_softirqs()
    senders = [subprocess.Popen([sys.executable, str(SENDER), str(cpu)]) for cpu in cpus[:2]]
    started = time.monotonic()
    try:
        time.sleep(1.0)
        for _ in range(SWITCHES):
            enable.write_text("1")
            enable.write_text("0")
    finally:
        enable.write_text("0")
        for sender in senders:
            sender.kill()
            sender.wait()
    after = read_proc_softirqs()
    moved = {cpu: after[(cpu, "NET_RX")] - before[(cpu, "NET_RX")] for cpu in cpus[:2]}
    print(f"{SWITCHES} switches in {time.monotonic() - started:.1f} s; NET_RX runs per CPU: {moved}")
    # The switches ran while both CPUs were taking softirqs at the site, or the test proved nothing.
    assert all(count >= 1000 for count in moved.values()), moved
    assert enable.read_text().strip() == "0"
