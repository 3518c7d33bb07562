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
