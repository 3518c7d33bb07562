# SPDX-License-Identifier: Apache-2.0
"""The command line's contract with scripts and people: version, exit codes, pipes, JSON shape, reports.

Each test here pins one defect a user hit (issue 17): it runs the real CLI (subprocess, real BPF)
where the behaviour is the process's, and the renderers directly where it is the report's text.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from datetime import datetime
from html.parser import HTMLParser

import pytest

from detector.decisions import ActionKind, Cause, Decision, SuppressAmount, Target
from detector.model import Culprit, Evidence, Incident
from noisyneighbor.cli import build_parser
from noisyneighbor.diagnose import DiagnoseReport, render_text
from noisyneighbor.output import SCHEMA_VERSION, package_version
from noisyneighbor.report_html import render_html
from testkit.exporter_support import REPO, cgroup_rel_path, write_config
from testkit.tools import require_tool
from tests.conftest import read_terminal

CLI = [sys.executable, "-m", "noisyneighbor.cli"]
LS_WORKER = REPO / "testkit" / "workloads" / "ls_worker.py"


def _run(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, **kw)


def _is_iso_utc(text: str) -> bool:
    return datetime.fromisoformat(text).utcoffset().total_seconds() == 0


# -- arguments ---------------------------------------------------------------------------------------


def test_version_prints_the_installed_version():
    res = _run("--version", timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"noisyneighbor {package_version()}" and package_version() != "0+unknown"


@pytest.mark.parametrize("command", ["top", "agent", "diagnose"])
def test_host_root_is_accepted_after_every_subcommand(command):
    args = build_parser().parse_args([command, "--host-root", "/host"])
    assert args.host_root == "/host"
    assert build_parser().parse_args(["--host-root", "/h", command]).host_root == "/h"


def test_exit_codes_are_documented_in_help():
    for argv in (["--help"], ["diagnose", "--help"]):
        out = _run(*argv, timeout=30).stdout
        assert re.search(r"^\s+0\s", out, re.M) and re.search(r"^\s+1\s", out, re.M), out
        assert re.search(r"^\s+3\s+diagnose --fail-on-incident", out, re.M), out


# -- pipes and JSON ----------------------------------------------------------------------------------


@pytest.mark.root
def test_top_json_into_a_reader_that_leaves_exits_0_quietly():
    # `noisyneighbor top --json | head -1`: the shell's pipeline, so the reader really exits early.
    cmd = " ".join([*CLI, "top", "--json", "--interval", "0.2"]) + " | head -n 1"
    res = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    assert json.loads(res.stdout)["type"] == "status"


@pytest.mark.root
def test_top_plain_tables_into_a_reader_that_leaves_exit_0_quietly():
    """`noisyneighbor top | head`: the plain tables go through rich, whose own broken-pipe handling
    exits 1; the reader leaving is no error here either."""
    cmd = " ".join([*CLI, "top", "--view", "all", "--interval", "0.2"]) + " | head -n 1"
    res = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    assert res.stdout.startswith("noisyneighbor top — "), res.stdout


@pytest.mark.root
def test_top_json_records_carry_schema_version_and_iso_utc_times():
    res = _run("top", "--json", "--interval", "0.3", "--count", "1", timeout=60)
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["type"] for r in records] == ["status", "interval"]
    for r in records:
        assert r["schema_version"] == SCHEMA_VERSION and _is_iso_utc(r["ts"]), r
    once = json.loads(_run("top", "--json", "--once", "--interval", "0.3", timeout=60).stdout)
    assert once["schema_version"] == SCHEMA_VERSION and _is_iso_utc(once["ts"])


@pytest.mark.root
def test_diagnose_exits_1_when_no_probe_can_start(tmp_path):
    env = dict(os.environ, NN_BPF_OBJECT_DIR=str(tmp_path))  # no objects: every BPF probe is off
    res = _run("diagnose", "--duration", "2", "--pods", "standalone", env=env, timeout=60)
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("noisyneighbor: no probe could start") and "Traceback" not in res.stderr
    assert res.stdout == ""


@pytest.mark.root
def test_diagnose_fail_on_incident_exits_3_with_progress_only_on_a_terminal(make_cgroup, tmp_path):
    """A pod throttled at its own 0.2-core quota while it wants 0.3 cores breaks a 2 ms runqueue SLO."""
    ls = make_cgroup("ls")
    ls.write("cpu", "cpu.cfs_quota_us", "20000")
    config = write_config(tmp_path / "policy.yaml", {"slo": {"runq_p99_ms": 2.0}})
    worker = subprocess.Popen([sys.executable, str(LS_WORKER), "--seconds", "40"], preexec_fn=ls.preexec,
                              stdout=subprocess.DEVNULL)
    try:
        args = ["diagnose", "--duration", "8", "--config", str(config), "--pods", "standalone",
                "--ls-cgroup", cgroup_rel_path(ls), "--fail-on-incident", "--json"]
        # stderr on a terminal (a pty): the progress line is drawn there; stdout stays the bare report.
        leader, follower = pty.openpty()
        proc = subprocess.Popen([*CLI, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=follower, text=True)
        os.close(follower)
        terminal = read_terminal(leader)
        stdout = proc.communicate(timeout=30)[0]
        os.close(leader)
        assert proc.returncode == 3, (proc.returncode, terminal.decode(errors="replace"))
        report = json.loads(stdout)
        assert report["incidents"] and report["schema_version"] == SCHEMA_VERSION
        # The worker is still throttled when the 8 s window ends: its incident reads "still open", not
        # closed by the detector's shutdown ("agent stopped"), in the real run and not only in a fixture.
        ongoing = [i for i in report["incidents"] if i["still_open"]]
        assert ongoing and all(i["ended_at"] is None for i in ongoing), report["incidents"]
        assert not [e for i in ongoing for e in i["evidence"] if e["signal"] == "closed"], ongoing
        assert re.search(rb"diagnose: \d+/8 s, [1-9]\d* incident\(s\) so far", terminal), terminal
        # Piped: the same run says nothing extra on stderr beyond log lines, and no progress at all.
        html = tmp_path / "report.html"
        piped = _run(*args, "--html", str(html), timeout=120)
        assert piped.returncode == 3, piped.stderr
        assert "so far" not in piped.stderr and "\r" not in piped.stderr
        # The real run's plots sit on the clock-time axis of the window (the store's monotonic times
        # shifted to the wall clock): every point of every line inside the picture.
        page = html.read_text(encoding="utf-8")
        lines = re.findall(r'<polyline [^>]*points="([^"]*)"', page)
        assert lines, page[:3000]
        xs = [float(p.split(",")[0]) for pts in lines for p in pts.split()]
        assert xs and all(0 <= x <= 760 for x in xs), (min(xs), max(xs))
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.root
def test_diagnose_json_has_schema_version_and_only_iso_utc_times(tmp_path):
    res = _run("diagnose", "--duration", "3", "--pods", "standalone", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["schema_version"] == SCHEMA_VERSION
    assert _is_iso_utc(report["started_at"]) and _is_iso_utc(report["ended_at"])
    assert report["host"] == os.uname().nodename and report["kernel"] == os.uname().release


# -- the report's text and HTML ------------------------------------------------------------------------


def _report(still_open: bool = True) -> DiagnoseReport:
    """An incident the way the detector leaves it when the window ends mid-contention: closed by
    Detector.close() with an 'agent stopped' note, the root cgroup ranked as a zero-score culprit, a
    self-throttling note built from a None quota, and a cpuset suppress decision."""
    t0 = 1_790_000_000.0
    victim = Target("/kubepods/pod-a", pod_uid="a", namespace="shop", pod="api </script><b>\"x\"", qos="LS")
    culprit = Target("/kubepods/besteffort/pod-b", pod_uid="b", namespace="batch", pod="hog", qos="BE")
    inc = Incident(
        "inc-1", victim, Cause.NEIGHBOR_CPU, t0 + 3, 0.9, "runq_p99_ns",
        culprits=[Culprit(culprit, 0.8, who_ran_instead_share=0.7, cpu_cores=1.6), Culprit(Target("/"), 0.0)],
        evidence=[Evidence("runq_p99_ns", 9.5e6, 5, threshold=5e6),
                  Evidence("throttled_ratio", 0.0, 5, note="throttled ratio 0.00, quota None"),
                  Evidence("closed", 0.0, 0.0, note="agent stopped")],
        ended_at=t0 + 30, updated_at=t0 + 30,
    )
    decision = Decision(ActionKind.SUPPRESS, culprit, SuppressAmount(policy="cpuset", cpus=(1, 2, 3)),
                        reason="batch/hog ran 70% of shop/api's runqueue wait", incident_id="inc-1", victim=victim,
                        created_at=t0 + 5)
    return DiagnoseReport(
        started_at=t0, duration_s=30.0, ticks=30, probes={"runqlat": "runqlat: on (tp_btf)"},
        incidents=[inc], decisions=[decision],
        top_workloads=[{"workload": "shop/api", "cgroup": "/kubepods/pod-a", "qos": "LS", "runq_p99_ms_max": 9.5,
                        "runq_p99_ms_median": 4.0, "cpu_cores_mean": None}],
        series={"inc-1": {"victim:runq_p99_ns": [(t0 + i, 1e6 * (i % 12)) for i in range(30)],
                          "victim:throttled_ratio": [(t0 + i, 0.0) for i in range(30)],
                          "culprit:batch/hog": [(t0 + i, 1.6 if i >= 3 else 0.1) for i in range(30)]}},
        still_open={"inc-1"} if still_open else set(),
    )


def test_text_report_header_names_host_kernel_window_and_probes():
    report = _report()
    head = render_text(report).splitlines()[:2]
    start, end = (time.strftime("%H:%M:%S", time.localtime(t)) for t in (report.started_at, report.ended_at))
    assert f"on {report.host} (kernel {report.kernel})" in head[0] and f"{start} to {end}" in head[0], head
    assert head[1] == "probes: runqlat: on (tp_btf)", head


def test_text_report_never_prints_python_none():
    text = render_text(_report())
    assert not re.search(r"\bNone\b", text), text


def test_text_report_never_ranks_the_root_cgroup_as_a_culprit():
    text = render_text(_report())
    assert "batch/hog" in text
    assert not re.search(r"^\s+\d+\. / ", text, re.M), text
    # Nor the JSON report (and so the HTML's embedded copy): the same ranking without the root.
    culprits = _report().to_dict()["incidents"][0]["culprits"]
    assert [c["target"]["cgroup"] for c in culprits] == ["/kubepods/besteffort/pod-b"], culprits


def test_text_report_shows_the_suppress_amount():
    text = render_text(_report())
    assert re.search(r"suppress batch/hog to CPUs 1-3 \(cpuset\)", text), text


def test_incident_open_at_the_end_reads_still_open_not_closed():
    text = render_text(_report(still_open=True))
    assert "still open" in text and "closed" not in text and "agent stopped" not in text, text
    doc = _report(still_open=True).to_dict()["incidents"][0]
    assert doc["still_open"] is True and doc["ended_at"] is None
    closed = render_text(_report(still_open=False))
    assert "still open" not in closed


class _ScriptGrabber(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, str] = {}
        self._id: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._id = dict(attrs).get("id")

    def handle_data(self, data):
        if self._id:
            self.scripts[self._id] = self.scripts.get(self._id, "") + data

    def handle_endtag(self, tag):
        if tag == "script":
            self._id = None


def test_html_report_embeds_parseable_json_even_with_a_closing_script_tag_in_a_name():
    report = _report()
    page = render_html(report)
    grabber = _ScriptGrabber()
    grabber.feed(page)
    embedded = json.loads(grabber.scripts["report"])  # the raw text a browser hands to JSON.parse
    assert embedded == json.loads(json.dumps(report.to_dict(), default=str))
    assert embedded["incidents"][0]["victim"]["pod"] == 'api </script><b>"x"'
    assert "&quot;" not in grabber.scripts["report"]


def test_report_json_times_are_iso_utc():
    doc = _report().to_dict()
    assert doc["schema_version"] == SCHEMA_VERSION
    assert all(_is_iso_utc(doc[k]) for k in ("started_at", "ended_at"))
    assert _is_iso_utc(doc["incidents"][0]["started_at"]) and _is_iso_utc(doc["suggested_actions"][0]["created_at"])


def test_html_report_reads_like_an_incident_summary():
    """Header, a card per incident, and plots in human units on the wall clock with the SLO line, the
    incident window shaded and the victim against its top culprit on one chart."""
    report = _report()
    page = render_html(report)
    for field in (f"<dd>{report.host}</dd>", f"<dd>{report.kernel}</dd>", "runqlat: on (tp_btf)",
                  time.strftime("%H:%M:%S", time.localtime(report.started_at))):
        assert field in page, field
    assert page.count("<section class='card") == 2  # the incident and the workloads table
    assert "still open at the end of the window" in page
    assert "Run-queue wait p99 of shop/api" in page and "vs CPU of batch/hog" in page  # one chart, two axes
    assert "SLO 5 ms" in page  # 5e6 ns threshold shown in ms
    assert "incident window" in page and "fill-opacity" in page
    assert "9.5 ms" in page and "e+0" not in page  # human units, no exponent notation
    ticks = re.findall(r'text-anchor="middle">(\d\d:\d\d:\d\d)</text>', page)
    assert ticks and all(datetime.strptime(t, "%H:%M:%S") for t in ticks)
    assert "suppress batch/hog to CPUs 1-3 (cpuset)" in page


def test_html_report_charts_have_legends_round_axes_human_headings_and_a_dated_header():
    """The rest of issue 17's list for the page as a browser shows it: a legend on every chart, a y axis
    with more than its min and max, headings in words (never a signal's code name outside the embedded
    JSON), and the date of the window in the header, not only clock times."""
    report = _report()
    page = render_html(report)
    visible = page.split("<script type='application/json'")[0]
    day = time.strftime("%Y-%m-%d", time.localtime(report.started_at))
    assert re.search(rf"<dt>window</dt><dd>{day} \d\d:\d\d:\d\d to \d\d:\d\d:\d\d", visible), visible[:2000]
    figures = re.findall(r"<figure>(.*?)</figure>", visible, re.S)
    assert figures
    for fig in figures:
        legend = re.search(r'<div class="legend">(.*?)</div>', fig, re.S)
        assert legend and "class=\"key\"" in legend.group(1), fig[:300]
        y_labels = re.findall(r'text-anchor="end">([\d.,]+)</text>', fig)
        assert len(y_labels) >= 3, y_labels  # round ticks with grid lines, not only min and max
    headline = figures[0]
    legend = re.search(r'<div class="legend">(.*?)</div>', headline, re.S).group(1)
    for key in ("run-queue wait p99", "batch/hog CPU", "SLO", "incident window"):
        assert key in legend, (key, legend)
    for code in ("runq_p99_ns", "throttled_ratio", "cpu_cores"):
        assert code not in visible, code
    # The evidence row names the breached signal in words, with its value and threshold in ms.
    assert re.search(r"<td>Run-queue wait p99</td><td class='num'><b>9.5 ms</b></td><td class='num'>5 ms</td>",
                     visible), visible


def test_incident_card_says_cause_culprit_share_and_advice_in_words():
    """The card of issue 17's list: victim and cause in a sentence, each culprit's share of the victim's
    wait, and the advice; the text report carries the same share."""
    from html import escape

    from noisyneighbor.diagnose import ADVICE

    report = _report()
    page = render_html(report)
    assert re.search(r"<h2>shop/api .*suffers from neighbours&#x27; CPU use</h2>", page), page[:3000]
    assert "<th class='num'>wait share</th>" in page and "<td class='num'>70%</td>" in page
    assert escape(ADVICE[Cause.NEIGHBOR_CPU]) in page
    assert "ran during 70% of the victim's wait" in render_text(report)


def test_culprit_cpu_is_shown_against_its_request():
    report = _report()
    report.cpu_requests = {"batch/hog": 0.0}  # a BestEffort pod the source knows: no request
    assert re.search(r"cpu 1\.60 cores \(request none\)", render_text(report)), render_text(report)
    report.cpu_requests = {"batch/hog": 0.5}
    assert "cpu 1.60 cores (request 0.50)" in render_text(report)
    assert "<td class='num'>0.50</td>" in render_html(report)
    report.cpu_requests = {}  # not known to the pod source: no claim either way
    assert "request" not in render_text(report).split("culprits (ranked):")[1].split("evidence:")[0]


def test_chart_axes_use_round_values_and_clock_aligned_times():
    from noisyneighbor.svgchart import fmt_value, nice_ticks, time_ticks

    assert nice_ticks(0, 7.21) == [0, 2, 4, 6, 8]
    assert nice_ticks(0, 0.034) == [0, 0.01, 0.02, 0.03, 0.04]
    assert [fmt_value(v) for v in (0, 0.25, 2.5, 40, 12000)] == ["0", "0.25", "2.5", "40", "12,000"]
    ticks = time_ticks(1_790_000_003.2, 1_790_000_063.2)
    assert all(t % 10 == 0 for t in ticks) and ticks[0] >= 1_790_000_003.2 and ticks[-1] <= 1_790_000_063.2


def test_html_report_renders_in_headless_chromium(tmp_path):
    """scripts/report-in-browser.py on a report page: Chromium's JSON.parse reads the embedded report,
    nothing is wider than the window, and a screenshot is written. Skipped without Debian's chromium."""
    require_tool("chromium")
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(render_html(_report()), encoding="utf-8")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "report-in-browser.py"), "--html", str(page),
                          "--screenshot", str(shot), "--height", "1600"], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout)
    assert result["ok"] and result["schema_version"] == SCHEMA_VERSION and result["incidents"] == 1
    assert result["svgs"] >= 2 and not result["overflow"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command", ["diagnose", "agent"])
@pytest.mark.parametrize("field", ["softirq_ms_per_s", "reclaim_stall_ms_per_s"])
def test_an_slo_of_zero_a_rule_divides_by_exits_2_with_one_line(tmp_path, command, field):
    """Defect: ``slo: {softirq_ms_per_s: 0}`` was accepted and diagnose died in the cause rule with
    ZeroDivisionError. Now it is refused before anything starts: one line, exit 2."""
    config = write_config(tmp_path / "policy.yaml", {"slo": {field: 0}})
    extra = ["--duration", "2"] if command == "diagnose" else ["--journal-dir", str(tmp_path / "journal")]
    res = _run(command, "--config", str(config), "--pods", "standalone", *extra, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "ZeroDivisionError" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("noisyneighbor:")]
    assert lines == [f"noisyneighbor: {config}: slo.{field}: must be > 0 (a cause rule divides by it), got 0"], \
        res.stderr
