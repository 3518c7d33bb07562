# SPDX-License-Identifier: Apache-2.0
"""testkit/sandbox.py's v1 -> v2 file spelling: tests and benches set cgroup files by their v1 names; on a
pure cgroup v2 host the same setting goes to the v2 file (checked here on files in a temp dir; the VM
lane runs the scenario bench and the tests on real v2 cgroups)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.sandbox import write_cgroup_file


@pytest.fixture
def v2_dir(tmp_path: Path) -> Path:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cpu.weight").write_text("100\n")
    (tmp_path / "memory.max").write_text("max\n")
    return tmp_path


def test_v1_names_are_written_as_their_v2_files(v2_dir: Path) -> None:
    write_cgroup_file(v2_dir, "cpu.cfs_quota_us", "25000")
    assert (v2_dir / "cpu.max").read_text() == "25000 100000"
    write_cgroup_file(v2_dir, "cpu.cfs_period_us", "50000")
    assert (v2_dir / "cpu.max").read_text() == "25000 50000"
    write_cgroup_file(v2_dir, "cpu.cfs_quota_us", "-1")
    assert (v2_dir / "cpu.max").read_text() == "max 50000"
    write_cgroup_file(v2_dir, "memory.limit_in_bytes", str(192 << 20))
    assert (v2_dir / "memory.max").read_text() == str(192 << 20)
    write_cgroup_file(v2_dir, "memory.limit_in_bytes", "-1")
    assert (v2_dir / "memory.max").read_text() == "max"
    assert not (v2_dir / "cpu.cfs_quota_us").exists() and not (v2_dir / "memory.limit_in_bytes").exists()


@pytest.mark.parametrize(("shares", "weight"), [(2, 1), (1024, 39), (2048, 79), (4096, 157), (8192, 313),
                                                 (16384, 625), (262144, 10000)])
def test_shares_map_to_weight_as_the_kubelet_does(v2_dir: Path, shares: int, weight: int) -> None:
    write_cgroup_file(v2_dir, "cpu.shares", str(shares))
    assert (v2_dir / "cpu.weight").read_text() == str(weight)


def test_a_v1_cgroup_gets_the_v1_file(tmp_path: Path) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    write_cgroup_file(tmp_path, "cpu.cfs_quota_us", "25000")
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "25000"
    assert not (tmp_path / "cpu.max").exists()
