# SPDX-License-Identifier: Apache-2.0
"""Listen queues wired into the agent: a server whose accept queue is full is named in its clients'
connect incident and exported per pod, checked against the kernel (`ss -lnt`, /proc/<pid>/net/netstat).

The end-to-end test runs the real agent loop in this process (real tcpconnect probe, real cgroups,
real network namespaces): a server pod in nn-test-<pid>-b listening with backlog 2 and never
accepting, a client pod in nn-test-<pid>-a connecting to it over a veth pair with a 1.5 s timeout and
keeping what it gets. Three connects fill the queue (the kernel holds backlog + 1); every later SYN is
dropped and counted in the server namespace's ListenOverflows, the client retransmits it once and
gives up: the connect incident the client gets must name the server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from detector.causes.tcpconnect import ListenJoin, _match
from detector.decisions import Cause, Target
from noisyneighbor import exporter as ex
from noisyneighbor.agent import Agent, AgentConfig
from probes.hist import LatencyHistogram
from probes.listenq import (
    ListenQueueSnapshot,
    ListenReport,
    ListenSocket,
    ListenWatch,
    NetnsReading,
    TcpCounters,
    read_local_addrs,
)
from probes.tcpconnect import ConnectStats, DestKey, DestStats, TcpConnectSnapshot
from testkit.exporter_support import cgroup_rel_path, write_config
from tests.conftest import readline_within
from tests.test_tcpconnect import OwnedNetns

PORT = 7200

# Listens on all addresses with the given backlog and never accepts; bounded life.
SERVER = r"""
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(int(sys.argv[2]))
print("ready", os.getpid(), flush=True)
time.sleep(float(sys.argv[3]))
"""

# Connects again and again with a timeout, keeping the connections it gets; bounded life.
CLIENT = r"""
import socket, sys, time
host, port, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
held = []
print("started", flush=True)
while time.monotonic() < end:
    s = socket.socket()
    s.settimeout(1.5)
    try:
        s.connect((host, port))
        held.append(s)
    except OSError:
        s.close()
"""


def _netstat(pid: int) -> dict[str, int]:
    """TcpExt of <pid>'s namespace, parsed here (not with the code under test)."""
    lines = Path(f"/proc/{pid}/net/netstat").read_text().splitlines()
    names, values = (line.split()[1:] for line in lines if line.startswith("TcpExt:"))
    return dict(zip(names, map(int, values), strict=True))


