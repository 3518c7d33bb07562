#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Throughput cost of BPF probes, side by side, in one run.

Arms (``--arms``):

* ``none``           nothing attached (the baseline every other arm is compared with);
* ``noisyneighbor``  our agent (``--ours-cmd``), ready at its first stdout line;
* ``bcc-runqlat``    Debian's ``runqlat-bpfcc`` (``--bcc-cmd``), ready at "Tracing run queue latency";
                     needs kernel headers: see ``bench/bcc_env.sh``.

Workloads (``--workload``): ``pipe`` (``perf bench sched pipe -l N``, ops/s) and ``connect`` (a
loopback TCP connect + 1-byte echo + close loop between two Python processes, connects/s).

For each workload, every round runs every arm once, in an order rotated by one each round (none,
ours, bcc; ours, bcc, none; ...) so slow drift of the machine does not bias one arm. A probe arm
starts its tool, waits for readiness, runs the workload, then stops the tool (SIGTERM). Results are
median throughputs and *paired* ratios (each round's arm / the same round's ``none``), never
absolute-time thresholds: this is meant for noisy machines. Per probe arm it also records the
start-up wall time (spawn -> readiness), the tool's peak RSS (VmHWM) and its CPU time.

    .venv/bin/python bench/overhead.py                       # everything, 5 rounds
    .venv/bin/python bench/overhead.py --arms none,bcc-runqlat --workload pipe --rounds 2
    .venv/bin/python bench/overhead.py --markdown --json /tmp/overhead.json

Exit status: 0, or 2 on a usage error, or 1 when the ``none`` arm itself failed (the workload
cannot run). An arm whose tool cannot start is reported as "unavailable: <reason>".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
ARM_NONE = "none"
ARM_OURS = "noisyneighbor"
ARM_BCC = "bcc-runqlat"
# Empty tp_btf programs on sched_switch: what any tracepoint-based probe costs before doing work.
ARM_FLOOR = "floor"
ALL_ARMS = (ARM_NONE, ARM_FLOOR, ARM_OURS, ARM_BCC)
DEFAULT_FLOOR_CMD = ".venv/bin/python -m bench.floor"
ALL_WORKLOADS = ("pipe", "connect")
# perf bench sched pipe on this 2-CPU VM: ~5 us/op with both ends on one CPU, ~45 us/op (wake-up IPIs)
# when they sit on different CPUs, and unpinned it flips between the two with the machine's other load.
LOOPS_PINNED = 600_000
LOOPS_FREE = 100_000
DEFAULT_OURS_CMD = ".venv/bin/noisyneighbor top --json --interval 1"
# An interval of 1 s, like the agent's --interval 1: both poll their maps once a second.
DEFAULT_BCC_CMD = "runqlat-bpfcc 1"
BCC_READY = "Tracing run queue latency"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TAIL_LINES = 5


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Workloads. Each returns (throughput per second, details) or raises WorkloadError.


class WorkloadError(RuntimeError):
    pass


@dataclass
class WorkloadResult:
    throughput: float  # operations per second
    elapsed_s: float  # the workload's own measured time
    ops: int
    unit: str
    detail: dict[str, Any] = field(default_factory=dict)


_OPS_RE = re.compile(r"^\s*([\d.]+)\s+ops/sec", re.M)
_TOTAL_RE = re.compile(r"Total time:\s*([\d.]+)\s*\[sec\]")


def parse_perf_pipe(output: str, loops: int) -> WorkloadResult:
    """Parse ``perf bench sched pipe`` output: ops/sec from the total time when present."""
    total = _TOTAL_RE.search(output)
    ops = _OPS_RE.search(output)
    if total and float(total.group(1)) > 0:
        secs = float(total.group(1))
        return WorkloadResult(loops / secs, secs, loops, "ops/s")
    if ops:
        rate = float(ops.group(1))
        return WorkloadResult(rate, loops / rate if rate else 0.0, loops, "ops/s")
    raise WorkloadError(f"cannot parse perf output: {output.strip()[-200:]!r}")


