# SPDX-License-Identifier: Apache-2.0
"""Whether this node can use resctrl: the CPU's RDT flags in ``/proc/cpuinfo`` and the resctrl mount."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from probes.cgroupfiles import PROC_CPUINFO, PROC_MOUNTS, CpuInfo
from probes.host import HostPaths

# -- support detection ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuRdtFlags:
    vendor: str  # "intel" | "amd" | "other" | "unknown"
    cat_l3: bool = False
    mba: bool = False
    cqm_llc: bool = False
    cqm_mbm_total: bool = False
    cqm_mbm_local: bool = False


def rdt_flags(info: CpuInfo) -> CpuRdtFlags:
    """Vendor and RDT flags of the CPU (``/proc/cpuinfo``'s first processor block)."""
    vendor_id, flags = info.vendor_id, info.flags
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}.get(
        vendor_id, "other" if vendor_id else "unknown")
    return CpuRdtFlags(
        vendor=vendor,
        cat_l3="cat_l3" in flags,
        mba="mba" in flags,
        cqm_llc="cqm_llc" in flags,
        cqm_mbm_total="cqm_mbm_total" in flags,
        cqm_mbm_local="cqm_mbm_local" in flags,
    )


@dataclass(frozen=True, slots=True)
class ResctrlSupport:
    cpu: CpuRdtFlags
    mounted: bool
    root: Path  # where the resctrl filesystem is (or would be) on this host root
    reason: str = ""  # why it is unavailable; empty when available

    @property
    def available(self) -> bool:
        return not self.reason

    @property
    def monitoring(self) -> bool:
        return self.available and (self.cpu.cqm_llc or self.cpu.cqm_mbm_total or self.cpu.cqm_mbm_local)

    @property
    def status(self) -> str:
        if self.reason:
            return f"resctrl unavailable: {self.reason}"
        parts = [p for p, ok in (("L3 CAT", self.cpu.cat_l3), ("MBA", self.cpu.mba),
                                 ("LLC occupancy", self.cpu.cqm_llc),
                                 ("MBM total", self.cpu.cqm_mbm_total), ("MBM local", self.cpu.cqm_mbm_local)) if ok]
        return f"resctrl available at {self.root} ({self.cpu.vendor}): {', '.join(parts)}"


def resctrl_root(paths: HostPaths) -> Path:
    return paths.sys / "fs/resctrl"


def detect_support(paths: HostPaths | None = None) -> ResctrlSupport:
    """Is resctrl usable here? Needs a CPU flag (``cat_l3`` or ``mba``) and a mounted resctrl fs."""
    paths = paths or HostPaths()
    root = resctrl_root(paths)
    try:
        cpu = rdt_flags(PROC_CPUINFO.read(paths))
    except OSError as e:
        return ResctrlSupport(CpuRdtFlags("unknown"), False, root, f"cannot read {PROC_CPUINFO.at(paths)}: {e.strerror}")
    mounted = any(m.fstype == "resctrl" for m in PROC_MOUNTS.read_or_none(paths) or ())
    if not (cpu.cat_l3 or cpu.mba):
        reason = f"the CPU ({cpu.vendor}) has neither cat_l3 nor mba in /proc/cpuinfo flags"
    elif not mounted:
        reason = "resctrl is not mounted (no resctrl entry in /proc/mounts; mount -t resctrl resctrl /sys/fs/resctrl)"
    elif not (root / "info").is_dir():
        reason = f"resctrl is mounted but {root}/info does not exist (host root mismatch?)"
    else:
        reason = ""
    return ResctrlSupport(cpu, mounted, root, reason)