def _ss_listener(netns: str, port: int) -> tuple[int, int]:
    """(Recv-Q, Send-Q) of the LISTEN socket on `port` in `netns`, as `ss -lnt` shows them."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-lntH", f"sport = :{port}"],
                         check=True, capture_output=True, text=True, timeout=20).stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    assert len(rows) == 1, out
    return int(rows[0][1]), int(rows[0][2])


@pytest.mark.root
def test_full_accept_queue_is_named_in_the_clients_connect_incident(make_cgroup, veth_pair, tmp_path):
    srv_cg = make_cgroup("srv", ("cpu", "cpuacct"))
    cli_cg = make_cgroup("cli", ("cpu", "cpuacct"))
    srv_rel, cli_rel = cgroup_rel_path(srv_cg), cgroup_rel_path(cli_cg)
    procs: list[subprocess.Popen] = []
    agent = None
    try:
        server = subprocess.Popen(["ip", "netns", "exec", veth_pair["b"], sys.executable, "-c", SERVER, str(PORT), "2",
                                   "150"], stdout=subprocess.PIPE, text=True, preexec_fn=srv_cg.preexec)
        procs.append(server)
        line = readline_within(server, 20)
        assert line.startswith("ready"), line
        server_pid = int(line.split()[1])
        overflows_before = _netstat(server_pid)["ListenOverflows"]
        assert _ss_listener(veth_pair["b"], PORT) == (0, 2)

        config = write_config(tmp_path / "config.yaml", {
            "interval_seconds": 0.5,
            "slo": {"breach_seconds": 1.0},
            "kubernetes": {"pod_source": "standalone"},
            "standalone": {"ls_cgroups": [cli_rel, srv_rel]},
        })
        agent = Agent(AgentConfig(config_path=str(config), listen=None, probes=("tcpconnect",), node_readers=False,
                                  journal_dir=str(tmp_path / "journal"),
                                  incident_log=str(tmp_path / "incidents.jsonl"))).start()
        agent.step()  # the first read of every owner's namespace (the cadence is due at start)
        first = agent.listen.watch.reads
        assert first == 1

        client = subprocess.Popen(["ip", "netns", "exec", veth_pair["a"], sys.executable, "-c", CLIENT,
                                   veth_pair["dst"], str(PORT), "150"], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=cli_cg.preexec)
        procs.append(client)
        assert readline_within(client, 20) == "started"

        named = None
        deadline = time.monotonic() + 90  # a fail-safe: each pass waits for the agent's next tick
        while named is None and time.monotonic() < deadline:
            time.sleep(agent.interval_s)
            agent.step()
            for inc in agent.detector.engine.open_incidents:
                if inc.victim.cgroup == "/" + cli_rel and inc.cause == Cause.NETWORK_CONNECT \
                        and any(c.target.cgroup == "/" + srv_rel for c in inc.culprits):
                    named = inc
        report = agent.listen.report
        assert named is not None, (f"no connect incident naming the server; open: "
                                   f"{agent.detector.engine.open_incidents}; report: {report}")

        # The kernel's view, read after the agent's: the listener the agent saw full is full now
        # (nobody accepts, the client keeps its three connections), and its overflow count lies
        # between the namespace's count before the clients started and now.
        recv_q, send_q = _ss_listener(veth_pair["b"], PORT)
        overflows_after = _netstat(server_pid)["ListenOverflows"]
        server_ns = os.stat(f"/proc/{server_pid}/ns/net").st_ino
        reading = report.namespaces[server_ns]
        assert reading.owners == ("/" + srv_rel,) and not reading.shared
        (listener,) = [s for s in reading.snapshot.listeners if s.port == PORT]
        assert (listener.queue_len, listener.backlog_max) == (recv_q, send_q) == (3, 2)
        assert listener.full
        seen = reading.snapshot.counters.listen_overflows
        assert overflows_before < seen <= overflows_after, (overflows_before, seen, overflows_after)
        assert reading.overflows_delta is not None and 0 < reading.overflows_delta <= seen - overflows_before
        assert veth_pair["dst"] in reading.local_addrs
        print(f"agent: queue {listener.queue_len}/{listener.backlog_max}, ListenOverflows {seen} "
              f"(+{reading.overflows_delta}); kernel: ss {recv_q}/{send_q}, ListenOverflows {overflows_before} -> "
              f"{overflows_after}; reads {agent.listen.watch.reads}")

        server_entry = next(c for c in named.culprits if c.target.cgroup == "/" + srv_rel)
        assert 0 < server_entry.score <= 1
        (ev,) = [e for e in named.evidence if e.signal == "server_listen_queue_fill"]
        assert ev.value == 1.5 and ev.threshold == 1.0
        assert f"/{srv_rel}" in ev.note and f"{veth_pair['dst']}:{PORT}" in ev.note and "matched by address" in ev.note
        assert "accept queue 3/2 full" in ev.note

        # Exported per pod: the server's overflow counter and fill, from the same read.
        fams = {f.name: f.samples for f in text_string_to_metric_families(ex.render_text(agent.exporter).decode())}
        fill = [s for s in fams[ex.LISTEN_QUEUE_FILL] if s.labels["cgroup"] == "/" + srv_rel]
        over = [s for s in fams[ex.LISTEN_OVERFLOWS.removesuffix("_total")] if s.labels["cgroup"] == "/" + srv_rel]
        assert [s.value for s in fill] == [1.5]
        assert [s.value for s in over] == [float(seen)]
        assert not [s for s in fams.get(ex.LISTEN_OVERFLOWS.removesuffix("_total"), ())
                    if s.labels["cgroup"] == "/" + cli_rel], "the client's namespace never overflowed"
    finally:
        if agent is not None:
            agent.stop()
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(10)
            if p.stdout:
                p.stdout.close()
    # The incident log's closed line (agent stopped) names the server.
    lines = [__import__("json").loads(x) for x in (tmp_path / "incidents.jsonl").read_text().splitlines()]
    closed = [r for r in lines if r["event"] == "closed" and r["incident_id"] == named.incident_id]
    assert closed and any(c["target"]["cgroup"] == "/" + srv_rel for c in closed[0]["culprits"]), lines


@pytest.mark.root
def test_shared_namespace_finds_the_listener_owner_by_its_socket(make_cgroup):
    """Two owners in one namespace (hostNetwork-like): the full listener is the server's, found by its fd."""
    srv_cg = make_cgroup("srv", ("cpu",))
    cli_cg = make_cgroup("cli", ("cpu",))
    ns = OwnedNetns("lqs").create()
    try:
        server = ns.popen(sys.executable, "-c", SERVER, str(PORT), "1", "60", preexec_fn=srv_cg.preexec)
        line = readline_within(server, 20)
        assert line.startswith("ready"), line
        server_pid = int(line.split()[1])
        client = ns.popen(sys.executable, "-c", CLIENT, "127.0.0.1", str(PORT), "60", preexec_fn=cli_cg.preexec)
        assert readline_within(client, 20) == "started"
        # The kernel says when the queue is full: ss shows Recv-Q = backlog + 1.
        while _ss_listener(ns.name, PORT) != (2, 1):
            time.sleep(0.1)
        owners = {"/" + cgroup_rel_path(srv_cg): srv_cg.dirs["cpu"], "/" + cgroup_rel_path(cli_cg): cli_cg.dirs["cpu"]}
        watch = ListenWatch("/proc", owners.get)
        report = watch.read(owners, "asked")
        reading = report.namespaces[os.stat(f"/proc/{server_pid}/ns/net").st_ino]
        assert reading.shared and set(reading.owners) == set(owners)
        (listener,) = [s for s in reading.snapshot.listeners if s.port == PORT]
        assert listener.full
        assert reading.owner_of(listener) == "/" + cgroup_rel_path(srv_cg)
        # no pod owns a shared namespace's counters: no reading is one owner's own
        assert not [r for r in report.namespaces.values() if not r.shared and r.owners]
    finally:
        ns.remove()


