# SPDX-License-Identifier: Apache-2.0
"""Shared by test_exporter and test_dashboards: real probes -> NodeSnapshot -> Exporter -> HTTP scrape.

The snapshot is built here from the probes and the /proc and cgroup readers (the agent's collector
does the same in production); it reads files only for the test's own cgroups, at their path in each
hierarchy (on this host the memory hierarchy puts our cgroups under a different parent than cpu).
:class:`AgentProcess` runs the real ``noisyneighbor agent`` as a subprocess for the end-to-end tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from detector.cgroups import CgroupResolver
from detector.decisions import Target
from noisyneighbor.exporter import Exporter, Labeler, ResolverLabeler
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.cpuacct import read_cgroup_cpu
from probes.engine import ProbeError
from probes.memstat import read_memstat, read_node_vmstat
from probes.psi import read_cgroup_psi, read_node_psi
from probes.reclaim import ReclaimProbe
from probes.runqlat import RunqLatProbe
from probes.snapshot import NodeSnapshot, parse_proc_stat
from probes.softirq import SoftirqProbe
from probes.tcpconnect import TcpConnectProbe
from testkit.sandbox import OwnedCgroup
from testkit.timing import slowdown

CONTROLLERS = ("cpu", "cpuacct", "memory", "unified")


def rel_path(cg: OwnedCgroup, controller: str, hierarchy: Hierarchy | None) -> str | None:
    if hierarchy is None or controller not in cg.dirs:
        return None
    return "/" + str(cg.dirs[controller].relative_to(hierarchy.mount))


class ProbeSet:
    """The four BPF probes, loaded once; skips the test with the reason when one cannot load."""

    def __init__(self) -> None:
        self.layout: CgroupLayout = discover()
        self.probes = {}
        try:
            self.probes["runqlat"] = RunqLatProbe(layout=self.layout)
            self.probes["softirq"] = SoftirqProbe(layout=self.layout)
            self.probes["reclaim"] = ReclaimProbe(layout=self.layout)
            self.probes["tcpconnect"] = TcpConnectProbe(layout=self.layout)
        except ProbeError as e:
            self.close()
            pytest.skip(f"a BPF probe cannot load on this kernel: {e}")

    def snapshot(self, cgroups: Iterable[OwnedCgroup] = ()) -> NodeSnapshot:
        lay = self.layout
        cpu_h, mem_h = lay.hierarchy_for("cpu") or lay.v2, lay.hierarchy_for("memory") or lay.v2
        cgroup_cpu, cgroup_mem, cgroup_psi = {}, {}, {}
        for cg in cgroups:
            if (p := rel_path(cg, "cpu", cpu_h)) and (stat := read_cgroup_cpu(lay, p)) is not None:
                cgroup_cpu[p] = stat
            if (p := rel_path(cg, "memory", mem_h)) and (mem := read_memstat(lay, p)) is not None:
                cgroup_mem[p] = mem
            if (p := rel_path(cg, "unified", lay.v2)) and lay.v2 is not None:
                psi = read_cgroup_psi(lay.v2.path_of(p))
                if psi:
                    cgroup_psi[p] = psi
        with open("/proc/stat") as f:
            node_cpu, per_cpu = parse_proc_stat(f.read())
        p = self.probes
        return NodeSnapshot(
            monotonic_s=time.monotonic(), wall_s=time.time(),
            plugins={name: probe.snapshot() for name, probe in p.items()},
            node_cpu=node_cpu, node_cpu_per_cpu=per_cpu, node_psi=read_node_psi(), node_vmstat=read_node_vmstat(),
            cgroup_cpu=cgroup_cpu, cgroup_mem=cgroup_mem, cgroup_psi=cgroup_psi,
            probe_status={name: probe.status for name, probe in p.items()},
            bpf_programs=[s for probe in p.values() for s in probe.probe.program_stats()],
        )

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
        self.probes.clear()


@dataclass
class PodLabeler:
    """The default labeler plus pod names for the test's fake pod UIDs (what pod metadata adds)."""

    inner: Labeler
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # uid -> (namespace, name)

    def _named(self, target: Target | None) -> Target | None:
        if target is None or target.pod_uid not in self.pods:
            return target
        namespace, pod = self.pods[target.pod_uid]
        return Target(target.cgroup, target.pod_uid, namespace, pod, target.qos)

    def target_for_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> Target | None:
        return self._named(self.inner.target_for_id(cgroup_id, hierarchy))

    def target_for_path(self, cgroup_path: str) -> Target | None:
        return self._named(self.inner.target_for_path(cgroup_path))


