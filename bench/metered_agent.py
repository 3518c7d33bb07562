# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor <args>` with a meter on what it copies out of BPF maps, for bench.node_scale.

The kernel counts what a process reads through read(2) (``rchar`` in ``/proc/<pid>/io``) but not what
it copies out of BPF maps through bpf(2). This wraps the two calls every map read goes through
(``BpfMap.lookup``: one value; ``BpfMap._batches``: one BPF_MAP_LOOKUP_BATCH call, only the entries
the kernel filled) and adds up the key and value bytes copied. Tables read in place through mmap (the
run-queue probe's slot tables and CPU histograms, the softirq probe's stats) have no call to wrap: each
probe's own count of the words it looked at and the slots it copied out is added, as "runqlat (mapped
tables)" and "softirq (mapped stats)". The maps each object loaded are remembered by name with their
fd, so the bench can read each one's ``memlock`` from ``/proc/<pid>/fdinfo/<fd>``. On SIGUSR1 both
are written, as JSON, to ``$NN_METER_OUT``.

    NN_METER_OUT=/tmp/meter.json python -m bench.metered_agent agent --dry-run ...
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from probes import libbpf  # noqa: E402

COUNTS = {"bpf_map_bytes": 0, "bpf_map_calls": 0}
BY_MAP: dict[str, int] = {}
MAP_FDS: dict[str, int] = {}
MAPPED_SCANNED: dict[str, int] = {}  # of BY_MAP's mapped entries: the bytes only looked at in place
LABELS: dict[int, str] = {}  # libbpf's map pointer -> "<object>:<map>" (map names repeat across objects)


def _add(m: libbpf.BpfMap, nbytes: int) -> None:
    COUNTS["bpf_map_bytes"] += nbytes
    COUNTS["bpf_map_calls"] += 1
    key = LABELS.get(m._ptr, m.name)
    BY_MAP[key] = BY_MAP.get(key, 0) + nbytes


def _meter_mapped_reads(cls: type, label: str) -> None:
    """Add what a probe's snapshot looked at or copied out of its mapped maps (its own counts), split
    into the counters looked at in place and the values copied out."""
    snapshot = cls.snapshot

    def metered_snapshot(self):  # type: ignore[no-untyped-def]
        read, scanned = self.bytes_read, getattr(self, "bytes_scanned", 0)
        snap = snapshot(self)
        n, looked = self.bytes_read - read, getattr(self, "bytes_scanned", 0) - scanned
        COUNTS["bpf_map_bytes"] += n
        BY_MAP[label] = BY_MAP.get(label, 0) + n
        MAPPED_SCANNED[label] = MAPPED_SCANNED.get(label, 0) + looked
        return snap

    cls.snapshot = metered_snapshot  # type: ignore[attr-defined]


def install(out: Path) -> None:
    lookup, batches, load = libbpf.BpfMap.lookup, libbpf.BpfMap._batches, libbpf.BpfObject.load

    def metered_lookup(self: libbpf.BpfMap, key: bytes):  # type: ignore[no-untyped-def]
        _add(self, self.key_size + self._stride)
        return lookup(self, key)

    def metered_batches(self: libbpf.BpfMap, batch: int) -> Iterator[tuple[int, bytes, bytes]]:
        for n, keys, values in batches(self, batch):
            _add(self, len(keys) + len(values))
            yield n, keys, values

    def metered_load(self: libbpf.BpfObject) -> None:
        load(self)
        for m in self.maps():
            label = f"{self.path.name.removesuffix('.bpf.o')}:{m.name}"
            LABELS[m._ptr] = label
            MAP_FDS[label] = m.fd

    from probes.runqlat import RunqLatProbe
    from probes.softirq import SoftirqProbe

    for cls, label in ((RunqLatProbe, "runqlat (mapped tables)"), (SoftirqProbe, "softirq (mapped stats)")):
        if hasattr(cls, "bytes_read"):  # a tree from before its mapped tables has nothing to add
            _meter_mapped_reads(cls, label)

    libbpf.BpfMap.lookup = metered_lookup  # type: ignore[method-assign]
    libbpf.BpfMap._batches = metered_batches  # type: ignore[method-assign]
    libbpf.BpfObject.load = metered_load  # type: ignore[method-assign]

    def dump(*_: object) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({**COUNTS, "by_map": BY_MAP, "mapped_scanned": MAPPED_SCANNED, "map_fds": MAP_FDS}))
        tmp.replace(out)

    signal.signal(signal.SIGUSR1, dump)


def main() -> int:
    install(Path(os.environ["NN_METER_OUT"]))
    from noisyneighbor.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
