# SPDX-License-Identifier: Apache-2.0
"""Small runner: apply one suppress/burst through the manager and hold it until SIGTERM; or reconcile.

    python -m actuators apply-suppress --cgroup <path> --policy cfsQuota --cores 0.5 --journal DIR [--dry-run]
    python -m actuators apply-suppress --cgroup <path> --policy cpuset --cores 1 --min-cpus 1 --journal DIR
    python -m actuators apply-burst --cgroup <path> [--burst-us N] [--quota-scale X] --journal DIR
    python -m actuators apply-memory-suppress --cgroup <path> [--headroom F] --journal DIR
    python -m actuators reconcile --journal DIR [--reown]

``apply-* --reown`` keeps what an earlier (killed) run left in the journal, owned by this run, instead
of restoring it first: several killed runs then leave one journal for the agent to reconcile.
``apply-*`` prints one JSON line (the action record) when applied, then waits; SIGTERM/SIGINT restore
the originals (manager.close) and exit 0. After ``kill -9``, ``reconcile`` restores from the journal.
Errors are one line on stderr with exit code 2. Every JSON line printed carries ``schema_version``, like
every JSON the project writes.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from actuators.burst import BurstActuator
from actuators.cgroupfile import CgroupFileError, CgroupFiles
from actuators.journal import DEFAULT_JOURNAL_DIR, Journal, JournalError
from actuators.manager import AUDIT_SCHEMA_VERSION, ActuatorManager
from actuators.memory import MemorySuppressActuator
from actuators.suppress import SuppressActuator, normalize_policy
from detector.decisions import ActionKind, BurstAmount, Decision, MemorySuppressAmount, SuppressAmount, Target
from detector.policy import ActuatorPolicy, CpuBurstStrategy, ResourceThresholdStrategy
from probes.host import HostPaths


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m actuators", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--journal", default=str(DEFAULT_JOURNAL_DIR))
    common.add_argument("--host-root", default=None, help="host paths below this root (tests)")
    s = sub.add_parser("apply-suppress", parents=[common])
    s.add_argument("--cgroup", required=True, help="cgroup path relative to the hierarchy root")
    s.add_argument("--policy", default="cfsQuota")
    s.add_argument("--cores", type=float, required=True)
    s.add_argument("--min-cpus", type=int, default=2)
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--audit-log", default=None)
    b = sub.add_parser("apply-burst", parents=[common])
    b.add_argument("--cgroup", required=True)
    b.add_argument("--burst-us", type=int, default=None)
    b.add_argument("--quota-scale", type=float, default=None)
    b.add_argument("--burst-percent", type=int, default=1000)
    b.add_argument("--dry-run", action="store_true")
    b.add_argument("--audit-log", default=None)
    m = sub.add_parser("apply-memory-suppress", parents=[common])
    m.add_argument("--cgroup", required=True)
    m.add_argument("--headroom", type=float, default=0.0)
    m.add_argument("--floor-mib", type=int, default=16)
    m.add_argument("--dry-run", action="store_true")
    m.add_argument("--audit-log", default=None)
    for sp in (s, b, m):
        sp.add_argument("--reown", action="store_true", help="keep the journal's entries instead of restoring them")
    r = sub.add_parser("reconcile", parents=[common])
    r.add_argument("--reown", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (CgroupFileError, JournalError, ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    journal = Journal(args.journal)
    if args.command == "reconcile":
        report = journal.reconcile(reown=args.reown)
        print(json.dumps({"schema_version": AUDIT_SCHEMA_VERSION, "reconcile": report.summary(),
                          "restored": report.restored, "failed": report.failed}))
        return 0 if report.ok else 1
    paths = HostPaths.under(args.host_root) if args.host_root else HostPaths()
    files = CgroupFiles(paths)
    policy = ActuatorPolicy(dry_run=args.dry_run, cooldown_seconds=0.0)
    if args.command == "apply-suppress":
        strategy = ResourceThresholdStrategy(cpu_suppress_policy=normalize_policy(args.policy),
                                             cpu_suppress_min_cpus=args.min_cpus)
        actuator = SuppressActuator(files, journal, strategy)
        pol = "cfs_quota" if normalize_policy(args.policy) == "cfsQuota" else "cpuset"
        decision = Decision(ActionKind.SUPPRESS, Target(args.cgroup, qos="BE"), SuppressAmount(pol, cpu_cores=args.cores),
                            "requested on the command line")
        manager = ActuatorManager([actuator], journal, policy, audit_log=args.audit_log, reown=args.reown)
    elif args.command == "apply-memory-suppress":
        actuator = MemorySuppressActuator(files, journal)
        decision = Decision(ActionKind.MEMORY_SUPPRESS, Target(args.cgroup, qos="BE"),
                            MemorySuppressAmount(headroom=args.headroom, floor_bytes=args.floor_mib << 20,
                                                 give_back_to_node=False), "requested on the command line")
        manager = ActuatorManager([actuator], journal, policy, audit_log=args.audit_log, reown=args.reown)
    else:
        actuator = BurstActuator(files, journal, CpuBurstStrategy(policy="auto", cpu_burst_percent=args.burst_percent))
        decision = Decision(ActionKind.BURST, Target(args.cgroup, qos="LS"),
                            BurstAmount(burst_us=args.burst_us, quota_scale=args.quota_scale), "requested on the command line")
        manager = ActuatorManager([actuator], journal, policy, audit_log=args.audit_log, reown=args.reown)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    manager.submit(decision)
    record = manager.records[-1]
    print(json.dumps({"schema_version": AUDIT_SCHEMA_VERSION, "state": str(record.state), "detail": record.detail,
                      "summary": record.plan.summary if record.plan else None,
                      "details": dict(record.plan.details) if record.plan else {},
                      "writes": [[w.path, w.old, w.new] for w in record.plan.writes] if record.plan else []}),
          flush=True)
    if record.state not in ("applied", "planned"):
        manager.close()
        return 1
    while not stop.wait(0.2):
        pass
    manager.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