def pin_prefix(cpus: str | None) -> list[str]:
    """``taskset -c CPUS`` (util-linux) to confine a workload, or nothing when unpinned."""
    if not cpus:
        return []
    taskset = shutil.which("taskset")
    if not taskset:
        raise WorkloadError("taskset not found (apt: util-linux); use --cpu none")
    return [taskset, "-c", cpus]


def run_pipe(loops: int, timeout_s: float, cpus: str | None = None) -> WorkloadResult:
    perf = shutil.which("perf")
    if not perf:
        raise WorkloadError("perf not found (apt: linux-perf)")
    cmd = [*pin_prefix(cpus), perf, "bench", "sched", "pipe", "-l", str(loops)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise WorkloadError(f"perf bench sched pipe -l {loops} took over {timeout_s:.0f} s") from e
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["?"]
        raise WorkloadError(f"perf bench exited {proc.returncode}: {last[0]}")
    return parse_perf_pipe(proc.stdout, loops)


# The server: one process, one thread, on 127.0.0.1 with an ephemeral port, printed on stdout.
# Per connection: read 1 byte, write it back, close (the server closes first, so TIME_WAIT stays on
# the server's side and the client never runs short of ephemeral ports).
_SERVER_CODE = r"""
import os, signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(512)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    try:
        b = c.recv(1)
        if b:
            c.sendall(b)
    except OSError:
        pass
    finally:
        c.close()
"""

# The client: COUNT cycles of connect, send 1 byte, recv 1 byte, close; stops early at MAX_SECONDS.
_CLIENT_CODE = r"""
import json, socket, sys, time
port, count, max_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
addr = ("127.0.0.1", port)
done = errors = 0
last_error = ""
t0 = time.perf_counter()
deadline = t0 + max_s
while done < count:
    try:
        with socket.create_connection(addr, timeout=5) as c:
            c.sendall(b"x")
            if c.recv(1) != b"x":
                raise OSError("short echo")
        done += 1
    except OSError as e:
        errors += 1
        last_error = repr(e)
        if errors > 100:
            break
    if (done & 255) == 0 and time.perf_counter() > deadline:
        break
elapsed = time.perf_counter() - t0
print(json.dumps({"done": done, "elapsed": elapsed, "errors": errors, "last_error": last_error}))
"""


def run_connect(count: int, max_seconds: float, cpus: str | None = None) -> WorkloadResult:
    pin = pin_prefix(cpus)
    server = subprocess.Popen(
        [*pin, sys.executable, "-c", _SERVER_CODE],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = _readline_with_timeout(server, 10.0)
        if not line.strip().isdigit():
            raise WorkloadError(f"connect server did not report its port (got {line.strip()!r})")
        port = int(line)
        try:
            proc = subprocess.run(
                [*pin, sys.executable, "-c", _CLIENT_CODE, str(port), str(count), str(max_seconds)],
                capture_output=True,
                text=True,
                timeout=max_seconds + 30,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise WorkloadError(f"connect client hung (over {max_seconds + 30:.0f} s)") from e
        if proc.returncode != 0:
            raise WorkloadError(f"connect client exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        if res["done"] == 0 or res["elapsed"] <= 0:
            raise WorkloadError(f"no connection succeeded ({res['last_error']})")
        detail = {"errors": res["errors"], "requested": count}
        if res["errors"]:
            detail["last_error"] = res["last_error"]
        if res["errors"] > 100:
            raise WorkloadError(f"connect loop aborted after {res['errors']} errors: {res['last_error']}")
        return WorkloadResult(res["done"] / res["elapsed"], res["elapsed"], res["done"], "connects/s", detail)
    finally:
        _stop_process(server, 5.0)


def _readline_with_timeout(proc: subprocess.Popen[str], timeout_s: float) -> str:
    box: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: box.put(stdout.readline()), daemon=True).start()
    try:
        return box.get(timeout=timeout_s)
    except queue.Empty as e:
        raise WorkloadError(f"no output within {timeout_s:.0f} s") from e


# --------------------------------------------------------------------------------------------------
# Tools (the probe arms): start, wait for readiness, measure, stop.


class ToolError(RuntimeError):
    pass


@dataclass
class ToolSpec:
    arm: str
    cmd: list[str]
    ready: Callable[[str], bool]
    ready_desc: str


@dataclass
class ToolStats:
    pid: int = 0
    startup_s: float | None = None  # spawn -> readiness line
    cpu_startup_s: float | None = None  # tool's CPU time (user+sys) at readiness
    cpu_total_s: float | None = None  # ... just before it was stopped
    cpu_during_workload_s: float | None = None
    rss_hwm_kb: int | None = None  # VmHWM of the tool's process just before it was stopped
    rss_hwm_tree_kb: int | None = None  # VmHWM summed over the process and its live descendants
    lines_after_ready: int = 0
    stop_s: float | None = None  # SIGTERM -> exit
    exit_code: int | None = None
    killed: bool = False


def proc_cpu_s(pid: int) -> float | None:
    """utime+stime (and reaped children's) of one process, in seconds; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14..17.
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / CLK_TCK


def proc_hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def tree_cpu_s(pid: int) -> float | None:
    own = proc_cpu_s(pid)
    if own is None:
        return None
    return own + sum(proc_cpu_s(c) or 0.0 for c in proc_descendants(pid))


class RunningTool:
    """A started probe tool whose stdout is drained by a thread (so it never blocks on a full pipe)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.stats = ToolStats()
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._tail: list[str] = []
        # Held for the tool's lifetime, closed in measure_and_stop().
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="overhead-tool-")  # noqa: SIM115
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # both tools are Python: no block-buffered stdout
        self._t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                spec.cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                errors="replace",
                env=env,
                start_new_session=True,  # its own process group: stopped as a group, nothing else
                cwd=REPO_ROOT,  # `python -m bench.floor` and relative tool paths resolve from the repo
            )
        except OSError as e:
            self._stderr.close()
            raise ToolError(f"cannot start {shlex.join(spec.cmd)}: {e.strerror or e}") from e
        self.stats.pid = self.proc.pid
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self._ready = False

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1] if lines else ""

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                seen = f"; last stdout: {self._tail[-1].strip()[:120]!r}" if self._tail else "; no stdout"
                raise ToolError(f"not ready within {timeout_s:.0f} s (waiting for {self.spec.ready_desc}{seen})")
            try:
                line = self._lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:  # stdout closed: the tool exited (or closed it) before being ready
                rc = self.proc.wait(timeout=10)
                err = self.stderr_tail()
                raise ToolError(f"exited with status {rc} before ready" + (f": {err[:200]}" if err else ""))
            self._tail = ([*self._tail, line])[-TAIL_LINES:]
            if self.spec.ready(line):
                self.stats.startup_s = time.perf_counter() - self._t0
                self.stats.cpu_startup_s = tree_cpu_s(self.proc.pid)
                self._ready = True
                return

    def alive(self) -> bool:
        return self.proc.poll() is None

    def measure_and_stop(self, timeout_s: float) -> None:
        st = self.stats
        if self.alive():
            st.rss_hwm_kb = proc_hwm_kb(self.proc.pid)
            kids = proc_descendants(self.proc.pid)
            if st.rss_hwm_kb is not None:
                st.rss_hwm_tree_kb = st.rss_hwm_kb + sum(proc_hwm_kb(k) or 0 for k in kids)
            st.cpu_total_s = tree_cpu_s(self.proc.pid)
            if st.cpu_total_s is not None and st.cpu_startup_s is not None:
                st.cpu_during_workload_s = st.cpu_total_s - st.cpu_startup_s
        t = time.perf_counter()
        st.exit_code, st.killed = _stop_process(self.proc, timeout_s)
        st.stop_s = time.perf_counter() - t
        self._reader.join(timeout=5)
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None and self._ready:
                st.lines_after_ready += 1
        self._stderr.close()


