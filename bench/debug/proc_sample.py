# SPDX-License-Identifier: Apache-2.0
"""Per-CPU steal and named kernel threads' CPU time, sampled every ``--interval`` s (bench/debug/README.md).

    taskset -c 0 .venv/bin/python -m bench.debug.proc_sample --seconds 150 --threads kswapd0,kdamond.0

One line a sample, printed at the end (nothing is written while the pass runs):
``<unix time> steal <cpuN>=<ms since the last sample> ... <thread>=<CPU ticks since the last sample>@<last CPU> ...``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

MS_PER_TICK = 10  # USER_HZ 100


def steal_ms(stat_text: str) -> dict[str, int]:
    """Per-CPU steal (the eighth value of each cpuN line of /proc/stat), in ms."""
    return {f[0]: int(f[8]) * MS_PER_TICK for f in (line.split() for line in stat_text.splitlines())
            if f and f[0].startswith("cpu") and f[0] != "cpu"}


def thread_cpu(stat_text: str) -> tuple[int, int]:
    """(utime + stime in clock ticks, the CPU it last ran on) from /proc/<pid>/stat."""
    f = stat_text.rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12]), int(f[36])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--threads", default="", help="comma list of exact thread names (pgrep -x)")
    a = p.parse_args(argv)
    pids = {}
    for name in filter(None, a.threads.split(",")):
        found = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
        if not found:
            print(f"error: no thread named {name!r}", file=sys.stderr)
            return 2
        pids[name] = found[0]

    def read() -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
        with open("/proc/stat", encoding="ascii") as f:
            steal = steal_ms(f.read())
        threads = {}
        for name, pid in pids.items():
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                threads[name] = thread_cpu(f.read())
        return steal, threads

    lines, prev = [], read()
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        time.sleep(a.interval)
        cur = read()
        steal = " ".join(f"{c}={v - prev[0][c]}" for c, v in sorted(cur[0].items()))
        threads = " ".join(f"{n}={t - prev[1][n][0]}@{cpu}" for n, (t, cpu) in cur[1].items())
        lines.append(f"{time.time():.3f} steal {steal} {threads}".rstrip())
        prev = cur
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