def test_local_addresses_of_our_namespace_include_loopback():
    assert "127.0.0.1" in read_local_addrs(os.getpid())


# -- pure: when to read, how destinations join listeners ---------------------------------------------


def test_reads_follow_connect_trouble_or_the_slow_cadence():
    w = ListenWatch("/proc", lambda p: None, cadence_s=30.0, trouble_spacing_s=5.0)
    assert w.due(False, now=0.0) == "cadence"  # never read: read once
    w.last_read_s = 0.0
    assert w.due(False, now=29.9) is None  # quiet: nothing until the cadence
    assert w.due(True, now=4.9) is None  # trouble, but read moments ago
    assert w.due(True, now=5.0) == "connect trouble"
    assert w.due(False, now=30.0) == "cadence"


def _reading(netns: int, listeners: list[ListenSocket], owners=("/srv",), shared=False, addrs=(), delta=None,
             socket_owners=None, overflows=7) -> NetnsReading:
    snap = ListenQueueSnapshot(1, netns, 100.0, listeners, TcpCounters(0, 0, 0, 0, overflows, overflows, 0))
    return NetnsReading(snap, owners, shared, frozenset(addrs), delta, socket_owners or {})


FULL = ListenSocket(2, "0.0.0.0", 80, 3, 2, 11)


