# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor agent` and `diagnose` as a user runs them: real subprocesses, real BPF, real cgroups.

The agent is started with a temp policy and a free port; what it serves (/readyz, /healthz, /metrics)
is checked against promtool and the kernel, and an enforcing run next to a real CPU hog must change
the hog's CFS quota and put it back on SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from detector.decisions import Cause, Target
from detector.model import Culprit, Evidence, Incident
from noisyneighbor import exporter as ex
from noisyneighbor.agent import IncidentLog, JsonLogFormatter
from noisyneighbor.cli import build_parser, parse_duration
from noisyneighbor.output import SCHEMA_VERSION, iso_utc
from testkit.exporter_support import REPO, AgentProcess, cgroup_rel_path, free_port, write_config
from testkit.timing import slowdown
from testkit.tools import require_tool

LS_WORKER = REPO / "testkit" / "workloads" / "ls_worker.py"
HOG = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end:\n    pass\n"
STANDALONE = {"kubernetes": {"pod_source": "standalone"}}


# -- pure --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [("30", 30.0), ("30s", 30.0), ("2m", 120.0), ("1.5h", 5400.0),
                                           ("500ms", 0.5), (" 5S ", 5.0)])
def test_durations_accept_plain_seconds_and_units(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "0", "-3s", "5x", "inf", "nan"])
def test_bad_durations_are_rejected_by_the_parser(text, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["diagnose", "--duration", text])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--duration" in err[-1], err


def test_agent_flags_parse_after_the_subcommand():
    args = build_parser().parse_args(["agent", "--host-root", "/host", "--no-dry-run", "--interval", "2s",
                                      "--probes", "runqlat,softirq", "--log-format", "json"])
    assert (args.host_root, args.dry_run, args.interval, args.probes, args.log_format) == \
        ("/host", False, 2.0, ("runqlat", "softirq"), "json")
    assert build_parser().parse_args(["agent"]).dry_run is None  # the policy decides


def _is_iso_utc(text: str) -> bool:
    return datetime.fromisoformat(text).utcoffset().total_seconds() == 0


def test_incident_log_lines_carry_schema_version_and_iso_utc_times(tmp_path):
    """The agent's incident log uses the CLI's JSON conventions: schema_version, ISO 8601 UTC times."""
    inc = Incident("nn-1", Target("/kubepods/pod1", "u1", "ns", "web", "LS"), Cause.NETWORK_CONNECT,
                   started_at=1_790_000_000.0, confidence=0.7, signal="syn_retransmits_per_s",
                   culprits=[Culprit(Target("/kubepods/pod2", "u2", "ns", "db", "LS"), 1.0)],
                   evidence=[Evidence("syn_retransmits_per_s", 2.0, 1.0)], updated_at=1_790_000_001.0)
    log = IncidentLog(str(tmp_path / "incidents.jsonl"))
    log.write(inc, "opened")
    log.write(inc, "updated")  # not a transition: not logged
    inc.ended_at = inc.updated_at = 1_790_000_030.0
    log.write(inc, "closed")
    opened, closed = (json.loads(line) for line in (tmp_path / "incidents.jsonl").read_text().splitlines())
    for r in (opened, closed):
        assert r["schema_version"] == SCHEMA_VERSION and _is_iso_utc(r["started_at"]) and _is_iso_utc(r["updated_at"])
        assert r["victim"]["display"] == "ns/web" and r["culprits"][0]["target"]["display"] == "ns/db"
    assert (opened["event"], opened["ended_at"], opened["started_at"]) == ("opened", None, "2026-09-21T14:13:20+00:00")
    assert closed["event"] == "closed" and _is_iso_utc(closed["ended_at"])


