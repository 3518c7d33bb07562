# SPDX-License-Identifier: Apache-2.0
"""Cost per BPF program invocation, measured by the kernel (BPF_ENABLE_STATS run_time_ns/run_cnt).

Throughput ratios are noisy on a shared 2-CPU VM; the kernel's own per-program accounting is not.

Default (as before): for each runqlat flavour (and the empty floor program) this attaches it alone,
runs `perf bench sched pipe` pinned to one CPU, and prints ns per run and ns per pipe round trip.

``--probes softirq,reclaim,tcpconnect,runqlat`` (or ``all``): attaches each named probe alone,
configured as ``noisyneighbor top`` configures it, and runs each ``--workloads`` workload under it:
``pipe`` (perf bench sched pipe, pinned to CPU 1) and ``connect`` (a bounded loop of loopback TCP
connect + 1-byte echo + close on 127.0.0.1, bench/overhead.py's connect workload). ``together`` in
the list adds one arm with all probes attached at once, ``floor`` one with the empty programs of
bench/floor.bpf.c on every tracepoint the probes use (but sched_wakeup): what a program there costs
before it does anything. Per arm it prints the kernel-measured ns per program run and the sum over the
probe's programs divided by the workload's operations: ns per op.

Note: enabling run-time stats itself adds two clock reads (~50 ns here) to every run; the floor row
shows that part.

    .venv/bin/python -m bench.bpf_cost [--loops N]
    .venv/bin/python -m bench.bpf_cost --probes all,together --workloads pipe,connect [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.floor import build as build_floor
from bench.overhead import WorkloadError, run_connect
from probes.base import BpfProbe
from probes.libbpf import BpfObject, ProgramStats, RunTimeStats
from probes.registry import PLUGINS, plugin
from probes.runqlat import RunqLatProbe

# Every BPF probe in the registry (runqlat last, as the arms always ran).
PROBES = tuple(sorted((p.name for p in PLUGINS if p.specs), key=lambda name: name == "runqlat"))
WORKLOADS = ("pipe", "connect")
ARM_TOGETHER = "together"
ARM_FLOOR = "floor"


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


# -- per-probe arms --------------------------------------------------------------------------------


class _FloorArm:
    """The empty programs of bench/floor.bpf.c, shaped like a probe for measure_arm (``.probe``)."""

    def __enter__(self) -> _FloorArm:
        self._tmp = tempfile.TemporaryDirectory()
        self.probe = BpfObject(build_floor(Path(self._tmp.name)))
        self.probe.set_autoload("floor_wakeup", False)  # no probe of ours attaches there
        self.probe.load()
        for prog in self.probe.program_names():
            if prog != "floor_wakeup":
                self.probe.attach(prog)
        return self

    def __exit__(self, *exc: object) -> None:
        self.probe.close()
        self._tmp.cleanup()


def open_probe(name: str, attach_mode: str) -> BpfProbe[Any] | _FloorArm:
    """One probe configured as `noisyneighbor top` configures it (its plugin's top_options)."""
    if name == ARM_FLOOR:
        return _FloorArm()
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r} (one of {', '.join(PROBES)})")
    found = plugin(name)
    return found.open(attach_mode=attach_mode, **found.top_options)


@dataclass(frozen=True)
class ProgramCost:
    probe: str
    program: str
    runs: int
    ns_per_run: float
    ns_per_op: float


@dataclass(frozen=True)
class ArmCost:
    arm: str  # a probe name, or "together"
    workload: str
    ops: int
    ops_per_s: float
    ns_per_op: float  # all programs of the arm, per workload operation
    programs: list[ProgramCost]
    recursion_misses: int


def run_workload(workload: str, loops: int, connects: int) -> tuple[int, float]:
    """(operations done, operations per second)."""
    if workload == "pipe":
        return loops, pipe(loops)
    if workload == "connect":
        res = run_connect(connects, max_seconds=120.0, cpus=None)
        return res.ops, res.throughput
    raise ValueError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")


