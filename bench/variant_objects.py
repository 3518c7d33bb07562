# SPDX-License-Identifier: Apache-2.0
"""Build a BPF object directory in which runqlat is a stripped bench variant; the other probes as built.

`noisyneighbor` loads its objects from `NN_BPF_OBJECT_DIR` when set, so an overhead arm can run the
same `top` with one program swapped, e.g. the bcc slot of bench/overhead.py (its name then stands
for the variant):

    .venv/bin/python -m bench.variant_objects --cpu-hist-only /tmp/nn/objs
    .venv/bin/python bench/overhead.py --workload pipe --arms none,floor,noisyneighbor,bcc-runqlat \\
        --floor-cmd '.venv/bin/python -m bench.floor --all-probes' \\
        --ours-cmd '.venv/bin/noisyneighbor top --view all --json --interval 1' \\
        --bcc-cmd 'env NN_BPF_OBJECT_DIR=/tmp/nn/objs .venv/bin/noisyneighbor top --view all --json --interval 1' \\
        --bcc-ready .

`--cpu-hist-only`: runqlat's sched_switch program keeps only this CPU's wait histogram (no cgroup,
no attribution, no migrated waits): what any wait probe on sched_switch pays above the empty-program
floor. Its source is bench/bpf/runqlat_cpu_hist_only.bpf.c (the shipped bpf/runqlat.bpf.c holds only
what ships). The bench may use a compiler; the agent never does.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILT = REPO / "probes/bpf_objects"
# variant -> its object (bench/bpf/ source); refuse_task_storage is tests/test_runqlat.py's
VARIANTS = {"cpu_hist_only": "runqlat_cpu_hist_only.bpf.o", "refuse_task_storage": "runqlat_refuse_task_storage.bpf.o"}
SWAPPED = "runqlat.bpf.o"


def build(out_dir: Path, variant: str) -> Path:
    """Copy the built objects but runqlat into `out_dir`; the Makefile's bench rule builds the variant
    (same flags as the agent's objects) and it takes runqlat's name there."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for obj in BUILT.glob("*.bpf.o"):
        if obj.name != SWAPPED:
            shutil.copy2(obj, out_dir / obj.name)
    build_dir = out_dir / ".variant-build"
    subprocess.run(
        ["make", "-s", "-C", str(REPO), f"BENCH_BPF_OUT={build_dir}", str(build_dir / VARIANTS[variant])],
        check=True, stdout=subprocess.DEVNULL,
    )
    shutil.copy2(build_dir / VARIANTS[variant], out_dir / SWAPPED)
    shutil.rmtree(build_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.variant_objects")
    parser.add_argument("--cpu-hist-only", action="store_const", const="cpu_hist_only", dest="variant",
                        required=True, help="runqlat keeps only the per-CPU wait histogram")
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    if not any(BUILT.glob("*.bpf.o")):
        print(f"bench.variant_objects: no built objects in {BUILT}: run make bpf first", file=sys.stderr)
        return 2
    try:
        print(build(args.out_dir, args.variant))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"bench.variant_objects: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