def test_json_log_lines_carry_schema_version_and_iso_utc_ts():
    """--log-format json (agent, top, diagnose): the same conventions as the other JSON, ts as `top` prints it."""
    record = logging.LogRecord("noisyneighbor.agent", logging.WARNING, __file__, 1, "probe %s off", ("tcp",), None)
    record.created = 1_790_000_000.25
    line = json.loads(JsonLogFormatter().format(record))
    assert line == {"schema_version": SCHEMA_VERSION, "ts": "2026-09-21T14:13:20+00:00", "level": "warning",
                    "logger": "noisyneighbor.agent", "msg": "probe tcp off"}
    assert line["ts"] == iso_utc(record.created)


# -- the agent process ---------------------------------------------------------------------------------


def _families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.smoke
@pytest.mark.vm
@pytest.mark.root
def test_agent_is_ready_with_its_probes_on_and_serves_metrics_promtool_accepts(tmp_path):
    promtool = require_tool("promtool")
    config = write_config(tmp_path / "config.yaml", STANDALONE)
    agent = AgentProcess(config, tmp_path, "--interval", "0.5", "--log-format", "json", "--extra-node-series")
    try:
        ready = agent.wait_ready()
        assert set(ready["probes"]) == {"runqlat", "softirq", "reclaim", "tcpconnect", "steal"}, ready
        assert all(p["state"] == "on" for p in ready["probes"].values()), ready["probes"]
        assert ready["actuators"]["mode"] == "dry-run", ready  # the default policy changes nothing
        assert ready["pod_source"]["source"] == "standalone"
        code, body = agent.get("/healthz")
        assert code == 200
        assert json.loads(body)["schema_version"] == SCHEMA_VERSION and ready["schema_version"] == SCHEMA_VERSION
        assert agent.get("/nope")[0] == 404
        time.sleep(1.5)  # a few more ticks, so counters have moved
        text = agent.scrape_text()
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                               timeout=60 * slowdown())
        assert check.returncode == 0, check.stdout + check.stderr
        fams = _families(text)
        up = {s.labels["probe"]: s.value for s in fams[ex.PROBE_UP]}
        states = {s.labels["probe"]: s.labels["state"] for s in fams[ex.PROBE_STATE]}
        assert all(up[p] == 1.0 and states[p] == "on" for p in ready["probes"]), (up, states)
        assert all(s.labels["node"] == "nn-agent-test" for s in fams[ex.PROBE_UP])
        # BPF_ENABLE_STATS is held by the agent, so its programs' kernel time is real and non-zero.
        run_s = sum(s.value for s in fams[ex.BPF_RUN_SECONDS.removesuffix("_total")])
        assert run_s > 0, "BPF run-time stats are not enabled by the agent"
        # /proc/stat ground truth: the exported node CPU time is what the kernel reports (USER_HZ ticks).
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            cpu0_user = int(next(line for line in f if line.startswith("cpu0 ")).split()[1]) / hz
        exported = next(s.value for s in fams[ex.NODE_CPU.removesuffix("_total")]
                        if s.labels["cpu"] == "0" and s.labels["mode"] == "user")
        assert exported <= cpu0_user + 0.01 and exported >= cpu0_user - 5.0, (exported, cpu0_user)
        # Log lines are JSON with --log-format json.
        lines = [line for line in agent.log_tail(200).splitlines() if line.strip()]
        assert lines and all(json.loads(line)["level"] for line in lines)
        assert all(json.loads(line)["schema_version"] == SCHEMA_VERSION and _is_iso_utc(json.loads(line)["ts"])
                   for line in lines)
    finally:
        rc = agent.terminate()
    assert rc == 0, agent.log_tail()
    tail = agent.stderr_path.read_text()
    assert "agent stopped" in tail
    assert "Traceback" not in tail


