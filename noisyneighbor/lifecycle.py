# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor restore`: put back every change a node's journal records, retrying until it is done.

What the agent does at SIGTERM, as a command of its own for the steps around it: after a `kill -9`, an
agent that was deleted together with its credentials (its in-place resize restores go through the
apiserver and failed 401/403), a rollback to a version that cannot read the journal, and the last step
of an uninstall (``--purge``: the journal directory is removed once nothing is left in it).

    noisyneighbor restore [--journal-dir DIR] [--host-root /host] [--attempts N] [--retry-interval S] [--purge]

Every entry goes through the agent's own journal code (the same files, the same order, the same
never-clobber rule: a file someone else changed since is left alone). Entries whose restore failed stay
in the journal and are tried again ``--attempts`` times, ``--retry-interval`` apart; what is still left
then is named on stderr and the exit code is 1, so a Job or a script retries it later: nothing is
dropped. Exit 0: the journal is empty (and, with ``--purge``, gone).

In-place resize entries (``k8s-resize://``) need the apiserver: in a pod the service account's
credentials (the agent's, which holds ``pods/resize patch`` with components/pod-resize), elsewhere
``--apiserver URL --token-file FILE [--ca-file FILE]``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actuators.journal import JOURNAL_FILE, Journal, RestoreReport

log = logging.getLogger("noisyneighbor.restore")


@dataclass(frozen=True)
class ApiserverAccess:
    """An apiserver outside a pod (tests, an operator's machine); None fields: in-cluster."""

    url: str
    token_file: str
    ca_file: str | None = None

    def api_client(self) -> Any:
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.url.rstrip("/")
        conf.api_key = {"authorization": Path(self.token_file).read_text().strip()}
        conf.api_key_prefix = {"authorization": "Bearer"}
        if self.ca_file:
            conf.ssl_ca_cert = self.ca_file
        return client.ApiClient(conf)


@dataclass
class RestoreOutcome:
    """What a restore run did: every attempt's report, and what is left in the journal."""

    attempts: list[RestoreReport] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    purged: bool = False

    @property
    def ok(self) -> bool:
        return not self.left

    def as_json(self) -> dict[str, Any]:
        restored = [p for r in self.attempts for p in r.restored]
        return {"ok": self.ok, "attempts": len(self.attempts), "restored": restored,
                "foreign": [p for r in self.attempts for p in r.foreign],
                "vanished": [p for r in self.attempts for p in r.vanished],
                "left": self.left, "last_failures": self.attempts[-1].failed if self.attempts else [],
                "purged": self.purged}


def _needs_apiserver(journal_dir: Path) -> bool:
    from actuators.resize import PREFIX

    try:
        return PREFIX in (journal_dir / JOURNAL_FILE).read_text()
    except OSError:
        return False


def open_journal(journal_dir: Path, host_root: str | None, apiserver: ApiserverAccess | None) -> Journal:
    """The journal with the agent's own I/O: cgroup and resctrl files under the host root, resize entries
    through the apiserver (when the journal has any)."""
    from actuators.resctrl import KernelResctrlFs, ResctrlFileIO, resctrl_root
    from noisyneighbor.agent.wiring import JournalIO, _in_cluster_client
    from probes.host import HostPaths

    paths = HostPaths.under(host_root) if host_root else HostPaths()
    resize = None
    if _needs_apiserver(journal_dir):
        from actuators.resize import ResizeIO

        api = apiserver.api_client() if apiserver is not None else _in_cluster_client()
        if api is not None:
            resize = ResizeIO(api)
    io = JournalIO(ResctrlFileIO(resctrl_root(paths), KernelResctrlFs()), resize)
    return Journal(journal_dir, read=io.read, write=io.write)


def restore(journal_dir: Path, *, host_root: str | None = None, apiserver: ApiserverAccess | None = None,
            attempts: int = 5, retry_interval_s: float = 2.0, purge: bool = False) -> RestoreOutcome:
    """Restore everything the journal holds; retry what failed; ``purge`` removes the emptied directory."""
    outcome = RestoreOutcome()
    if journal_dir.exists():
        journal = open_journal(journal_dir, host_root, apiserver)
        for attempt in range(max(attempts, 1)):
            if attempt:
                time.sleep(retry_interval_s)
            report = journal.restore_all()
            outcome.attempts.append(report)
            log.info("restore attempt %d: %s", attempt + 1, report.summary())
            if report.ok:
                break
        outcome.left = sorted(journal.owned())
    if purge and outcome.ok:
        outcome.purged = _purge(journal_dir)
    return outcome


def _purge(journal_dir: Path) -> bool:
    """Remove the emptied journal directory and its parent when that is empty too (/var/lib/noisyneighbor).
    Only empty directories (rmdir), never a tree: a file someone put there stays, and says so."""
    removed = False
    for d in (journal_dir, journal_dir.parent):
        with contextlib.suppress(FileNotFoundError):
            for stale in d.glob(".journal-*"):  # temp files of an interrupted save, never renamed
                stale.unlink()
            try:
                d.rmdir()
                removed = True
            except OSError as e:
                log.warning("not removing %s: %s", d, e.strerror or e)
                break
    return removed


def cmd_restore(args: Any) -> int:
    apiserver = None
    if args.apiserver:
        if not args.token_file:
            print("noisyneighbor: restore --apiserver needs --token-file", file=sys.stderr)
            return 2
        apiserver = ApiserverAccess(args.apiserver, args.token_file, args.ca_file)
    outcome = restore(Path(args.journal_dir), host_root=getattr(args, "host_root", None), apiserver=apiserver,
                      attempts=args.attempts, retry_interval_s=args.retry_interval, purge=args.purge)
    print(json.dumps(outcome.as_json(), sort_keys=True))
    if not outcome.ok:
        failures = "; ".join(outcome.attempts[-1].failed) if outcome.attempts else ""
        print(f"noisyneighbor: restore incomplete after {len(outcome.attempts)} attempts, "
              f"{len(outcome.left)} left in the journal (run it again): {failures}", file=sys.stderr)
        return 1
    return 0
