# SPDX-License-Identifier: Apache-2.0
"""Does a busy neighbour on the *other* CPU lengthen the scenario victim's requests? (issue 41, global-reclaim)

After global-reclaim's memory cap the BE grower keeps running on OTHER_CPU (0.91 cores: its stream
through its page cache, under its own limit), with no wait of the victim behind it, no reclaim stall and
no steal (the pass's ``timeline``). This runs the victim as the scenario does (CPU work 1 ms + 2 MiB
touched every 5 ms, on VICTIM_CPU) through phases of ``--phase-s`` each: quiet, a CPU-only spinner on
the other CPU, a page-cache stream on the other CPU that does not grow (POSIX_FADV_DONTNEED behind it, as
a capped grower reclaims its own pages), quiet. It prints each phase's latency p50/p99 and its requests
over ``SLOW_MS`` per second. Reads and writes only its own files under ``--dir``.

    flock /tmp/nn-heavy.lock .venv/bin/python -m bench.debug.sibling_load
"""

from __future__ import annotations

import argparse
import itertools
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scenarios.runner import OTHER_CPU, VICTIM_CPU

VICTIM = str(Path(__file__).resolve().parents[1] / "scenarios" / "victim.py")
SLOW_MS = 4.5  # 1.5x the victim's quiet p99 in the bench (about 3 ms)

SPIN = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
STREAM = """
import os, sys, time
path, seconds = sys.argv[2], float(sys.argv[1])
with open(path, "wb") as f:
    f.truncate(256 << 30)
fd = os.open(path, os.O_RDONLY)
buf, off, end = bytearray(4 << 20), 0, time.monotonic() + seconds
try:
    while time.monotonic() < end:
        off += os.readv(fd, [buf])
        if off % (64 << 20) == 0:  # drop what was read: the stream does not grow, as under a memory cap
            os.posix_fadvise(fd, 0, off, os.POSIX_FADV_DONTNEED)
finally:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    os.unlink(path)
print(f"streamed {off >> 20} MiB", file=sys.stderr)
"""


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.debug.sibling_load", description=__doc__.splitlines()[0])
    p.add_argument("--phase-s", type=float, default=8.0)
    p.add_argument("--dir", default=None, help="where the victim's log and the sparse file go (default: a temp dir)")
    args = p.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="nn-sibling-", dir="/var/tmp"))
    log = work / "victim.log"
    total = 4 * args.phase_s + 2
    victim = subprocess.Popen(["taskset", "-c", str(VICTIM_CPU), sys.executable, VICTIM, "cpu", "--out", str(log),
                               "--seconds", str(total), "--work-ms", "1", "--period-ms", "5", "--alloc-kb", "2048"])
    marks = [("quiet", time.monotonic_ns() + 1_000_000_000)]
    time.sleep(1 + args.phase_s)
    for name, code, extra in (("spin", SPIN, []), ("stream", STREAM, [str(work / "sparse")])):
        marks.append((name, time.monotonic_ns()))
        subprocess.run(["taskset", "-c", str(OTHER_CPU), sys.executable, "-c", code, str(args.phase_s), *extra],
                       check=True)
    marks.append(("quiet", time.monotonic_ns()))
    victim.wait()
    marks.append(("", marks[-1][1] + int(args.phase_s * 1e9)))
    rows = [(int(a), int(b) / 1e6) for a, b, *_ in (line.split() for line in log.read_text().splitlines())]
    for (name, lo), (_, hi) in itertools.pairwise(marks):
        xs = [ms for t, ms in rows if lo <= t < hi]
        if xs:
            slow = sum(1 for x in xs if x > SLOW_MS) / ((hi - lo) / 1e9)
            print(f"{name:6s} n={len(xs)} p50={sorted(xs)[len(xs) // 2]:.2f} p99={p99(xs):.2f} ms, "
                  f"over {SLOW_MS} ms: {slow:.2f}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