def _stop_process(proc: subprocess.Popen[Any], timeout_s: float) -> tuple[int | None, bool]:
    """SIGTERM the process group we created for ``proc``; SIGKILL it after ``timeout_s``."""
    if proc.poll() is not None:
        return proc.returncode, False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10), True


# --------------------------------------------------------------------------------------------------
# Procedure.


@dataclass
class Run:
    workload: str
    round: int
    position: int  # 0-based place of the arm in this round's order
    arm: str
    throughput: float | None = None
    elapsed_s: float | None = None
    ops: int | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    tool: ToolStats | None = None


def rotated(arms: Sequence[str], r: int) -> list[str]:
    """Round r's order: the arm list rotated left by r (none, ours, bcc; ours, bcc, none; ...)."""
    k = r % len(arms)
    return [*arms[k:], *arms[:k]]


def bcc_preflight(cmd: list[str]) -> str | None:
    """A one-line reason the bcc arm cannot run, or None."""
    if not shutil.which(cmd[0]):
        return f"{cmd[0]} not found (run bench/bcc_env.sh: apt bpfcc-tools)"
    build = Path("/lib/modules") / os.uname().release / "build"
    if not build.is_dir() and not os.environ.get("BCC_KERNEL_SOURCE"):
        return f"no kernel headers at {build} (run bench/bcc_env.sh)"
    if os.geteuid() != 0:
        return "needs root"
    return None


