# SPDX-License-Identifier: Apache-2.0
"""Resctrl actuator against a kernel-like fake resctrl fs (this host has no RDT) and the real host's status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actuators.base import ActionError, FileWrite, Plan, Refused
from actuators.resctrl import (
    L3Info,
    ResctrlActuator,
    ResctrlInfo,
    detect_support,
    l3_mask,
    mb_value,
    parse_schemata,
    qos_strategy_decisions,
    rdt_flags,
)
from detector.decisions import ActionKind, Decision, ResctrlAmount, Target
from detector.policy import ResctrlQos, ResourceQosStrategy
from probes.cgroupfiles import parse_cpuinfo
from probes.host import HostPaths
from tests.fake_resctrl import (
    AMD_1D,
    AMD_CPUINFO,
    INTEL_2S,
    INTEL_20WAY,
    INTEL_CPUINFO,
    INTEL_HASWELL,
    NO_RDT_CPUINFO,
    FakeMachine,
    FakeResctrl,
)


def decision(group: str, start: int = 0, end: int = 100, mba: int = 100, cgroup: str = "") -> Decision:
    return Decision(ActionKind.RESCTRL, Target(cgroup=cgroup, qos=group),
                    ResctrlAmount(group, start, end, mba), reason=f"test {group}")


def make(tmp_path: Path, machine: FakeMachine, **kw) -> tuple[FakeResctrl, ResctrlActuator]:
    fake = FakeResctrl(tmp_path, machine, **kw)
    actuator = ResctrlActuator(HostPaths.under(tmp_path), fs=fake.fs, journal_dir=tmp_path / "journal",
                               task_source=lambda target: [])
    return fake, actuator


@pytest.fixture
def sleepers():
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[int]:
        new = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(n)]
        procs.extend(new)
        return [p.pid for p in new]

    yield start
    for p in procs:
        p.kill()
        p.wait()


# -- support ----------------------------------------------------------------------------------


def test_cpuinfo_flags_from_sample_files():
    intel = rdt_flags(parse_cpuinfo(INTEL_CPUINFO))
    assert (intel.vendor, intel.cat_l3, intel.mba, intel.cqm_llc, intel.cqm_mbm_total, intel.cqm_mbm_local) == \
        ("intel", True, True, True, True, True)
    amd = rdt_flags(parse_cpuinfo(AMD_CPUINFO))
    assert (amd.vendor, amd.cat_l3, amd.mba) == ("amd", True, True)
    none = rdt_flags(parse_cpuinfo(NO_RDT_CPUINFO))
    assert (none.cat_l3, none.mba, none.cqm_llc) == (False, False, False)
    assert rdt_flags(parse_cpuinfo("")).vendor == "unknown"


def test_support_detection_on_fake_hosts(tmp_path):
    fake = FakeResctrl(tmp_path / "a", INTEL_2S)
    support = detect_support(HostPaths.under(fake.root))
    assert support.available and support.monitoring
    assert support.status.startswith("resctrl available") and "L3 CAT" in support.status

    FakeResctrl(tmp_path / "b", AMD_1D, mounted=False)
    support = detect_support(HostPaths.under(tmp_path / "b"))
    assert not support.available
    assert support.status.startswith("resctrl unavailable: resctrl is not mounted")

    (tmp_path / "c/proc").mkdir(parents=True)
    (tmp_path / "c/proc/cpuinfo").write_text(NO_RDT_CPUINFO)
    (tmp_path / "c/proc/mounts").write_text("resctrl /sys/fs/resctrl resctrl rw 0 0\n")
    support = detect_support(HostPaths.under(tmp_path / "c"))
    assert support.status == "resctrl unavailable: the CPU (amd) has neither cat_l3 nor mba in /proc/cpuinfo flags"

    support = detect_support(HostPaths.under(tmp_path / "missing"))
    assert support.status.startswith("resctrl unavailable: cannot read")


def test_real_host_reports_unavailable():
    support = detect_support(HostPaths())
    real_flags = rdt_flags(parse_cpuinfo(Path("/proc/cpuinfo").read_text()))
    real_mounted = "resctrl" in Path("/proc/filesystems").read_text() and any(
        line.split()[2] == "resctrl" for line in Path("/proc/mounts").read_text().splitlines())
    if (real_flags.cat_l3 or real_flags.mba) and real_mounted:
        pytest.skip("this host has resctrl mounted: the unavailable path cannot be checked here")
    assert not support.available
    assert support.status.startswith("resctrl unavailable: ")
    with pytest.raises(Refused, match=r"^resctrl unavailable: "):
        ResctrlActuator().plan(decision("BE", 0, 30))


# -- masks and MBA values ---------------------------------------------------------------------


@pytest.mark.parametrize(("cbm", "min_bits", "start", "end", "expected"), [
    (0x7FF, 1, 0, 100, 0x7FF),
    (0x7FF, 1, 0, 30, 0xF),  # ceil(11*0.3) = 4 ways: koordlet's BE default
    (0x7FF, 1, 10, 50, 0x3C),  # ways 2..5
    (0x3FF, 1, 10, 50, 0x1E),  # koordlet's own example
    (0xFFFFF, 1, 0, 30, 0x3F),
    (0xFFFFF, 1, 50, 100, 0xFFC00),
    (0xFFFFF, 2, 95, 100, 0xC0000),  # one way by the formula, widened to min_cbm_bits
    (0x7FF, 1, 0, 1, 0x1),  # ceil(0.11) = 1 way
    (0x7FF, 1, 99, 100, 0x400),  # ceil(10.89) = 11 = end: widened to one way
    (0xFFFF, 0, 0, 50, 0xFF),
])
def test_l3_masks(cbm, min_bits, start, end, expected):
    assert l3_mask(L3Info(cbm, min_bits, 16, 0), start, end) == expected


def test_every_mask_is_accepted_by_the_kernel_rules(tmp_path):
    for i, machine in enumerate((INTEL_2S, INTEL_20WAY, INTEL_HASWELL, AMD_1D)):
        fake = FakeResctrl(tmp_path / str(i), machine)
        l3 = L3Info(machine.cbm_mask, machine.min_cbm_bits, 16, 0)
        for start in range(0, 100, 5):
            for end in range(start + 5, 101, 5):
                mask = l3_mask(l3, start, end)
                assert fake._parse_cbm(f"{mask:x}") == mask, (machine.vendor, start, end)
                assert mask.bit_count() >= max(1, machine.min_cbm_bits)


@pytest.mark.parametrize("bad", [(30, 30), (-1, 50), (50, 101), (60, 40)])
def test_bad_l3_range_is_refused(bad):
    with pytest.raises(Refused, match="L3 range"):
        l3_mask(L3Info(0x7FF, 1, 16, 0), *bad)


def test_mba_rounding_intel_and_amd(tmp_path):
    intel = ResctrlActuator(HostPaths.under(tmp_path), fs=FakeResctrl(tmp_path, INTEL_2S).fs).info()
    assert [mb_value(intel, p) for p in (100, 91, 35, 30, 5, 1)] == [100, 100, 40, 30, 10, 10]
    amd_root = tmp_path / "amd"
    amd = ResctrlActuator(HostPaths.under(amd_root), fs=FakeResctrl(amd_root, AMD_1D).fs).info()
    assert amd.vendor == "amd"
    assert [mb_value(amd, p) for p in (100, 50, 25, 1)] == [2048, 1024, 512, 21]
    with pytest.raises(Refused, match="MBA 0%"):
        mb_value(intel, 0)
    with pytest.raises(Refused, match="no MBA"):
        mb_value(ResctrlInfo(intel.l3, None, "intel"), 50)


# -- apply / rollback / revert ----------------------------------------------------------------


def test_apply_intel_two_sockets_and_revert(tmp_path):
    fake, act = make(tmp_path, INTEL_2S)
    before = fake.snapshot()
    plan = act.plan(decision("BE", 0, 30, 35))
    assert plan.writes[0].old is None and plan.reversible
    assert plan.writes[0].new == "L3:0=f;1=f\nMB:0=40;1=40\n"
    assert "create BE" in plan.summary
    assert fake.commands == []  # planning changes nothing
    act.apply(plan)
    text = (fake.resctrl / "BE/schemata").read_text()
    assert text == "L3:0=00f;1=00f\nMB:0= 40;1= 40\n"  # the kernel pads values to one width
    assert parse_schemata(text) == {"L3": {0: "00f", 1: "00f"}, "MB": {0: "40", 1: "40"}}
    assert fake.l3["BE"] == {0: 0xF, 1: 0xF} and fake.mb["BE"] == {0: 40, 1: 40}
    # one line per write, newline-terminated
    assert [c for c in fake.commands if c[0] == "write"] == [
        ("write", "BE/schemata", "L3:0=f;1=f\n"), ("write", "BE/schemata", "MB:0=40;1=40\n")]
    act.revert(plan)
    assert not (fake.resctrl / "BE").exists()
    assert fake.snapshot() == before


def test_existing_group_is_restored_line_by_line_with_padded_values(tmp_path):
    fake, act = make(tmp_path, INTEL_20WAY)
    act.apply(act.plan(decision("LS")))  # create LS at defaults
    fake.schemata_write("LS", "L3:0=ff;1=fff\nMB:0=70;1=80\n")  # someone else's settings, kept by revert
    before = fake.snapshot()
    assert "MB:0=   70;1=   80" in (fake.resctrl / "LS/schemata").read_text()  # kernel pads to 5
    plan = act.plan(decision("LS", 0, 50, 50))
    assert plan.writes[0].old == (fake.resctrl / "LS/schemata").read_text()
    act.apply(plan)
    assert fake.l3["LS"] == {0: 0x3FF, 1: 0x3FF} and fake.mb["LS"] == {0: 50, 1: 50}
    act.revert(plan)
    assert fake.snapshot() == before
    assert fake.l3["LS"] == {0: 0xFF, 1: 0xFFF} and fake.mb["LS"] == {0: 70, 1: 80}


def test_amd_single_domain(tmp_path):
    fake, act = make(tmp_path, AMD_1D)
    plan = act.plan(decision("BE", 0, 30, 50))
    assert plan.writes[0].new == "L3:0=1f\nMB:0=1024\n"  # ceil(16*0.3)=5 ways
    act.apply(plan)
    assert fake.l3["BE"] == {0: 0x1F} and fake.mb["BE"] == {0: 1024}
    assert "MB:0=1024" in (fake.resctrl / "BE/schemata").read_text()


def test_invalid_mask_is_one_line_error_with_kernel_text_and_nothing_changes(tmp_path):
    fake, act = make(tmp_path, INTEL_2S)
    act.apply(act.plan(decision("LSR")))
    before = fake.snapshot()
    path = str(fake.resctrl / "LSR/schemata")
    bad = Plan(decision("LSR"), "hand-made", (FileWrite(path, "", "L3:0=f;1=f\nMB:0=50;1=50\nL3:0=70f;1=70f\n"),))
    with pytest.raises(ActionError) as exc:
        act.apply(bad)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "The mask 70f has non-consecutive 1-bits" in msg
    assert "rolled back 2 earlier write(s)" in msg
    assert fake.snapshot() == before


@pytest.mark.parametrize(("machine", "value", "kernel_text"), [
    (INTEL_2S, "L3:0=800;1=7ff", "Mask out of range"),  # a bit outside cbm_mask
    (INTEL_HASWELL, "L3:0=1", "Need at least 2 bits in the mask"),
    (INTEL_2S, "MB:0=5;1=100", "MB value 5 out of range [10,100]"),
    (AMD_1D, "MB:0=4096", "MB value 4096 out of range [0,2048]"),
    (INTEL_2S, "L3:0=7ff;0=7ff", "Duplicate domain 0"),
    (INTEL_2S, "XX:0=1", "Unknown or unsupported resource name 'XX'"),
])
def test_kernel_rejections_carry_last_cmd_status(tmp_path, machine, value, kernel_text):
    fake, act = make(tmp_path, machine)
    act.apply(act.plan(decision("LS")))
    before = fake.snapshot()
    plan = Plan(decision("LS"), "hand-made", (FileWrite(str(fake.resctrl / "LS/schemata"), "", value + "\n"),))
    with pytest.raises(ActionError, match=f"last_cmd_status: {kernel_text}".replace("[", r"\[")):
        act.apply(plan)
    assert fake.snapshot() == before


def test_multi_group_failure_rolls_back_groups_already_written(tmp_path):
    fake, act = make(tmp_path, INTEL_2S)
    act.apply(act.plan(decision("LSR", 0, 100, 90)))  # exists before: must be restored, not removed
    before = fake.snapshot()
    plan = act.plan_groups([decision("LSR", 0, 80, 80), decision("LS", 0, 90, 90), decision("BE", 0, 30, 30)])
    fake.online_domains.discard(1)  # socket 1's L3 went offline between plan and apply
    with pytest.raises(ActionError) as exc:
        act.apply(plan)
    assert "last_cmd_status: ok" in str(exc.value)  # the kernel gives no text for an unknown domain
    assert fake.snapshot() == before
    assert not (fake.resctrl / "LS").exists() and not (fake.resctrl / "BE").exists()


def test_out_of_closids_rolls_back_created_groups(tmp_path):
    fake, act = make(tmp_path, FakeMachine(**{**INTEL_2S.__dict__, "mb_closids": 3}))
    plan = act.plan_groups([decision("LSR"), decision("LS"), decision("BE", 0, 30)])
    expected = r"mkdir .*/BE: No space left on device \(last_cmd_status: Out of CLOSIDs\); removed 2 new group"
    with pytest.raises(ActionError, match=expected):
        act.apply(plan)
    assert sorted(p.name for p in fake.resctrl.iterdir() if (p / "schemata").exists()) == []
    assert set(fake.l3) == {""}


def test_plan_refusals(tmp_path):
    _, act = make(tmp_path, INTEL_2S)
    with pytest.raises(Refused, match="group 'XX'"):
        act.plan(decision("XX"))
    with pytest.raises(Refused, match="twice"):
        act.plan_groups([decision("BE"), decision("BE")])
    with pytest.raises(Refused, match="MBA 0%"):
        act.plan(decision("BE", mba=0))
    _, no_mb = make(tmp_path / "h", INTEL_HASWELL)
    with pytest.raises(Refused, match="no MBA"):
        no_mb.plan(decision("BE", 0, 30, 50))
    assert no_mb.plan(decision("BE", 0, 30)).writes[0].new == "L3:0=3f\n"


class JournalCheckingFs:
    """Wraps the fake kernel fs: before every schemata write, the journal on disk must hold that file's original."""

    def __init__(self, fake: FakeResctrl, journal_file: Path) -> None:
        self.inner, self.journal_file = fake.fs, journal_file
        self.checked: list[str] = []
        self.read, self.mkdir, self.rmdir = self.inner.read, self.inner.mkdir, self.inner.rmdir

    def write(self, path: Path, data: str) -> None:
        if Path(path).name == "schemata":
            entries = {e["path"]: e for e in json.loads(self.journal_file.read_text())["entries"]}
            assert str(path) in entries, f"{path} written before its original was journaled"
            self.checked.append(entries[str(path)]["original"])
        self.inner.write(path, data)


