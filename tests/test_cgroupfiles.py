"""probes/cgroupfiles.py: cgroup files the probes and the actuators both read are declared once, so the
same bad text gives the same one-line parse error on both sides (the probes skip it, the actuators
report it), on v1 and v2 spellings alike. Temp file trees only: no real cgroup is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from actuators.cgroupfile import CgroupFileError, CgroupFiles
from probes.cgroupfiles import (
    CPU_MAX,
    CPUSET_CPUS,
    CPUSET_EFFECTIVE_CPUS,
    CgroupFileParseError,
    CpuMax,
    parse_cpu_list,
)
from probes.cgroupfs import discover
from probes.cgroupwatch import CgroupWatch
from probes.cpuacct import CgroupCpuReader, cpu_stat_unavailable_reason, read_cgroup_cpu
from tests.helpers_actuators import fake_v1_host, fake_v2_host

CG = "kubepods.slice/kubepods-besteffort.slice"


def _parse_error(file, version: int, *texts: str) -> str:
    with pytest.raises(CgroupFileParseError) as e:
        file.parse(version, *texts)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_declarations_name_both_spellings():
    assert CPU_MAX.names(1) == ("cpu.cfs_quota_us", "cpu.cfs_period_us") and CPU_MAX.names(2) == ("cpu.max",)
    assert CPUSET_CPUS.names(1) == CPUSET_CPUS.names(2) == ("cpuset.cpus",)
    assert CPUSET_EFFECTIVE_CPUS.names(1) == ("cpuset.effective_cpus",)
    assert CPUSET_EFFECTIVE_CPUS.names(2) == ("cpuset.cpus.effective",)
    assert CPU_MAX.parse(2, "max 100000\n") == CpuMax(None, 100000)
    assert CPU_MAX.parse(2, "50000 100000") == CpuMax(50000, 100000)
    assert CPU_MAX.parse(1, "-1\n", "100000\n") == CpuMax(None, 100000)
    assert CPU_MAX.parse(1, "30000\n", "50000\n").cores == 0.6
    assert parse_cpu_list("0-2,5,4\n") == (0, 1, 2, 4, 5)


@pytest.mark.parametrize("bad", ["lots 100000", "50000 0", "max", "-1 100000", "1 2 3"])
def test_bad_cpu_max_same_error_from_probe_and_actuator_v2(tmp_path: Path, bad: str) -> None:
    paths = fake_v2_host(tmp_path, ["kubepods.slice", CG])
    (tmp_path / "sys/fs/cgroup" / CG / "cpu.max").write_text(bad + "\n")
    expected = _parse_error(CPU_MAX, 2, bad + "\n")
    layout = discover(paths)

    # The probes skip the value (no reading rather than a guess) and say why in the parser's words.
    assert read_cgroup_cpu(layout, "/" + CG) is None
    assert CgroupCpuReader(layout, "/" + CG).read() is None
    reason = cpu_stat_unavailable_reason(layout, "/" + CG)
    assert reason is not None and reason.endswith(": " + expected)

    # The actuators surface it as one line: the file's path, then the same words.
    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpu_max(CG)
    assert str(e.value) == f"{tmp_path / 'sys/fs/cgroup' / CG / 'cpu.max'}: {expected}"


def test_bad_cfs_quota_same_error_from_probe_and_actuator_v1(tmp_path: Path) -> None:
    paths = fake_v1_host(tmp_path, ["kubepods", "kubepods/besteffort"])
    cg = "kubepods/besteffort"
    (tmp_path / "sys/fs/cgroup/cpu" / cg / "cpu.cfs_quota_us").write_text("fifty\n")
    expected = _parse_error(CPU_MAX, 1, "fifty\n", "100000\n")

    # The probe reads usage and skips the bandwidth it cannot parse (no quota, no throttling).
    stat = CgroupCpuReader(discover(paths), "/" + cg).read()
    assert stat is not None and stat.quota_us is None and stat.period_us is None

    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpu_max(cg)
    assert str(e.value) == f"{tmp_path / 'sys/fs/cgroup/cpu' / cg / 'cpu.cfs_quota_us'}: {expected}"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("bad", ["1,x,3", "0-100000000", "3-1", "0x3"])
def test_bad_cpu_list_skipped_by_the_watch_reported_by_the_actuator(tmp_path: Path, version: int, bad: str) -> None:
    if version == 2:
        paths = fake_v2_host(tmp_path, ["kubepods.slice", CG])
        cg, cg_dir = CG, tmp_path / "sys/fs/cgroup" / CG
    else:
        paths = fake_v1_host(tmp_path, ["kubepods", "kubepods/besteffort"])
        cg, cg_dir = "kubepods/besteffort", tmp_path / "sys/fs/cgroup/cpuset/kubepods/besteffort"
    (effective,) = CPUSET_EFFECTIVE_CPUS.names(version)
    (configured,) = CPUSET_CPUS.names(version)
    expected = _parse_error(CPUSET_CPUS, version, bad)
    assert _parse_error(CPUSET_EFFECTIVE_CPUS, version, bad) == expected

    # The collector's watch: a good list is read, a bad one is skipped (the last good value stays).
    (cg_dir / effective).write_text("0-1\n")
    watch = CgroupWatch(discover(paths), slow_refresh_ticks=1)
    watch.set_listed(["/" + cg])
    watch.tick()
    assert watch.cpus["/" + cg] == (0, 1)
    (cg_dir / effective).write_text(bad + "\n")
    watch.tick()
    assert watch.cpus["/" + cg] == (0, 1)
    watch.close()

    (cg_dir / configured).write_text(bad + "\n")
    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpus(cg)
    assert str(e.value) == f"{cg_dir / configured}: {expected}"
