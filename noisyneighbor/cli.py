"""The `noisyneighbor` command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from probes.engine import ProbeError
from probes.host import HostPaths

log = logging.getLogger("noisyneighbor")


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from noisyneighbor.top import SORT_KEYS, VIEW_CHOICES

    parser = argparse.ArgumentParser(
        prog="noisyneighbor",
        description="eBPF interference detector for Kubernetes nodes: who steals time from whom, and why.",
    )
    parser.add_argument("--host-root", metavar="DIR", help="host filesystem root (e.g. /host in a container)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: libbpf too)")
    sub = parser.add_subparsers(dest="command", required=True)

    top = sub.add_parser(
        "top",
        help="live interference per cgroup / pod / CPU: runqueue, softirq, reclaim, TCP connects, pressure",
        description="One view per probe. On a terminal every probe is loaded and keys switch views "
        "(r runq, s softirq, c reclaim, t tcp, p psi, a all); piped or --json, only the probes of --view load.",
    )
    top.add_argument("--view", choices=VIEW_CHOICES, default="runq", help="what to show (default: runq)")
    top.add_argument("--interval", type=_positive_float, default=1.0, metavar="S", help="refresh every S seconds")
    top.add_argument("--once", action="store_true", help="print one interval and exit")
    top.add_argument("--json", action="store_true", help="JSON (with --once: one record; else JSON lines)")
    top.add_argument("--count", type=int, metavar="N", help="stop after N intervals")
    top.add_argument("--sort", choices=sorted(SORT_KEYS), default="wait", help="runq sort column (default: wait)")
    top.add_argument(
        "--cgroup", metavar="PATH", help="only this cgroup and its descendants (path in each view's hierarchy)"
    )
    top.add_argument("--limit", type=int, metavar="N", help="show at most N rows per view")
    top.add_argument(
        "--attach-mode",
        choices=("auto", "sched_info", "tp_btf", "raw_tp"),
        default="auto",
        help="force a tracepoint flavour (sched_info: runqlat only; the other probes then use auto)",
    )
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.verbose < 2:
        logging.getLogger("probes.libbpf").setLevel(logging.INFO)
    # SIGTERM ends the run like Ctrl-C, so probes are detached and cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    paths = HostPaths.under(args.host_root) if args.host_root else HostPaths()
    try:
        if args.command == "top":
            return cmd_top(args, paths)
    except KeyboardInterrupt:
        return 0
    except ProbeError as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"noisyneighbor: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `noisyneighbor top --json | head`: the reader left; not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
