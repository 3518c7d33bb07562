# SPDX-License-Identifier: Apache-2.0
"""What the agent process carries for nothing it does: its footprint at 300 pods (issue 39, RSS <= 80 MiB)
was megabytes of modules and per-victim containers that its loop never needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from detector.incident_diagnosis import CULPRIT_WINDOW_TICKS, Recent, VictimState

REPO = Path(__file__).resolve().parent.parent

# The agent's start (its command line, its modules) and a tick's read of the run-queue probe's mapped slot
# table at given slots (a fake table: two slots of 2 copies of 24 bytes used), in a fresh interpreter.
_AGENT_START = """
import json, struct, sys
from noisyneighbor.cli import build_parser
build_parser()
import noisyneighbor.agent
from probes.striped_slots import StripedSlots

class Mapped:
    def __init__(self):
        self.copies = [[bytes(24)] * 2 for _ in range(64)]
        for slot in (1, 3):
            self.copies[slot][0] = struct.pack("<QQQ", 5, 50, 1000 + slot)
    def map_mmap(self, name):
        return bytearray(b"".join(b"".join(c) for c in self.copies))

slots = StripedSlots(Mapped(), "index", "stats", "free", 24, 8, 2, (0, 1, 2))
moved = [c.slot for c in slots.read_changed(candidates=[3, 1, 3, 10**6, -1, 2])]
print(json.dumps({"moved": moved, "modules": sorted(sys.modules)}))
"""


def test_the_agent_imports_no_renderer_no_metadata_and_no_masked_arrays() -> None:
    """rich (top's renderer: the agent renders only for a client's /top), importlib.metadata (the
    --version string) and numpy.ma (np.unique asks whether its input is masked) were ~8 MiB of a fresh
    interpreter's RSS; none is imported by the agent's start or by a tick's slot read. The slot read
    still looks at each candidate slot once, in order, and at no slot outside the table."""
    res = subprocess.run([sys.executable, "-c", _AGENT_START], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["moved"] == [1, 3]
    carried = [m for m in out["modules"] if m.split(".")[0] == "rich" or m in ("importlib.metadata", "numpy.ma")]
    assert carried == []


def test_a_victims_windows_keep_the_last_ticks_only() -> None:
    """Recent drops its oldest past its maxlen, as the deques it replaced did, on append and on extend (a
    successor incident takes over its predecessor's breach ticks)."""
    window = Recent(3)
    for v in range(5):
        window.append(v)
    assert window == [2, 3, 4]
    window.extend([7, 8, 9, 10])
    assert window == [8, 9, 10] and window.maxlen == 3
    state = VictimState()
    for v in range(CULPRIT_WINDOW_TICKS + 5):
        state.recent_wait_ns.append(float(v))
        state.breach_ran.append(frozenset({str(v)}))
    assert list(state.recent_wait_ns) == [float(v) for v in range(5, CULPRIT_WINDOW_TICKS + 5)]
    assert len(state.breach_ran) == CULPRIT_WINDOW_TICKS
    assert all(len(w) <= w.maxlen for w in state.recent_slo.values())