def ours_preflight(cmd: list[str]) -> str | None:
    exe = cmd[0]
    if "/" in exe:
        if not os.access(exe, os.X_OK):
            return f"{exe} not found or not executable"
    elif not shutil.which(exe):
        return f"{exe} not found on PATH"
    return None


def resolve_cmd(cmd: str) -> list[str]:
    """Split a command line; a relative program path is taken from the repository root."""
    argv = shlex.split(cmd)
    if not argv:
        raise ValueError("empty command")
    exe = argv[0]
    if "/" in exe and not os.path.isabs(exe) and not os.path.exists(exe):
        argv[0] = str(REPO_ROOT / exe)
    return argv


def make_specs(args: argparse.Namespace) -> dict[str, ToolSpec]:
    ours_re = re.compile(args.ours_ready) if args.ours_ready else None
    bcc_re = re.compile(args.bcc_ready)
    return {
        ARM_OURS: ToolSpec(
            ARM_OURS,
            resolve_cmd(args.ours_cmd),
            (lambda ln: bool(ours_re.search(ln))) if ours_re else (lambda ln: bool(ln.strip())),
            f"a line matching {args.ours_ready!r}" if ours_re else "its first stdout line",
        ),
        ARM_BCC: ToolSpec(ARM_BCC, resolve_cmd(args.bcc_cmd), lambda ln: bool(bcc_re.search(ln)), f"{args.bcc_ready!r}"),
        ARM_FLOOR: ToolSpec(ARM_FLOOR, resolve_cmd(args.floor_cmd), lambda ln: ln.startswith("attached"), "'attached'"),
    }


def run_workload(name: str, args: argparse.Namespace) -> WorkloadResult:
    if name == "pipe":
        return run_pipe(args.loops, args.workload_timeout, args.cpu)
    if name == "connect":
        return run_connect(args.connects, args.connect_max_seconds, args.cpu)
    raise ValueError(name)


def one_run(workload: str, rnd: int, pos: int, arm: str, spec: ToolSpec | None, args: argparse.Namespace) -> Run:
    """One arm's run: start its tool (if any), wait until ready, run the workload, stop the tool."""
    run = Run(workload, rnd, pos, arm)
    tool: RunningTool | None = None
    try:
        if spec is not None:
            tool = RunningTool(spec)
            run.tool = tool.stats
            tool.wait_ready(args.ready_timeout)
        res = run_workload(workload, args)
        run.throughput, run.elapsed_s, run.ops = res.throughput, res.elapsed_s, res.ops
        run.detail.update(res.detail)
        if tool is not None and not tool.alive():
            rc, err = tool.proc.returncode, tool.stderr_tail()
            run.error = f"tool exited during the workload (status {rc})" + (f": {err[:200]}" if err else "")
    except (ToolError, WorkloadError) as e:
        run.error = str(e)
        run.detail["error_kind"] = "tool" if isinstance(e, ToolError) else "workload"
    finally:
        if tool is not None:
            tool.measure_and_stop(args.stop_timeout)
    return run


