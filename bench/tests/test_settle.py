# SPDX-License-Identifier: Apache-2.0
"""The wait for the hypervisor's free page reporting after a pass that freed the node's memory."""

from __future__ import annotations

from pathlib import Path

from bench.scenarios.settle import (
    MAINLINE_REPORT_S,
    QUIET_S,
    balloon_reports_free_pages,
    read_reported_kib,
    wait_for_free_page_reporting,
)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _device(root: Path, name: str, device: str, features: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "device").write_text(device + "\n")
    (root / name / "features").write_text(features + "\n")


def test_a_balloon_reporting_free_pages_is_found_by_its_feature_bit(tmp_path):
    # This machine's virtio devices as sysfs lists them (2026-11-28): net, block, the balloon with bit 5
    _device(tmp_path, "virtio1", "0x0002", "1" * 40)
    _device(tmp_path, "virtio0", "0x0005", "0110010100000000000000000000000010000000")
    assert balloon_reports_free_pages(tmp_path)
    (tmp_path / "virtio0" / "features").write_text("0110000100000000000000000000000010000000\n")  # no bit 5
    assert not balloon_reports_free_pages(tmp_path)
    assert not balloon_reports_free_pages(tmp_path / "absent")
    (tmp_path / "kib").write_text("511056032\n")
    assert read_reported_kib(tmp_path / "kib") == 511056032
    assert read_reported_kib(tmp_path / "absent") is None


def test_the_wait_ends_once_the_reports_stop():
    # The shape seen after the global-reclaim heap was freed: ~1.5 GiB every 2.5 s for 35 s, then a few MiB
    t = FakeTime()
    start = t.now

    def reported() -> int:
        since = t.now - start
        return int(min(since, 35.0) // 2.5) * (1536 << 10) + (4096 if since > 60 else 0)

    got = wait_for_free_page_reporting(reported=reported, reporting=lambda: True, clock=t.clock, sleep=t.sleep)
    assert got.how == "counter"
    assert 35.0 + QUIET_S - 0.5 <= got.waited_s <= 35.0 + QUIET_S + 1.0
    assert got.reported_mib == 14 * 1536


def test_the_wait_is_bounded_and_skipped_where_nothing_reports():
    t = FakeTime()
    endless = wait_for_free_page_reporting(timeout_s=20.0, reported=lambda: int(t.now * 1e6), reporting=lambda: True,
                                           clock=t.clock, sleep=t.sleep)
    assert endless.how == "timeout" and 20.0 <= endless.waited_s <= 21.0
    assert wait_for_free_page_reporting(reporting=lambda: False, clock=t.clock, sleep=t.sleep).how == "none"
    before = t.now
    fixed = wait_for_free_page_reporting(reported=lambda: None, reporting=lambda: True, clock=t.clock, sleep=t.sleep)
    assert fixed.how == "fixed" and t.now - before == MAINLINE_REPORT_S
