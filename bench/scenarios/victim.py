# SPDX-License-Identifier: Apache-2.0
"""The LS victim for scenarios: it logs every response time, so the runner can cut before/during/after windows.

Modes (all write ``<monotonic ns> <latency ns>`` lines to ``--out``, flushed twice a second, so a
killed worker still leaves its samples; CLOCK_MONOTONIC is shared with the runner process):

- ``cpu``: W ms of CPU work every P ms; latency = end of the work - when it was due (wakeup delay +
  work), the ls_worker victim of testkit/workloads with a per-request log. ``--alloc-kb`` also touches
  that much fresh memory per request, so a pod at its memory limit reclaims in the victim's path.
- ``tcp``: a loopback request/response pair (the process forks a server that does W ms of work per
  request); latency = the client's round trip.
- ``connect``: a new TCP connection to ``--host:--port`` every P ms; latency = connect time
  (a SYN dropped by a full accept queue costs a 1 s retransmit).

    python -m bench.scenarios.victim cpu --out /tmp/v.log --seconds 30
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import socket
import sys
import time
from typing import TextIO

FLUSH_EVERY_NS = 500_000_000


def busy(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


class SampleLog:
    def __init__(self, path: str) -> None:
        self.file: TextIO = open(path, "w", encoding="ascii")  # noqa: SIM115 - closed in close()
        self.buf: list[str] = []
        self.flushed_at = time.monotonic_ns()

    def add(self, t_ns: int, latency_ns: int) -> None:
        self.buf.append(f"{t_ns} {latency_ns}\n")
        if t_ns - self.flushed_at >= FLUSH_EVERY_NS:
            self.flush()

    def flush(self) -> None:
        self.file.write("".join(self.buf))
        self.file.flush()
        self.buf.clear()
        self.flushed_at = time.monotonic_ns()

    def close(self) -> None:
        self.flush()
        self.file.close()


class Stop:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.flag = False
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def _on_term(self, *_: object) -> None:
        self.flag = True

    def __bool__(self) -> bool:
        return self.flag or time.monotonic() >= self.deadline


def run_cpu(args: argparse.Namespace, log: SampleLog, stop: Stop) -> None:
    period, work = int(args.period_ms * 1e6), int(args.work_ms * 1e6)
    alloc = int(args.alloc_kb * 1024)
    due = time.monotonic_ns()
    while not stop:
        busy(work)
        if alloc:
            m = mmap.mmap(-1, alloc)
            for off in range(0, alloc, 4096):  # touch each page: a charge (and maybe reclaim) per page
                m[off] = 1
            m.close()
        end = time.monotonic_ns()
        log.add(end, end - due)
        due = _pace(due, period, end)


def run_tcp(args: argparse.Namespace, log: SampleLog, stop: Stop) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        conn, _ = listener.accept()
        work = int(args.work_ms * 1e6)
        while True:
            data = conn.recv(64)
            if not data:
                os._exit(0)
            busy(work)
            conn.sendall(data)
    listener.close()
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    period = int(args.period_ms * 1e6)
    try:
        due = time.monotonic_ns()
        while not stop:
            start = time.monotonic_ns()
            client.sendall(b"x" * 32)
            got = 0
            while got < 32:
                chunk = client.recv(64)
                if not chunk:
                    return
                got += len(chunk)
            end = time.monotonic_ns()
            log.add(end, end - start)
            due = _pace(due, period, end)
    finally:
        client.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _pace(due: int, period: int, end: int) -> int:
    """Sleep until the next request is due (ns); after an overrun start again from now, no catch-up burst."""
    due += period
    if due > end:
        time.sleep((due - end) / 1e9)
        return due
    return end


def run_connect(args: argparse.Namespace, log: SampleLog, stop: Stop) -> None:
    period = int(args.period_ms * 1e6)
    due = time.monotonic_ns()
    while not stop:
        start = time.monotonic_ns()
        try:
            with socket.create_connection((args.host, args.port), timeout=args.timeout_s):
                pass
        except OSError:
            pass  # a timeout is a sample of timeout length: the user saw it
        end = time.monotonic_ns()
        log.add(end, end - start)
        due = _pace(due, period, end)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.victim", description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("cpu", "tcp", "connect"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--work-ms", type=float, default=1.5)
    p.add_argument("--period-ms", type=float, default=5.0)
    p.add_argument("--alloc-kb", type=float, default=0.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=3.0)
    args = p.parse_args(argv)
    stop = Stop(args.seconds)
    log = SampleLog(args.out)
    try:
        {"cpu": run_cpu, "tcp": run_tcp, "connect": run_connect}[args.mode](args, log, stop)
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
