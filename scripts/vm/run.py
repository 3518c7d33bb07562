#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run one command inside the VM lane: Debian 12's 6.1 kernel (scripts/vm/kernel.env) under qemu with
virtme-ng, this machine's root shared read-only, the project tree shared read-write, a pure cgroup v2
hierarchy with every controller enabled in the root's subtree_control (scripts/vm/guest.sh).

    scripts/vm/run.sh [--cpus N] [--memory SIZE] [--timeout S] [--disk SIZE] -- COMMAND [ARG...]

The command runs as root from the project root; its output is streamed here and its exit status is
this script's. A guest that does not boot, dies or runs past --timeout is a failure (exit 125 or
124), never a pass. KVM is used only where it works (/dev/kvm and vmx/svm in /proc/cpuinfo), TCG
otherwise; NN_VM_KVM=0/1 overrides the detection.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
EXIT_TIMEOUT = 124
EXIT_NO_STATUS = 125


def kernel_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (HERE / "kernel.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
    return env


def kvm_works() -> bool:
    """KVM only when the CPU exposes vmx/svm: /dev/kvm alone is not enough (a guest hung here)."""
    forced = os.environ.get("NN_VM_KVM")
    if forced in ("0", "1"):
        return forced == "1"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f" {flag}" in flags for flag in ("vmx", "svm"))


def vng_binary() -> str:
    venv_bin = PROJECT / ".venv" / "bin"
    found = shutil.which("vng", path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        sys.exit("vm: vng not found: run scripts/setup.sh vm (virtme-ng is in the dev extra)")
    return found


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = [], argv
    parser = argparse.ArgumentParser(prog="scripts/vm/run.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", type=int, default=int(os.environ.get("NN_VM_CPUS", "2")))
    parser.add_argument("--memory", default=os.environ.get("NN_VM_MEMORY", "2G"))
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("NN_VM_TIMEOUT", "3600")),
                        help="seconds from start to the guest's exit, boot included (default 3600)")
    parser.add_argument("--disk", metavar="SIZE",
                        help="attach a scratch disk of SIZE (e.g. 1G), formatted ext4 and mounted at "
                             "/tmp/nn-disk in the guest ($NN_VM_DISK)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (console log) afterwards")
    parser.add_argument("--append", action="append", default=[], metavar="ARG",
                        help="a kernel command-line argument (repeatable), e.g. possible_cpus=192: a node of "
                             "192 CPUs to every per-CPU map, with --cpus online")
    args = parser.parse_args(own)
    if not command:
        parser.error("no command: scripts/vm/run.sh [options] -- COMMAND [ARG...]")
    return args, command


def stream(path: Path, offset: int) -> int:
    """Copy what the guest appended to `path` since `offset` to our stdout; the new offset."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    if chunk:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
    return offset + len(chunk)


def main(argv: list[str]) -> int:
    args, command = parse(argv)
    env = kernel_env()
    subprocess.run([str(HERE / "fetch-kernel.sh")], check=True)
    release = env["NN_VM_KERNEL_RELEASE"]
    vmlinuz = Path(os.environ.get("NN_VM_CACHE_OVERRIDE") or env["NN_VM_CACHE"]) / "root/boot" / f"vmlinuz-{release}"

    run_dir = Path(tempfile.mkdtemp(prefix="nn-vm-"))
    (run_dir / "cmd").write_text(shlex.join(command) + "\n")
    (run_dir / "modroot").write_text(str(vmlinuz.parent.parent) + "\n")  # guest.sh links its modules from there
    vng = [vng_binary(), "--run", str(vmlinuz), "--cpus", str(args.cpus), "--memory", args.memory,
           "--user", "root", "--cwd", str(PROJECT), "--rwdir", str(PROJECT), "--rwdir", str(run_dir),
           # The kernel's modules: the guest's /var/cache is its own, not this machine's.
           "--rodir", str(vmlinuz.parent.parent)]
    kvm = kvm_works()
    if not kvm:
        vng.append("--disable-kvm")
    for arg in args.append:
        vng += ["--append", arg]
    if args.disk:
        disk = run_dir / "disk.img"
        subprocess.run(["truncate", "-s", args.disk, str(disk)], check=True)
        (run_dir / "disk").write_text(str(disk) + "\n")
        vng += ["--disk", str(disk)]
    # The command goes through a file: the kernel command line (which carries --exec) is 2 KiB.
    # A copy: bash reads a script as it runs it, so an edit of the tree's guest.sh during a run would
    # change what the guest runs after the command.
    shutil.copy(HERE / "guest.sh", run_dir / "guest.sh")
    vng += ["--exec", f"bash {shlex.quote(str(run_dir / 'guest.sh'))} {shlex.quote(str(run_dir))} "
                      f"{shlex.quote(str(PROJECT))}"]

    print(f"vm: {release}, {args.cpus} vCPUs, {args.memory}, {'KVM' if kvm else 'TCG'}"
          f"{''.join(' ' + a for a in args.append)}: {shlex.join(command)}",
          file=sys.stderr, flush=True)
    venv_bin = PROJECT / ".venv" / "bin"
    child_env = dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    started = time.monotonic()
    with (run_dir / "console.log").open("wb") as console:
        # Our own process group, so a timeout or a cancelled job stops qemu with it and nothing else.
        vm = subprocess.Popen(vng, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                              cwd=PROJECT, env=child_env, start_new_session=True)

        def stop(*_: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(vm.pid, signal.SIGKILL)

        old_term = signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(143)))
        offset = 0
        timed_out = False
        try:
            while vm.poll() is None:
                offset = stream(run_dir / "output", offset)
                if time.monotonic() - started > args.timeout:
                    timed_out = True
                    stop()
                    vm.wait()
                    break
                time.sleep(0.5)
        except BaseException:  # Ctrl-C, or SIGTERM (a cancelled job): no VM and no run directory left
            stop()
            vm.wait()
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        finally:
            signal.signal(signal.SIGTERM, old_term)
        stream(run_dir / "output", offset)
    elapsed = time.monotonic() - started

    rc_file = run_dir / "rc"
    status = rc_file.read_text().strip() if rc_file.exists() else ""
    keep = args.keep
    if timed_out:
        print(f"vm: FAILED: timed out after {args.timeout:.0f} s (--timeout); console: {run_dir / 'console.log'}",
              file=sys.stderr)
        rc, keep = EXIT_TIMEOUT, True
    elif not status.isdigit():
        tail = (run_dir / "console.log").read_text(errors="replace").splitlines()[-15:]
        print("vm: FAILED: no exit status from the guest (did not boot, or died); last console lines:",
              *("    " + line for line in tail), sep="\n", file=sys.stderr)
        rc, keep = EXIT_NO_STATUS, True
    else:
        rc = int(status)
        print(f"vm: exit {rc} after {elapsed:.0f} s", file=sys.stderr)
    if keep:
        print(f"vm: run directory kept: {run_dir}", file=sys.stderr)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
