# SPDX-License-Identifier: Apache-2.0
"""What every BPF probe shares: its drop counters, its event ring buffer, closing.

Each probe keeps its own maps and decoding (ebpf_exporter style); this is only the plumbing around
`LoadedProbe` that would otherwise be repeated in each of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Generic, Self, TypeVar

from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.engine import LoadedProbe, ProbeStatus
from probes.host import HostPaths
from probes.libbpf import RingBuffer

# enum nn_drop_reason in bpf/nn_events.h, in order.
DROP_REASONS = ("task_storage", "key_map_full", "ringbuf_full", "start_map_full")

Event = TypeVar("Event")


class BpfProbe(Generic[Event]):
    """Base of the BPF probes. Subclasses set `self.probe` (and so `status`) and may call
    `_watch_events` once to decode a ring buffer of outlier events."""

    probe: LoadedProbe
    paths: HostPaths
    layout: CgroupLayout
    hierarchy: Hierarchy | None  # the hierarchy whose cgroup ids key this probe's maps
    _ring: RingBuffer | None = None
    _events: list[Event]

    def _key_by(self, controller: str, paths: HostPaths | None, layout: CgroupLayout | None) -> bool:
        """Choose the hierarchy whose cgroup ids the BPF side reports; True if it is a v1 one.

        On v1/hybrid hosts pods live in the v1 controller hierarchies (cpu for scheduling and
        network, memory for reclaim), so the BPF programs read that controller's cgroup; on v2 hosts
        the default hierarchy's. The result goes into the program's rodata before load.
        """
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)
        self.hierarchy = self.layout.hierarchy_for(controller) or self.layout.v2
        return bool(self.hierarchy and self.hierarchy.version == 1)

    @property
    def status(self) -> ProbeStatus:
        return self.probe.status

    def _watch_events(self, ring_map: str, decode: Callable[[bytes], Event]) -> None:
        self._events = []
        self._ring = self.probe.ring_buffer(ring_map, lambda raw: self._events.append(decode(raw)))

    def _poll_events(self, timeout_ms: int = 0) -> list[Event]:
        """Events since the last call (waits up to timeout_ms for the first one)."""
        if self._ring is None:
            return []
        self._ring.poll(timeout_ms)
        out, self._events = self._events, []
        return out

    def read_drops(self) -> dict[str, int]:
        """The per-CPU `drops` counters summed over CPUs, by reason."""
        # One batched read of the whole (small, per-CPU) array, not a lookup per reason: every probe's
        # snapshot reads it every tick. Each entry is one u64 per possible CPU.
        blob = self.probe.map_array_prefix("drops", len(DROP_REASONS))
        words = struct.unpack(f"<{len(blob) // 8}Q", blob[: len(blob) // 8 * 8])
        per_cpu = len(words) // len(DROP_REASONS)
        return {reason: sum(words[i * per_cpu:(i + 1) * per_cpu]) for i, reason in enumerate(DROP_REASONS)}

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        self.probe.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
