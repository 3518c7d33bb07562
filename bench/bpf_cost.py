"""Cost per BPF program invocation, measured by the kernel (BPF_ENABLE_STATS run_time_ns/run_cnt).

Throughput ratios are noisy on a shared 2-CPU VM; the kernel's own per-program accounting is not.
For each runqlat flavour (and the empty floor program) this attaches it alone, runs
`perf bench sched pipe` pinned to one CPU, and prints ns per run and ns per pipe round trip.
Note: enabling run-time stats itself adds two clock reads (~50 ns here) to every run; the floor row
shows that part.

    .venv/bin/python -m bench.bpf_cost [--loops N]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from bench.floor import build as build_floor
from probes.libbpf import BpfObject, ProgramStats, RunTimeStats
from probes.runqlat import RunqLatProbe


def pipe(loops: int) -> float:
    out = subprocess.run(
        ["taskset", "-c", "1", "perf", "bench", "sched", "pipe", "-l", str(loops)],
        capture_output=True, text=True, check=True,
    ).stdout
    return float(re.search(r"(\d+) ops/sec", out).group(1))


def report(name: str, stats: list[ProgramStats], loops: int) -> str:
    total = sum(s.run_time_ns for s in stats)
    parts = ", ".join(f"{s.name} {s.run_time_ns / max(s.run_count, 1):.0f} ns x {s.run_count}" for s in stats)
    return f"| {name} | {total / loops:.0f} | {parts} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bpf_cost.py")
    parser.add_argument("--loops", type=int, default=200_000)
    args = parser.parse_args(argv)
    stats_fd = RunTimeStats()
    rows = ["| arm | ns per pipe round trip | per program: ns per run x runs |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        floor = BpfObject(build_floor(Path(tmp)))
        floor.set_autoload("floor_wakeup", False)
        floor.load()
        floor.attach("floor_switch")
        pipe(args.loops)
        rows.append(report("floor (empty sched_switch)", floor.program_stats(), args.loops))
        floor.close()
    for flavour in ("sched_info", "tp_btf", "raw_tp"):
        with RunqLatProbe(attach_mode=flavour) as probe:
            pipe(args.loops)
            rows.append(report(f"runqlat {flavour}", probe.probe.program_stats(), args.loops))
    stats_fd.close()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
