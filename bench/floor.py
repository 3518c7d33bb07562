"""Attach empty programs to scheduler tracepoints until SIGTERM: the overhead bench's floor arm.

`python -m bench.floor [--wakeup]`: sched_switch only (the tracepoint our default runqlat flavour
uses), or also sched_wakeup (what wakeup-based tools like bcc runqlat attach to). The object is
compiled here with clang (the bench may use a compiler; the agent never does).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from probes.libbpf import BpfObject

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def build(out_dir: Path) -> Path:
    obj = out_dir / "floor.bpf.o"
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-I", str(REPO / "bpf/.output"),
         "-c", str(HERE / "floor.bpf.c"), "-o", str(obj)],
        check=True,
    )
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.floor")
    parser.add_argument("--wakeup", action="store_true", help="also attach to sched_wakeup")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        obj = BpfObject(build(Path(tmp)))
        programs = ["floor_switch", "floor_wakeup"] if args.wakeup else ["floor_switch"]
        if not args.wakeup:
            obj.set_autoload("floor_wakeup", False)
        obj.load()
        for p in programs:
            obj.attach(p)
        print("attached " + " ".join(programs), flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        obj.close()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main())
