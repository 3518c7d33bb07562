# SPDX-License-Identifier: Apache-2.0
"""Kernel files the tests read as ground truth and the runtime never reads (so they are not rows of the
runtime's kernel-file table, probes/cgroupfiles.py): /proc/softirqs, the kernel's own count of softirq runs
that the softirq probe's entries are checked against."""

from __future__ import annotations

from probes.host import HostPaths


def parse_softirqs(text: str) -> dict[tuple[int, str], int]:
    """/proc/softirqs as {(cpu, vector name): count}: the kernel's own count of softirq runs.
    Columns or counts that are not numbers are skipped; an empty file gives {}."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = [int(c[3:]) for c in lines[0].split() if c.startswith("CPU") and c[3:].isascii() and c[3:].isdigit()]
    out: dict[tuple[int, str], int] = {}
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        if not rest:
            continue
        for cpu, count in zip(cpus, rest.split(), strict=False):
            if count.isascii() and count.isdigit():
                out[(cpu, name.strip())] = int(count)
    return out


def read_proc_softirqs(paths: HostPaths | None = None) -> dict[tuple[int, str], int]:
    """/proc/softirqs under ``paths`` (the real host by default), parsed."""
    return parse_softirqs(((paths or HostPaths()).proc / "softirqs").read_text())
