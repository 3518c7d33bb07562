# SPDX-License-Identifier: Apache-2.0
"""Cgroup file abstraction, journal, and the actuator manager (dry-run, limits, verify/revert)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from actuators.base import ActionError, FileWrite
from actuators.cgroupfile import (
    CgroupFiles,
    CgroupVanished,
    CgroupWriteError,
    parse_cpu_list,
    write_file,
)
from actuators.journal import Journal
from probes.cgroupfiles import CGROUP_THREADS, CPU_BURST, CPU_MAX, CPUSET_CPUS, format_cpu_list
from probes.cgroupfs import discover
from probes.host import HostPaths
from tests.helpers_actuators import fake_v1_host, fake_v2_host

BE = "kubepods.slice/kubepods-besteffort.slice"


# -- cgroupfile ---------------------------------------------------------------------------------


def test_v2_formats_on_fake_host(tmp_path: Path) -> None:
    paths = fake_v2_host(tmp_path, ["kubepods.slice", BE])
    files = CgroupFiles(paths)
    assert files.layout.mode == "v2"
    assert files.path(CPU_MAX, BE).name == "cpu.max"
    assert files.path(CPU_BURST, BE).name == "cpu.max.burst"
    assert files.path(CGROUP_THREADS, BE).name == "cgroup.threads"
    assert files.read_cpu_max(BE).quota_us is None
    [w] = files.quota_writes(BE, 50_000)
    assert (w.old, w.new) == ("max 100000", "50000 100000")
    Journal(tmp_path / "j").apply("a1", [w])
    assert files.read_cpu_max(BE).cores == 0.5
    [w] = files.quota_writes(BE, None)
    assert w.new == "max 100000"
    assert files.burst_write(BE, 20_000).new == "20000"
    (tmp_path / "sys/fs/cgroup" / BE / "cgroup.threads").write_text("11\n12\n")
    assert files.read(CGROUP_THREADS, BE) == (11, 12)


def test_v1_formats_and_cgroupfs_driver(tmp_path: Path) -> None:
    paths = fake_v1_host(tmp_path, ["kubepods", "kubepods/besteffort"])
    files = CgroupFiles(paths)
    be = "kubepods/besteffort"
    assert files.path(CPU_MAX, be) == tmp_path / "sys/fs/cgroup/cpu/kubepods/besteffort/cpu.cfs_quota_us"
    assert files.path(CPUSET_CPUS, be).parent == tmp_path / "sys/fs/cgroup/cpuset/kubepods/besteffort"
    writes = files.quota_writes(be, 30_000, period_us=50_000)
    assert [(Path(w.path).name, w.old, w.new) for w in writes] == [
        ("cpu.cfs_period_us", "100000", "50000"), ("cpu.cfs_quota_us", "-1", "30000")]
    assert files.read(CGROUP_THREADS, be) == ()
    assert files.descendants(CPUSET_CPUS, "kubepods") == ["kubepods", "kubepods/besteffort"]


def test_cpu_list_format() -> None:
    assert parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert format_cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert parse_cpu_list("") == ()


def test_vanished_cgroup_is_a_specific_one_line_error(tmp_path: Path) -> None:
    files = CgroupFiles(fake_v2_host(tmp_path, ["gone"]))
    target = tmp_path / "sys/fs/cgroup/gone"
    for f in target.iterdir():
        f.unlink()
    target.rmdir()
    with pytest.raises(CgroupVanished) as exc:
        files.read_cpu_max("gone")
    assert "\n" not in str(exc.value) and "gone" in str(exc.value)


# -- journal ------------------------------------------------------------------------------------


def test_journal_original_on_disk_before_write_and_restored_once(tmp_path: Path) -> None:
    paths = fake_v2_host(tmp_path, [BE])
    files = CgroupFiles(paths)
    jdir = tmp_path / "journal"
    seen_on_disk: list[dict] = []

    def spying_write(path: str, value: str) -> None:
        seen_on_disk.append(json.loads((jdir / "journal.json").read_text()))
        Path(path).write_text(value)

    journal = Journal(jdir, write=spying_write)
    for quota in (80_000, 60_000, 40_000):
        journal.apply(f"a{quota}", files.quota_writes(BE, quota))
    # each write found the original already journaled
    assert all(doc["entries"][0]["original"] == "max 100000" for doc in seen_on_disk)
    assert len(journal.owned()) == 1
    report = journal.restore_all()
    assert report.restored == [str(files.path(CPU_MAX, BE))]
    assert files.read_cpu_max(BE).quota_us is None
    assert journal.owned() == {}
    assert not (jdir / "journal.json").exists()  # an empty journal is no file


def test_journal_reconcile_after_crash_restores_and_reown_keeps(tmp_path: Path) -> None:
    files = CgroupFiles(fake_v2_host(tmp_path, [BE]))
    jdir = tmp_path / "journal"
    Journal(jdir).apply("a1", [*files.quota_writes(BE, 50_000), files.burst_write(BE, 10_000)])
    # "crash": a new Journal object reads the file left on disk
    reowned = Journal(jdir).reconcile(reown=True)
    assert len(reowned.reowned) == 2 and files.read_cpu_max(BE).quota_us == 50_000
    report = Journal(jdir).reconcile()
    assert sorted(report.restored) == sorted(str(files.path(r, BE)) for r in (CPU_MAX, CPU_BURST))
    assert files.read_cpu_max(BE).quota_us is None and files.read_burst_us(BE) == 0


def test_journal_leaves_foreign_changes_alone(tmp_path: Path) -> None:
    files = CgroupFiles(fake_v2_host(tmp_path, [BE]))
    journal = Journal(tmp_path / "j")
    journal.apply("a1", files.quota_writes(BE, 50_000))
    files.path(CPU_MAX, BE).write_text("70000 100000\n")  # kubelet re-applied its own value
    report = journal.restore_all()
    assert report.foreign and not report.restored
    assert files.read_cpu_max(BE).quota_us == 70_000


def test_journal_revert_goes_back_to_pre_action_value(tmp_path: Path) -> None:
    files = CgroupFiles(fake_v2_host(tmp_path, [BE]))
    journal = Journal(tmp_path / "j")
    journal.apply("a1", files.quota_writes(BE, 80_000))
    journal.apply("a2", files.quota_writes(BE, 40_000))
    assert journal.revert("a2").restored
    assert files.read_cpu_max(BE).quota_us == 80_000
    assert journal.revert("a1").restored
    assert files.read_cpu_max(BE).quota_us is None and journal.owned() == {}


@pytest.mark.root
def test_failed_multi_file_change_rolls_back_real_cgroup(make_cgroup, tmp_path: Path) -> None:
    cg = make_cgroup("rollback", ("cpu", "cpuset"))
    layout = discover(HostPaths())
    files = CgroupFiles(HostPaths(), layout)
    rel = str(cg.path("cpu").relative_to(layout.hierarchy_for("cpu").mount))
    assert str(cg.path("cpuset").relative_to(layout.hierarchy_for("cpuset").mount)) == rel
    before = {r: files.read_raw(r, rel) for r in (CPU_MAX, CPU_BURST, CPUSET_CPUS)}
    journal = Journal(tmp_path / "j")
    writes = [*files.quota_writes(rel, 50_000), files.burst_write(rel, 20_000),
              FileWrite(str(files.path(CPUSET_CPUS, rel)), before[CPUSET_CPUS].strip(), "4096")]
    with pytest.raises(ActionError) as exc:
        journal.apply("bad", writes)
    assert "rolled back 2" in str(exc.value) and "\n" not in str(exc.value)
    assert {r: files.read_raw(r, rel) for r in before} == before
    assert journal.owned() == {}
    # the kernel rule that shapes the undo order: burst may not exceed quota
    journal.apply("ok", [*files.quota_writes(rel, 50_000), files.burst_write(rel, 50_000)])
    with pytest.raises(CgroupWriteError):
        write_file(files.path(CPU_MAX, rel), "30000")
    assert journal.restore_all().ok
    assert {r: files.read_raw(r, rel) for r in before} == before


# -- manager ------------------------------------------------------------------------------------

from prometheus_client import CollectorRegistry  # noqa: E402

from actuators.base import ActionState  # noqa: E402
from actuators.manager import ActuatorManager  # noqa: E402
from actuators.suppress import SuppressActuator  # noqa: E402
from detector.decisions import ActionKind, Decision, SuppressAmount, Target  # noqa: E402
from detector.policy import ActuatorPolicy, ResourceThresholdStrategy  # noqa: E402
from tests.helpers_actuators import fake_cpu_topology, tree_hashes  # noqa: E402

LS = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice"
SIGNAL = "runq_p99_ns"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _manager(tmp_path: Path, **policy) -> tuple[ActuatorManager, CgroupFiles, CollectorRegistry, FakeClock]:
    paths = fake_v2_host(tmp_path, ["kubepods.slice", BE, f"{BE}/pod1", "kubepods.slice/kubepods-burstable.slice", LS])
    fake_cpu_topology(tmp_path, ["0", "1", "2", "3"], {0: "0-3"})
    files = CgroupFiles(paths)
    journal = Journal(tmp_path / "journal")
    registry = CollectorRegistry()
    clock = FakeClock()
    pol = ActuatorPolicy(**{"dry_run": False, "cooldown_seconds": 5.0, **policy})
    manager = ActuatorManager([SuppressActuator(files, journal, ResourceThresholdStrategy())], journal, pol,
                              registry=registry, audit_log=tmp_path / "audit.jsonl", clock=clock)
    return manager, files, registry, clock


def _suppress(cores: float, cgroup: str = BE, qos: str | None = "BE", incident: str | None = "inc-1") -> Decision:
    return Decision(ActionKind.SUPPRESS, Target(cgroup, qos=qos), SuppressAmount("cfs_quota", cpu_cores=cores),
                    "test", incident_id=incident, victim=Target(LS, qos="LS"), victim_signal=SIGNAL)


def _observe(manager: ActuatorManager, values: list[float]) -> None:
    for v in values:
        manager.observe({f"{LS}:{SIGNAL}": v}, 0.0)


def test_dry_run_writes_nothing_and_exports_plan(tmp_path: Path) -> None:
    manager, _, registry, _ = _manager(tmp_path, dry_run=True)
    before = tree_hashes(tmp_path / "sys/fs/cgroup")
    manager.submit(_suppress(1.0))
    assert tree_hashes(tmp_path / "sys/fs/cgroup") == before
    [record] = manager.records
    assert record.state == ActionState.PLANNED and record.plan is not None
    assert record.plan.writes[0].new == "100000 100000"
    assert manager.planned[-1] is record.plan
    # Actions by kind and state are the exporter's noisyneighbor_actions_total (from the records), not the manager's.
    assert registry.get_sample_value("noisyneighbor_actuator_actions_total", {"kind": "suppress", "state": "planned"}) is None
    assert registry.get_sample_value("noisyneighbor_be_suppress_cpu_cores", {"policy": "cfsQuota"}) == 1.0
    assert not (tmp_path / "journal/journal.json").exists() or Journal(tmp_path / "journal").owned() == {}


def test_verified_action_is_kept_and_unhelpful_one_reverted(tmp_path: Path) -> None:
    manager, files, registry, clock = _manager(tmp_path, verify_intervals=3, verify_min_improvement_percent=10)
    _observe(manager, [10e6, 11e6, 10e6])
    manager.submit(_suppress(1.0))
    assert manager.records[-1].state == ActionState.APPLIED
    assert files.read_cpu_max(BE).quota_us == 100_000
    _observe(manager, [5e6, 4e6, 6e6])  # halved: helped
    rec = manager.records[-1]
    assert rec.state == ActionState.VERIFIED and "baseline 1e+07 -> 5e+06" in rec.detail
    assert files.read_cpu_max(BE).quota_us == 100_000

    clock.t += 60
    _observe(manager, [5e6, 5e6, 5e6])
    manager.submit(_suppress(0.5))
    assert files.read_cpu_max(BE).quota_us == 50_000
    _observe(manager, [5e6, 4.9e6])
    assert manager.records[-1].state == ActionState.APPLIED  # window not over yet
    _observe(manager, [5.1e6])  # no real change: revert to the previous value, not the original
    rec = manager.records[-1]
    assert rec.state == ActionState.REVERTED and "did not help" in rec.detail
    assert files.read_cpu_max(BE).quota_us == 100_000
    assert registry.get_sample_value("noisyneighbor_actuator_reverts_total", {"kind": "suppress"}) == 1
    # a reverted target is blocked for a while: no flapping
    clock.t += 6
    manager.submit(_suppress(0.5))
    assert manager.records[-1].state == ActionState.REFUSED and "reverted recently" in manager.records[-1].detail
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["state"] for x in lines if x.get("event") == "action"][-2:] == ["reverted", "refused"]
    assert all(x["incident_id"] == "inc-1" for x in lines if x.get("event") == "action")
    manager.close()
    assert files.read_cpu_max(BE).quota_us is None


def test_limits_protect_ls_rate_and_cooldown(tmp_path: Path) -> None:
    manager, files, _, clock = _manager(tmp_path, max_changes_per_minute=2, cooldown_seconds=10)
    for qos in ("LS", "LSR", "LSE", "SYSTEM", None):
        manager.submit(_suppress(1.0, cgroup=LS, qos=qos))
        assert manager.records[-1].state == ActionState.REFUSED, qos
    assert files.read_cpu_max(LS).quota_us is None
    # a path in the besteffort QoS cgroup counts as BE without a label
    manager.submit(_suppress(1.0, qos=None, incident=None))
    assert manager.records[-1].state == ActionState.APPLIED
    clock.t += 3
    manager.submit(_suppress(2.0, incident=None))
    assert "cooldown" in manager.records[-1].detail
    clock.t += 10
    manager.submit(_suppress(1.3, cgroup=f"{BE}/pod1", incident=None))
    assert manager.records[-1].state == ActionState.APPLIED
    clock.t += 10
    manager.submit(_suppress(1.2, incident=None))
    assert "rate limit" in manager.records[-1].detail
    clock.t += 61
    manager.submit(_suppress(1.2, incident=None))
    assert manager.records[-1].state == ActionState.APPLIED, manager.records[-1].detail
    manager.close()
    assert files.read_cpu_max(BE).quota_us is None and files.read_cpu_max(f"{BE}/pod1").quota_us is None


def test_one_incidents_next_step_on_its_target_skips_the_cooldown(tmp_path: Path) -> None:
    # An incident's plan in two steps on one target (softirq starvation: the RT pod moved off the
    # victim's CPUs, then its traffic capped) is not flapping; another incident's change still waits.
    manager, files, _, clock = _manager(tmp_path, cooldown_seconds=10)
    manager.submit(_suppress(1.0, incident="inc-a"))
    assert manager.records[-1].state == ActionState.APPLIED
    clock.t += 1
    manager.submit(_suppress(0.5, incident="inc-b"))
    assert manager.records[-1].state == ActionState.REFUSED and "cooldown" in manager.records[-1].detail
    manager.submit(_suppress(0.5, incident="inc-a"))
    assert manager.records[-1].state == ActionState.APPLIED, manager.records[-1].detail
    assert files.read_cpu_max(BE).quota_us == 50_000
    manager.close()
    assert files.read_cpu_max(BE).quota_us is None and files.read_cpu_max(f"{BE}/pod1").quota_us is None


def test_submit_never_raises_on_bad_input(tmp_path: Path) -> None:
    manager, _, _, _ = _manager(tmp_path)
    manager.submit(_suppress(1.0, cgroup="kubepods.slice/kubepods-besteffort.slice/missing"))
    assert manager.records[-1].state == ActionState.REFUSED and "gone" in manager.records[-1].detail
    manager.submit(Decision(ActionKind.SUPPRESS, Target(BE, qos="BE"), SuppressAmount("bogus", cpu_cores=1), "x"))
    assert "unknown CPU suppress policy" in manager.records[-1].detail
    manager.submit(Decision(ActionKind.BURST, Target(LS, qos="LS"), SuppressAmount("cfs_quota", 1.0), "x"))
    assert manager.records[-1].state == ActionState.REFUSED  # no burst actuator wired here


def test_victim_histories_of_removed_pods_are_forgotten(tmp_path: Path) -> None:
    """Pod churn must not grow the manager: a victim key no tick carries any more is dropped (after
    SIGNAL_HISTORY_IDLE_OBSERVES calls), one still fed keeps its history and still verifies."""
    from actuators.manager import SIGNAL_HISTORY_IDLE_OBSERVES, SIGNAL_PRUNE_EVERY

    manager, _, _, _ = _manager(tmp_path)
    for i in range(200):  # 200 pods come, are victims for a tick, and go
        manager.observe({f"/kubepods.slice/pod{i}:{SIGNAL}": 1e6}, 0.0)
    for _ in range(SIGNAL_HISTORY_IDLE_OBSERVES + 2 * SIGNAL_PRUNE_EVERY):
        _observe(manager, [10e6])
    assert set(manager._signals) == {f"{LS}:{SIGNAL}"}
    manager.submit(_suppress(1.0))
    assert manager.records[-1].state == ActionState.APPLIED
    assert [a.verification is not None for a in manager._active.values()] == [True]  # its "before" is known


def test_reconciling_an_empty_journal_writes_nothing(tmp_path: Path) -> None:
    """Every agent start reconciles its journal; with nothing in it there is nothing to make durable.
    CI under load caught the agent stuck for over 60 s in the fsync of that empty write (disk busy)."""
    journal = Journal(tmp_path / "journal")
    for reown in (False, True):
        report = journal.reconcile(reown=reown)
        assert report.summary() is not None
        assert not journal.file.exists() and list(journal.directory.iterdir()) == []
    journal.restore_all()
    assert not journal.file.exists()


def test_the_journal_is_fsynced_while_it_holds_entries_not_once_it_is_empty(tmp_path: Path, monkeypatch) -> None:
    """Durable before an action's first write (an fsync of the file and of its directory), once per action
    however many files it writes; the state after the writes is fsynced without its directory; the empty
    journal a full restore leaves is no file, removed without an fsync (losing the removal in a crash only
    brings back entries whose files hold their originals already)."""
    import actuators.journal as journal_module

    synced: list[str] = []
    real_fsync = journal_module.os.fsync

    def spying_fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")) else "file")
        real_fsync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", spying_fsync)
    paths = fake_v2_host(tmp_path, [BE])
    files = CgroupFiles(paths)
    journal = Journal(tmp_path / "journal")
    order: list[str] = []
    journal._write = lambda path, value: (order.append(f"write after {len(synced)} fsyncs"),
                                          Path(path).write_text(value))
    writes = [*files.quota_writes(BE, 50_000), *files.quota_writes(BE, 40_000)]
    assert len(writes) >= 2
    journal.apply("a1", writes)
    # the original (file and directory) on disk before the first cgroup write; nothing between writes
    assert order[0] == "write after 2 fsyncs" and set(order) == {order[0]}
    assert synced == ["file", "dir", "file"]
    synced.clear()
    journal.restore_all()
    assert synced == [] and not journal.file.exists()




# -- JSON conventions of the audit log and `python -m actuators` ----------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
from datetime import datetime  # noqa: E402

from actuators.manager import AUDIT_SCHEMA_VERSION, audit_time  # noqa: E402
from noisyneighbor.output import SCHEMA_VERSION, iso_utc  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _cli_time(text: str) -> bool:
    """ISO 8601 UTC exactly as `top`/`diagnose`/the incident log print it (noisyneighbor.output.iso_utc)."""
    return iso_utc(datetime.fromisoformat(text).timestamp()) == text


def test_audit_conventions_are_the_clis():
    # actuators/ keeps its own copy (it does not import noisyneighbor/): both must say the same.
    assert AUDIT_SCHEMA_VERSION == SCHEMA_VERSION
    for t in (0.0, 1_790_000_000.0, 1_790_000_000.999, 2_000_000_000.5):
        assert audit_time(t) == iso_utc(t)


def test_audit_lines_carry_schema_version_and_iso_utc_ts(tmp_path: Path) -> None:
    manager, _, _, _ = _manager(tmp_path)
    manager.submit(_suppress(1.0))
    manager.submit(_suppress(1.0, cgroup=LS, qos="LS"))  # refused: an audit line too
    manager.close()  # the shutdown line (_audit_raw without a record)
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x.get("state", x["event"]) for x in lines] == ["applied", "refused", "reverted", "shutdown"], lines
    for x in lines:
        assert x["schema_version"] == SCHEMA_VERSION and _cli_time(x["ts"]), x


def _actuators_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "actuators", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_actuators_cli_json_carries_schema_version(tmp_path: Path) -> None:
    """`python -m actuators`: the record line of apply-* and the reconcile summary, on a fake host."""
    fake_v2_host(tmp_path / "host", ["kubepods.slice", BE])
    fake_cpu_topology(tmp_path / "host", ["0", "1", "2", "3"], {0: "0-3"})
    p = _actuators_cli("apply-suppress", "--host-root", str(tmp_path / "host"), "--cgroup", BE, "--cores", "1",
                       "--journal", str(tmp_path / "j"), "--dry-run")
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.poll() is not None else "no output"
        out = json.loads(line)
        assert out["schema_version"] == SCHEMA_VERSION and out["state"] == "planned", out
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0, p.stderr.read()
    r = subprocess.run([sys.executable, "-m", "actuators", "reconcile", "--journal", str(tmp_path / "j")], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["schema_version"] == SCHEMA_VERSION and "reconcile" in out, out
