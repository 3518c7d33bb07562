# SPDX-License-Identifier: Apache-2.0
"""bench/variant_objects.py: the stripped runqlat it builds keeps the per-CPU histogram and nothing per cgroup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from probes.engine import LibbpfEngine
from probes.runqlat import RunqLatProbe
from testkit.tools import require_tool
from testkit.variant_objects import build

pytestmark = pytest.mark.root

# 200 sleeps of 1 ms: every wakeup is a switch-in with a runqueue wait, on an idle node too.
WAKEUPS = "import time\nfor _ in range(200): time.sleep(0.001)\n"


def _waits(probe: RunqLatProbe) -> tuple[int, dict]:
    before = probe.snapshot()
    subprocess.run([sys.executable, "-c", WAKEUPS], check=True)
    after = probe.snapshot()
    per_cpu = sum(a.delta(b).count for a, b in zip(after.per_cpu, before.per_cpu, strict=True))
    return per_cpu, after.per_cgroup


def test_cpu_hist_only_variant_counts_switches_but_no_cgroup(tmp_path):
    require_tool("clang")
    require_tool("make")
    out = build(tmp_path / "objs", "cpu_hist_only")
    with RunqLatProbe(engine=LibbpfEngine(object_dir=out)) as variant:
        per_cpu, per_cgroup = _waits(variant)
    assert per_cpu >= 200
    assert per_cgroup == {}
    # The control: the built object, loaded the same way, does fill the per-cgroup maps.
    with RunqLatProbe() as full:
        per_cpu, per_cgroup = _waits(full)
    assert per_cpu >= 200 and per_cgroup
