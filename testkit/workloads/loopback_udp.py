# SPDX-License-Identifier: Apache-2.0
"""NET_RX softirqs on demand: UDP datagrams over loopback, one NET_RX run per datagram, drained as they go.

As a function (``loopback_udp``) in the test's own process, or as a script on one CPU until killed:
`loopback_udp.py CPU` (64 datagrams, drain, 2 ms pause, forever), for a test that needs softirqs on
given CPUs while it does something else.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

BURST = 64  # datagrams sent between two drains of the receiving socket (its buffer never fills)


def loopback_udp(packets: int, seconds: float, pause_s: float = 0.0) -> int:
    """Send up to ``packets`` datagrams over loopback within ``seconds``, draining the receiver every
    BURST and then pausing ``pause_s``; how many were sent."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        addr = rx.getsockname()
        sent = 0
        deadline = time.monotonic() + seconds
        while sent < packets and time.monotonic() < deadline:
            tx.sendto(b"x" * 64, addr)
            sent += 1
            if sent % BURST == 0:
                with contextlib.suppress(BlockingIOError):
                    while rx.recv(128):
                        pass
                if pause_s:
                    time.sleep(pause_s)
        return sent
    finally:
        rx.close()
        tx.close()


def main() -> None:
    os.sched_setaffinity(0, {int(sys.argv[1])})
    loopback_udp(packets=1 << 62, seconds=1e9, pause_s=0.002)


if __name__ == "__main__":
    main()
