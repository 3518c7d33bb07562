# SPDX-License-Identifier: Apache-2.0
"""How much slower than the reference machine this one runs Python now: the deadlines of tests and bench
runs that wait for Python processes scale by it."""

from __future__ import annotations

import functools
import time

# A fixed amount of pure-Python work, and the seconds it takes on the reference machine (2 cores of the
# developers' kind, quiet: 0.095-0.10 s of CPU). Tests that wait for Python processes to do something
# (an agent starting, a detection) scale their deadlines by how much slower this machine runs it now:
# a TCG guest (the VM lane) about 10 times, a loaded CI host 2-3 times. Never below 1.
_CALIBRATION_LOOPS = 1_000_000
_CALIBRATION_REFERENCE_S = 0.1


@functools.cache
def slowdown() -> float:
    """How many times slower than the reference machine this one runs Python now (≥ 1); the median
    of three timings of the same loop, measured once per session."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        x = 0
        for i in range(_CALIBRATION_LOOPS):
            x += i * i % 7
        times.append(time.perf_counter() - start)
    return max(1.0, sorted(times)[1] / _CALIBRATION_REFERENCE_S)