@dataclass
class Bench:
    args: argparse.Namespace
    arms: list[str]
    workloads: list[str]
    specs: dict[str, ToolSpec]
    runs: list[Run] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    none_failed: dict[str, str] = field(default_factory=dict)
    started: str = ""
    finished: str = ""

    def execute(self) -> None:
        a = self.args
        self.started = _now()
        for arm in self.arms:
            if arm == ARM_BCC:
                reason = bcc_preflight(self.specs[ARM_BCC].cmd)
            elif arm == ARM_OURS:
                reason = ours_preflight(self.specs[ARM_OURS].cmd)
            else:
                reason = None
            if reason:
                self.unavailable[arm] = reason
                log(f"{arm}: unavailable: {reason}")
        ok_runs: dict[str, int] = {arm: 0 for arm in self.arms}
        fails_in_row: dict[str, int] = {arm: 0 for arm in self.arms}
        for wl in self.workloads:
            for w in range(a.warmup):
                log(f"{wl}: warm-up {w + 1}/{a.warmup} (not recorded)")
                try:
                    run_workload(wl, a)
                except WorkloadError as e:
                    log(f"{wl}: warm-up failed: {e}")
            for rnd in range(a.rounds):
                order = rotated(self.arms, rnd)
                for pos, arm in enumerate(order):
                    if arm in self.unavailable:
                        continue
                    if wl in self.none_failed:
                        break
                    run = one_run(wl, rnd, pos, arm, self.specs.get(arm), a)
                    self.runs.append(run)
                    log(_describe(run, a.rounds))
                    if run.error is None:
                        ok_runs[arm] += 1
                        fails_in_row[arm] = 0
                    elif arm == ARM_NONE:
                        self.none_failed[wl] = run.error
                        log(f"{wl}: the none arm failed: skipping the rest of this workload")
                    elif run.detail.get("error_kind") != "workload":
                        fails_in_row[arm] += 1
                        # A tool that never worked, or fails twice running, is not retried.
                        if ok_runs[arm] == 0 or fails_in_row[arm] >= 2:
                            self.unavailable[arm] = run.error
                            log(f"{arm}: unavailable from now on: {run.error}")
                    if a.settle > 0:
                        time.sleep(a.settle)
        self.finished = _now()

    # ---- results

    def ok(self, wl: str, arm: str) -> list[Run]:
        return [r for r in self.runs if r.workload == wl and r.arm == arm and r.error is None]

    def ratios(self, wl: str, arm: str) -> list[float]:
        base = {r.round: r.throughput for r in self.ok(wl, ARM_NONE)}
        return [r.throughput / base[r.round] for r in self.ok(wl, arm) if r.throughput is not None and base.get(r.round)]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workloads": {}, "tools": {}}
        for wl in self.workloads:
            rows: dict[str, Any] = {}
            for arm in self.arms:
                runs = [r for r in self.runs if r.workload == wl and r.arm == arm]
                tps = [r.throughput for r in self.ok(wl, arm) if r.throughput is not None]
                ratios = self.ratios(wl, arm)
                med_ratio = statistics.median(ratios) if ratios else None
                rows[arm] = {
                    "unit": "ops/s" if wl == "pipe" else "connects/s",
                    "runs": len(runs),
                    "ok": len(tps),
                    "errors": [r.error for r in runs if r.error],
                    "median": statistics.median(tps) if tps else None,
                    "min": min(tps) if tps else None,
                    "max": max(tps) if tps else None,
                    "median_ratio": med_ratio,
                    "loss_pct": (1 - med_ratio) * 100 if med_ratio is not None else None,
                    "ratio_min": min(ratios) if ratios else None,
                    "ratio_max": max(ratios) if ratios else None,
                    "status": self._status(wl, arm, tps),
                }
            out["workloads"][wl] = rows
        for arm in self.arms:
            if arm == ARM_NONE:
                continue
            stats = [r.tool for r in self.runs if r.arm == arm and r.tool is not None and r.error is None]
            out["tools"][arm] = {
                "runs": len(stats),
                "startup_s": _spread([s.startup_s for s in stats]),
                "rss_hwm_mb": _spread([s.rss_hwm_kb / 1024 if s.rss_hwm_kb else None for s in stats]),
                "cpu_startup_s": _spread([s.cpu_startup_s for s in stats]),
                "cpu_workload_pct": _spread(
                    [
                        100 * s.cpu_during_workload_s / r.elapsed_s
                        if s.cpu_during_workload_s is not None and r.elapsed_s
                        else None
                        for r in self.runs
                        if r.arm == arm and r.error is None and (s := r.tool) is not None
                    ]
                ),
                "stop_s": _spread([s.stop_s for s in stats]),
                "status": ("unavailable: " + self.unavailable[arm]) if arm in self.unavailable else "ok",
            }
        return out

    def _status(self, wl: str, arm: str, tps: list[float]) -> str:
        if arm == ARM_NONE and wl in self.none_failed:
            return "failed: " + self.none_failed[wl]
        if arm in self.unavailable and not tps:
            return "unavailable: " + self.unavailable[arm]
        return "ok"


