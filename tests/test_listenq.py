# SPDX-License-Identifier: Apache-2.0
"""Listen-queue health (probes/listenq.py) against a listener that never accepts, in a test namespace."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from probes.listenq import ListenQueueSnapshot, read_counters, read_netns
from tests.conftest import readline_within
from tests.test_tcpconnect import OwnedNetns

PORT = 7100

# Opens n non-blocking connects to the port and holds them for a while (bounded), then exits.
CLIENTS = r"""
import socket, sys, time
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", int(sys.argv[1])))
    socks.append(s)
print("started", flush=True)
time.sleep(float(sys.argv[3]))
"""


@pytest.fixture
def ns():
    n = OwnedNetns("lq").create()
    yield n
    n.remove()


def _listener(snap: ListenQueueSnapshot, addr: str, port: int):
    found = [s for s in snap.listeners if s.addr == addr and s.port == port]
    assert len(found) == 1, snap.listeners
    return found[0]


def _wait(pid: int, until, timeout: float) -> ListenQueueSnapshot:
    deadline = time.monotonic() + timeout
    while True:
        snap = read_netns(pid)
        assert snap is not None
        if until(snap) or time.monotonic() > deadline:
            return snap
        time.sleep(0.1)


@pytest.mark.root
def test_full_accept_queue_and_rising_overflows(ns):
    """Backlog 2, never accepting, 5 clients: the queue sits at the kernel's limit (max + 1 = 3), the
    other 2 clients' SYNs are dropped, and ListenOverflows keeps rising as they retransmit."""
    server = ns.start_server([PORT], backlog=2, accept=False)
    netns_ino = os.stat(f"/proc/{server}/ns/net").st_ino
    before = read_netns(server)
    assert before is not None and before.netns == netns_ino
    idle = _listener(before, "127.0.0.1", PORT)
    assert (idle.queue_len, idle.backlog_max, idle.full) == (0, 2, False)

    clients = ns.popen(sys.executable, "-c", CLIENTS, str(PORT), "5", "4")
    assert readline_within(clients, 10) == "started"

    def overflowing(s: ListenQueueSnapshot) -> bool:
        return _listener(s, "127.0.0.1", PORT).queue_len == 3 and s.counters.delta(before.counters).listen_overflows >= 2

    first = _wait(server, overflowing, 3)
    q = _listener(first, "127.0.0.1", PORT)
    d1 = first.counters.delta(before.counters)
    print(f"queue {q.queue_len}/{q.backlog_max} full={q.full}; after {first.monotonic_s - before.monotonic_s:.2f} s: {d1}")
    assert (q.queue_len, q.backlog_max, q.full) == (3, 2, True)
    assert q.fill == 1.5 and first.full == [q]
    assert d1.listen_overflows >= 2 and d1.listen_drops >= d1.listen_overflows
    assert d1.active_opens == 5  # every client sent its SYN (the namespace's MIB, clients included)
    v6 = _listener(first, "::1", PORT)
    assert (v6.queue_len, v6.backlog_max, v6.family) == (0, 2, socket.AF_INET6)

    # The two clients still in SYN_SENT retransmit after the 1 s initial RTO: more overflows.
    later = _wait(server, lambda s: s.counters.listen_overflows > first.counters.listen_overflows, 2.5)
    d2 = later.counters.delta(before.counters)
    print(f"after {later.monotonic_s - before.monotonic_s:.2f} s: {d2}")
    assert d2.listen_overflows > d1.listen_overflows
    assert d2.syn_retrans >= 2
    assert _listener(later, "127.0.0.1", PORT).queue_len == 3

    # Per namespace: the test namespace (server and clients) and ours are told apart.
    snaps = [read_netns(pid) for pid in (server, clients.pid, os.getpid())]
    assert all(s is not None for s in snaps)
    assert [s.netns for s in snaps] == [netns_ino, netns_ino, os.stat("/proc/self/ns/net").st_ino]
    assert netns_ino != os.stat("/proc/self/ns/net").st_ino


@pytest.mark.root
def test_vanished_pid_is_none():
    p = subprocess.Popen(["true"])
    p.wait()
    assert read_netns(p.pid) is None
    assert read_counters(p.pid) is None


def test_own_namespace_without_setns():
    """Our own namespace needs no setns (and works unprivileged): a listener we own shows up."""
    srv = socket.socket()
    try:
        srv.bind(("127.0.0.1", 0))
        srv.listen(7)
        snap = read_netns(os.getpid())
        assert snap is not None
        s = _listener(snap, "127.0.0.1", srv.getsockname()[1])
        assert (s.queue_len, s.backlog_max, s.endpoint) == (0, 7, f"127.0.0.1:{srv.getsockname()[1]}")
        assert snap.counters.active_opens >= 0
    finally:
        srv.close()


def test_every_listener_of_our_namespace_matches_ss():
    """The raw inet_diag dump against iproute2's ss: the same LISTEN sockets (v4 and v6), with the same
    accept queue (Recv-Q) and backlog (Send-Q)."""
    servers = [socket.create_server(("127.0.0.1", 0), backlog=5),
               socket.create_server(("::1", 0), family=socket.AF_INET6, backlog=9)]
    waiting = socket.create_connection(servers[0].getsockname()[:2])  # one in the accept queue
    try:
        snap = read_netns(os.getpid())
        assert snap is not None
        ours = {(s.addr, s.port, s.queue_len, s.backlog_max) for s in snap.listeners}
        out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
        from_ss = set()
        for line in out.splitlines():
            _state, recv_q, send_q, local, *_ = line.split()
            addr, _, port = local.rpartition(":")
            addr = addr.strip("[]").split("%")[0]
            from_ss.add((addr if addr != "*" else "::", int(port), int(recv_q), int(send_q)))
        mine = {(s.getsockname()[0], s.getsockname()[1]) for s in servers}
        assert {x for x in ours if x[:2] in mine} == {("127.0.0.1", servers[0].getsockname()[1], 1, 5),
                                                     ("::1", servers[1].getsockname()[1], 0, 9)}
        assert {x for x in from_ss if x[:2] in mine} == {x for x in ours if x[:2] in mine}
        # Other tests' listeners may come and go, and their queues move, between the two reads: compare
        # the backlog of those present in both.
        stable = {x[:2] for x in ours} & {x[:2] for x in from_ss}
        assert mine <= stable
        assert {(*x[:2], x[3]) for x in ours if x[:2] in stable} == {(*x[:2], x[3]) for x in from_ss if x[:2] in stable}
    finally:
        waiting.close()
        for s in servers:
            s.close()
