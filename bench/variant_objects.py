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
floor. The bench may use a compiler; the agent never does.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILT = REPO / "probes/bpf_objects"
VARIANTS = {"cpu_hist_only": "NN_BENCH_CPU_HIST_ONLY"}


def build(out_dir: Path, variant: str) -> Path:
    """Copy the built objects into `out_dir` and rebuild runqlat there with the variant's macro."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for obj in BUILT.glob("*.bpf.o"):
        shutil.copy2(obj, out_dir / obj.name)
    arch = {"x86_64": "x86", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    # The Makefile's BPF_CFLAGS, plus the macro.
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", "-Wall", "-Wno-unused-function",
         f"-D{VARIANTS[variant]}", "-I", str(REPO / "bpf/.output"), "-I", str(REPO / "bpf"),
         "-I", f"/usr/include/{platform.machine()}-linux-gnu",
         "-c", str(REPO / "bpf/runqlat.bpf.c"), "-o", str(out_dir / "runqlat.bpf.o")],
        check=True,
    )
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