@pytest.mark.vm
@pytest.mark.root
@pytest.mark.slow
def test_enforcing_agent_suppresses_a_be_hog_and_sigterm_restores_its_quota(make_cgroup, tmp_path):
    cpu = (os.cpu_count() or 1) - 1
    ls = make_cgroup("nnls", ("cpu", "cpuacct"))
    be = make_cgroup("nnbe", ("cpu", "cpuacct"))
    v2 = not (be.path("cpu") / "cpu.shares").exists()
    # A busy BE pod next to a small LS one, with the weights the kubelet gives such pods on either hierarchy
    # (cpu.shares 512 and 2048, or their v2 weights 20 and 79): the LS worker's fair share of their CPU
    # (1/5) is below what it needs (3/10), so it waits under CFS too (a default-weight LS cgroup, 100 on
    # v2 but 1024 shares on v1, got more than it needed from 6.1's CFS and barely waited).
    ls.write("cpu", "cpu.weight" if v2 else "cpu.shares", "20" if v2 else "512")
    be.write("cpu", "cpu.weight" if v2 else "cpu.shares", "79" if v2 else "2048")
    quota_file = be.path("cpu") / ("cpu.max" if v2 else "cpu.cfs_quota_us")
    original = quota_file.read_text().strip()
    config = write_config(tmp_path / "config.yaml", {
        "slo": {"runq_p99_ms": 2.0},
        # Long verification: the suppress must still be in effect when SIGTERM arrives.
        "actuators": {"dry_run": False, "verify_intervals": 10000, "cooldown_seconds": 0},
        "kubernetes": {"pod_source": "standalone"},
        "standalone": {"ls_cgroups": [cgroup_rel_path(ls)], "be_cgroups": [cgroup_rel_path(be)]},
        "resource-threshold-config": {"cpuSuppressPolicy": "cfsQuota"},
    })
    procs = [
        subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, str(LS_WORKER), "--seconds", "90"],
                         preexec_fn=ls.preexec, stdout=subprocess.DEVNULL),
    ]
    # Enforcing on a shared node: the agent may only change the cgroup this test created.
    agent = AgentProcess(config, tmp_path, "--act-only", cgroup_rel_path(be))
    applied: list[dict] = []
    try:
        assert agent.wait_ready()["actuators"]["mode"] == "enforcing"
        procs.append(subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", HOG, "90"],
                                      preexec_fn=be.preexec))
        deadline = time.monotonic() + 45 * slowdown()
        while time.monotonic() < deadline and not applied:
            applied = [a for a in agent.audit() if a.get("event") == "action" and a["kind"] == "suppress"
                       and a["state"] == "applied"]
            time.sleep(0.5)
        assert applied, f"no suppress applied; audit {agent.audit()}\n{agent.log_tail()}"
        assert applied[0]["target"].strip("/") == cgroup_rel_path(be)
        suppressed = quota_file.read_text().strip()
        # v1: "<quota>"; v2: "<quota|max> <period>" (the original is "max 100000").
        assert suppressed != original and int(suppressed.split()[0]) > 0, (original, suppressed)
        assert {w["new"] for w in applied[0]["writes"]} >= {suppressed}
        fams = _families(agent.scrape_text())
        active = [s for s in fams[ex.ACTION_ACTIVE] if s.labels["kind"] == "suppress"]
        assert active and active[0].value == 1.0 and active[0].labels["target_cgroup"].endswith("nnbe"), active
        assert any(s.value >= 1 for s in fams[ex.INCIDENTS_OPEN]), "the incident is not exported"
    finally:
        rc = agent.terminate()
        for p in procs:
            p.kill()
            p.wait()
    assert rc == 0, agent.log_tail()
    assert quota_file.read_text().strip() == original, "SIGTERM did not restore the BE quota"
    journal = json.loads((agent.journal / "journal.json").read_text()) if (agent.journal / "journal.json").exists() \
        else {"entries": []}
    assert journal["entries"] == [], journal
    assert any(a.get("event") == "shutdown" for a in agent.audit())


