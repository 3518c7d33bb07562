# SPDX-License-Identifier: Apache-2.0
"""BPF map memory of the tcpconnect, reclaim, hardirq and softirq probes, each loaded alone with its
defaults: per map its type, max_entries and the kernel's ``memlock`` (``/proc/self/fdinfo``).

Run it with the tree to measure first on the path, e.g. in the VM lane at 192 possible CPUs:
  scripts/vm/run.sh --append possible_cpus=192 -- env PYTHONPATH=<tree> .venv/bin/python bench/probe_maps.py
(6.1 reports an estimate by map size, max_entries x (key + value), per-CPU values x possible CPUs;
6.4+ reports what the map allocated.)
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

TYPES = {1: "HASH", 2: "ARRAY", 5: "PERCPU_HASH", 6: "PERCPU_ARRAY", 9: "LRU_HASH", 10: "LRU_PERCPU_HASH",
         27: "RINGBUF", 29: "TASK_STORAGE"}


def memlock(fd: int) -> int:
    info = Path(f"/proc/self/fdinfo/{fd}").read_text()
    m = re.search(r"^memlock:\s+(\d+)", info, re.M)
    return int(m.group(1)) if m else -1


def measure() -> dict:
    from probes.hardirq import HardirqProbe
    from probes.reclaim import ReclaimProbe
    from probes.softirq import SoftirqProbe
    from probes.tcpconnect import TcpConnectProbe

    out: dict = {"possible_cpus": Path("/sys/devices/system/cpu/possible").read_text().strip(),
                 "kernel": os.uname().release, "probes": {}}
    for name, cls in (("tcpconnect", TcpConnectProbe), ("reclaim", ReclaimProbe), ("hardirq", HardirqProbe),
                      ("softirq", SoftirqProbe)):
        probe = cls()
        try:
            maps = {}
            for m in probe.probe.obj.maps():  # type: ignore[attr-defined]
                fd = m.fd  # .rodata too: every map of the object is loaded
                maps[m.name] = {"type": TYPES.get(m.type, str(m.type)), "entries": m.max_entries,
                                "value": m.value_size, "kib": round(memlock(fd) / 1024, 1)}
            out["probes"][name] = {"mode": probe.probe.status.attach_mode, "maps": maps,
                                   "kib": round(sum(v["kib"] for v in maps.values()), 1)}
        finally:
            probe.close()
    out["kib"] = round(sum(p["kib"] for p in out["probes"].values()), 1)
    return out


def main() -> int:
    result = measure()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
