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
import subprocess
import sys
from pathlib import Path

from testkit.variant_objects import BUILT, build


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
