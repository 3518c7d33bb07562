# SPDX-License-Identifier: Apache-2.0
"""One side of a pipe ping-pong: `pingpong.py ping|pong READ_FD WRITE_FD ROUNDS WORK_US`.

Each round waits for a byte, burns WORK_US of CPU, answers. With the two sides in different cgroups
every wakeup is done by a task of the *other* cgroup, which is what runqueue attribution must not
be fooled by. Bounded by ROUNDS.
"""

import os
import sys
import time


def main() -> None:
    role, rfd, wfd, rounds, work_us = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    work_s = work_us / 1e6
    for _ in range(rounds):
        if role == "ping":
            os.write(wfd, b"x")
        if not os.read(rfd, 1):
            return
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass
        if role == "pong":
            os.write(wfd, b"x")


if __name__ == "__main__":
    main()
