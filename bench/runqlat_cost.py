# SPDX-License-Identifier: Apache-2.0
"""Kernel-measured cost of the sched_info runqlat program, with and without the who-ran-instead matrix.

`perf bench sched pipe` pinned to one CPU, under BPF_ENABLE_STATS, in two placements:
- same cgroup: both pipe processes in one test cgroup (every wait is charged to the victim's own
  cgroup: the path the matrix must keep almost free);
- foreign: the two processes in two test cgroups (every wait is charged to the other one: the matrix
  hash update runs at every switch).
Each object (e.g. the committed one as a baseline and the working tree's) is attached alone, arms
alternate, and the median of `--rounds` is reported. ns per round trip is the program's ns per run
times 2 (one switch each way); runs on other CPUs by other workloads are in the average too, so
the total over `loops` is printed as well, and the least disturbed (minimum) round.

    .venv/bin/python -m bench.runqlat_cost [--loops N] [--rounds R] [--baseline-src FILE.bpf.c]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from probes.libbpf import BpfError, BpfObject, RunTimeStats
from probes.runqlat import RunqLatProbe
from testkit.sandbox import OwnedCgroup

REPO = Path(__file__).resolve().parent.parent
PROGRAM = "runqlat_switch_schedinfo"


@dataclass
class Run:
    ns_per_run: float
    runs: int
    total_ns: int
    ops_per_s: float


def build(src: Path, out_dir: Path) -> Path:
    """Compile `src` (e.g. `git show HEAD:bpf/runqlat.bpf.c`) with the headers next to it first."""
    obj = out_dir / (src.stem + ".o")
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wno-unused-function",
         "-I", str(src.parent), "-I", str(REPO / "bpf/.output"), "-I", str(REPO / "bpf"),
         "-c", str(src), "-o", str(obj)],
        check=True,
    )
    return obj


def pipe(loops: int, cgroups: tuple[OwnedCgroup, OwnedCgroup]) -> float:
    """perf's pipe ping-pong on CPU 1: the parent in cgroups[0], its forked child moved to cgroups[1]."""
    first, second = cgroups
    proc = subprocess.Popen(
        ["taskset", "-c", "1", "perf", "bench", "sched", "pipe", "-l", str(loops)],
        stdout=subprocess.PIPE, text=True, preexec_fn=first.preexec,
    )
    if second is not first:
        deadline = time.monotonic() + 5
        child = None
        while child is None and time.monotonic() < deadline:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            child = int(children[0]) if children else None
            time.sleep(0.0005)
        if child is None:
            proc.kill()
            raise RuntimeError("perf bench did not fork its pipe partner")
        second.add_pid(child)
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"perf bench sched pipe exited {proc.returncode}")
    match = re.search(r"(\d+) ops/sec", out)
    return float(match.group(1)) if match else 0.0


def measure(obj_path: Path, probe: RunqLatProbe, loops: int, cgroups: tuple[OwnedCgroup, OwnedCgroup]) -> Run:
    """One round of `obj_path`'s switch program alone, set up as the probe sets up its own object."""
    with BpfObject(obj_path) as obj:
        for name in obj.program_names():
            if name != PROGRAM:
                obj.set_autoload(name, False)
        obj.set_rodata({"v1_cpu_cgroup": probe.v1_cpu})
        with contextlib.suppress(BpfError):  # older objects kept the last run_delay in task storage only
            obj.set_rodata({"pid_slots": probe.pid_slots})
            obj.map("task_run_delay").set_max_entries(probe.pid_slots)
        with contextlib.suppress(BpfError):  # objects before the striped tables (per-CPU arrays)
            obj.set_rodata({"pid_slot_bits": probe.pid_slots.bit_length() - 1, "stripes": probe.stripes,
                            "stripes_shared": probe.stripes_shared, "cgroup_slot_count": probe.cgroup_slot_count,
                            "pair_slot_count": probe.pair_slot_count})
            obj.map("cgroup_runq").set_max_entries(probe.cgroup_slot_count * probe.stripes)
            obj.map("runq_culprits").set_max_entries(probe.pair_slot_count * probe.stripes)
        obj.load()
        obj.attach(PROGRAM)
        ops = pipe(loops, cgroups)
        (stats,) = obj.program_stats()
    return Run(stats.run_time_ns / max(stats.run_count, 1), stats.run_count, stats.run_time_ns, ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/runqlat_cost.py")
    parser.add_argument("--loops", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-src", type=Path, help="a runqlat.bpf.c to compare against (built here)")
    parser.add_argument("--object", type=Path, default=REPO / "probes/bpf_objects/runqlat.bpf.o")
    args = parser.parse_args(argv)

    probe = RunqLatProbe()  # only to learn how the agent sets up the object here (hierarchy, pid_max, stripes)
    probe.close()
    with tempfile.TemporaryDirectory() as tmp:
        objects = {"current": args.object}
        if args.baseline_src:
            objects = {"baseline": build(args.baseline_src, Path(tmp)), **objects}
        a = OwnedCgroup(f"bench-runqcost-{os.getpid()}-a").create()
        b = OwnedCgroup(f"bench-runqcost-{os.getpid()}-b").create()
        stats_fd = RunTimeStats()
        try:
            results: dict[tuple[str, str], list[Run]] = {}
            for _ in range(args.rounds):
                for placement, cgroups in (("same cgroup", (a, a)), ("foreign", (a, b))):
                    for name, path in objects.items():
                        results.setdefault((name, placement), []).append(measure(path, probe, args.loops, cgroups))
        finally:
            stats_fd.close()
            b.remove()
            a.remove()
    # Other workloads only add runs (and cost) to the average: the minimum is the least disturbed round.
    print("| object | pipe placement | ns per run (median) | ns per round trip (median, min) | total ns / loops | ops/s |")
    print("|---|---|---|---|---|---|")
    for (name, placement), runs in results.items():
        per_run = statistics.median(r.ns_per_run for r in runs)
        best = min(r.ns_per_run for r in runs)
        per_loop = statistics.median(r.total_ns / args.loops for r in runs)
        ops = statistics.median(r.ops_per_s for r in runs)
        print(f"| {name} | {placement} | {per_run:.1f} | {2 * per_run:.1f}, {2 * best:.1f} | {per_loop:.1f} | {ops:.0f} |")
    if "baseline" in objects:
        # Arms alternate within a round, so a round's difference sees the same machine load.
        print()
        for placement in ("same cgroup", "foreign"):
            diffs = [2 * (c.ns_per_run - b.ns_per_run)
                     for b, c in zip(results[("baseline", placement)], results[("current", placement)], strict=True)]
            print(f"{placement}: current - baseline per round trip, paired by round: median {statistics.median(diffs):+.1f} ns "
                  f"(rounds: {', '.join(f'{d:+.0f}' for d in diffs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