def pod_cgroup_name(qos: str) -> tuple[str, str]:
    """(cgroup name below the test prefix, pod uid) laid out as kubelet's systemd driver does it."""
    uid = str(uuid.uuid4())
    slug = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{slug}.slice", uid
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice", uid


class Scraper:
    """An Exporter on its own registry, served over HTTP on 127.0.0.1 (ephemeral port)."""

    def __init__(self, exporter_kwargs: dict | None = None, labeler: Labeler | None = None) -> None:
        self.registry = CollectorRegistry()
        layout = discover()
        self.labeler = PodLabeler(labeler or ResolverLabeler(CgroupResolver(layout=layout)))
        self.exporter = Exporter(self.registry, self.labeler, layout=layout, **(exporter_kwargs or {}))
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self.server.server_port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def scrape_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=10) as resp:
            return resp.read().decode()

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        """{(sample name, labels): value} of one scrape."""
        out = {}
        for family in text_string_to_metric_families(self.scrape_text()):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.shutdown()
            self.server.server_close()


def samples(scrape: dict, name: str, **labels: str) -> dict[frozenset, float]:
    """The samples named `name` whose labels include `labels`."""
    want = set(labels.items())
    return {lbls: v for (n, lbls), v in scrape.items() if n == name and want <= lbls}


# -- the real agent, as a subprocess -----------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cgroup_rel_path(cg: OwnedCgroup, controller: str = "cpu") -> str:
    """The cgroup's path relative to its hierarchy root, no leading slash (what policy globs match)."""
    h = cg.layout.hierarchy_for(controller)
    return str(cg.dirs[controller].relative_to(h.mount))


def _proc_state(pid: int) -> str:
    """Where a process is stuck, as the kernel sees it: state, wait channel, kernel stack, command."""
    parts = []
    for name in ("stat", "wchan", "stack", "cmdline"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text(errors="replace")
        except OSError as e:
            text = f"<{e.strerror}>"
        if name == "stat":
            text = text.rsplit(")", 1)[-1].split()[0]
        parts.append(f"{name}: {' '.join(text.replace(chr(0), ' ').split())[:400]}")
    return "; ".join(parts)


class AgentProcess:
    """``noisyneighbor agent`` started with ``python -m noisyneighbor.cli`` on a free 127.0.0.1 port."""

    def __init__(self, config: Path, tmp: Path, *extra: str, node: str = "nn-agent-test",
                 cgroup: OwnedCgroup | None = None) -> None:
        self.port = free_port()
        self.journal = tmp / "journal"
        self.audit_log = tmp / "audit.jsonl"
        self.stderr_path = tmp / "agent.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "noisyneighbor.cli", "agent", "--config", str(config), "--node-name", node,
             "--listen", f"127.0.0.1:{self.port}", "--journal-dir", str(self.journal),
             "--audit-log", str(self.audit_log), *extra],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=self._stderr,
            # faulthandler: an agent that never gets ready is sent SIGABRT and prints where each of
            # its threads is (wait_ready), instead of an empty log.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        if cgroup is not None:
            # Moved by this process right after the spawn, not by a preexec_fn: Python code between fork
            # and exec in a process with threads (the test's fake kubelet, Prometheus) can deadlock on
            # a lock another thread held at the fork. CI under load saw an agent that never started
            # (nothing logged in 60 s, not even faulthandler's stacks at SIGABRT).
            cgroup.add_pid(self.proc.pid)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.target}{path}", timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_ready(self, timeout: float | None = None) -> dict:
        """The /readyz body once it answers 200; fails with the agent's log tail otherwise. The
        default: 60 s on the reference machine, longer on a slower one (a TCG guest, a loaded host)."""
        timeout = timeout if timeout is not None else 60.0 * slowdown()
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                code, body = self.get("/readyz", timeout=2)
                last = (code, body[:300])
                if code == 200:
                    return json.loads(body)
            except OSError:
                pass
            time.sleep(0.3)
        stacks = ""
        if self.proc.poll() is None:
            stacks = f" (process: {_proc_state(self.proc.pid)})"
            os.kill(self.proc.pid, signal.SIGABRT)  # faulthandler prints every thread's stack, then it dies
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            stacks += " (its Python stacks at SIGABRT, if it got that far, are at the end of the log)"
        raise AssertionError(f"agent not ready in {timeout:.0f} s (last {last}){stacks}:\n{self.log_tail(80)}")

    def scrape_text(self) -> str:
        code, body = self.get("/metrics")
        assert code == 200, code
        return body.decode()

    def audit(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            return []

    def log_tail(self, lines: int = 30) -> str:
        if not self._stderr.closed:  # closed by terminate(): the file is complete then
            self._stderr.flush()
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit code (killed after `timeout`, then -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


def write_config(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