def test_originals_are_on_disk_before_the_first_write_and_survive_a_crash(tmp_path):
    fake, act = make(tmp_path, INTEL_2S)
    act.apply(act.plan(decision("BE")))
    original = (fake.resctrl / "BE/schemata").read_text().strip()
    journal_dir = tmp_path / "journal2"
    checking = JournalCheckingFs(fake, journal_dir / "journal.json")
    crashed = ResctrlActuator(HostPaths.under(tmp_path), fs=checking, journal_dir=journal_dir, task_source=lambda t: [])
    crashed.apply(crashed.plan(decision("BE", 0, 30, 50)))
    assert checking.checked == [original, original]  # both lines, the original recorded once
    assert fake.l3["BE"] == {0: 0xF, 1: 0xF}
    # the agent died here; the next one reconciles from the journal left on disk
    restarted = ResctrlActuator(HostPaths.under(tmp_path), fs=fake.fs, journal_dir=journal_dir)
    report = restarted.journal.reconcile()
    assert report.restored == [str(fake.resctrl / "BE/schemata")]
    assert (fake.resctrl / "BE/schemata").read_text().strip() == original


# -- tasks ------------------------------------------------------------------------------------


def test_incremental_task_assignment_skips_present_and_vanished(tmp_path, sleepers):
    fake, act = make(tmp_path, INTEL_2S)
    act.apply(act.plan(decision("BE", 0, 30)))
    a, b, c, gone = sleepers(4)
    os.kill(gone, 9)
    os.waitpid(gone, 0)
    first = act.assign_tasks("BE", [a, b])
    assert first.added == [a, b] and first.already == 0
    n = len(fake.commands)
    second = act.assign_tasks("BE", [a, b, c, gone, c])
    assert second.added == [c] and second.already == 2 and second.vanished == [gone]
    task_writes = [cmd for cmd in fake.commands[n:] if cmd[1] == "BE/tasks"]
    assert task_writes == [("write", "BE/tasks", f"{c}\n"), ("write", "BE/tasks", f"{gone}\n")]
    assert fake.tasks["BE"] == [a, b, c]
    assert f"No task {gone}" in fake.last_cmd_status


