# SPDX-License-Identifier: Apache-2.0
"""Antagonists (and the connect scenario's server), run as separate processes inside test pods.

    python antagonists.py hog --seconds S
    python antagonists.py pagecache --file F --mb N --seconds S
    python antagonists.py udpflood --dest ADDR --seconds S
    python antagonists.py rtbusy --seconds S        (SCHED_FIFO, RLIMIT_RTTIME-bounded, self-checking)
    python antagonists.py server --port P --seconds S   (stops accepting on SIGUSR1)
    python antagonists.py heap --leave-free-mb N --ready F --seconds S [--margin-mb M]
                                              (anon heap; OOM-kill first; grows at SIGUSR1)
    python antagonists.py sparseread --file F --seconds S   (page cache at memory speed, no disk)
    python antagonists.py jobs --mean-busy-ms B --mean-gap-ms G --seconds S   (short jobs at random)
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import resource
import signal
import socket
import sys
import time
from pathlib import Path

RT_BURST_S = 0.2  # busy this long, then sleep 1 ms: keeps RLIMIT_RTTIME (CPU time without blocking) from firing
RTTIME_SOFT_US = 1_000_000
RTTIME_HARD_US = 2_000_000
RT_MAX_SECONDS = 60.0


def hog(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def jobs(mean_busy_ms: float, mean_gap_ms: float, seconds: float) -> None:
    """Short CPU jobs at random: exponential lengths (capped at 10 times the mean) and gaps, as a pod
    serving requests does. Random arrivals never phase-lock with a periodic victim, so the waits they
    cause are the same before and after an onset (a fixed period locked in a different phase in each
    pass). A job's length is CPU time: waiting for the CPU is not work."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0, busy_s = time.thread_time(), min(random.expovariate(1e3 / mean_busy_ms), 10 * mean_busy_ms / 1e3)
        while time.thread_time() - t0 < busy_s:
            pass
        time.sleep(random.expovariate(1e3 / mean_gap_ms))


def pagecache(path: str, mb: int, seconds: float) -> None:
    """Rewrite a file bigger than the pod's memory limit, over and over: its page cache fills the memcg."""
    end = time.monotonic() + seconds
    block = b"\1" * (1 << 20)
    try:
        while time.monotonic() < end:
            with open(path, "wb") as f:
                for _ in range(mb):
                    f.write(block)
                    if time.monotonic() >= end:
                        break
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
    finally:
        Path(path).unlink(missing_ok=True)


def heap(leave_free_mb: int, ready: str, seconds: float, margin_mb: int | None = None) -> None:
    """Hold an anonymous heap that leaves ``leave_free_mb`` of the node's memory free, then sleep.

    The BE job of the global-reclaim scenario: most of the node's memory is its own before the onset,
    so its page-cache growth after the onset reaches the watermarks in seconds. It is the first the OOM
    killer takes (oom_score_adj 1000, as the kubelet gives BestEffort pods) should anything else grow.
    Without swap the heap is never reclaimed; the node keeps ``leave_free_mb`` for everyone else.

    ``margin_mb``: on SIGUSR1 the heap grows until the node's free memory is kswapd's high watermark
    plus this margin, then writes ``<ready>.grown``; the scenario asks once its victim runs, right
    before the baseline. A margin fixed when the heap is first held depends on what the victim, the
    agent and the bench allocate after it; and the growth cannot wait for the onset, because under qemu
    TCG any growth (this heap's pages as the stream's) is ~50-100 MB/s: 1,280 MiB left at setup put the
    start of reclaim 20-23 s after the onset (make bench-vm-mitigate, 2026-11-29 14:38 UTC), the same
    growth at the onset still 13-15 s (16:19 UTC).
    """
    Path("/proc/self/oom_score_adj").write_text("1000")
    if margin_mb is not None:  # before ``ready``: the scenario signals only after reading it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    end = time.monotonic() + seconds
    size = (_meminfo_kb("MemFree") // 1024 - leave_free_mb) << 20
    held = []
    chunk = 256 << 20
    while size >= chunk:  # populated by the kernel chunk by chunk: no Python loop over pages
        held.append(_populated(chunk))
        size -= chunk
    Path(ready).write_text(f"{len(held) * chunk}\n")
    if margin_mb is not None and signal.sigtimedwait({signal.SIGUSR1}, seconds) is not None:
        target_kib = _high_watermarks_kib() + (margin_mb << 10)
        step = GROWTH_CHUNK_MB << 20
        grown = 0
        # Free memory is read again before each chunk: whatever else allocates meanwhile is left room for.
        while _meminfo_kb("MemFree") - target_kib >= step >> 10:
            held.append(_populated(step))
            grown += step
        Path(f"{ready}.grown").write_text(f"{grown}\n")
    time.sleep(max(0.0, end - time.monotonic()))


GROWTH_CHUNK_MB = 32  # the growth to the margin, in steps small beside it


def _populated(size: int) -> mmap.mmap:
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)


