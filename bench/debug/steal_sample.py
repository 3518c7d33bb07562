# SPDX-License-Identifier: Apache-2.0
"""Slow victim requests lined up with steal, free page reporting and the victim's own counters.

    taskset -c 0 .venv/bin/python -m bench.debug.steal_sample record --seconds 170 --out samples.txt &
    .venv/bin/python -m bench.scenarios --only global-reclaim-evict cpu-neighbor-shared --modes mitigate ...
    .venv/bin/python -m bench.debug.steal_sample slow samples.txt --over-ms 8

``record``: every 5 ms, one ``S`` line: monotonic ns, this platform's page reporting counters
(``/sys/module/page_reporting/parameters/{reported_kib,passes,walked}``, -1 where absent), ``nr_free_pages``,
CPU 1's steal (clock ticks), and per scenario victim (``bench.scenarios.victim``, found by its command
line) ``pid:on-cpu ns:run_delay ns:minflt:majflt``; its request log is copied as ``R pid end_ns latency_ns``
lines (read from an open descriptor: the pass deletes the file). ``slow``: each request over ``--over-ms``
with what those counters did around it, then the per-second timeline.
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
import time
from pathlib import Path
from typing import TextIO

REPORTING = Path("/sys/module/page_reporting/parameters")
VICTIM_MODULE = "bench.scenarios.victim"


def _read(path: str | Path) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _counter(name: str) -> str:
    try:
        return _read(REPORTING / name).strip()
    except OSError:
        return "-1"


def _victims() -> dict[int, str]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = _read(f"/proc/{pid}/cmdline").split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        if VICTIM_MODULE in argv and "--out" in argv:
            found[int(pid)] = argv[argv.index("--out") + 1]
    return found


def record(seconds: float, out: TextIO) -> None:
    logs: dict[int, TextIO] = {}
    end, scanned = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < end:
            now = time.monotonic_ns()
            if now - scanned > 300_000_000:
                scanned = now
                for pid, path in _victims().items():
                    if pid not in logs:
                        try:
                            logs[pid] = open(path, encoding="ascii")  # noqa: SIM115 - closed below
                        except OSError:
                            continue
                        out.write(f"V {now} {pid} {path}\n")
            vmstat = _read("/proc/vmstat")
            free = vmstat.split("nr_free_pages ", 1)[1].split("\n", 1)[0]
            steal = next(line.split()[8] for line in _read("/proc/stat").splitlines() if line.startswith("cpu1 "))
            rec = [str(now), _counter("reported_kib"), _counter("passes"), _counter("walked"), free, steal]
            for pid in list(logs):
                try:
                    sched = _read(f"/proc/{pid}/schedstat").split()
                    stat = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
                    rec.append(f"{pid}:{sched[0]}:{sched[1]}:{stat[7]}:{stat[9]}")
                except OSError:
                    continue
            out.write("S " + " ".join(rec) + "\n")
            for pid, f in logs.items():
                out.writelines(f"R {pid} {line}\n" for line in f.read().splitlines())
            time.sleep(0.005)
    finally:
        for f in logs.values():
            f.close()


def slow(path: str, over_ms: float) -> None:
    samples, requests = [], {}
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if f and f[0] == "S":
            per_victim = {int(x.split(":")[0]): tuple(map(int, x.split(":")[1:])) for x in f[7:]}
            samples.append((*map(int, f[1:7]), per_victim))
        elif f and f[0] == "R" and len(f) == 4:
            requests.setdefault(int(f[1]), []).append((int(f[2]), int(f[3])))
    times = [s[0] for s in samples]
    t0 = times[0]

    def at(t: int) -> tuple:
        return samples[max(0, bisect.bisect_right(times, t) - 1)]

    for pid, reqs in requests.items():
        print(f"victim {pid}: {len(reqs)} requests from {(reqs[0][0] - t0) / 1e9:.2f} s")
        for end, lat in (r for r in reqs if r[1] > over_ms * 1e6):
            a, b = at(end - lat - 5_000_000), at(end + 5_000_000)
            va, vb = a[6].get(pid), b[6].get(pid)
            own = "" if va is None or vb is None else (
                f" | on-cpu +{(vb[0] - va[0]) / 1e6:.1f} ms, run_delay +{(vb[1] - va[1]) / 1e6:.1f} ms, "
                f"minflt +{vb[2] - va[2]}, majflt +{vb[3] - va[3]}")
            print(f"  {(end - t0) / 1e9:8.3f} s {lat / 1e6:6.1f} ms | {(b[0] - a[0]) / 1e6:.0f} ms around it: "
                  f"reported +{b[1] - a[1]} KiB, cpu1 steal +{b[5] - a[5]} ticks{own}")
    print("per second: reported KiB, reporting passes, free MiB, cpu1 steal ticks")
    last = samples[0]
    for s in samples:
        if s[0] - last[0] >= 1e9:
            print(f"  {(s[0] - t0) / 1e9:7.1f} s +{s[1] - last[1]:>9} +{s[2] - last[2]} {s[4] * 4 // 1024:>6} "
                  f"+{s[5] - last[5]}")
            last = s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record")
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--out", required=True)
    s = sub.add_parser("slow")
    s.add_argument("file")
    s.add_argument("--over-ms", type=float, default=8.0)
    a = p.parse_args(argv)
    try:
        if a.what == "record":
            with open(a.out, "w", encoding="ascii") as out:
                record(a.seconds, out)
        else:
            slow(a.file, a.over_ms)
    except (OSError, ValueError, IndexError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
