# SPDX-License-Identifier: Apache-2.0
"""The real Prometheus server (Debian's `prometheus` binary) for tests: 127.0.0.1 only, a temp config
and storage directory, scraping the targets it is given, stopped (and its directory removed) after.

    with PrometheusServer(["127.0.0.1:9100"], rule_files=[path]) as prom:
        prom.wait_for_samples("up")
        prom.query('up{job="nn"}')
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import yaml


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered a query with an error; str() is one line."""


def _free_port() -> int:
    # A small race (the port could be taken before Prometheus binds it) that start() reports clearly.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(
        self,
        targets: Iterable[str],
        *,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Iterable[Path] = (),
        binary: str = "prometheus",
        job: str = "noisyneighbor",
        target_labels: Iterable[dict[str, str]] = (),
        bearer_token_file: Path | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        found = shutil.which(binary)
        if found is None:
            raise PrometheusError(f"{binary} is not installed (scripts/setup.sh test installs the prometheus package)")
        self.binary = found
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.rule_files = [Path(p) for p in rule_files]
        self.job = job
        # Each also scrapes every target once more with these labels (e.g. {"cluster": "c1"}): the same
        # series with and without a label, as a multi-cluster Prometheus and a single-cluster one see them.
        self.target_labels = [dict(labels) for labels in target_labels]
        # Scrapes send this token (`authorization: credentials_file`), as a ServiceMonitor's bearerTokenFile does.
        self.bearer_token_file = bearer_token_file
        # Target labels a ServiceMonitor's relabelings would add (e.g. app_kubernetes_io_name).
        self.labels = dict(labels or {})
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.dir = Path(tempfile.mkdtemp(prefix="nn-prometheus-"))
        rules = []
        for i, rule_file in enumerate(self.rule_files):
            copy = self.dir / f"rules-{i}.yaml"
            shutil.copyfile(rule_file, copy)
            rules.append(str(copy))
        job: dict = {"job_name": self.job, "static_configs": [
            {"targets": self.targets, "labels": self.labels},
            *({"targets": self.targets, "labels": {**self.labels, **labels}} for labels in self.target_labels),
        ]}
        if self.bearer_token_file is not None:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(self.bearer_token_file)}
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.evaluation_interval},
            "rule_files": rules,
            "scrape_configs": [job],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = _free_port()
        log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process in stop()
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        self._log = log
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"prometheus was not ready within {timeout:.0f} s")

    def log_tail(self, lines: int = 5) -> str:
        if self.dir is None or not (self.dir / "prometheus.log").exists():
            return ""
        return " | ".join((self.dir / "prometheus.log").read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str | list[str]) -> dict | list:
        """GET /api/v1/<path>; returns `data`, raises PrometheusError on an error answer."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query: the result vector (or [] for an empty one)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)
        return data["result"]

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict]:
        """Poll until the query returns data."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
