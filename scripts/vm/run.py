#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run one command inside the VM lane: Debian 12's 6.1 kernel (scripts/vm/kernel.env) under qemu with
virtme-ng, this machine's root shared read-only, the project tree shared read-write, a pure cgroup v2
hierarchy with every controller enabled in the root's subtree_control (scripts/vm/guest.sh).

    scripts/vm/run.sh [--cpus N] [--memory SIZE] [--timeout S] [--idle-timeout S] [--disk SIZE] -- COMMAND [ARG...]

The command runs as root from the project root; its output is streamed here and its exit status is
this script's. A guest that does not boot, dies, runs past --timeout or writes nothing for
--idle-timeout is a failure (exit 125 or 124), never a pass. KVM is used only where it works (/dev/kvm
and vmx/svm in /proc/cpuinfo), TCG otherwise; NN_VM_KVM=0/1 overrides the detection.

TCG runs single-threaded (one host thread for every vCPU, --tcg-thread single) unless told otherwise.
Multi-threaded TCG (qemu's default, one host thread per vCPU; qemu 7.2 here) livelocks this guest
when its kernel patches its own code while the other vCPU runs it: a tracepoint switched on or off
(a probe attached or closed) rewrites a jump-label site through an int3, and a vCPU that keeps
executing its translated copy of the int3 after the site was restored is sent back to it by the
kernel's int3 handler forever (both vCPUs at handle_softirqs' softirq_exit site, soft lockups, RCU
stalls: CI's VM smoke on 2026-11-30). tests/test_v2_lane.py switches such a site under softirq load.

The guest kernel's console (boot, oopses, hung-task and RCU-stall reports) is kept in the run
directory's console.log (vng --verbose: quiet mode sends it to /dev/null). A guest silent for
--idle-timeout is dumped before it is stopped, into the run directory's stall.txt: every vCPU's
kernel backtrace (SysRq l, and w: the blocked tasks, sent through qemu's monitor), the guest's
registers, the console's tail, and host-side qemu's /proc status, thread kernel stacks and gdb
backtraces; the run directory is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
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
STALL_CONSOLE_WAIT_S = 8.0  # for the guest to print its SysRq backtraces over the emulated serial line
STALL_TAIL_LINES = 80


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


def qemu_options(run_dir: Path, kvm: bool, tcg_thread: str) -> list[str]:
    """qemu's own options: a monitor for the stall dump (SysRq keys to the guest, its registers) and,
    without KVM, TCG's threading (single by default: see the module's docstring)."""
    options = ["-monitor", f"unix:{run_dir / 'monitor.sock'},server=on,wait=off"]
    if not kvm:
        options += ["-accel", f"tcg,thread={tcg_thread}"]
    return options


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
    parser.add_argument("--idle-timeout", type=float, default=float(os.environ.get("NN_VM_IDLE_TIMEOUT", "600")),
                        help="seconds the guest's command may write nothing before the guest is dumped "
                             "(run directory's stall.txt) and stopped (default 600; 0: never)")
    parser.add_argument("--disk", metavar="SIZE",
                        help="attach a scratch disk of SIZE (e.g. 1G), formatted ext4 and mounted at "
                             "/tmp/nn-disk in the guest ($NN_VM_DISK)")
    parser.add_argument("--tcg-thread", choices=("single", "multi"),
                        default=os.environ.get("NN_VM_TCG_THREAD", "single"),
                        help="qemu's TCG threading without KVM (NN_VM_TCG_THREAD; default single: "
                             "multi livelocks the guest when its kernel patches its own code, see above)")
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


def monitor(sock: Path, command: str, wait_s: float = 2.0) -> str:
    """One human-monitor command to qemu (``-monitor unix:sock``); what it printed, or why nothing."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(wait_s)
            conn.connect(str(sock))
            conn.sendall(command.encode() + b"\n")
            out = b""
            deadline = time.monotonic() + wait_s
            with contextlib.suppress(TimeoutError):
                while time.monotonic() < deadline:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    out += chunk
    except OSError as e:
        return f"(monitor {command!r}: {e})"
    # The monitor's line editor echoes the command with cursor moves: dropped, with its prompt lines
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.decode(errors="replace").replace("\r", ""))
    return "\n".join(line for line in text.splitlines() if not line.startswith("(qemu)"))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as e:
        return f"({path}: {e.strerror})"


def host_side(pgid: int) -> list[str]:
    """qemu (and vng) as this machine sees them: /proc status, each thread's CPU time, state and kernel
    stack, and gdb's backtraces of qemu's threads (when gdb is there)."""
    out: list[str] = []
    for pid in sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            if os.getpgid(pid) != pgid:
                continue
        except OSError:
            continue
        out += [f"== pid {pid}: {_read(Path(f'/proc/{pid}/cmdline')).replace(chr(0), ' ')[:300]}",
                _read(Path(f"/proc/{pid}/status"))]
        for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
            stat = _read(task / "stat").rsplit(")", 1)[-1].split()
            comm = _read(task / "comm").strip()
            cpu = f"utime {stat[11]} stime {stat[12]} ticks" if len(stat) > 12 else ""
            out += [f"-- thread {task.name} {comm} state {stat[0] if stat else '?'} {cpu}",
                    _read(task / "stack").rstrip()]
        if "qemu" in _read(Path(f"/proc/{pid}/comm")) and shutil.which("gdb"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out.append(subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                                          capture_output=True, text=True, timeout=60).stdout)
    return out


def dump_stall(run_dir: Path, pgid: int, silent_s: float) -> Path:
    """What a silent guest is doing, into run_dir/stall.txt, before it is stopped: its vCPUs' kernel
    backtraces (SysRq l; w: blocked tasks) on its console, its registers, and qemu from this side."""
    sock = run_dir / "monitor.sock"
    info_cpus = monitor(sock, "info cpus")
    registers = monitor(sock, "info registers -a", wait_s=4.0)
    for key in ("alt-sysrq-l", "alt-sysrq-w"):
        monitor(sock, f"sendkey {key}")
    time.sleep(STALL_CONSOLE_WAIT_S)
    console = _read(run_dir / "console.log").splitlines()
    text = [f"the guest wrote nothing for {silent_s:.0f} s", "", "== qemu monitor: info cpus", info_cpus,
            "== qemu monitor: info registers -a (RIP lines)",
            *[line for line in registers.splitlines() if line.startswith(("RIP", "CPU#"))],
            "", f"== guest console, last {STALL_TAIL_LINES} lines (console.log)", *console[-STALL_TAIL_LINES:],
            "", "== host side", *host_side(pgid)]
    path = run_dir / "stall.txt"
    path.write_text("\n".join(text) + "\n")
    return path


def main(argv: list[str]) -> int:
    args, command = parse(argv)
    env = kernel_env()
    subprocess.run([str(HERE / "fetch-kernel.sh")], check=True)
    release = env["NN_VM_KERNEL_RELEASE"]
    vmlinuz = Path(os.environ.get("NN_VM_CACHE_OVERRIDE") or env["NN_VM_CACHE"]) / "root/boot" / f"vmlinuz-{release}"

    run_dir = Path(tempfile.mkdtemp(prefix="nn-vm-"))
    (run_dir / "cmd").write_text(shlex.join(command) + "\n")
    (run_dir / "modroot").write_text(str(vmlinuz.parent.parent) + "\n")  # guest.sh links its modules from there
    kvm = kvm_works()
    vng = [vng_binary(), "--run", str(vmlinuz), "--cpus", str(args.cpus), "--memory", args.memory,
           "--user", "root", "--cwd", str(PROJECT), "--rwdir", str(PROJECT), "--rwdir", str(run_dir),
           # The kernel's modules: the guest's /var/cache is its own, not this machine's.
           "--rodir", str(vmlinuz.parent.parent),
           # The kernel's console into console.log (quiet mode: /dev/null): boot, oopses, stall reports.
           "--verbose",
           # (one argument: vng's parser takes a separate value starting with "-" for an option)
           "--qemu-opts=" + shlex.join(qemu_options(run_dir, kvm, args.tcg_thread))]
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
        stalled: Path | None = None
        last_output = started  # the boot counts as silence too: a guest that never starts its command
        try:
            while vm.poll() is None:
                moved = stream(run_dir / "output", offset)
                now = time.monotonic()
                if moved != offset:
                    offset, last_output = moved, now
                if now - started > args.timeout:
                    timed_out = True
                elif args.idle_timeout and now - last_output > args.idle_timeout:
                    stalled = dump_stall(run_dir, vm.pid, now - last_output)
                if timed_out or stalled is not None:
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
    if stalled is not None:
        print(f"vm: FAILED: the guest wrote nothing for {args.idle_timeout:.0f} s (--idle-timeout), stopped after "
              f"{elapsed:.0f} s; its backtraces and qemu's: {stalled}", file=sys.stderr)
        rc, keep = EXIT_TIMEOUT, True
    elif timed_out:
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