@pytest.mark.root
def test_bad_config_is_one_line_exit_2_and_nothing_started(tmp_path):
    config = write_config(tmp_path / "config.yaml", {"slo": {"runq_p99_ms": -1}, "actuators": {"dry_run": False}})
    port = free_port()
    journal = tmp_path / "journal"
    res = subprocess.run(
        [sys.executable, "-m", "noisyneighbor.cli", "agent", "--config", str(config), "--listen", f"127.0.0.1:{port}",
         "--journal-dir", str(journal)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "runq_p99_ms" in lines[0] and str(config) in lines[0], res.stderr
    assert not journal.exists(), "a bad config must not create the journal"
    for args in (["--listen", "nowhere"], ["--interval", "0"], ["--config", str(tmp_path / "missing.yaml")]):
        res = subprocess.run([sys.executable, "-m", "noisyneighbor.cli", "agent", "--journal-dir", str(journal), *args],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
        # argparse's own errors come after its usage text; ours are one line. Either way the last line says why.
        assert "Traceback" not in res.stderr and res.stderr.strip().splitlines()[-1].startswith(
            ("noisyneighbor", "noisyneighbor agent: error")), res.stderr
    assert not journal.exists()


@pytest.mark.root
def test_diagnose_prints_a_json_report_and_writes_html(tmp_path):
    html = tmp_path / "report.html"
    res = subprocess.run(
        [sys.executable, "-m", "noisyneighbor.cli", "diagnose", "--duration", "5", "--interval", "1", "--json",
         "--pods", "standalone", "--html", str(html)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert {"started_at", "duration_s", "ticks", "probes", "incidents", "suggested_actions", "top_workloads"} <= set(report)
    assert 4.5 <= report["duration_s"] <= 30 and report["ticks"] >= 3, report
    assert all(": on" in line for line in report["probes"].values()), report["probes"]
    # Something always waits on a runqueue on a busy node; the root cgroup at least is measured.
    assert report["top_workloads"], report
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "application/json" in page


@pytest.mark.root
def test_diagnose_refuses_an_unwritable_html_path_before_running(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "noisyneighbor.cli", "diagnose", "--duration", "30", "--html",
         str(tmp_path / "no" / "such" / "dir" / "r.html")],
        cwd=REPO, capture_output=True, text=True, timeout=20)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr



@pytest.mark.root
def test_agent_forgets_removed_cgroups_from_the_kernel_maps(make_cgroup, tmp_path):
    """Pod churn must not fill the bounded BPF maps: a removed, idle cgroup leaves the runqueue map."""
    from noisyneighbor.agent import Agent, AgentConfig
    from noisyneighbor.sections import FORGET_AFTER_INTERVALS

    agent = Agent(AgentConfig(listen=None, journal_dir=str(tmp_path / "journal"), pod_source="standalone",
                              dry_run=True, probes=("runqlat",)))
    agent.start()
    try:
        cg = make_cgroup("churn")
        cg_id = (cg.dirs["cpu"]).stat().st_ino
        # Sleep/wake cycles, not a busy loop: every wakeup is a runqueue wait even on an idle node,
        # where a lone spinner may never wait at all (it did in CI).
        subprocess.run([sys.executable, "-c", "import time\nfor _ in range(200): time.sleep(0.001)"],
                       preexec_fn=cg.preexec, check=True)
        agent.step()
        probe = agent.collector.probes["runqlat"]
        assert cg_id in probe.snapshot().per_cgroup  # its waits were recorded under its id
        cg.remove()
        for _ in range(FORGET_AFTER_INTERVALS + 2):
            agent.step()
        assert cg_id not in probe.snapshot().per_cgroup
    finally:
        agent.stop()


def test_removed_pod_leaves_no_series_store_rows_baselines_or_map_entries(make_cgroup, tmp_path, monkeypatch):
    """Pod churn must leave nothing behind: once the kubelet stops listing a pod and its cgroups are gone,
    its series, its detector store rows and baselines and its kernel-map entries go within a few ticks."""
    import uuid

    from detector import runtime
    from noisyneighbor.agent import Agent, AgentConfig
    from noisyneighbor.sections import FORGET_AFTER_INTERVALS
    from testkit.fakekube import FakeKube, container_id_for, make_pod

    monkeypatch.setattr(runtime, "POD_LIST_INTERVAL_S", 0.2)  # relist as soon as the pod list changes
    uid = str(uuid.uuid4())
    pod_path = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    controllers = ("cpu", "cpuacct", "cpuset", "memory")
    pod = make_cgroup(pod_path, controllers)
    ctr = make_cgroup(f"{pod_path}/cri-containerd-{container_id_for(uid, 'main')}.scope", controllers)
    ctr_id = ctr.dirs["cpu"].stat().st_ino
    with FakeKube(node_name="node-1") as kube:
        kube.add_pod(make_pod("churned", uid=uid))
        kube.add_pod(make_pod("bystander"))  # a kubelet's list empties only after confirmations: keep one
        config = tmp_path / "config.yaml"
        config.write_text(f"kubernetes:\n  pod_source: kubelet\n  kubelet_url: {kube.url}\n"
                          "  kubelet_token_file: null\n  kubelet_ca_file: null\n")
        agent = Agent(AgentConfig(config_path=str(config), listen=None, journal_dir=str(tmp_path / "journal"),
                                  dry_run=True, probes=("runqlat",), node_name="node-1", node_readers=False))
        agent.start()
        try:
            deadline = time.monotonic() + 10
            while agent.pod_source.get(uid) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            for _ in range(3):  # sleep/wake cycles: waits the probe records under the container's id
                subprocess.run([sys.executable, "-c", "import time\nfor _ in range(100): time.sleep(0.001)"],
                               preexec_fn=ctr.preexec, check=True)
                agent.step()
                time.sleep(0.3)
            text = ex.render_text(agent.exporter).decode()
            assert f'pod_uid="{uid}"' in text
            # The container's series carry its name from the kubelet's pod list (the join key of cAdvisor
            # and kube-state-metrics), the runtime's id apart.
            assert f'container="main",container_id="{container_id_for(uid, "main")[:12]}"' in text, text
            engine = agent.detector.engine
            assert any(uid in e for e in engine.store.entities())
            assert ctr_id in agent.collector.probes["runqlat"].snapshot().per_cgroup

            kube.remove_pod("default", "churned")
            ctr.remove()
            pod.remove()
            deadline = time.monotonic() + 15  # the kubelet source polls every 5 s
            while agent.pod_source.status.pods > 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            for _ in range(FORGET_AFTER_INTERVALS + 3):
                time.sleep(0.3)
                agent.step()
            # (Its uid may still name a culprit of an open incident: that is history, not a series of its own.)
            assert f'pod_uid="{uid}"' not in ex.render_text(agent.exporter).decode()
            assert not [e for e in engine.store.entities() if uid in e]
            assert not [e for e in engine.baselines.entities() if uid in e]
            assert ctr_id not in agent.collector.probes["runqlat"].snapshot().per_cgroup
            assert pod_path not in " ".join(agent.collector.watch.watched)
        finally:
            agent.stop()


@pytest.mark.root
def test_the_agent_runs_the_mitigation_planner_and_memory_suppress(tmp_path):
    """Issue 19's per-cause mitigation runs in the agent, not only in the bench: the planner is an
    incident hook that hears back from the manager, the memory suppress actuator is there, and the
    planner's candidates are the node's pods."""
    from detector.decisions import ActionKind
    from noisyneighbor.agent import Agent, AgentConfig

    config = write_config(tmp_path / "config.yaml", {"kubernetes": {"pod_source": "standalone"}})
    agent = Agent(AgentConfig(config_path=str(config), listen=None, journal_dir=str(tmp_path / "journal"),
                              probes=("runqlat",), node_readers=False))
    agent.start()
    try:
        agent.step()
        assert agent.planner in agent.detector.engine.on_incident
        assert agent.planner.note_record in agent.manager.on_record
        assert ActionKind.MEMORY_SUPPRESS in agent.manager.actuators
        assert agent.manager.policy.dry_run  # the default: the planner's decisions are plans only
        assert isinstance(agent.detector.pod_targets(), list)
    finally:
        agent.stop()
