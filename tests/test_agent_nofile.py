# SPDX-License-Identifier: Apache-2.0
"""The agent raises its soft RLIMIT_NOFILE to the hard limit at start (as Go's runtime does), so that under
a runtime giving containers a soft limit of 1,024 the collector's kept-open usage files (HotFiles, at most
half the soft limit) still cover 1,000 pods. Checked on a real agent process started with a low soft
limit (the kernel's /proc/<pid>/limits is the ground truth), and a failure to raise is a warning only."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys

import pytest

from noisyneighbor.agent import wiring
from testkit.exporter_support import AgentProcess, write_config

LOW_SOFT = 256


def _open_files_limits(pid: int) -> tuple[str, str]:
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return soft, hard


def _with_low_soft_limit() -> tuple[int, int]:
    """Lower this process's soft limit (children inherit it); returns the limits to restore."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    if before[1] != resource.RLIM_INFINITY and before[1] <= LOW_SOFT:
        pytest.skip(f"hard RLIMIT_NOFILE {before[1]} leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_SOFT, before[1]))
    return before


def test_a_process_with_a_low_soft_limit_raises_it_to_the_hard_limit():
    before = _with_low_soft_limit()
    try:
        code = ("import resource\nfrom noisyneighbor.agent.wiring import raise_open_files_limit\n"
                "print(*resource.getrlimit(resource.RLIMIT_NOFILE), *raise_open_files_limit(),"
                " *resource.getrlimit(resource.RLIMIT_NOFILE))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    started, _hard, soft, hard, now_soft, now_hard = map(int, out.stdout.split())
    assert started == LOW_SOFT
    assert (soft, hard) == (now_soft, now_hard) == (before[1], before[1])


def test_a_failure_to_raise_is_a_one_line_warning(monkeypatch, caplog):
    def refuse(which: int, limits: tuple[int, int]) -> None:
        raise ValueError("not allowed\nhere")

    monkeypatch.setattr(wiring.resource, "getrlimit", lambda which: (LOW_SOFT, 4096))
    monkeypatch.setattr(wiring.resource, "setrlimit", refuse)
    with caplog.at_level(logging.INFO, logger="noisyneighbor.agent"):
        assert wiring.raise_open_files_limit() == (LOW_SOFT, 4096)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


@pytest.mark.root
def test_the_agent_started_with_a_low_soft_limit_runs_with_the_hard_limit(tmp_path):
    config = write_config(tmp_path / "config.yaml", {"kubernetes": {"pod_source": "standalone"}})
    before = _with_low_soft_limit()
    try:
        agent = AgentProcess(config, tmp_path, "--interval", "0.5")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    try:
        agent.wait_ready()
        soft, hard = _open_files_limits(agent.proc.pid)
        assert soft == hard and soft != str(LOW_SOFT), (soft, hard)
    finally:
        rc = agent.terminate()
    assert rc == 0, agent.log_tail()
