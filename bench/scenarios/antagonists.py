"""Antagonists (and the connect scenario's server), run as separate processes inside test pods.

    python antagonists.py hog --seconds S
    python antagonists.py pagecache --file F --mb N --seconds S
    python antagonists.py udpflood --dest ADDR --seconds S
    python antagonists.py rtbusy --seconds S        (SCHED_FIFO, RLIMIT_RTTIME-bounded, self-checking)
    python antagonists.py server --port P --seconds S   (stops accepting on SIGUSR1)
"""

from __future__ import annotations

import argparse
import os
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
    p.add_argument("what", choices=("hog", "pagecache", "udpflood", "rtbusy", "server"))
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--file")
    p.add_argument("--mb", type=int, default=400)
    p.add_argument("--dest")
    p.add_argument("--port", type=int, default=8080)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if a.what == "hog":
        hog(a.seconds)
    elif a.what == "pagecache":
        pagecache(a.file, a.mb, a.seconds)
    elif a.what == "udpflood":
        udpflood(a.dest, a.seconds)
    elif a.what == "rtbusy":
        rtbusy(a.seconds)
    else:
        server(a.port, a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
