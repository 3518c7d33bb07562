# SPDX-License-Identifier: Apache-2.0
"""network_connect, the tcpconnect probe's cause: the connect path (SYN drops, retransmits, full accept
queues of the servers), and its culprit finder, who stalled clients wait on: their failed and slow
connects joined to the listen queues of the node's pods.

A listener whose accept queue is full drops SYNs (and handshake-completing ACKs): its clients see
SYN retransmits, connects that take a second or more, or that their own timeout gives up on. The
tcpconnect probe says which workload had that trouble and, for every connect that ended, to which
destination; ``probes.listenq.ListenWatch`` says which namespaces' listeners are full or counted
ListenOverflows. This module joins the two, so the connect incident of a client names the server:

- :meth:`ListenJoin.observe` (every tick, with the detector's interval of the probe: :meth:`ListenJoin.observe_tcp`)
  remembers, per client workload, the destinations of its failed (refused, timed out, given up) and slow
  connects over the last ``window_s``, and says whether the tick had connect trouble at all (what makes
  the agent read listen queues now);
- :meth:`ListenJoin.servers_for` (from the incident engine, for a connect incident) matches those
  destinations against the last listen report: same port, and the address is local to the listener's
  namespace (loopback: the client's own namespace; else a /32 of the namespace), or, when the address
  is local to no namespace read (a Service VIP before its DNAT, a node port), the port alone — said so
  in the evidence and scored half.

Connects still in flight have no destination yet (the probe records it when they end): a client
whose every SYN is dropped and that never gives up is only joined once one of its connects ends.

The join is this cause's culprit source (``SPEC.culprit_source``, detector/causes/base.py): the agent's
listen-queue reader (noisyneighbor/agent/listen.py) builds it, feeds it every tick and every listen report,
and hooks :meth:`ListenJoin.servers_for` in as this cause's culprits (``CauseContext.culprit_hooks``, by its
NAME).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from detector.causes.base import CauseContext, CauseSpec, CulpritSourceSpec, SourceWiring, Verdict
from detector.decisions import Target
from detector.model import Culprit, Evidence
from probes.hist import HIST_SLOTS, slot_bounds_us
from probes.listenq import ListenReport, ListenSocket, NetnsReading
from probes.tcpconnect import PLUGIN as TCP_PLUGIN
from probes.tcpconnect import TcpConnectInterval, TcpConnectSnapshot
from probes.tcpconnect import delta as tcp_delta

if TYPE_CHECKING:
    from detector.signals import ProbeTick

log = logging.getLogger(__name__)

NAME = "network_connect"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)
PROBE = TCP_PLUGIN.name  # the probe whose connects it joins (NodeSnapshot.probe(PROBE))
WINDOW_S = 60.0  # a client's failed/slow destinations are remembered this long
REPORT_MAX_AGE_S = 90.0  # an older listen report names nobody (a cadence read is every 30 s)
PORT_ONLY_WEIGHT = 0.5
MAX_SERVERS = 3
PORT_ONLY_NOTE = "; port only: the address is local to no namespace read (a Service VIP, or another node)"

_Dest = tuple[int, int, str, int]  # (client netns, family, daddr, dport)


@dataclass
class _Seen:
    count: int = 0
    last_s: float = 0.0


@dataclass
class ListenJoin:
    """The connect cause's culprit source (a ``CulpritSource``): its clients' troubled connects joined to
    the listen reports."""

    workload_of_id: Callable[[int], str | None]  # cgroup id (tcpconnect's hierarchy) -> workload key
    target_of_owner: Callable[[str], Target]  # owner cgroup path (ListenWatch) -> workload Target
    slow_ns: float = 200e6  # a successful connect at least this slow counts as trouble (the connect SLO)
    window_s: float = WINDOW_S
    report: ListenReport | None = None
    recent: dict[str, dict[_Dest, _Seen]] = field(default_factory=dict)
    trouble: bool = False  # the last observed tick had failed, retransmitting or slow connects

    # -- per tick ---------------------------------------------------------------------------------
    def observe(self, tick: ProbeTick) -> bool:
        """The tick's connects against the last tick's, with the detector's interval of the probe (the one
        its step then reads): :meth:`observe_tcp`."""
        return self.observe_tcp(tick.previous(PROBE), tick.current(PROBE), interval=tick.interval(PROBE))

    def observe_tcp(self, prev: TcpConnectSnapshot | None, cur: TcpConnectSnapshot | None,
                    now: float | None = None, interval: TcpConnectInterval | None = None) -> bool:
        """Remember this tick's failed and slow destinations; True if any connect had trouble.
        ``interval``: the probe's ``delta(prev, cur)`` when the caller has it (computed here otherwise)."""
        now = time.monotonic() if now is None else now
        trouble = False
        if prev is not None and cur is not None:
            slow_slot = next((i for i in range(HIST_SLOTS) if slot_bounds_us(i)[0] * 1e3 >= self.slow_ns), HIST_SLOTS)
            # The probe's own interval (its plugin's delta, what top and the detector read): only the
            # (cgroup, netns) keys whose counters moved.
            for moved in (interval if interval is not None else tcp_delta(prev, cur)).per_key.values():
                bad = moved.failures + moved.aborts + moved.syn_retransmits
                slow = sum(moved.latency.slots[slow_slot:])
                trouble = trouble or bad > 0 or slow > 0
            # The destination table (up to 16k entries) is walked only in a tick with trouble.
            for dest, d in (cur.destinations.items() if trouble else ()):
                pd = prev.destinations.get(dest)
                if pd == d:
                    continue
                failed = d.failures - (pd.failures if pd else 0)
                n = d.count - (pd.count if pd else 0)
                slow_mean = n > 0 and (d.sum_ns - (pd.sum_ns if pd else 0)) / n >= self.slow_ns
                if failed <= 0 and not slow_mean:
                    continue
                workload = self.workload_of_id(dest.cgroup_id)
                if workload is None:
                    continue
                seen = self.recent.setdefault(workload, {}).setdefault(
                    (dest.netns, dest.family, dest.daddr, dest.dport), _Seen())
                seen.count += max(failed, 0) + (n if slow_mean else 0)
                seen.last_s = now
        for workload in list(self.recent):
            kept = {k: v for k, v in self.recent[workload].items() if now - v.last_s <= self.window_s}
            if kept:
                self.recent[workload] = kept
            else:
                del self.recent[workload]
        self.trouble = trouble
        return trouble

    def observe_report(self, report: ListenReport | None) -> None:
        if report is not None:
            self.report = report

    # -- for the incident engine ------------------------------------------------------------------
    def culprits_for(self, victim_key: str) -> tuple[list[Culprit], list[Evidence]]:
        """The CulpritSource's hook: :meth:`servers_for`."""
        return self.servers_for(victim_key)

    def servers_for(self, victim_key: str, now: float | None = None) -> tuple[list[Culprit], list[Evidence]]:
        """The servers whose full or overflowing listeners the victim's troubled connects went to.
        Never raises (it runs inside the incident engine): a failure names nobody and is logged."""
        try:
            return self._servers_for(victim_key, time.monotonic() if now is None else now)
        except Exception as e:
            log.error("listen join for %s failed: %s: %s", victim_key, type(e).__name__, e)
            return [], []

    def _servers_for(self, victim_key: str, now: float) -> tuple[list[Culprit], list[Evidence]]:
        report, dests = self.report, self.recent.get(victim_key)
        if report is None or not dests or now - report.monotonic_s > REPORT_MAX_AGE_S:
            return [], []
        total = sum(s.count for s in dests.values())
        local = frozenset().union(*(r.local_addrs for r in report.namespaces.values()))
        found: dict[str, dict] = {}
        for reading in report.namespaces.values():
            overflowing = bool(reading.overflows_delta)
            for listener in reading.snapshot.listeners:
                # Full now (dumped in this read), or in a namespace that dropped connections since the read before.
                if not ((listener.full and reading.dumped) or overflowing):
                    continue
                matched = [(dest, how) for dest in dests if (how := _match(dest, listener, reading, local))]
                if not matched:
                    continue
                owner = reading.owner_of(listener)
                if owner is None:
                    continue
                target = self.target_of_owner(owner)
                entry = found.setdefault(target.cgroup, {"target": target, "count": 0.0, "notes": []})
                weight = 1.0 if all(how != "port" for _, how in matched) else PORT_ONLY_WEIGHT
                n = sum(dests[d].count for d, _ in matched)
                entry["count"] += n * weight
                entry["notes"].append((listener, reading, n, sorted({_endpoint(d) for d, _ in matched}),
                                       sorted({how for _, how in matched})))
        culprits, evidence = [], []
        age = now - report.monotonic_s
        for entry in sorted(found.values(), key=lambda e: -e["count"])[:MAX_SERVERS]:
            share = min(1.0, entry["count"] / total) if total else 0.0
            target = entry["target"]
            culprits.append(Culprit(target, round(share, 4), attribution=round(share, 4)))
            for listener, reading, n, endpoints, hows in entry["notes"]:
                overflow = "first read of its netns" if reading.overflows_delta is None \
                    else f"ListenOverflows +{reading.overflows_delta} since the read before"
                evidence.append(Evidence(
                    "server_listen_queue_fill", round(listener.fill, 4), round(age, 3), threshold=1.0,
                    note=(f"server {target.display}: {listener.endpoint} accept queue {listener.queue_len}/"
                          f"{listener.backlog_max}{' full' if listener.full else ''}, {overflow} "
                          f"(netns {reading.netns}); {n} of the client's {total} failed or slow connects went to "
                          f"{', '.join(endpoints)} (matched by {'/'.join(hows)}"
                          f"{PORT_ONLY_NOTE if 'port' in hows else ''})"),
                ))
        return culprits, evidence