def _spread(xs: Sequence[float | None]) -> dict[str, float] | None:
    vals = [x for x in xs if x is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _describe(run: Run, rounds: int) -> str:
    head = f"{run.workload} round {run.round + 1}/{rounds} [{run.position + 1}] {run.arm}: "
    if run.error:
        return head + "ERROR " + run.error
    s = f"{run.throughput:,.0f}/s in {run.elapsed_s:.2f} s"
    if run.tool is not None and run.tool.startup_s is not None:
        rss = f", rss {run.tool.rss_hwm_kb / 1024:.0f} MB" if run.tool.rss_hwm_kb else ""
        s += f" (tool ready in {run.tool.startup_s:.2f} s{rss})"
    return head + s


# --------------------------------------------------------------------------------------------------
# Reports.


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _sp(s: dict[str, float] | None, fmt: str) -> str:
    if not s:
        return "-"
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"


def throughput_rows(bench: Bench, summ: dict[str, Any]) -> list[list[str]]:
    rows = []
    for wl in bench.workloads:
        for arm in bench.arms:
            s = summ["workloads"][wl][arm]
            if s["status"] != "ok" and s["median"] is None:
                rows.append([wl, arm, s["status"]])  # a short row: the status spans the rest
                continue
            rows.append(
                [
                    wl,
                    arm,
                    f"{_f(s['median'], ',.0f')} {s['unit']}",
                    _f(s["median_ratio"], ".3f"),
                    _f(s["loss_pct"], "+.1f"),
                    f"{_f(s['ratio_min'], '.3f')}-{_f(s['ratio_max'], '.3f')}",
                    f"{_f(s['min'], ',.0f')}-{_f(s['max'], ',.0f')}",
                    f"{s['ok']}/{s['runs']}",
                ]
            )
    return rows


THROUGHPUT_HEAD = ["workload", "arm", "median", "ratio", "loss %", "ratio min-max", "min-max", "ok/runs"]
TOOL_HEAD = ["arm", "startup s", "peak RSS MB", "start-up CPU s", "CPU % while loaded", "stop s", "runs"]


def tool_rows(summ: dict[str, Any]) -> list[list[str]]:
    rows = []
    for arm, t in summ["tools"].items():
        if t["runs"] == 0:
            rows.append([arm, t["status"]])
            continue
        rows.append(
            [
                arm,
                _sp(t["startup_s"], ".2f"),
                _sp(t["rss_hwm_mb"], ".0f"),
                _sp(t["cpu_startup_s"], ".2f"),
                _sp(t["cpu_workload_pct"], ".1f"),
                _sp(t["stop_s"], ".2f"),
                str(t["runs"]),
            ]
        )
    return rows


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """Aligned columns; a row shorter than the head ends in a status that spans the remaining columns
    (and does not widen them)."""
    n = len(head)
    widths = [len(h) for h in head]
    for r in rows:
        for i, c in enumerate(r if len(r) == n else r[:-1]):
            widths[i] = max(widths[i], len(c))
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        lines.append("  ".join(cells if len(r) == n else [*cells[:-1], r[-1]]).rstrip())
    return "\n".join(lines)


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [c.replace("|", "\\|") for c in r] + [""] * (len(head) - len(r))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def command_line(argv: Sequence[str]) -> str:
    py = sys.executable
    try:
        rel = os.path.relpath(py, REPO_ROOT)
        if not rel.startswith(".."):
            py = rel
    except ValueError:
        pass
    return shlex.join([py, "bench/overhead.py", *argv])


def environment() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
    }


