# SPDX-License-Identifier: Apache-2.0
"""A temp-dir resctrl filesystem that refuses what the kernel refuses.

:func:`build` lays out ``<root>/sys/fs/resctrl`` exactly like the kernel does (``info/L3``,
``info/MB``, ``info/last_cmd_status``, ``schemata``, ``tasks``, ``cpus``, ``cpus_list``,
``mon_data/mon_L3_XX/*``, ``mon_groups``) plus ``<root>/proc/cpuinfo`` and ``<root>/proc/mounts``,
for an Intel 2-socket or an AMD single-domain machine.

A temp dir accepts any write, so all changes must go through :class:`FakeResctrlFs` (the
``ResctrlFs`` the actuator takes). It validates schemata writes with the rules and messages of
``fs/resctrl/ctrlmondata.c`` (all lines of one write are checked before any is applied), emulates
``tasks`` (a task lives in exactly one group; a missing task gives ESRCH and ``No task <pid>``),
``mkdir`` (new group with full masks; ENOSPC and ``Out of CLOSIDs`` past ``num_closids``) and
``rmdir`` (tasks return to the default group). Every command resets ``info/last_cmd_status`` to
``ok`` or the kernel's message.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class FakeMachine:
    vendor: str  # "intel" | "amd"
    domains: tuple[int, ...]  # L3 (and MB) domain ids
    cbm_mask: int
    min_cbm_bits: int
    l3_closids: int
    mb_gran: int
    mb_min: int
    mb_max: int
    mb_closids: int
    delay_linear: bool
    sparse_masks: bool  # AMD accepts non-contiguous masks
    cpus: int
    monitoring: bool = True
    mba: bool = True

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()

    @property
    def data_width(self) -> int:
        # show_doms pads every value to the widest resource: cache masks (cbm_len+3)/4 hex digits,
        # MB 3 digits (Intel percent) or 4 (AMD units).
        mb_width = 4 if self.vendor == "amd" else 3
        return max((self.cbm_len + 3) // 4, mb_width if self.mba else 0)

    @property
    def max_groups(self) -> int:
        return min(self.l3_closids, self.mb_closids) if self.mba else self.l3_closids


# Skylake-SP 2-socket: 11 ways, MBA in 10 % steps, 16/8 closids.
INTEL_2S = FakeMachine("intel", (0, 1), 0x7FF, 1, 16, 10, 10, 100, 8, True, False, cpus=8)
# A 20-way Xeon: schemata values are padded to 5 characters ("MB:0=  100").
INTEL_20WAY = replace(INTEL_2S, cbm_mask=0xFFFFF)
# Haswell needs at least 2 ways.
INTEL_HASWELL = replace(INTEL_2S, domains=(0,), min_cbm_bits=2, cbm_mask=0xFFFFF, mba=False)
# EPYC with one L3 domain exposed: 16 ways, sparse masks allowed, MB absolute units up to 2048.
AMD_1D = FakeMachine("amd", (0,), 0xFFFF, 0, 16, 1, 0, 2048, 16, False, True, cpus=8)

INTEL_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse \
sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology \
nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid \
dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch \
cpuid_fault epb cat_l3 cdp_l3 invpcid_single pti intel_ppin ssbd mba ibrs ibpb stibp tpr_shadow flexpriority ept \
vpid ept_ad fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm cqm mpx rdt_a avx512f avx512dq rdseed adx \
smap clflushopt clwb intel_pt avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc \
cqm_mbm_total cqm_mbm_local dtherm ida arat pln pts pku ospke md_clear flush_l1d arch_capabilities
"""

AMD_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7502P 32-Core Processor
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid aperfmperf \
pni pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm \
extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext perfctr_core perfctr_nb \
bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd mba ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 \
cqm rdt_a rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total \
cqm_mbm_local clzero irperf xsaveerptr wbnoinvd arat npt lbrv svm_lock nrip_save
"""

# A VM without RDT (what this project's CI host looks like): no cat_l3, no mba.
NO_RDT_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC-Milan Processor
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 \
syscall nx rdtscp lm constant_tsc rep_good nopl cpuid pni ssse3 fma cx16 sse4_1 sse4_2 hypervisor lahf_lm
"""

RESCTRL_MOUNT_LINE = "resctrl /sys/fs/resctrl resctrl rw,relatime 0 0\n"
BASE_MOUNTS = "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\nsysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"


def _task_exists(tid: int) -> bool:
    return os.path.exists(f"/proc/{tid}")


