# SPDX-License-Identifier: Apache-2.0
"""BE memory suppress: cap a BestEffort pod's memory near its usage when its growth drives global reclaim.

Global (direct) reclaim stalls every pod's allocations, the LS victim's too, while a BE pod's page
cache or heap keeps growing. Capping the BE pod at ``usage * (1 + headroom)`` (cgroup v1
``memory.limit_in_bytes``, v2 ``memory.high``: throttled and reclaimed, not OOM-killed) stops the
growth, and reclaim then takes the BE pod's pages first. Journaled like every file change, verified
and reverted by the manager like any action.

A cap at usage alone leaves the node where it was: at kswapd's watermarks, where whatever kswapd
frees the capped pod takes again (its charge fits under the cap once kswapd took its pages), and
kswapd keeps running on the LS pods' CPUs. So the cap is also lowered by what the node's free memory
lacks to stand clear of the watermarks (kswapd's high watermark plus ``FREE_MARGIN``), taken only
from the pod's page cache: without swap its heap cannot be reclaimed, and a v1 limit under what can
be reclaimed fails (EBUSY) rather than cap. Memcg reclaim at the victim's *own* limit is never a
neighbour's doing: no decision ever comes here for it (advice only, see actuators/mitigate.py).

Refused: non-BE targets (also by the manager), a cap that would not be lower than the current
limit, and a cap under ``floor_bytes``.
"""

from __future__ import annotations

import os

from actuators.base import FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupFileError, CgroupFiles, CgroupVanished
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, Decision, MemorySuppressAmount
from probes.cgroupfiles import MEMORY_HIGH, MEMORY_USAGE
from probes.memstat import read_memstat, read_node_memory

UNLIMITED_V1 = 1 << 62  # v1 reads an unlimited limit as a page-rounded 2^63 - 1
# Free memory the node should have above kswapd's high watermark once the BE pod gives back its page
# cache: room for the other pods' allocation bursts before kswapd wakes again.
FREE_MARGIN_MIN_BYTES = 256 << 20
FREE_MARGIN_RATIO = 0.01  # of the memory the allocator manages
GIVE_BACK_FILE_SHARE = 0.9  # of the pod's page cache at most: some of it is dirty or in use right now
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class MemorySuppressActuator(JournaledFileActuator):
    kind = ActionKind.MEMORY_SUPPRESS

    def __init__(self, files: CgroupFiles, journal: Journal) -> None:
        super().__init__(journal)
        self.files = files

    def plan(self, decision: Decision) -> Plan:
        amount = decision.amount
        if not isinstance(amount, MemorySuppressAmount):
            raise Refused(f"memory suppress needs a MemorySuppressAmount, got {type(amount).__name__}")
        if (decision.target.qos or "").upper() != "BE":
            raise Refused(f"memory suppress only touches BE pods; {decision.target.display} is "
                          f"{decision.target.qos or 'of unknown QoS'}")
        cgroup = decision.target.cgroup.strip("/")
        try:
            usage = int(self.files.read_raw(MEMORY_USAGE, cgroup).strip())
            limit_text = self.files.read_raw(MEMORY_HIGH, cgroup).strip()
        except CgroupVanished as e:
            raise Refused(f"target is gone: {e}") from None
        except (CgroupFileError, ValueError) as e:
            raise Refused(f"cannot read its memory: {e}") from None
        limit = None if limit_text == "max" or int(limit_text) >= UNLIMITED_V1 else int(limit_text)
        give_back, why = self._give_back(cgroup) if amount.give_back_to_node else (0, "")
        cap = int(usage * (1.0 + max(0.0, amount.headroom))) - give_back
        cap -= cap % 4096
        if cap < amount.floor_bytes:
            raise Refused(f"{decision.target.display} uses {usage >> 20} MiB: a cap there is under the "
                          f"{amount.floor_bytes >> 20} MiB floor")
        if limit is not None and cap >= limit:
            raise Refused(f"{decision.target.display} already has a memory limit of {limit >> 20} MiB <= {cap >> 20} MiB")
        path = self.files.path(MEMORY_HIGH, cgroup)
        write = FileWrite(str(path), limit_text, str(cap))
        return Plan(decision, f"memory suppress {decision.target.display}: limit "
                              f"{'none' if limit is None else f'{limit >> 20} MiB'} -> {cap >> 20} MiB "
                              f"(usage {usage >> 20} MiB{why})", (write,),
                    details={"usage_bytes": usage, "limit_bytes": cap, "give_back_bytes": give_back})

    def _give_back(self, cgroup: str) -> tuple[int, str]:
        """Bytes of the pod's page cache that bring the node's free memory to its target, and why."""
        node = read_node_memory(self.files.paths)
        if node is None:
            return 0, ""
        margin = max(FREE_MARGIN_MIN_BYTES, int(node.managed_pages * PAGE_BYTES * FREE_MARGIN_RATIO))
        target = node.wmark_high_pages * PAGE_BYTES + margin
        free = node.free_pages * PAGE_BYTES
        if free >= target:
            return 0, ""
        file_bytes = self._file_bytes(cgroup)
        give_back = min(target - free, int(file_bytes * GIVE_BACK_FILE_SHARE))
        give_back -= give_back % PAGE_BYTES
        if give_back <= 0:
            return 0, f"; the node lacks {(target - free) >> 20} MiB of free memory but it holds no page cache"
        return give_back, (f"; gives back {give_back >> 20} MiB of its {file_bytes >> 20} MiB page cache: node free "
                           f"{free >> 20} MiB, kswapd's high watermark + margin {target >> 20} MiB")

    def _file_bytes(self, cgroup: str) -> int:
        """The pod's page cache (file LRU pages, its whole subtree on v1 too); 0 when unreadable."""
        m = read_memstat(self.files.layout, "/" + cgroup)
        if m is None:
            return 0
        keys = ("total_inactive_file", "total_active_file") if m.cgroup_version == 1 else ("inactive_file", "active_file")
        return sum(m.stat.get(k, 0) for k in keys)