def _high_watermarks_kib(zoneinfo: str = "/proc/zoneinfo") -> int:
    """The zones' high watermarks, summed (/proc/zoneinfo, in pages): kswapd reclaims up to them once
    a zone's free memory falls below its low one. The per-CPU pagesets' ``high:`` lines are not one."""
    pages = 0
    with open(zoneinfo, encoding="ascii") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 2 and fields[0] == "high":
                pages += int(fields[1])
    return pages * (os.sysconf("SC_PAGE_SIZE") >> 10)


def _meminfo_kb(field: str) -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


SPARSE_FILE_BYTES = 256 << 30  # never read to its end in a scenario: every read is a new page-cache page


def sparseread(path: str, seconds: float) -> None:
    """Read a sparse file from the start, never the same page twice: page cache grows at memory speed.

    The holes cost no disk and no I/O; ext4 still adds every page it reads to the page cache (zeroed),
    charged to this process's memcg, as a batch job streaming its input would. The file is unlinked at
    the end, which drops its pages.
    """
    with open(path, "wb") as f:
        f.truncate(SPARSE_FILE_BYTES)
    end = time.monotonic() + seconds
    try:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(4 << 20)
            while time.monotonic() < end and f.readinto(buf):
                pass
    finally:
        Path(path).unlink(missing_ok=True)


def udpflood(dest: str, seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"\0" * 64
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            for _ in range(1000):
                s.sendto(payload, (dest, 9))
        except OSError:
            continue  # ENOBUFS / ICMP-unreachable errors: keep flooding


def rtbusy(seconds: float) -> None:
    seconds = min(seconds, RT_MAX_SECONDS)
    resource.setrlimit(resource.RLIMIT_RTTIME, (RTTIME_SOFT_US, RTTIME_HARD_US))
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the self-check: never past ``seconds`` whatever the signals do
        burst_end = min(end, time.monotonic() + RT_BURST_S)
        while time.monotonic() < burst_end:
            pass
        time.sleep(0.001)


def server(port: int, seconds: float) -> None:
    accepting = True

    def stop_accepting(*_: object) -> None:
        nonlocal accepting
        accepting = False

    signal.signal(signal.SIGUSR1, stop_accepting)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    s.settimeout(0.1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not accepting:
            time.sleep(0.1)
            continue
        try:
            conn, _ = s.accept()
            conn.close()
        except (TimeoutError, InterruptedError):
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("hog", "pagecache", "udpflood", "rtbusy", "server", "heap", "sparseread", "jobs"))
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--file")
    p.add_argument("--mb", type=int, default=400)
    p.add_argument("--dest")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--leave-free-mb", type=int, default=4096)
    p.add_argument("--ready", help="heap: this file is written once the heap is held")
    p.add_argument("--margin-mb", type=int, help="heap: at SIGUSR1, grow until free is the high watermark + this")
    p.add_argument("--mean-busy-ms", type=float, default=0.35)
    p.add_argument("--mean-gap-ms", type=float, default=1.4)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if a.what == "hog":
        hog(a.seconds)
    elif a.what == "pagecache":
        pagecache(a.file, a.mb, a.seconds)
    elif a.what == "udpflood":
        udpflood(a.dest, a.seconds)
    elif a.what == "heap":
        heap(a.leave_free_mb, a.ready, a.seconds, a.margin_mb)
    elif a.what == "sparseread":
        sparseread(a.file, a.seconds)
    elif a.what == "rtbusy":
        rtbusy(a.seconds)
    elif a.what == "jobs":
        jobs(a.mean_busy_ms, a.mean_gap_ms, a.seconds)
    else:
        server(a.port, a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
