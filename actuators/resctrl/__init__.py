# SPDX-License-Identifier: Apache-2.0
"""Resctrl (Intel RDT / AMD PQoS) actuator: L3 cache ways and memory bandwidth per QoS group.

Koordlet's layout: one control group per QoS class (``LSR``, ``LS``, ``BE``) directly under the
resctrl mount, each with a ``schemata`` holding ``L3:<dom>=<hex mask>;...`` and ``MB:<dom>=<n>;...``
lines, and the pods' task ids written into its ``tasks`` file.

Everything goes through two injectable seams so tests can use a temp dir that behaves like the
kernel: :class:`HostPaths` (where ``/proc`` and ``/sys/fs/resctrl`` are) and :class:`ResctrlFs`
(every read, write, mkdir and rmdir). A temp dir accepts any write, so the fake ``ResctrlFs`` in
``tests/fake_resctrl.py`` validates like the kernel does and fills ``info/last_cmd_status``.

Kernel facts this module relies on (fs/resctrl/ctrlmondata.c):
- a schemata write must end in a newline; all lines of one write are validated before any is
  applied, so one write is atomic, but writes to several lines or groups are not: ``apply`` writes
  one line per write (so the failing line is known) through :class:`actuators.journal.Journal`
  (originals on disk before the first write, rollback of the lines already written) and removes the
  groups it created;
- after any failed command, ``info/last_cmd_status`` holds the reason (or ``ok`` when the kernel
  gave none, e.g. an unknown domain id);
- ``tasks`` takes one id per write here (the kernel also accepts a comma list but stops at the
  first failure with the earlier ids moved, which is harder to account for); a task that exited
  gives ESRCH;
- removing a group moves its tasks back to the default group.

One module per job: :mod:`~actuators.resctrl.support` (can this node use it),
:mod:`~actuators.resctrl.fs` (the filesystem seam), :mod:`~actuators.resctrl.schemata` (info, schemata
lines, masks) and :mod:`~actuators.resctrl.actuator` (:class:`ResctrlActuator`). The names below are
re-exported so ``from actuators.resctrl import X`` keeps working.
"""

from actuators.resctrl.actuator import ResctrlActuator, TaskAssignment, cgroup_task_source
from actuators.resctrl.fs import KernelResctrlFs, ResctrlFileIO, ResctrlFs
from actuators.resctrl.schemata import (
    AMD_MB_UNLIMITED,
    INTEL_MB_MAX,
    QOS_GROUPS,
    L3Info,
    MbInfo,
    ResctrlInfo,
    format_line,
    l3_mask,
    mb_value,
    parse_schemata,
    qos_strategy_decisions,
    read_info,
)
from actuators.resctrl.support import CpuRdtFlags, ResctrlSupport, detect_support, rdt_flags, resctrl_root

__all__ = [
    "AMD_MB_UNLIMITED",
    "INTEL_MB_MAX",
    "QOS_GROUPS",
    "CpuRdtFlags",
    "KernelResctrlFs",
    "L3Info",
    "MbInfo",
    "ResctrlActuator",
    "ResctrlFileIO",
    "ResctrlFs",
    "ResctrlInfo",
    "ResctrlSupport",
    "TaskAssignment",
    "cgroup_task_source",
    "detect_support",
    "format_line",
    "l3_mask",
    "mb_value",
    "parse_schemata",
    "qos_strategy_decisions",
    "rdt_flags",
    "read_info",
    "resctrl_root",
]