def legend(bench: Bench) -> list[str]:
    a = bench.args
    out = [
        "ratio = median over rounds of (arm throughput / the same round's `none` throughput); "
        "loss % = (1 - ratio) * 100. Each round runs all arms in a rotated order.",
        "startup = spawn to readiness (noisyneighbor: its first stdout line, the status record printed "
        "once its probes are attached; floor: 'attached'; bcc: the 'Tracing run queue latency' line); "
        "peak RSS = VmHWM before stop; "
        "CPU % while loaded = the tool's CPU time during the workload / workload time (100 = one core).",
    ]
    if ARM_OURS in bench.arms:
        out.append(f"noisyneighbor: `{shlex.join(bench.specs[ARM_OURS].cmd)}`")
    if ARM_BCC in bench.arms:
        out.append(f"bcc-runqlat: `{shlex.join(bench.specs[ARM_BCC].cmd)}`")
    out.append(
        f"workload processes pinned to CPU {a.cpu} (taskset -c); the tools run unpinned"
        if a.cpu
        else "workload processes unpinned"
    )
    if "pipe" in bench.workloads:
        out.append(f"pipe: `perf bench sched pipe -l {a.loops}`")
    if "connect" in bench.workloads:
        out.append(
            f"connect: {a.connects} loopback TCP connect + 1-byte echo + close cycles (at most {a.connect_max_seconds:.0f} s)"
        )
    return out


def render_text(bench: Bench, summ: dict[str, Any]) -> str:
    env = environment()
    parts = [
        f"noisyneighbor overhead bench, {bench.started} .. {bench.finished}, kernel {env['kernel']}, "
        f"{env['cpus']} CPUs, {bench.args.rounds} rounds",
        "",
        text_table(THROUGHPUT_HEAD, throughput_rows(bench, summ)),
    ]
    if summ["tools"]:
        parts += ["", text_table(TOOL_HEAD, tool_rows(summ))]
    parts += ["", *legend(bench)]
    return "\n".join(parts)


def render_markdown(bench: Bench, summ: dict[str, Any], argv: Sequence[str]) -> str:
    env = environment()
    parts = [
        f"### Probe overhead ({bench.started[:10]})",
        "",
        f"- command: `{command_line(argv)}`",
        f"- date: {bench.started} .. {bench.finished} (UTC)",
        f"- machine: kernel {env['kernel']} ({env['machine']}), {env['cpus']} CPUs, {env['cpu_model']}",
        f"- rounds: {bench.args.rounds}, warm-up runs per workload: {bench.args.warmup}",
        "",
        md_table(THROUGHPUT_HEAD, throughput_rows(bench, summ)),
    ]
    if summ["tools"]:
        parts += ["", md_table(TOOL_HEAD, tool_rows(summ))]
    parts += ["", *[f"- {x}" for x in legend(bench)]]
    return "\n".join(parts)


