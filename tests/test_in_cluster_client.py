# SPDX-License-Identifier: Apache-2.0
"""The agent's in-cluster apiserver client is built at its first use, not at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# In a child: the agent's wiring in a pod-like environment (service host set, a token file), then
# the first Event. load_incluster_config() reads the real service account paths, absent here, so
# that first use fails: the poster logs it and counts a failure, the agent goes on.
CHILD = r"""
import logging, sys
from noisyneighbor.agent import wiring as agent  # where the in-cluster client is wired
from detector.policy import Policy
from tests.test_kube_events import _incident

logging.disable(logging.CRITICAL)
agent.SERVICE_ACCOUNT_TOKEN = sys.argv[1]
poster = agent._event_poster(Policy())
print("poster", poster is not None)
if poster is None:
    sys.exit(0)
loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes")
print("at start", loaded())
print("posted", poster.post(_incident()), "failures", poster.failures)
print("after first use", bool(loaded()))
"""


def _run(tmp_path: Path, token: Path, env_host: bool) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if env_host:
        env |= {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(token)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    return out.stdout + out.stderr


def test_the_client_is_imported_at_the_first_event_not_at_start(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    out = _run(tmp_path, token, env_host=True)
    assert "poster True" in out and "at start []" in out, out
    assert "posted False failures 1" in out, out
    assert "after first use True" in out, out
    assert "Traceback" not in out, out


def test_no_service_account_token_means_no_poster(tmp_path: Path) -> None:
    out = _run(tmp_path, tmp_path / "missing", env_host=True)
    assert "poster False" in out and "Traceback" not in out, out