@pytest.mark.parametrize("dest, reading, how", [
    ((5, 2, "127.0.0.1", 80), _reading(5, [FULL]), "loopback"),  # the client's own namespace
    ((5, 2, "127.0.0.1", 80), _reading(6, [FULL]), None),  # loopback of another namespace
    ((5, 2, "10.0.0.7", 80), _reading(6, [FULL], addrs={"10.0.0.7"}), "address"),
    ((5, 2, "10.0.0.7", 81), _reading(6, [FULL], addrs={"10.0.0.7"}), None),  # another port
    ((5, 2, "10.96.0.10", 80), _reading(6, [FULL], addrs={"10.0.0.7"}), "port"),  # a VIP: port only
    ((5, 2, "10.0.0.7", 80), _reading(6, [ListenSocket(2, "127.0.0.1", 80, 3, 2, 11)], addrs={"10.0.0.7"}), None),
])
def test_destination_to_listener_match(dest, reading, how):
    assert _match(dest, reading.snapshot.listeners[0], reading, reading.local_addrs) == how


def test_an_address_of_another_namespace_is_not_a_port_only_match():
    other = _reading(7, [], owners=("/other",), addrs={"10.0.0.8"})
    assert _match((5, 2, "10.0.0.8", 80), FULL, _reading(6, [FULL]), other.local_addrs) is None


def _tcp(failures: int, retrans: int, dest_failures: int) -> TcpConnectSnapshot:
    hist = LatencyHistogram.decode(bytes(8 * 35))
    stats = ConnectStats(hist, 0, failures, 0, 0, 0, 0, retrans)
    dest = DestKey(42, 5, 2, "10.0.0.7", 80)
    return TcpConnectSnapshot(0.0, {(42, 5): stats}, {dest: DestStats(0, 0, 0, dest_failures)}, {})


def test_join_names_full_servers_only_for_clients_that_failed_to_reach_them():
    join = ListenJoin(lambda cg: "/client" if cg == 42 else None, lambda path: Target(path, qos="LS"))
    assert join.observe_tcp(_tcp(0, 0, 0), _tcp(2, 1, 2), now=100.0) is True
    assert join.observe_tcp(_tcp(2, 1, 2), _tcp(2, 1, 2), now=100.5) is False  # a quiet tick
    not_full = ListenSocket(2, "0.0.0.0", 80, 0, 128, 12)
    join.observe_report(ListenReport(100.0, "connect trouble", {
        6: _reading(6, [FULL], owners=("/srv",), addrs={"10.0.0.7"}, delta=4),
        8: _reading(8, [not_full], owners=("/idle",), addrs={"10.0.0.9"}),
    }))
    culprits, evidence = join.servers_for("/client", now=101.0)
    assert [(c.target.cgroup, c.score) for c in culprits] == [("/srv", 1.0)]
    assert "ListenOverflows +4" in evidence[0].note and "10.0.0.7:80" in evidence[0].note
    assert join.servers_for("/someone-else", now=101.0) == ([], [])
    # Destinations are forgotten after the window; an old report names nobody.
    join.observe_tcp(_tcp(2, 1, 2), _tcp(2, 1, 2), now=100.0 + join.window_s + 1)
    assert join.servers_for("/client", now=102.0) == ([], [])


class _PathLabeler:
    def target_for_id(self, cgroup_id, hierarchy):
        return None

    def target_for_path(self, cgroup_path):
        return Target(cgroup_path, qos="LS")


