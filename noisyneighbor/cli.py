# SPDX-License-Identifier: Apache-2.0
"""The `noisyneighbor` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, TextIO

from noisyneighbor.kubectl_plugin import parse_duration  # one stdlib-only file (krew ships it alone)
from probes.engine import ProbeError, use_btf_file
from probes.host import HostPaths

if TYPE_CHECKING:
    from noisyneighbor.agent.auth import AuthConfig

log = logging.getLogger("noisyneighbor")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCIDENTS = 0, 1, 2, 3
EXIT_CODES = """exit codes:
  0  done (diagnose: no incident, or incidents without --fail-on-incident; top: quit or reader left the pipe)
  1  could not run: no probe could start, or a file/host error (one line on stderr)
  2  bad usage or configuration (one line on stderr; nothing was started or changed)
  3  diagnose --fail-on-incident: at least one incident in the window"""


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _probe_list(text: str) -> tuple[str, ...]:
    from probes.registry import NAMES

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown probe(s) {', '.join(unknown) or '(none)'}; known: {', '.join(NAMES)}")
    return names


class _VersionAction(argparse.Action):
    """argparse's "version" action with the version looked up when asked: the lookup imports
    importlib.metadata (~1.5 MiB of RSS), which the agent would otherwise carry for its whole life."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: str = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from noisyneighbor.output import package_version

        print(f"{parser.prog} {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    # Not noisyneighbor.top: it imports rich's live display, which `agent` would carry for nothing.
    from noisyneighbor.sections import DEFAULT_SORT, SORT_KEYS, SORT_VIEWS, VIEW_CHOICES, VIEWS
    from noisyneighbor.views import VIEW_HOTKEYS, VIEW_TITLES
    from probes.registry import ENGINE_ATTACH_MODES, PLUGINS

    # --attach-mode: "auto", each probe's own flavours (ProbePlugin.flavours, with its probe), the engine's.
    own_flavours = tuple((p.name, mode) for p in PLUGINS for mode in p.flavours)
    attach_modes = ("auto", *(mode for _, mode in own_flavours), *(m for m in ENGINE_ATTACH_MODES if m != "auto"))
    # The probes with node metric families that grow with the CPUs (MetricSpec.per_cpu): --per-cpu-series.
    per_cpu_probes = tuple(p.name for p in PLUGINS if any(spec.per_cpu for spec in p.metric_specs))

    parser = argparse.ArgumentParser(
        prog="noisyneighbor",
        description="eBPF interference detector for Kubernetes nodes: who steals time from whom, and why.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--host-root", metavar="DIR", help="host filesystem root (e.g. /host in a container)")
    parser.add_argument("--btf", metavar="FILE", help="BTF of this kernel, for kernels without /sys/kernel/btf/vmlinux")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: libbpf too)")
    sub = parser.add_subparsers(dest="command", required=True)
    # Global options are also accepted after every subcommand (the DaemonSet and the kubectl plugin
    # pass --host-root there).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host-root", metavar="DIR", default=argparse.SUPPRESS, help="host filesystem root")
    common.add_argument("--btf", metavar="FILE", default=argparse.SUPPRESS, help="BTF of this kernel (no vmlinux BTF)")
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="more logging")
    common.add_argument("--log-format", choices=("plain", "json"), default=argparse.SUPPRESS,
                        help="log lines on stderr: plain text (default) or one JSON object per line")

    top = sub.add_parser(
        "top", parents=[common],
        help="live interference per cgroup / pod / CPU, one view per probe: " + ", ".join(VIEWS),
        description="One view per probe: " + "; ".join(f"{view}: {VIEW_TITLES[view]}" for view in VIEWS)
        + ". On a terminal every probe is loaded and keys switch views ("
        + ", ".join(f"{key} {view}" for key, view in VIEW_HOTKEYS.items())
        + "); piped or --json, only the probes of --view load.",
    )
    top.add_argument("--view", choices=VIEW_CHOICES, default=VIEWS[0], help=f"what to show (default: {VIEWS[0]})")
    top.add_argument("--interval", type=_positive_float, default=1.0, metavar="S", help="refresh every S seconds")
    top.add_argument("--once", action="store_true", help="print one interval and exit")
    top.add_argument("--json", action="store_true", help="JSON (with --once: one record; else JSON lines)")
    top.add_argument("--count", type=int, metavar="N", help="stop after N intervals")
    top.add_argument("--sort", choices=sorted(SORT_KEYS), default=DEFAULT_SORT,
                     help=f"{', '.join(SORT_VIEWS)} sort column (default: {DEFAULT_SORT})")
    top.add_argument(
        "--cgroup", metavar="PATH", help="only this cgroup and its descendants (path in each view's hierarchy)"
    )
    top.add_argument("--limit", type=int, metavar="N", help="show at most N rows per view")
    top.add_argument(
        "--attach-mode",
        choices=attach_modes,
        default="auto",
        help="force a tracepoint flavour ("
        + "; ".join(f"{mode}: {name} only" for name, mode in own_flavours) + "; the other probes then use auto)",
    )

    agent = sub.add_parser(
        "agent", parents=[common],
        help="the node daemon: probes -> detector -> actuators, with /metrics, /healthz and /readyz",
        description="Runs until SIGTERM/SIGINT, then restores every actuator change and exits 0. "
        "A bad config is one line on stderr and exit 2, with nothing started or changed.",
    )
    agent.add_argument("--config", metavar="FILE", help="policy file (ours or a Koordinator slo-controller-config)")
    agent.add_argument("--node-name", metavar="NAME", help="this node's name (default: policy, then $NODE_NAME)")
    agent.add_argument("--listen", metavar="HOST:PORT", default="[::]:9717",
                       help="HTTP address for /metrics, /healthz, /readyz (port 0: any free port; [::] falls "
                            "back to 0.0.0.0 without IPv6)")
    agent.add_argument("--auth", choices=("none", "kubernetes"), default="none",
                       help="kubernetes: /top and /diagnose only for bearer tokens the apiserver accepts and "
                            "authorizes (TokenReview + SubjectAccessReview on the path); /healthz, /readyz stay open")
    agent.add_argument("--auth-metrics", action="store_true", help="with --auth kubernetes: /metrics too")
    agent.add_argument("--auth-apiserver", metavar="URL", help="apiserver for the reviews (default: in-cluster)")
    agent.add_argument("--auth-ca-file", metavar="FILE", help="CA of the apiserver (default: the service account's)")
    agent.add_argument("--auth-token-file", metavar="FILE",
                       help="the agent's own token for the reviews (default: the service account's)")
    agent.add_argument("--dry-run", action=argparse.BooleanOptionalAction, default=None,
                       help="plan and log actions without changing anything (default: the policy's actuators.dry_run)")
    # The opt-in actuators that need more than the base install (an RBAC grant, a host mount): the
    # deploy/components that add those also turn the actuator on with these flags.
    agent.add_argument("--evict", action=argparse.BooleanOptionalAction, default=None,
                       help="the evict actuator (default: the policy's actuators.evict_enabled)")
    agent.add_argument("--resctrl", action=argparse.BooleanOptionalAction, default=None,
                       help="the LLC/memory-bandwidth actuator (default: the policy's actuators.resctrl_enabled)")
    agent.add_argument("--journal-dir", metavar="DIR", default=None,
                       help="where originals of changed files are kept until restored")
    agent.add_argument("--audit-log", metavar="FILE", help="JSON lines, one per action state change")
    agent.add_argument("--incident-log", metavar="FILE", help="JSON lines, one per incident opened/closed")
    agent.add_argument("--interval", type=parse_duration, metavar="S", help="tick interval (default: the policy's)")
    agent.add_argument("--probes", type=_probe_list, metavar="LIST", default=None,
                       help="comma-separated BPF probes to load (default: all)")
    agent.add_argument("--max-cgroups", type=int, default=2000, metavar="N",
                       help="cgroups with their own metric series; the rest are summed into cgroup=\"_overflow\"")
    for option in (o for p in PLUGINS for o in p.options if o.flag):  # the probes' own (ProbePlugin.options)
        agent.add_argument(option.flag, type=option.type, default=option.default, metavar=option.metavar,
                           help=option.help)
    agent.add_argument("--bucket-max", type=parse_duration, default=10.0, metavar="S",
                       help="runqueue histograms: the last bucket's bound (default 10 s: le 8.39 s, then +Inf)")
    agent.add_argument("--bucket-min", type=parse_duration, default=100e-6, metavar="S",
                       help="runqueue histograms: the first bucket's bound, waits below it share that bucket "
                            "(default 100us: le 128 us; 17 buckets with the default max)")
    agent.add_argument("--extra-node-series", action="store_true",
                       help="also export PSI averages and /proc/stat per CPU and mode (node_exporter has both)")
    agent.add_argument("--per-cpu-series", action="store_true",
                       help="export the node series that grow with its CPUs per CPU, not summed over CPUs (those "
                            f"of {', '.join(per_cpu_probes)}; e.g. ~26k more series at 64 CPUs)")
    agent.add_argument("--pods", choices=("auto", "kubelet", "apiserver", "standalone"), default=None,
                       help="pod metadata source (default: the policy's)")
    agent.add_argument("--act-only", action="append", default=[], metavar="GLOB",
                       help="actuators only touch cgroups matching this path glob (repeatable; default: any)")

    diag = sub.add_parser(
        "diagnose", parents=[common],
        help="watch for a while, then report victims, causes, culprits, evidence and advice (changes nothing)",
        description="Runs the probes and the detector for --duration; suggested actions are printed, never applied. "
        "On a terminal, progress (elapsed / duration, incidents so far) is shown on stderr; piped, nothing extra.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diag.add_argument("--duration", type=parse_duration, default=30.0, metavar="D", help="how long (30, 30s, 2m)")
    diag.add_argument("--interval", type=parse_duration, default=1.0, metavar="S", help="tick interval")
    diag.add_argument("--json", action="store_true", help="print the report as one JSON document")
    diag.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    diag.add_argument("--config", metavar="FILE", help="policy file (SLO thresholds, standalone globs)")
    diag.add_argument("--pods", choices=("auto", "kubelet", "apiserver", "standalone"), default=None,
                      help="pod metadata source (default: the policy's)")
    diag.add_argument("--ls-cgroup", action="append", default=[], metavar="GLOB",
                      help="cgroup path glob of a latency-sensitive workload (repeatable)")
    diag.add_argument("--be-cgroup", action="append", default=[], metavar="GLOB",
                      help="cgroup path glob of a best-effort workload (repeatable)")
    diag.add_argument("--probes", type=_probe_list, metavar="LIST", default=None,
                      help="comma-separated BPF probes to load (default: all)")
    diag.add_argument("--fail-on-incident", action="store_true",
                      help="exit 3 when the window had at least one incident (for scripts and CI)")

    restore = sub.add_parser(
        "restore", parents=[common],
        help="put back every change the node's journal records (uninstall, after a kill -9), retrying failures",
        description="Exit 0 when the journal is empty; 1 with what is left (kept in the journal, run it again).",
    )
    restore.add_argument("--journal-dir", metavar="DIR", default="/var/lib/noisyneighbor/journal")
    restore.add_argument("--attempts", type=int, default=5, metavar="N", help="tries for entries that failed")
    restore.add_argument("--retry-interval", type=parse_duration, default=2.0, metavar="S")
    restore.add_argument("--purge", action="store_true",
                         help="then remove the emptied journal directory (and its parent if empty): uninstall")
    restore.add_argument("--apiserver", metavar="URL", help="for resize entries outside a pod (default: in-cluster)")
    restore.add_argument("--token-file", metavar="FILE", help="bearer token for --apiserver")
    restore.add_argument("--ca-file", metavar="FILE", help="CA of --apiserver")

    completion = sub.add_parser(
        "completion", help="print a shell completion script (bash, or zsh through bashcompinit)",
        description="bash: source <(noisyneighbor completion bash); zsh: source <(noisyneighbor completion zsh)",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    return parser


def _auth_config(args: argparse.Namespace) -> AuthConfig | None:
    from noisyneighbor.agent.auth import AuthConfig

    if args.auth == "none":
        return None
    defaults = AuthConfig()
    return AuthConfig(protect_metrics=args.auth_metrics, apiserver=args.auth_apiserver,
                      ca_file=args.auth_ca_file or defaults.ca_file, token_file=args.auth_token_file or defaults.token_file)


def _probe_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The probes' own flags as given (ProbePlugin.options): probe name -> factory keyword -> value."""
    from probes.registry import PLUGINS

    return {p.name: {o.name: getattr(args, o.dest) for o in p.options if o.flag} for p in PLUGINS if p.options}


def cmd_agent(args: argparse.Namespace) -> int:
    from noisyneighbor.agent import Agent, AgentConfig, AgentConfigError
    from probes.collect import BPF_PROBES

    config = AgentConfig(
        config_path=args.config, node_name=args.node_name, host_root=getattr(args, "host_root", None),
        listen=args.listen, dry_run=args.dry_run, evict=args.evict, resctrl=args.resctrl,
        audit_log=args.audit_log, incident_log=args.incident_log,
        interval_s=args.interval, probes=args.probes or BPF_PROBES, max_cgroups=args.max_cgroups,
        pod_source=args.pods, act_only=tuple(args.act_only), max_bucket_seconds=args.bucket_max,
        min_bucket_seconds=args.bucket_min, probe_options=_probe_flags(args),
        extra_node_series=args.extra_node_series, per_cpu_series=args.per_cpu_series, btf=getattr(args, "btf", None),
        auth=_auth_config(args),
    )
    if args.journal_dir:
        config.journal_dir = args.journal_dir
    try:
        config.validate()
    except AgentConfigError as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return EXIT_USAGE
    agent = Agent(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.request_stop())
    agent.start()  # PolicyError / JournalError / OSError go to main()'s one-line handlers
    agent.run()  # returns after a signal; stop() has restored actuator changes
    return 0


def cmd_diagnose(args: argparse.Namespace, paths: HostPaths) -> int:
    import dataclasses

    from detector.cgroups import CgroupResolver
    from detector.decisions import LoggingSink
    from detector.pods import make_pod_source
    from detector.policy import load_policy
    from detector.runtime import Detector
    from noisyneighbor.diagnose import render_text, run_diagnose
    from noisyneighbor.report_html import render_html
    from probes.cgroupfs import discover
    from probes.collect import BPF_PROBES, NodeCollector

    policy = load_policy(args.config)
    changes: dict = {"incident_log": None, "interval_seconds": args.interval}  # diagnose writes nothing
    if args.pods:
        changes["pod_source"] = args.pods
    if args.ls_cgroup:
        changes["ls_cgroups"] = (*policy.ls_cgroups, *args.ls_cgroup)
    if args.be_cgroup:
        changes["be_cgroups"] = (*policy.be_cgroups, *args.be_cgroup)
    policy = dataclasses.replace(policy, **changes)
    if args.html:
        with open(args.html, "a", encoding="utf-8"):  # fail on an unwritable path now, not after the run
            pass
    layout = discover(paths)
    source = make_pod_source(policy, paths)
    detector = Detector(policy, paths, layout, CgroupResolver(paths, layout), pods=source.pods, sink=LoggingSink())
    collector = NodeCollector(paths, layout, probes=args.probes or BPF_PROBES, cgroup_paths=detector.cgroup_paths,
                              psi_paths=detector.psi_paths)
    progress = _TerminalProgress(sys.stderr) if sys.stderr.isatty() else None
    try:
        collector.start()
        # Steal (a /proc file) alone detects nothing: what must start is a probe with BPF programs.
        from probes.registry import BY_NAME  # here: kubectl-noisyneighbor imports this module and no probe

        bpf = [st for name, st in collector.status.items() if BY_NAME[name].specs]
        if bpf and all(st.state == "off" for st in bpf):
            raise ProbeError("no probe could start: " + "; ".join(st.line() for st in collector.status.values()))
        report = run_diagnose(detector, collector, args.duration, args.interval,
                              progress=progress.update if progress else None, pods=source.pods)
    finally:
        if progress:
            progress.close()
        collector.close()
        source.close()
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render_html(report))
    sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n" if args.json else render_text(report))
    sys.stdout.flush()
    return EXIT_INCIDENTS if args.fail_on_incident and report.incidents else EXIT_OK


class _TerminalProgress:
    """One self-overwriting status line on a terminal; the report itself goes to stdout untouched.
    Log lines (incident opened, ...) share the terminal: the line is cleared before each one is
    written, and the next update draws it again below."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        for handler in logging.getLogger().handlers:
            handler.addFilter(self._clear_before_log)

    def _clear_before_log(self, record: logging.LogRecord) -> bool:
        self.clear()
        return True

    def update(self, elapsed_s: float, duration_s: float, incidents: int) -> None:
        self._stream.write(f"\r\x1b[Kdiagnose: {min(elapsed_s, duration_s):.0f}/{duration_s:.0f} s, "
                           f"{incidents} incident(s) so far")
        self._stream.flush()

    def clear(self) -> None:
        self._stream.write("\r\x1b[K")
        self._stream.flush()

    def close(self) -> None:
        self.clear()
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self._clear_before_log)


def cmd_top(args: argparse.Namespace, paths: HostPaths) -> int:
    from detector.cgroups import CgroupResolver
    from noisyneighbor.sections import Context
    from noisyneighbor.top import is_live, open_sources, run_top, sources_to_load, unavailable
    from probes.cgroupfs import discover

    layout = discover(paths)
    ctx = Context(paths, layout, CgroupResolver(paths, layout), args.cgroup)
    live = is_live(sys.stdout, args.json, args.once)
    sources = open_sources(sources_to_load(args.view, live), ctx, args.attach_mode)
    try:
        error = unavailable(args.view, sources)
        if error:
            raise ProbeError(error)
        return run_top(
            sources,
            args.view,
            interval_s=args.interval,
            once=args.once,
            as_json=args.json,
            sort_key=args.sort,
            limit=args.limit,
            count=args.count,
        )
    finally:
        for source in sources:
            source.close()


def cmd_completion(args: argparse.Namespace) -> int:
    from noisyneighbor.completion import bash_script

    script = bash_script(build_parser())
    if args.shell == "zsh":  # zsh runs bash completion functions through bashcompinit
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    sys.stdout.write(script)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "completion":
        return cmd_completion(args)
    _setup_logging(args)
    # SIGTERM ends the run like Ctrl-C, so probes are detached and cleanup runs (the agent has its own).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    paths = HostPaths.under(args.host_root) if args.host_root else HostPaths()
    try:
        use_btf_file(getattr(args, "btf", None))  # every probe engine of this run relocates against it
    except ValueError as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return EXIT_USAGE
    from actuators.journal import JournalError
    from detector.policy import PolicyError

    try:
        if args.command == "top":
            return cmd_top(args, paths)
        if args.command == "agent":
            return cmd_agent(args)
        if args.command == "diagnose":
            return cmd_diagnose(args, paths)
        if args.command == "restore":
            from noisyneighbor.lifecycle import cmd_restore

            return cmd_restore(args)
    except KeyboardInterrupt:
        return EXIT_OK
    except (PolicyError, JournalError) as e:
        # Bad configuration: nothing was started or changed (Agent.start closes what it opened).
        print(f"noisyneighbor: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except ProbeError as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # `noisyneighbor top --json | head`: the reader left; not an error. Before OSError, its base
        # class, or that clause takes it. stdout goes to /dev/null so the exit-time flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (OSError, ValueError) as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_USAGE


def _setup_logging(args: argparse.Namespace) -> None:
    verbose = getattr(args, "verbose", 0) or 0
    default = logging.INFO if args.command == "agent" else logging.WARNING
    level = default - 10 * min(verbose, 2)
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "plain") == "json":
        from noisyneighbor.agent import JsonLogFormatter

        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    if verbose < 2:
        logging.getLogger("probes.libbpf").setLevel(max(level, logging.INFO))


if __name__ == "__main__":
    sys.exit(main())
