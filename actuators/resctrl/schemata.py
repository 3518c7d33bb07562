# SPDX-License-Identifier: Apache-2.0
"""Resctrl's ``info`` directory, ``schemata`` lines, L3 cache-way masks and memory-bandwidth values,
and the decisions a ``resource-qos-config`` strategy asks for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from actuators.base import ActionError, Refused
from actuators.resctrl.fs import KernelResctrlFs, ResctrlFs
from detector.decisions import ActionKind, Decision, ResctrlAmount, Target
from detector.policy import ResourceQosStrategy

QOS_GROUPS = ("LSR", "LS", "BE")
AMD_MB_UNLIMITED = 2048  # AMD MBA takes absolute units; 2048 means "no limit"
INTEL_MB_MAX = 100


# -- info, schemata, masks --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class L3Info:
    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int

    @property
    def ways(self) -> int:
        return self.cbm_mask.bit_count()


@dataclass(frozen=True, slots=True)
class MbInfo:
    bandwidth_gran: int
    min_bandwidth: int
    num_closids: int
    delay_linear: bool


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    l3: L3Info | None
    mb: MbInfo | None
    vendor: str


def _read_int(fs: ResctrlFs, path: Path, base: int = 10) -> int:
    text = fs.read(path).strip()
    try:
        return int(text, base)
    except ValueError:
        raise ActionError(f"resctrl: unexpected content {text[:40]!r} in {path}") from None


def read_info(root: Path, vendor: str, fs: ResctrlFs | None = None) -> ResctrlInfo:
    fs = fs or KernelResctrlFs()
    info = root / "info"
    l3 = mb = None
    if (info / "L3").is_dir():
        l3 = L3Info(
            cbm_mask=_read_int(fs, info / "L3/cbm_mask", 16),
            min_cbm_bits=_read_int(fs, info / "L3/min_cbm_bits"),
            num_closids=_read_int(fs, info / "L3/num_closids"),
            shareable_bits=_read_int(fs, info / "L3/shareable_bits", 16),
        )
    if (info / "MB").is_dir():
        mb = MbInfo(
            bandwidth_gran=_read_int(fs, info / "MB/bandwidth_gran"),
            min_bandwidth=_read_int(fs, info / "MB/min_bandwidth"),
            num_closids=_read_int(fs, info / "MB/num_closids"),
            delay_linear=_read_int(fs, info / "MB/delay_linear") == 1,
        )
    if l3 is None and mb is None:
        raise ActionError(f"resctrl: neither {info}/L3 nor {info}/MB exists (CDP on, or no allocation support)")
    return ResctrlInfo(l3, mb, vendor)


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """``{"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", ...}}``; the kernel pads names and values."""
    result: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or not name.strip():
            continue
        domains: dict[int, str] = {}
        for item in rest.split(";"):
            dom, eq, value = item.partition("=")
            if eq and dom.strip().isdigit():
                domains[int(dom)] = value.strip()
        result[name.strip()] = domains
    return result


def format_line(resource: str, values: dict[int, str]) -> str:
    return f"{resource}:" + ";".join(f"{dom}={values[dom]}" for dom in sorted(values))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def l3_mask(l3: L3Info, start_percent: int, end_percent: int) -> int:
    """Ways [ceil(ways*start%), ceil(ways*end%)) of ``cbm_mask``, contiguous, at least ``min_cbm_bits``.

    Koordlet's formula; when rounding leaves fewer than ``min_cbm_bits`` (or no) ways, the range is
    widened upwards first, then downwards, so the group still gets a mask the kernel accepts.
    """
    if not 0 <= start_percent < end_percent <= 100:
        raise Refused(f"resctrl: L3 range {start_percent}%..{end_percent}% is not 0 <= start < end <= 100")
    ways = l3.ways
    low_bit = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1
    if ways == 0 or ((l3.cbm_mask >> low_bit) + 1) & (l3.cbm_mask >> low_bit):
        raise ActionError(f"resctrl: cbm_mask {l3.cbm_mask:x} is not a contiguous run of ways")
    start = _ceil_div(ways * start_percent, 100)
    end = _ceil_div(ways * end_percent, 100)
    need = max(1, l3.min_cbm_bits)
    if end - start < need:
        end = min(ways, start + need)
        start = max(0, end - need)
    return ((1 << end) - (1 << start)) << low_bit


def mb_value(info: ResctrlInfo, percent: int) -> int:
    """The MB schemata value for ``percent`` of the bandwidth.

    Intel: a percent rounded up to ``bandwidth_gran``, at least ``min_bandwidth``, at most 100.
    AMD: absolute units where 2048 is unlimited; we map ``percent`` to that share of 2048 (rounded
    up), so 100 % stays unlimited.
    """
    if info.mb is None:
        raise Refused("resctrl: this host has no MBA (no info/MB)")
    if not 1 <= percent <= 100:
        raise Refused(f"resctrl: MBA {percent}% is not within 1..100")
    mb = info.mb
    if info.vendor == "amd":
        value = AMD_MB_UNLIMITED if percent == 100 else _ceil_div(AMD_MB_UNLIMITED * percent, 100)
        return min(AMD_MB_UNLIMITED, max(value, mb.min_bandwidth, 1))
    gran = max(1, mb.bandwidth_gran)
    return min(INTEL_MB_MAX, max(_ceil_div(percent, gran) * gran, mb.min_bandwidth))


def qos_strategy_decisions(strategy: ResourceQosStrategy) -> list[Decision]:
    """One RESCTRL decision per enabled class of a koordinator ``resource-qos-config`` (for :meth:`plan_groups`)."""
    decisions = []
    for group, qos in (("LSR", strategy.lsr), ("LS", strategy.ls), ("BE", strategy.be)):
        if qos.enable:
            amount = ResctrlAmount(group, qos.cat_range_start_percent, qos.cat_range_end_percent, qos.mba_percent)
            decisions.append(Decision(ActionKind.RESCTRL, Target(cgroup="", qos=group), amount,
                                      reason=f"resource-qos-config resctrlQOS for {group}"))
    return decisions


