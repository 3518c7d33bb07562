# SPDX-License-Identifier: Apache-2.0
"""A BPF object directory in which runqlat is a variant built from bench/bpf/ (the other probes as built):
the bench's stripped cost arms (bench/variant_objects.py) and the tests' fault-injection object
(tests/test_runqlat.py: task storage that refuses every create) load it through the engine's object_dir.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILT = REPO / "probes/bpf_objects"
# variant -> its object (bench/bpf/ source); refuse_task_storage is tests/test_runqlat.py's,
# cpu_hist_only the bench's
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


