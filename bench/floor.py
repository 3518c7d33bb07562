# SPDX-License-Identifier: Apache-2.0
"""Attach empty programs to tracepoints until SIGTERM: the overhead bench's floor arm.

`python -m bench.floor [--wakeup] [--all-probes]`: sched_switch only (the tracepoint our default
runqlat flavour uses), also sched_wakeup (what wakeup-based tools like bcc runqlat attach to), or
every tracepoint the default probes attach (softirq raise/entry/exit, inet_sock_set_state,
tcp_retransmit_skb, the vmscan reclaim pairs): what attaching costs before any probe does work.
The object is compiled here with clang (the bench may use a compiler; the agent never does).
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
    parser.add_argument("--all-probes", action="store_true", help="also every other tracepoint of the default probes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        obj = BpfObject(build(Path(tmp)))
        programs = ["floor_switch"] + (["floor_wakeup"] if args.wakeup else [])
        if args.all_probes:
            programs += [p for p in obj.program_names() if p not in ("floor_switch", "floor_wakeup")]
        for p in obj.program_names():
            if p not in programs:
                obj.set_autoload(p, False)
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