class FakeResctrl:
    """The fake host (``root``) plus the kernel-like state behind ``<root>/sys/fs/resctrl``."""

    def __init__(self, root: Path, machine: FakeMachine, *, mounted: bool = True,
                 task_exists: Callable[[int], bool] = _task_exists, default_tasks: tuple[int, ...] = ()) -> None:
        self.root = root
        self.machine = machine
        self.resctrl = root / "sys/fs/resctrl"
        self.task_exists = task_exists
        self.online_domains: set[int] = set(machine.domains)
        self.l3: dict[str, dict[int, int]] = {}  # group ("" = default) -> domain -> mask
        self.mb: dict[str, dict[int, int]] = {}
        self.tasks: dict[str, list[int]] = {}
        self.commands: list[tuple[str, str, str]] = []  # (op, path relative to resctrl, data): every command seen
        self._build(mounted, default_tasks)
        self.fs = FakeResctrlFs(self)

    # -- layout --------------------------------------------------------------------------------
    def _build(self, mounted: bool, default_tasks: tuple[int, ...]) -> None:
        m = self.machine
        proc = self.root / "proc"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cpuinfo").write_text(INTEL_CPUINFO if m.vendor == "intel" else AMD_CPUINFO)
        (proc / "mounts").write_text(BASE_MOUNTS + (RESCTRL_MOUNT_LINE if mounted else ""))
        if not mounted:
            return
        info = self.resctrl / "info"
        l3 = info / "L3"
        l3.mkdir(parents=True)
        (l3 / "cbm_mask").write_text(f"{m.cbm_mask:x}\n")
        (l3 / "min_cbm_bits").write_text(f"{m.min_cbm_bits}\n")
        (l3 / "num_closids").write_text(f"{m.l3_closids}\n")
        (l3 / "shareable_bits").write_text("0\n")
        (l3 / "bit_usage").write_text(";".join(f"{d}=" + "X" * m.cbm_len for d in m.domains) + "\n")
        if m.mba:
            mb = info / "MB"
            mb.mkdir()
            (mb / "bandwidth_gran").write_text(f"{m.mb_gran}\n")
            (mb / "min_bandwidth").write_text(f"{m.mb_min}\n")
            (mb / "num_closids").write_text(f"{m.mb_closids}\n")
            (mb / "delay_linear").write_text(f"{int(m.delay_linear)}\n")
        if m.monitoring:
            mon = info / "L3_MON"
            mon.mkdir()
            (mon / "mon_features").write_text("llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n")
            (mon / "num_rmids").write_text("176\n")
        (info / "last_cmd_status").write_text("ok\n")
        self._make_group("", tuple(default_tasks))

    def _group_dir(self, group: str) -> Path:
        return self.resctrl / group if group else self.resctrl

    def _make_group(self, group: str, tasks: tuple[int, ...] = ()) -> None:
        m = self.machine
        d = self._group_dir(group)
        d.mkdir(exist_ok=True)
        self.l3[group] = dict.fromkeys(m.domains, m.cbm_mask)
        if m.mba:
            self.mb[group] = dict.fromkeys(m.domains, m.mb_max)
        self.tasks[group] = list(tasks)
        (d / "cpus").write_text(f"{(1 << m.cpus) - 1 if not group else 0:x}\n")
        (d / "cpus_list").write_text(f"0-{m.cpus - 1}\n" if not group else "\n")
        (d / "mode").write_text("shareable\n")
        (d / "mon_groups").mkdir(exist_ok=True)
        if m.monitoring:
            for dom in m.domains:
                md = d / "mon_data" / f"mon_L3_{dom:02d}"
                md.mkdir(parents=True, exist_ok=True)
                for name in ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"):
                    (md / name).write_text("0\n")
        self._sync(group)

    def _sync(self, group: str) -> None:
        m = self.machine
        d = self._group_dir(group)
        w = m.data_width
        lines = ["L3:" + ";".join(f"{dom}={self.l3[group][dom]:0{w}x}" for dom in sorted(self.l3[group]))]
        if m.mba:
            lines.append("MB:" + ";".join(f"{dom}={self.mb[group][dom]:{w}d}" for dom in sorted(self.mb[group])))
        (d / "schemata").write_text("\n".join(lines) + "\n")
        (d / "tasks").write_text("".join(f"{t}\n" for t in self.tasks[group]))

    def _status(self, message: str = "") -> None:
        (self.resctrl / "info/last_cmd_status").write_text(message or "ok\n")

    # -- test helpers --------------------------------------------------------------------------
    def group_of(self, tid: int) -> str | None:
        return next((g for g, ts in self.tasks.items() if tid in ts), None)

    @property
    def last_cmd_status(self) -> str:
        return (self.resctrl / "info/last_cmd_status").read_text().strip()

    def snapshot(self) -> dict[str, str]:
        """Every group's schemata and task set (the kernel lists tasks in no set order), for "nothing changed" checks."""
        return {g: (self._group_dir(g) / "schemata").read_text() + "|" + ",".join(map(str, sorted(self.tasks[g])))
                for g in sorted(self.l3)}

    # -- kernel behaviour ----------------------------------------------------------------------
    def group_for(self, directory: Path) -> str | None:
        """The group a directory is ("" for the resctrl root), None if it is not a live group."""
        try:
            parts = Path(directory).relative_to(self.resctrl).parts
        except ValueError:
            return None
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 and parts[0] in self.l3 else None

    def schemata_write(self, group: str, data: str) -> None:
        if not data.endswith("\n"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))  # rejected before last_cmd_clear
        self._status()
        staged_l3: dict[int, int] = {}
        staged_mb: dict[int, int] = {}
        for tok in data[:-1].split("\n"):
            resname, sep, rest = tok.partition(":")
            resname = resname.strip()
            if not sep:
                self._fail("Missing ':'\n")
            if rest == "":
                self._fail(f"Missing '{resname}' value\n")
            if resname == "L3":
                self._parse_line(rest, staged_l3, self._parse_cbm)
            elif resname == "MB" and self.machine.mba:
                self._parse_line(rest, staged_mb, self._parse_bw)
            else:
                self._fail(f"Unknown or unsupported resource name '{resname}'\n")
        self.l3[group].update(staged_l3)
        if self.machine.mba:
            self.mb[group].update(staged_mb)
        self._sync(group)

    def _fail(self, message: str, code: int = errno.EINVAL) -> None:
        if message:
            self._status(message)
        raise OSError(code, os.strerror(code))

    def _parse_line(self, line: str, staged: dict[int, int], parse: Callable[[str], int]) -> None:
        for item in line.split(";"):
            if item == "":
                break  # the kernel stops at an empty remainder
            dom_id, eq, value = item.partition("=")
            if not eq or not dom_id.isdigit():
                self._fail("Missing '=' or non-numeric domain\n")
            dom = int(dom_id)
            if dom not in self.online_domains:
                self._fail("")  # the kernel returns EINVAL here without a message: status stays "ok"
            if dom in staged:
                self._fail(f"Duplicate domain {dom}\n")
            staged[dom] = parse(value.strip())

    def _parse_cbm(self, text: str) -> int:
        m = self.machine
        try:
            val = int(text, 16)
        except ValueError:
            self._fail(f"Non-hex character in the mask {text}\n")
        if (m.min_cbm_bits > 0 and val == 0) or val > m.cbm_mask:
            self._fail("Mask out of range\n")
        if val == 0:
            return val
        first = (val & -val).bit_length() - 1
        run = val >> first
        zero = first + (~run & (run + 1)).bit_length() - 1  # first clear bit above the first run
        if not m.sparse_masks and val >> zero:
            self._fail(f"The mask {val:x} has non-consecutive 1-bits\n")
        if zero - first < m.min_cbm_bits:
            self._fail(f"Need at least {m.min_cbm_bits} bits in the mask\n")
        return val

    def _parse_bw(self, text: str) -> int:
        m = self.machine
        if not m.delay_linear and m.vendor == "intel":
            self._fail("No support for non-linear MB domains\n")
        if not text.isdigit():
            self._fail(f"Invalid MB value {text}\n")
        bw = int(text)
        if bw < m.mb_min or bw > m.mb_max:
            self._fail(f"MB value {bw} out of range [{m.mb_min},{m.mb_max}]\n")
        return -(-bw // m.mb_gran) * m.mb_gran

    def tasks_write(self, group: str, data: str) -> None:
        self._status()
        for pid_str in data.strip().split(","):
            pid_str = pid_str.strip()
            try:
                pid = int(pid_str, 0)
            except ValueError:
                self._fail(f"Task list parsing error pid {pid_str}\n")
            if pid < 0:
                self._fail(f"Invalid pid {pid}\n")
            if not self.task_exists(pid):
                self._status(f"No task {pid}\nError while processing task {pid}\n")
                raise OSError(errno.ESRCH, os.strerror(errno.ESRCH))
            for members in self.tasks.values():
                if pid in members:
                    members.remove(pid)
            self.tasks[group].append(pid)
        for g in self.tasks:
            self._sync(g)

    def mkdir(self, path: Path) -> None:
        self._status()
        if path.parent != self.resctrl:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        if path.exists():
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
        if len(self.l3) >= self.machine.max_groups:
            self._fail("Out of CLOSIDs\n", errno.ENOSPC)
        self._make_group(path.name)

    def rmdir(self, path: Path) -> None:
        group = self.group_for(path)
        if not group:
            raise OSError(errno.ENOENT if not path.exists() else errno.EPERM, "not a resctrl group")
        self.tasks[""].extend(self.tasks.pop(group))
        del self.l3[group]
        self.mb.pop(group, None)
        shutil.rmtree(path)
        self._sync("")


class FakeResctrlFs:
    """The ``ResctrlFs`` for a :class:`FakeResctrl`: reads are plain file reads, changes are validated."""

    def __init__(self, fake: FakeResctrl) -> None:
        self.fake = fake

    def read(self, path: Path) -> str:
        return Path(path).read_text()

    def write(self, path: Path, data: str) -> None:
        path = Path(path)
        self.fake.commands.append(("write", str(path.relative_to(self.fake.resctrl)), data))
        group = self.fake.group_for(path.parent) if path.name in ("schemata", "tasks") else None
        if group is None or not path.exists():
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if path.name == "schemata":
            self.fake.schemata_write(group, data)
        else:
            self.fake.tasks_write(group, data)

    def mkdir(self, path: Path) -> None:
        self.fake.commands.append(("mkdir", str(Path(path).relative_to(self.fake.resctrl)), ""))
        self.fake.mkdir(Path(path))

    def rmdir(self, path: Path) -> None:
        self.fake.commands.append(("rmdir", str(Path(path).relative_to(self.fake.resctrl)), ""))
        self.fake.rmdir(Path(path))