def to_json(bench: Bench, summ: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    return {
        "command": command_line(argv),
        "started": bench.started,
        "finished": bench.finished,
        "environment": environment(),
        "options": {k: v for k, v in vars(bench.args).items() if k not in ("json", "markdown")},
        "arms": bench.arms,
        "workloads": bench.workloads,
        "commands": {arm: spec.cmd for arm, spec in bench.specs.items() if arm in bench.arms},
        "unavailable": bench.unavailable,
        "none_failed": bench.none_failed,
        "runs": [asdict(r) for r in bench.runs],
        "summary": summ,
    }


# --------------------------------------------------------------------------------------------------
# Command line.


def _list_arg(allowed: Sequence[str], aliases: dict[str, Sequence[str]]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        out: list[str] = []
        for item in (x.strip() for x in text.split(",")):
            names = aliases.get(item, [item])
            for n in names:
                if n not in allowed:
                    raise argparse.ArgumentTypeError(f"{item!r}: choose from {', '.join(allowed)}")
                if n not in out:
                    out.append(n)
        return out

    return parse


def parse_cpu_list(text: str) -> set[int] | None:
    """'1', '0-1', '0,2-3' -> the CPUs; None when malformed."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            return None
        out.update(range(lo, hi + 1))
    return out


def _pos_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/overhead.py",
        description="Throughput cost of BPF probes (ours vs bcc runqlat vs nothing), alternating arms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--workload",
        type=_list_arg(ALL_WORKLOADS, {"both": ALL_WORKLOADS, "all": ALL_WORKLOADS}),
        default=",".join(ALL_WORKLOADS),
        help="pipe, connect, or a comma list (both/all = every workload)",
    )
    p.add_argument(
        "--arms",
        type=_list_arg(ALL_ARMS, {"ours": [ARM_OURS], "bcc": [ARM_BCC], "all": ALL_ARMS}),
        default=",".join(ALL_ARMS),
        help="comma list of arms; must include none",
    )
    p.add_argument("--rounds", type=_pos_int, default=5, help="rounds per workload (use >= 5 for numbers)")
    p.add_argument(
        "--loops",
        type=_pos_int,
        default=None,
        help=f"pipe: perf bench sched pipe -l N; none = {LOOPS_PINNED} when pinned, {LOOPS_FREE} when not (about 3-5 s here)",
    )
    p.add_argument(
        "--cpu",
        default="auto",
        help="CPU list the workload processes are confined to (taskset -c); auto = the last CPU; none ="
        " unpinned (perf bench sched pipe then swings 20k..150k ops/s with where the scheduler puts it)",
    )
    p.add_argument("--connects", type=_pos_int, default=20_000, help="connect: cycles per run")
    p.add_argument("--connect-max-seconds", type=float, default=60.0, help="connect: stop a run early after this")
    p.add_argument("--workload-timeout", type=float, default=300.0, help="pipe: kill perf after this")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded none-arm runs before each workload")
    p.add_argument("--ours-cmd", default=DEFAULT_OURS_CMD, help="the noisyneighbor arm's command")
    p.add_argument("--ours-ready", default="", help="regex a stdout line must match to be ready; empty = any line")
    p.add_argument("--bcc-cmd", default=DEFAULT_BCC_CMD, help="the bcc-runqlat arm's command")
    p.add_argument("--floor-cmd", default=DEFAULT_FLOOR_CMD,
                   help="the floor arm's command (add --all-probes for every tracepoint of the default probes)")
    p.add_argument("--bcc-ready", default=BCC_READY, help="regex of the bcc tool's readiness line")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds a tool has to get ready")
    p.add_argument("--stop-timeout", type=float, default=10.0, help="seconds after SIGTERM before SIGKILL")
    p.add_argument("--settle", type=_nonneg_float, default=1.0, help="seconds of quiet after each run")
    p.add_argument("--json", metavar="PATH", help="write all raw numbers here")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (for docs/benchmarks.md)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if ARM_NONE not in args.arms:
        parser.error("--arms must include none (every ratio is against it)")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.cpu == "auto":
        args.cpu = str(max(os.sched_getaffinity(0)))
    elif args.cpu in ("none", ""):
        args.cpu = None
    else:
        cpus = parse_cpu_list(args.cpu)
        allowed = os.sched_getaffinity(0)
        if cpus is None or not cpus <= allowed:
            parser.error(f"--cpu: auto, none, or a list of CPUs among {sorted(allowed)}, like 1 or 0-1")
    if args.loops is None:
        args.loops = LOOPS_PINNED if args.cpu else LOOPS_FREE
    try:
        specs = make_specs(args)
    except (ValueError, re.error) as e:
        parser.error(f"bad command or readiness regex: {e}")
    if args.rounds < 5:
        log(f"note: {args.rounds} rounds: fine for a trial; use >= 5 for numbers you quote")
    arms = [a for a in ALL_ARMS if a in args.arms]  # the base order; rounds rotate it
    bench = Bench(args, arms, list(args.workload), specs)
    try:
        bench.execute()
    except KeyboardInterrupt:
        log("interrupted: reporting what was measured")
        bench.finished = _now()
    summ = bench.summary()
    if args.json:  # first: the raw numbers survive a closed stdout
        Path(args.json).write_text(json.dumps(to_json(bench, summ, argv), indent=2) + "\n")
        log(f"raw numbers written to {args.json}")
    print(render_markdown(bench, summ, argv) if args.markdown else render_text(bench, summ))
    if bench.none_failed:
        for wl, err in bench.none_failed.items():
            log(f"FAILED: {wl}: the none arm failed: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