def test_apply_moves_the_target_cgroups_real_tasks_and_revert_moves_them_back(tmp_path, make_cgroup):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup")
    cg = make_cgroup("be", ("cpu",))
    proc = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                             "threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"],
                            preexec_fn=cg.preexec)
    try:
        cpu_dir = cg.dirs["cpu"]
        for _ in range(100):
            tids = {int(t) for t in (cpu_dir / "tasks").read_text().split()}
            if len(tids) >= 2:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        assert len(tids) == 2, tids  # main thread + sleeper thread, read from the kernel
        fake = FakeResctrl(tmp_path, INTEL_2S)
        act = ResctrlActuator(HostPaths(cgroup_root=Path("/sys/fs/cgroup"), proc=tmp_path / "proc", sys=tmp_path / "sys"),
                              fs=fake.fs, journal_dir=tmp_path / "journal")
        from probes.cgroupfs import discover
        rel = str(cpu_dir.relative_to(discover().cpu.mount))
        plan = act.plan(decision("BE", 0, 30, cgroup=rel))
        act.apply(plan)
        assert set(fake.tasks["BE"]) == tids
        act.revert(plan)
        assert not (fake.resctrl / "BE").exists()
        assert tids <= set(fake.tasks[""])
    finally:
        proc.kill()
        proc.wait()


