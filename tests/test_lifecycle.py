# SPDX-License-Identifier: Apache-2.0
"""Uninstall, upgrade and rollback lose no change: `noisyneighbor restore` and the journal's format rule.

A quota-capped pod is a real cgroup of this test's (its CPU quota written through the agent's journal); a
resized pod is a pod of FakeKube, a real HTTPS apiserver double, resized through the agent's ResizeIO.
The documented uninstall (deploy/README.md, "Uninstall") is: delete the DaemonSet first so each agent
restores at SIGTERM while its ServiceAccount still exists, then `noisyneighbor restore --purge` on every
node (the cleanup component's pods) for whatever an agent could not restore, then the rest. These tests
run that second step on a journal the agent left, including one whose restore failed because the
credentials were gone, and a journal written by today's (0.1.0) code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actuators.journal import FORMAT_VERSION, Journal, JournalTooNew
from actuators.resize import ResizeIO, resize_path
from noisyneighbor.agent.wiring import JournalIO
from noisyneighbor.lifecycle import ApiserverAccess, restore
from testkit.fakekube import FakeKube, make_pod

REPO = Path(__file__).resolve().parent.parent
TODAYS_JOURNAL = REPO / "tests" / "data" / "journal-format-1.json"  # written by 3e004f2's Journal
TOKEN = "agent-token"


def _quota_file(cg) -> tuple[Path, str, str]:
    """(the cgroup's CPU quota file, its value now, a capped value) in v1 or v2 terms."""
    v1 = cg.path("cpu") / "cpu.cfs_quota_us"
    if v1.exists():
        return v1, v1.read_text().strip(), "20000"
    v2 = cg.path("cpu") / "cpu.max"
    return v2, v2.read_text().strip(), "20000 100000"


@pytest.fixture
def kube():
    with FakeKube(token=TOKEN, tls=True, node_name="node-1") as k:
        k.add_pod(make_pod("web-0", "shop", node_name="node-1", requests={"cpu": "1"}, limits={"cpu": "1"}))
        yield k


def _limit(kube: FakeKube) -> str:
    return kube.get_pod("shop", "web-0")["spec"]["containers"][0]["resources"]["limits"]["cpu"]


def _access(kube: FakeKube, tmp_path: Path, token: str = TOKEN) -> ApiserverAccess:
    token_file = tmp_path / f"token-{token}"
    token_file.write_text(token)
    return ApiserverAccess(kube.url, str(token_file), kube.ca_file)


def _agent_journal(directory: Path, kube: FakeKube) -> Journal:
    """The journal as the agent builds it: one journal, resize entries through the apiserver."""
    from actuators.resctrl import KernelResctrlFs, ResctrlFileIO

    io = JournalIO(ResctrlFileIO(Path("/nonexistent-resctrl"), KernelResctrlFs()), ResizeIO(kube.api_client()))
    return Journal(directory, read=io.read, write=io.write)


def _run_restore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "noisyneighbor.cli", "restore", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


@pytest.mark.root
def test_uninstall_restores_a_capped_and_a_resized_pod_even_after_the_credentials_failed(
        make_cgroup, kube: FakeKube, tmp_path: Path):
    cg = make_cgroup("be-pod")
    quota, original, capped = _quota_file(cg)
    state_dir = tmp_path / "var-lib-noisyneighbor"
    journal_dir = state_dir / "journal"
    journal = _agent_journal(journal_dir, kube)
    journal.apply("suppress-1", [(str(quota), capped)], kind="suppress")
    journal.apply("suppress-2", [(resize_path("shop", "web-0", "main"), "200m")], kind="suppress")
    assert quota.read_text().strip() == capped.split()[0] and _limit(kube) == "200m"
    del journal  # the agent is gone (deleted, or killed) without restoring

    # The agent's ServiceAccount was deleted with it: the apiserver refuses its token. The cgroup comes
    # back, the resize does not, and stays in the journal (exit 1, named), not dropped.
    res = _run_restore("--journal-dir", str(journal_dir), "--attempts", "2", "--retry-interval", "0.1",
                       "--apiserver", kube.url, "--token-file", str(_access(kube, tmp_path, "revoked").token_file),
                       "--ca-file", str(kube.ca_file), "--purge")
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "1 left in the journal" in res.stderr and "401" in res.stderr, res.stderr
    out = json.loads(res.stdout)
    assert out["attempts"] == 2 and out["left"] == [resize_path("shop", "web-0", "main")] and not out["purged"]
    assert quota.read_text().strip() == original.split()[0]
    assert _limit(kube) == "200m" and journal_dir.exists()

    # The documented step with credentials (the cleanup pods run as the agent's ServiceAccount): done, purged.
    res = _run_restore("--journal-dir", str(journal_dir), "--apiserver", kube.url,
                       "--token-file", str(_access(kube, tmp_path).token_file), "--ca-file", str(kube.ca_file),
                       "--purge")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["restored"] == [resize_path("shop", "web-0", "main")] and out["left"] == [] and out["purged"]
    assert _limit(kube) == "1" and quota.read_text().strip() == original.split()[0]
    assert not state_dir.exists(), "the node directory is removed once nothing is left in it"


def test_a_failed_restore_is_retried_not_stranded(kube: FakeKube, tmp_path: Path):
    journal_dir = tmp_path / "journal"
    journal = _agent_journal(journal_dir, kube)
    journal.apply("suppress-1", [(resize_path("shop", "web-0", "main"), "300m")], kind="suppress")
    kube.fail("500", times=2, path="/api/v1/namespaces/shop/pods/web-0/resize")
    outcome = restore(journal_dir, apiserver=_access(kube, tmp_path), attempts=5, retry_interval_s=0.05)
    assert outcome.ok and len(outcome.attempts) == 3, outcome.as_json()
    assert [bool(r.failed) for r in outcome.attempts] == [True, True, False]
    assert _limit(kube) == "1"


@pytest.mark.root
def test_a_journal_written_by_todays_code_restores(make_cgroup, kube: FakeKube, tmp_path: Path):
    """The 0.1.0 journal file (format 1, no min_reader_version) as that code wrote it, pointing at a real
    capped cgroup and a resized pod: this code restores both."""
    cg = make_cgroup("be-pod")
    quota, original, capped = _quota_file(cg)
    quota.write_text(capped.split()[0] if quota.name == "cpu.cfs_quota_us" else capped)
    kube.modify_pod("shop", "web-0", lambda p: p["spec"]["containers"][0]["resources"]["limits"].update(cpu="200m"))
    text = TODAYS_JOURNAL.read_text()
    assert '"version": 1' in text and "min_reader_version" not in text
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    (journal_dir / "journal.json").write_text(text.replace("@QUOTA@", str(quota))
                                              .replace("@QUOTA_ORIGINAL@", original).replace("@QUOTA_CAPPED@", capped))
    outcome = restore(journal_dir, apiserver=_access(kube, tmp_path), attempts=1)
    assert outcome.ok, outcome.as_json()
    assert sorted(outcome.attempts[0].restored) == sorted([str(quota), resize_path("shop", "web-0", "main")])
    assert quota.read_text().strip() == original.split()[0] and _limit(kube) == "1"


def _journal_doc(version: int, min_reader: int | None, extra_field: bool) -> dict:
    entry = {"action_id": "a", "first_at": 1.0, "kind": "suppress", "last_written": "2", "original": "1",
             "path": "/f", "pending": None, "seq": 1}
    if extra_field:
        entry["written_by_cpu"] = 3  # a field a newer format adds
    doc = {"version": version, "pid": 1, "saved_at": 1.0, "entries": [entry]}
    if min_reader is not None:
        doc["min_reader_version"] = min_reader
    return doc


def test_a_newer_journal_is_read_when_it_says_this_reader_can(tmp_path: Path):
    (tmp_path / "journal.json").write_text(json.dumps(_journal_doc(FORMAT_VERSION + 1, FORMAT_VERSION, True)))
    files = {"/f": "2"}
    journal = Journal(tmp_path, read=files.__getitem__, write=files.__setitem__)
    assert journal.restore_all().restored == ["/f"] and files["/f"] == "1"


def test_a_journal_this_reader_cannot_restore_is_refused_in_one_line_and_kept(tmp_path: Path):
    (tmp_path / "journal.json").write_text(json.dumps(_journal_doc(FORMAT_VERSION + 1, FORMAT_VERSION + 1, True)))
    with pytest.raises(JournalTooNew) as e:
        Journal(tmp_path, read=lambda p: "", write=lambda p, v: None)
    assert "\n" not in str(e.value) and "do not remove it" in str(e.value)
    assert (tmp_path / "journal.json").exists()
    # A known format with a field it does not define is corrupt, not silently read.
    (tmp_path / "journal.json").write_text(json.dumps(_journal_doc(FORMAT_VERSION, None, True)))
    with pytest.raises(Exception, match="corrupt"):
        Journal(tmp_path, read=lambda p: "", write=lambda p, v: None)


def test_the_journal_says_its_format_and_oldest_reader(tmp_path: Path):
    files = {"/f": "1"}
    journal = Journal(tmp_path, read=files.__getitem__, write=files.__setitem__)
    journal.apply("a", [("/f", "2")], kind="suppress")
    doc = json.loads((tmp_path / "journal.json").read_text())
    assert doc["version"] == FORMAT_VERSION and doc["min_reader_version"] == 1


def test_restore_of_a_missing_journal_is_a_no_op_and_bad_flags_are_one_line(tmp_path: Path):
    res = _run_restore("--journal-dir", str(tmp_path / "none"))
    assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stderr
    res = _run_restore("--journal-dir", str(tmp_path), "--apiserver", "https://127.0.0.1:1")
    assert res.returncode == 2 and res.stderr.strip() == "noisyneighbor: restore --apiserver needs --token-file"
