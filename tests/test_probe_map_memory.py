# SPDX-License-Identifier: Apache-2.0
"""Kernel memory of the tcpconnect, reclaim, hardirq and softirq probes' maps on a large node.

The kernel sizes a per-CPU map by the *possible* CPUs: on a 192-CPU node a per-CPU value of V bytes
costs entries x round_up(V, 8) x 192. These probes count rare events (connects, reclaim passes) or
keep one entry per (CPU, IRQ line): their maps are shared, and only tiny per-CPU state is left.
The estimate here is the one Debian's 6.1 kernel reports as ``memlock`` (max_entries x (key +
value), per-CPU values times the possible CPUs), taken from each probe as it loads by default on this
host, and priced at 192 CPUs. Measured in the VM lane: bench/probe_maps.py.
"""

from __future__ import annotations

import pytest

from probes.hardirq import HardirqProbe
from probes.reclaim import ReclaimProbe
from probes.softirq import VECTORS, SoftirqProbe
from probes.tcpconnect import TcpConnectProbe
from testkit.bpf_maps import BPF_MAP_TYPE_RINGBUF

LARGE_NODE_CPUS = 192
# The four probes' share of the agent's 24 MiB at 192 possible CPUs (runqlat takes most of the rest).
BUDGET_BYTES = 5 << 20
PROBES = {"tcpconnect": TcpConnectProbe, "reclaim": ReclaimProbe, "hardirq": HardirqProbe, "softirq": SoftirqProbe}
# Shared arrays the loader sizes by the possible CPUs (entries per CPU): priced like a per-CPU map.
SIZED_BY_CPUS = {"softirq.stats": len(VECTORS)}


def footprint(m, cpus: int, per_cpu_entries: int = 0) -> int:
    """What 6.1's fdinfo says for a map at `cpus` possible CPUs (kernel/bpf/syscall.c,
    bpf_map_memory_footprint): max_entries x round_up(key + value, 8), page-rounded; a ring buffer is
    its data pages."""
    if m.type == BPF_MAP_TYPE_RINGBUF:
        return m.max_entries
    value = (m.value_size + 7) // 8 * 8 * cpus if m.percpu else m.value_size
    size = (m.key_size + value + 7) // 8 * 8
    entries = per_cpu_entries * cpus if per_cpu_entries else m.max_entries
    return (entries * size + 4095) // 4096 * 4096


@pytest.mark.root
def test_the_probes_maps_fit_a_large_node_without_growing_with_its_cpus():
    at_2, at_large, by_map = 0, 0, {}
    for name, cls in PROBES.items():
        with cls() as probe:
            for m in probe.probe.obj.maps():  # type: ignore[attr-defined]
                per_cpu = SIZED_BY_CPUS.get(f"{name}.{m.name}", 0)
                at_2 += footprint(m, 2, per_cpu)
                at_large += footprint(m, LARGE_NODE_CPUS, per_cpu)
                by_map[f"{name}.{m.name}"] = footprint(m, LARGE_NODE_CPUS, per_cpu) - footprint(m, 2, per_cpu)
    grows = {k: v for k, v in by_map.items() if v > 0}
    print(f"\nat 2 CPUs {at_2 / 2**20:.2f} MiB, at {LARGE_NODE_CPUS} {at_large / 2**20:.2f} MiB; grow: {grows}")
    assert at_large <= BUDGET_BYTES, (at_large, by_map)
    # What still grows with the CPUs is per-CPU state of the hot path: softirq's (10 vectors), the
    # drop counters, hardirq's handler in progress.
    assert set(grows) <= {"softirq.pending", "softirq.stats", "hardirq.running", *(f"{p}.drops" for p in PROBES)}, grows
    assert at_large - at_2 <= 1_250_000, grows


@pytest.mark.root
def test_the_raw_tp_only_begin_hash_takes_one_entry_in_tp_btf_mode():
    with ReclaimProbe() as probe:
        if probe.status.attach_mode != "tp_btf":
            pytest.skip("this kernel loads the raw_tp flavour")
        assert probe.probe.obj.map("fallback_reclaim").max_entries == 1  # type: ignore[attr-defined]
    with ReclaimProbe(attach_mode="raw_tp") as probe:
        assert probe.probe.obj.map("fallback_reclaim").max_entries == 16384  # type: ignore[attr-defined]
