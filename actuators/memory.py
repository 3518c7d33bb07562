"""BE memory suppress: cap a BestEffort pod's memory near its usage when its growth drives global reclaim.

Global (direct) reclaim stalls every pod's allocations, the LS victim's too, while a BE pod's page
cache or heap keeps growing. Capping the BE pod at ``usage * (1 + headroom)`` (cgroup v1
``memory.limit_in_bytes``, v2 ``memory.high``: throttled and reclaimed, not OOM-killed) stops the
growth, and reclaim then takes the BE pod's pages first. Journaled like every file change, verified
and reverted by the manager like any action. Memcg reclaim at the victim's *own* limit is never a
neighbour's doing: no decision ever comes here for it (advice only, see actuators/mitigate.py).

Refused: non-BE targets (also by the manager), a cap that would not be lower than the current
limit, and a cap under ``floor_bytes``.
"""

from __future__ import annotations

from actuators.base import FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupFileError, CgroupFiles, CgroupVanished, Resource
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, Decision, MemorySuppressAmount

UNLIMITED_V1 = 1 << 62  # v1 reads an unlimited limit as a page-rounded 2^63 - 1


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
            usage = int(self.files.read_raw(Resource.MEMORY_USAGE, cgroup).strip())
            limit_text = self.files.read_raw(Resource.MEMORY_LIMIT, cgroup).strip()
        except CgroupVanished as e:
            raise Refused(f"target is gone: {e}") from None
        except (CgroupFileError, ValueError) as e:
            raise Refused(f"cannot read its memory: {e}") from None
        limit = None if limit_text == "max" or int(limit_text) >= UNLIMITED_V1 else int(limit_text)
        cap = int(usage * (1.0 + max(0.0, amount.headroom)))
        cap -= cap % 4096
        if cap < amount.floor_bytes:
            raise Refused(f"{decision.target.display} uses {usage >> 20} MiB: a cap there is under the "
                          f"{amount.floor_bytes >> 20} MiB floor")
        if limit is not None and cap >= limit:
            raise Refused(f"{decision.target.display} already has a memory limit of {limit >> 20} MiB <= {cap >> 20} MiB")
        path = self.files.path(Resource.MEMORY_LIMIT, cgroup)
        write = FileWrite(str(path), limit_text, str(cap))
        return Plan(decision, f"memory suppress {decision.target.display}: limit "
                              f"{'none' if limit is None else f'{limit >> 20} MiB'} -> {cap >> 20} MiB "
                              f"(usage {usage >> 20} MiB)", (write,),
                    details={"usage_bytes": usage, "limit_bytes": cap})