def test_task_failure_rolls_back_everything(tmp_path, sleepers):
    a, b = sleepers(2)
    fake = FakeResctrl(tmp_path, INTEL_2S)
    fake.tasks[""].extend([a, b])
    fake._sync("")
    act = ResctrlActuator(HostPaths.under(tmp_path), fs=fake.fs, journal_dir=tmp_path / "j", task_source=lambda t: [a, -5, b])
    before = fake.snapshot()
    with pytest.raises(ActionError, match=r"moving task -5 .*Invalid pid -5"):
        act.apply(act.plan(decision("BE", 0, 30)))
    assert fake.snapshot() == before and fake.group_of(a) == ""


def test_koordinator_qos_strategy_defaults_applied_as_one_plan(tmp_path):
    fake, act = make(tmp_path, INTEL_2S)
    assert qos_strategy_decisions(ResourceQosStrategy()) == []  # resctrlQOS is off by default
    on = ResctrlQos(enable=True)
    strategy = ResourceQosStrategy(lsr=on, ls=on, be=ResctrlQos(enable=True, cat_range_end_percent=30, mba_percent=50))
    plan = act.plan_groups(qos_strategy_decisions(strategy))
    act.apply(plan)
    assert fake.l3["LSR"] == fake.l3["LS"] == {0: 0x7FF, 1: 0x7FF}
    assert fake.l3["BE"] == {0: 0xF, 1: 0xF} and fake.mb["BE"] == {0: 50, 1: 50}
    act.revert(plan)
    assert set(fake.l3) == {""}