def _endpoint(dest: _Dest) -> str:
    _netns, family, addr, port = dest
    return f"[{addr}]:{port}" if family == 10 else f"{addr}:{port}"


def _match(dest: _Dest, listener: ListenSocket, reading: NetnsReading, local: frozenset[str]) -> str | None:
    """How a client's destination reaches this listener: "loopback", "address", "port", or None.
    ``local``: the addresses of every namespace read (an address local to another one is not this)."""
    client_netns, family, daddr, dport = dest
    if dport != listener.port or family != listener.family:
        return None
    wildcard = listener.addr in ("0.0.0.0", "::")
    try:
        loopback = ipaddress.ip_address(daddr).is_loopback
    except ValueError:
        return None
    if loopback:
        if client_netns == reading.netns and (wildcard or listener.addr == daddr):
            return "loopback"
        return None
    if daddr in reading.local_addrs:
        return "address" if wildcard or listener.addr == daddr else None
    if daddr in local:
        return None
    try:
        if ipaddress.ip_address(listener.addr).is_loopback:
            return None  # a loopback-only listener is reached from its own namespace only
    except ValueError:
        return None
    return "port"


def listen_join(wiring: SourceWiring) -> ListenJoin:
    """The cause's join (its culprit source's factory): a connect as slow as the connect SLO counts as trouble."""
    return ListenJoin(wiring.workload_of_id, wiring.target_of_path, slow_ns=wiring.slo.connect_p99_ms * 1e6)


def rule(ctx: CauseContext) -> Verdict | None:
    if not ctx.breached & {"connect_p99_ns", "syn_retransmits_per_s"}:
        return None
    row, dt = ctx.row, ctx.row.interval_s
    servers, more = ctx.hooked_culprits(NAME)  # ListenJoin.servers_for, when the agent reads listen queues
    return Verdict(NAME, 0.7, servers, [
        Evidence("connect_failures_per_s", row.connect_failures_per_s, dt),
        Evidence("syn_retransmits_per_s", row.syn_retransmits_per_s, dt),
        *more,
    ], share=0.0 if ctx.runq_breach else 1.0)  # the connect path explains none of a runqueue wait


SPEC = CauseSpec(
    NAME, rule,
    title="the TCP connect path",
    advice="connects stall (SYN drops/retransmits): check the server's accept backlog and ListenOverflows",
    culprit_source=CulpritSourceSpec(reads=ListenReport, build=listen_join),
)
