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


def test_an_eviction_s_after_window_waits_for_the_reports_to_stop(monkeypatch):
    """The pass runs on (its tick loop) until reported_kib is quiet, and the after-window starts there;
    the ticks recorded since the eviction count, and the bound is REPORTING_BOUND_S after it."""
    from bench.scenarios import runner
    from bench.scenarios.metrics import PassResult

    t = FakeTime()
    t.now = 14.0  # s since onset: the run's end; evicted at +3 s, reports of 1 GiB every 2.5 s until +33 s

    def total() -> int:
        return int((min(t.now, 33.0) - 3.0) // 2.5) * (1 << 20) if t.now >= 3.0 else 0

    result = PassResult("global-reclaim-evict", "mitigate", 8, 14)
    for s in range(0, 15):  # the ticks already recorded: their running totals
        t.now = float(s)
        result.timeline.append({"t": float(s), "reported_kib": total()})
    t.now = 14.0
    monkeypatch.setattr(runner, "balloon_reports_free_pages", lambda: True)
    monkeypatch.setattr(runner, "read_reported_kib", total)
    runner._wait_out_eviction_aftermath(result, 3.0, t.sleep, t.clock)
    assert 33.0 + QUIET_S - 1 <= result.after_from_s <= 33.0 + QUIET_S + 1.5
    assert result.run_s >= result.after_from_s + 8.0
    assert "settled" in result.aftermath and "12288 MiB reported" in result.aftermath

    # Reports that never stop: the window starts at the bound, and the note says so
    t.now = 14.0
    endless = PassResult("global-reclaim-evict", "mitigate", 8, 14)
    monkeypatch.setattr(runner, "read_reported_kib", lambda: int(t.now * (1 << 20)))
    runner._wait_out_eviction_aftermath(endless, 3.0, t.sleep, t.clock)
    assert 3.0 + runner.REPORTING_BOUND_S <= endless.after_from_s <= 3.0 + runner.REPORTING_BOUND_S + 1.5
    assert "had not settled" in endless.aftermath

    # No balloon reporting free pages (bare metal): nothing waited for, the usual window
    plain = PassResult("global-reclaim-evict", "mitigate", 8, 14)
    monkeypatch.setattr(runner, "balloon_reports_free_pages", lambda: False)
    runner._wait_out_eviction_aftermath(plain, 3.0, t.sleep, t.clock)
    assert plain.after_from_s is None and plain.aftermath == ""
