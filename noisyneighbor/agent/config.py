# SPDX-License-Identifier: Apache-2.0
"""The agent's command-line configuration and the policy it yields (the file plus the command line's overrides)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from actuators.journal import DEFAULT_JOURNAL_DIR
from detector.policy import POD_SOURCES, Policy, load_policy
from noisyneighbor.agent.auth import AuthConfig, AuthSetupError
from probes.collect import BPF_PROBES
from probes.engine import check_btf_file
from probes.registry import NAMES, PLUGINS

# IPv6 and IPv4 on one socket; 0.0.0.0 when the node has IPv6 off (http_server.start_http_server).
DEFAULT_LISTEN = "[::]:9717"
# /healthz turns 503 when no tick completed for this many intervals (a stuck loop, not a slow one).
STALE_INTERVALS = 3


class AgentConfigError(ValueError):
    """A bad agent setting (flag or config); ``str(exc)`` is one line. Raised before anything starts."""


@dataclass
class AgentConfig:
    """What the command line (or an in-process driver such as the scenario bench) sets.

    ``None`` means "what the policy file says" for the fields the policy also has.
    """

    config_path: str | None = None
    node_name: str | None = None
    host_root: str | None = None
    listen: str | None = DEFAULT_LISTEN  # None: no HTTP server (in-process use)
    dry_run: bool | None = None
    evict: bool | None = None  # actuators.evict_enabled
    resctrl: bool | None = None  # actuators.resctrl_enabled
    journal_dir: str = str(DEFAULT_JOURNAL_DIR)
    audit_log: str | None = None
    incident_log: str | None = None
    interval_s: float | None = None
    probes: tuple[str, ...] = BPF_PROBES
    max_cgroups: int = 2000
    # The probes' own settings from the command line (ProbePlugin.options, e.g. the run-queue probe's table
    # sizes): probe name -> factory keyword -> value; None or missing: the probe's default.
    probe_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    max_bucket_seconds: float = 10.0  # runqueue histograms: the last finite bucket's bound
    min_bucket_seconds: float = 100e-6  # and the first's (waits below it share that bucket)
    extra_node_series: bool = False  # PSI averages and /proc/stat per CPU: node_exporter has them
    # Runqueue and softirq series per CPU (and CPU x vector), not summed over the node's CPUs: ~26k
    # more series on a 64-CPU node. The detector reads per-CPU softirq time either way.
    per_cpu_series: bool = False
    pod_source: str | None = None  # auto | kubelet | apiserver | standalone
    ls_cgroups: tuple[str, ...] = ()  # added to the policy's standalone globs
    be_cgroups: tuple[str, ...] = ()
    # Open the node readers of the probes not loaded (ProbePlugin.node_reader: NVML for the node's GPU
    # device metrics); tests turn them off.
    node_readers: bool = True
    # Actuators only touch cgroups matching one of these globs (fnmatch on the path without leading
    # slash); empty: no restriction. Tests and benches use it so an enforcing agent on a shared node
    # can only change cgroups they created.
    act_only: tuple[str, ...] = ()
    btf: str | None = None  # BTF of this kernel when it has no /sys/kernel/btf/vmlinux (--btf)
    # /top and /diagnose (and /metrics if it says so) only for callers the apiserver vouches for (--auth
    # kubernetes; the DaemonSet sets it). None: open, as for a local `noisyneighbor agent`.
    auth: AuthConfig | None = None

    def validate(self) -> None:
        unknown = set(self.probes) - set(NAMES)
        if unknown:
            raise AgentConfigError(f"unknown probe(s) {', '.join(sorted(unknown))}; known: {', '.join(NAMES)}")
        if self.interval_s is not None and not 0.01 <= self.interval_s <= 3600:
            raise AgentConfigError(f"interval must be between 0.01 and 3600 s, got {self.interval_s:g}")
        if self.max_cgroups < 1:
            raise AgentConfigError(f"max cgroups must be at least 1, got {self.max_cgroups}")
        for plugin in PLUGINS:
            for option in plugin.options:
                if problem := option.problem(self.probe_options.get(plugin.name, {}).get(option.name)):
                    raise AgentConfigError(problem)
        if not self.max_bucket_seconds > 0:
            raise AgentConfigError(f"bucket max must be positive, got {self.max_bucket_seconds:g} s")
        if not 0 < self.min_bucket_seconds < self.max_bucket_seconds:
            raise AgentConfigError(f"bucket min must be above 0 and below the bucket max, got "
                                   f"{self.min_bucket_seconds:g} s")
        if self.pod_source is not None and self.pod_source not in POD_SOURCES:
            raise AgentConfigError(f"pod source must be one of {', '.join(POD_SOURCES)}, got {self.pod_source!r}")
        if self.listen is not None:
            parse_listen(self.listen)
        if self.auth is not None and self.listen is not None:
            try:
                self.auth.check()
            except AuthSetupError as e:
                raise AgentConfigError(str(e)) from None
        if self.btf is not None:
            try:
                check_btf_file(self.btf)
            except ValueError as e:
                raise AgentConfigError(str(e)) from None


def parse_listen(text: str) -> tuple[str, int]:
    """'0.0.0.0:9717' / ':9717' / '[::1]:0' -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise AgentConfigError(f"listen address must be HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def policy_for(config: AgentConfig, policy: Policy | None = None) -> Policy:
    """The policy file (or ``policy``) with the command line's overrides applied."""
    base = policy if policy is not None else load_policy(config.config_path)
    changes: dict[str, Any] = {}
    if config.node_name:
        changes["node_name"] = config.node_name
    if config.interval_s is not None:
        changes["interval_seconds"] = config.interval_s
    if config.incident_log is not None:
        changes["incident_log"] = config.incident_log
    if config.pod_source is not None:
        changes["pod_source"] = config.pod_source
    if config.ls_cgroups:
        changes["ls_cgroups"] = (*base.ls_cgroups, *config.ls_cgroups)
    if config.be_cgroups:
        changes["be_cgroups"] = (*base.be_cgroups, *config.be_cgroups)
    acts = {name: value for name, value in (("dry_run", config.dry_run), ("evict_enabled", config.evict),
                                            ("resctrl_enabled", config.resctrl)) if value is not None}
    if acts:
        changes["actuators"] = dataclasses.replace(base.actuators, **acts)
    return dataclasses.replace(base, **changes) if changes else base