def measure_arm(arm: str, names: list[str], workload: str, loops: int, connects: int, attach_mode: str) -> ArmCost:
    with contextlib.ExitStack() as stack:
        probes = {n: stack.enter_context(open_probe(n, attach_mode)) for n in names}
        # Counters are cumulative per program since load: subtract what the probes' own loading cost.
        before = {(n, s.name): s for n, p in probes.items() for s in p.probe.program_stats()}
        ops, rate = run_workload(workload, loops, connects)
        after = {(n, s.name): s for n, p in probes.items() for s in p.probe.program_stats()}
    programs, total_ns, misses = [], 0, 0
    for (probe, prog), s in after.items():
        b = before.get((probe, prog))
        runs = s.run_count - (b.run_count if b else 0)
        ns = s.run_time_ns - (b.run_time_ns if b else 0)
        misses += s.recursion_misses - (b.recursion_misses if b else 0)
        total_ns += ns
        programs.append(ProgramCost(probe, prog, runs, ns / runs if runs else 0.0, ns / ops))
    return ArmCost(arm, workload, ops, rate, total_ns / ops, programs, misses)


def render(costs: list[ArmCost]) -> str:
    rows = [
        "| arm | workload | ops/s | ns per op (all programs) | per program: ns per run x runs (ns per op) |",
        "|---|---|---|---|---|",
    ]
    for c in costs:
        parts = ", ".join(
            f"{p.program} {p.ns_per_run:.0f} ns x {p.runs} ({p.ns_per_op:.0f})" for p in c.programs if p.runs
        )
        rows.append(f"| {c.arm} | {c.workload} | {c.ops_per_s:.0f} | {c.ns_per_op:.0f} | {parts or 'no runs'} |")
    return "\n".join(rows)


def _list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        out: list[str] = []
        for t in items:
            if t == "all":
                out.extend(a for a in allowed if a not in (ARM_TOGETHER, ARM_FLOOR))
            elif t in allowed:
                out.append(t)
            else:
                raise argparse.ArgumentTypeError(f"unknown {t!r}: use {', '.join(allowed)} or all")
        return list(dict.fromkeys(out))

    return parse


def legacy_runqlat_flavours(loops: int) -> list[str]:
    rows = ["| arm | ns per pipe round trip | per program: ns per run x runs |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        floor = BpfObject(build_floor(Path(tmp)))
        floor.set_autoload("floor_wakeup", False)
        floor.load()
        floor.attach("floor_switch")
        pipe(loops)
        rows.append(report("floor (empty sched_switch)", floor.program_stats(), loops))
        floor.close()
    for flavour in ("sched_info", "tp_btf", "raw_tp"):
        with RunqLatProbe(attach_mode=flavour) as probe:
            pipe(loops)
            rows.append(report(f"runqlat {flavour}", probe.probe.program_stats(), loops))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bpf_cost.py")
    parser.add_argument("--loops", type=int, default=200_000, help="pipe: round trips")
    parser.add_argument("--connects", type=int, default=5_000, help="connect: loopback connect cycles (bounded)")
    parser.add_argument("--probes", type=_list((*PROBES, ARM_TOGETHER, ARM_FLOOR)), default=None,
                        help="comma list of probes to attach one at a time (all = every probe), "
                             "plus 'together' for all at once and 'floor' for the empty programs; without it: the "
                             "runqlat flavours")
    parser.add_argument("--workloads", type=_list(WORKLOADS), default=["pipe", "connect"])
    parser.add_argument("--attach-mode", default="auto", choices=("auto", "tp_btf", "raw_tp"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.loops <= 0 or args.connects <= 0:
        parser.error("--loops and --connects must be positive")
    stats_fd = RunTimeStats()
    try:
        if args.probes is None:
            print("\n".join(legacy_runqlat_flavours(args.loops)))
            return 0
        costs: list[ArmCost] = []
        for arm in args.probes:
            names = [p for p in PROBES] if arm == ARM_TOGETHER else [arm]
            for wl in args.workloads:
                try:
                    costs.append(measure_arm(arm, names, wl, args.loops, args.connects, args.attach_mode))
                except (WorkloadError, subprocess.CalledProcessError) as e:
                    print(f"bpf_cost: {arm} / {wl}: workload failed: {e}", file=sys.stderr)
        print(render(costs))
        if args.json:
            args.json.write_text(json.dumps([asdict(c) for c in costs], indent=1))
        return 0
    finally:
        stats_fd.close()


if __name__ == "__main__":
    raise SystemExit(main())
