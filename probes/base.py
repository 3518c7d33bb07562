"""What every BPF probe shares: its drop counters, its event ring buffer, closing.

Each probe keeps its own maps and decoding (ebpf_exporter style); this is only the plumbing around
`LoadedProbe` that would otherwise be repeated in each of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Generic, Self, TypeVar

from probes.engine import LoadedProbe, ProbeStatus
from probes.libbpf import RingBuffer

# enum nn_drop_reason in bpf/nn_events.h, in order.
DROP_REASONS = ("task_storage", "key_map_full", "ringbuf_full", "start_map_full")

Event = TypeVar("Event")


class BpfProbe(Generic[Event]):
    """Base of the BPF probes. Subclasses set `self.probe` (and so `status`) and may call
    `_watch_events` once to decode a ring buffer of outlier events."""

    probe: LoadedProbe
    _ring: RingBuffer | None = None
    _events: list[Event]

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
        drops = {}
        for i, reason in enumerate(DROP_REASONS):
            values = self.probe.map_lookup("drops", i.to_bytes(4, "little")) or []
            drops[reason] = sum(struct.unpack("<Q", v)[0] for v in values)  # type: ignore[union-attr]
        return drops

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        self.probe.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