def test_exported_per_pod_only_what_a_pod_owns():
    """Own namespace: fill and (once non-zero) ListenOverflows. Shared (hostNetwork, or the node's): the
    namespace's counters belong to no pod; a listener's fill goes to the pod found holding it, if any."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from probes.cgroupfs import discover
    from probes.snapshot import NodeSnapshot

    half = ListenSocket(2, "0.0.0.0", 8080, 1, 2, 21)
    report = ListenReport(1.0, "cadence", {
        6: _reading(6, [FULL, half], owners=("/srv",)),  # own namespace, 7 overflows so far
        7: _reading(7, [half], owners=("/quiet",), overflows=0),
        1: _reading(1, [FULL, ListenSocket(2, "0.0.0.0", 22, 0, 128, 31)], owners=("/hostnet-a", "/hostnet-b"),
                    shared=True, socket_owners={11: "/hostnet-b"}),
    })
    registry = CollectorRegistry()
    ex.Exporter(registry, _PathLabeler(), node="n1", layout=discover()).update(
        NodeSnapshot(monotonic_s=1.0, wall_s=1.0, listen=report))
    samples = {(s.name, s.labels["cgroup"]): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
               if f.name in (ex.LISTEN_QUEUE_FILL, ex.LISTEN_OVERFLOWS.removesuffix("_total"))}
    assert samples == {
        (ex.LISTEN_QUEUE_FILL, "/srv"): 1.5, (ex.LISTEN_OVERFLOWS, "/srv"): 7.0,
        (ex.LISTEN_QUEUE_FILL, "/quiet"): 0.5,  # never overflowed: no counter yet
        (ex.LISTEN_QUEUE_FILL, "/hostnet-b"): 1.5,
    }


def test_a_namespace_that_cannot_be_read_is_an_error_line_not_a_failed_read(tmp_path, monkeypatch):
    """Without SYS_ADMIN setns fails with EPERM: the read goes on (other namespaces, the next read) and
    says why once per namespace; the owner's cgroup is found through its cgroup.procs."""
    import probes.listenq as lq

    (tmp_path / "pod" / "ctr").mkdir(parents=True)
    (tmp_path / "pod" / "cgroup.procs").write_text("")
    (tmp_path / "pod" / "ctr" / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def denied(pid, proc="/proc"):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(lq, "read_netns", denied)
    watch = ListenWatch("/proc", lambda owner: tmp_path / owner.strip("/"))
    report = watch.read(["/pod", "/gone"], "cadence")
    ino = os.stat("/proc/self/ns/net").st_ino
    assert report.namespaces == {}
    assert report.errors == (f"listenq: Operation not permitted (netns {ino}, pid {os.getpid()})",)
    assert watch.reads == 1 and watch.due(False, now=watch.last_read_s) is None  # the next read waits its turn


@pytest.mark.root
def test_listeners_are_dumped_on_first_sight_and_when_the_namespace_overflowed(tmp_path):
    """The costly sock_diag dump follows the kernel's ListenOverflows: none while nothing overflows
    (counters are still read), one as soon as the namespace's count moved."""
    ns = OwnedNetns("lqd").create()
    try:
        server = ns.popen(sys.executable, "-c", SERVER, str(PORT), "1", "60")
        line = readline_within(server, 20)
        assert line.startswith("ready"), line
        server_pid = int(line.split()[1])
        (tmp_path / "pod").mkdir()
        (tmp_path / "pod" / "cgroup.procs").write_text(f"{server_pid}\n")
        watch = ListenWatch("/proc", lambda owner: tmp_path / owner.strip("/"), dump_max_age_s=1e9)
        ino = os.stat(f"/proc/{server_pid}/ns/net").st_ino

        first = watch.read(["/pod"]).namespaces[ino]
        assert first.dumped and first.overflows_delta is None and watch.dumps == 1
        quiet = watch.read(["/pod"]).namespaces[ino]  # nobody connects in this namespace
        assert not quiet.dumped and quiet.overflows_delta == 0 and watch.dumps == 1
        assert quiet.snapshot.counters.listen_overflows == _netstat(server_pid)["ListenOverflows"]

        clients = ns.popen(sys.executable, "-c", CLIENT, "127.0.0.1", str(PORT), "60")
        assert readline_within(clients, 20) == "started"
        deadline = time.monotonic() + 60  # a fail-safe (the clients live 60 s), not a timing bound
        while _netstat(server_pid)["ListenOverflows"] == quiet.snapshot.counters.listen_overflows:
            assert time.monotonic() < deadline, "the kernel never dropped a SYN"
            time.sleep(0.1)  # until the kernel has dropped a SYN (backlog 1: the third client's)
        kernel = _netstat(server_pid)["ListenOverflows"]
        after = watch.read(["/pod"]).namespaces[ino]
        assert after.dumped and watch.dumps == 2
        assert after.overflows_delta >= kernel - quiet.snapshot.counters.listen_overflows > 0
        (listener,) = [s for s in after.snapshot.listeners if s.port == PORT]
        assert listener.full and (listener.queue_len, listener.backlog_max) == _ss_listener(ns.name, PORT)
    finally:
        ns.remove()
