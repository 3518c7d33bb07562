# SPDX-License-Identifier: Apache-2.0
"""The agent fixes glibc's mmap threshold: per-tick buffers of a few hundred KiB stay mmapped
(returned to the kernel when freed) instead of moving to the heap once a larger block was freed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Free a 4 MiB block (glibc then raises a dynamic threshold to 4 MiB), then hold a 300 KiB one: glibc's
# own count of mmapped bytes (mallinfo2) grows by it only if 300 KiB is still above the threshold.
CHILD = r"""
import ctypes, sys
from noisyneighbor.agent.wiring import _fix_large_allocations_to_mmap

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert _fix_large_allocations_to_mmap()
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblkhd  # bytes in mmapped blocks
held = bytearray(300 << 10)
print("mapped" if libc.mallinfo2().hblkhd - before >= 300 << 10 else "heap")
"""

def _where(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_a_buffer_below_the_largest_freed_one_stays_mmapped_once_the_threshold_is_fixed() -> None:
    assert _where("dynamic") == "heap"  # glibc's default behaviour: why the agent fixes it
    assert _where("fixed") == "mapped"


# Fill the heap with 4 KiB blocks (above pymalloc's 512 B: glibc's), keep a block allocated after them so
# the heap's top cannot shrink, free the rest: their pages stay resident until a trim gives them back.
TRIM_CHILD = r"""
import os, sys
from noisyneighbor.agent.wiring import FreeMemoryReturner

def rss_kib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

clock = [0.0]
trimmer = FreeMemoryReturner(every_s=60, clock=lambda: clock[0])
blocks = [bytearray(4096) for _ in range(20000)]  # ~80 MiB in the heap
pin = bytearray(4096)
del blocks
before = rss_kib()
clock[0] = 59.0
assert not trimmer.maybe_trim()  # not yet due
clock[0] = 60.0
assert trimmer.maybe_trim() and trimmer.trims == 1
print(before - rss_kib())
"""


def test_free_heap_pages_are_given_back_once_due() -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    released_kib = int(out.stdout.strip())
    assert released_kib > 40 * 1024, f"trim gave back {released_kib} KiB of ~80 MiB freed"
