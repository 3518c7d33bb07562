# SPDX-License-Identifier: Apache-2.0
"""Listen-queue health per network namespace: accept backlogs and the kernel's TCP counters.

For each LISTEN socket of a namespace, netlink sock_diag (inet_diag, read straight off the netlink socket) reports
`idiag_rqueue` = connections waiting for accept() and `idiag_wqueue` = the listen() backlog the kernel
enforces (capped by net.core.somaxconn). The kernel admits one more than that: a listener is full
when queue_len > backlog_max (`sk_acceptq_is_full`), and then drops SYNs and handshake-completing
ACKs, counting them in TcpExt ListenOverflows (and ListenDrops, which also counts other listener
drops). /proc/<pid>/net/{snmp,netstat} give those counters and ActiveOpens/AttemptFails for the
namespace of <pid>.

Entering a namespace: a netlink socket belongs to the network namespace it was created in. We open
/proc/<pid>/ns/net (which keeps that namespace alive while the fd is open), and create the socket in
a dedicated short-lived thread that calls setns(CLONE_NEWNET) on itself only — a network namespace
is per thread, so no other thread of this process (the agent's BPF polling, the UI) ever changes
namespace — then switches back and ends. The socket stays bound to the target namespace. No fork
(a library's netns support that forks a child may also create a named namespace), no mount
namespace games, and nothing is left behind if the target process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from probes.cgroupfiles import (  # the kernel files table
    CGROUP_PROCS,
    PID_NET_FIB_TRIE,
    PID_NET_IF_INET6,
    PID_NET_NETSTAT,
    PID_NET_SNMP,
    PID_NS_NET,
)
from probes.host import HostPaths

CLONE_NEWNET = 0x40000000
NETLINK_SOCK_DIAG = 4
TCP_LISTEN_STATE = 10  # TCP_LISTEN in the kernel's numbering
_GONE = (errno.ENOENT, errno.ESRCH, errno.EINVAL)
# The calling thread's namespace is in this process's /proc, whatever /proc the tasks are read from.
_OWN_NETNS = str(PID_NS_NET.at(HostPaths(), pid="thread-self"))


def _host(proc: str) -> HostPaths:
    return HostPaths(proc=Path(proc))


@dataclass(frozen=True)
class ListenSocket:
    family: int  # socket.AF_INET / AF_INET6
    addr: str
    port: int
    queue_len: int  # connections waiting for accept()
    backlog_max: int  # the enforced listen() backlog
    inode: int  # socket inode (match against /proc/<pid>/fd to find the owner)

    @property
    def endpoint(self) -> str:
        return f"[{self.addr}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.addr}:{self.port}"

    @property
    def full(self) -> bool:
        """New connections are being dropped (the kernel's sk_acceptq_is_full: len > max)."""
        return self.queue_len > self.backlog_max

    @property
    def fill(self) -> float:
        """queue_len / backlog_max: ≥ 1 means at the limit (the kernel holds up to max + 1)."""
        return self.queue_len / self.backlog_max if self.backlog_max else float(self.queue_len > 0)


@dataclass(frozen=True)
class TcpCounters:
    """Cumulative TCP counters of one network namespace (Tcp from snmp, TcpExt from netstat)."""

    active_opens: int
    passive_opens: int
    attempt_fails: int
    estab_resets: int
    listen_overflows: int
    listen_drops: int
    syn_retrans: int  # TcpExt TCPSynRetrans (active and passive)

    def delta(self, earlier: TcpCounters) -> TcpCounters:
        return TcpCounters(*(a - b for a, b in zip(self._values(), earlier._values(), strict=True)))

    def _values(self) -> tuple[int, ...]:
        return (self.active_opens, self.passive_opens, self.attempt_fails, self.estab_resets,
                self.listen_overflows, self.listen_drops, self.syn_retrans)


@dataclass(frozen=True)
class ListenQueueSnapshot:
    pid: int
    netns: int  # inode of the namespace (os.stat('/proc/<pid>/ns/net').st_ino)
    monotonic_s: float
    listeners: list[ListenSocket]
    counters: TcpCounters

    @property
    def full(self) -> list[ListenSocket]:
        return [s for s in self.listeners if s.full]


def read_counters(pid: int, proc: str = "/proc") -> TcpCounters | None:
    """The TCP counters of <pid>'s network namespace; None if the process is gone."""
    try:
        snmp = PID_NET_SNMP.read(_host(proc), pid=pid)
        netstat = PID_NET_NETSTAT.read(_host(proc), pid=pid)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise
    tcp, ext = snmp.get("Tcp", {}), netstat.get("TcpExt", {})
    return TcpCounters(
        tcp.get("ActiveOpens", 0), tcp.get("PassiveOpens", 0), tcp.get("AttemptFails", 0),
        tcp.get("EstabResets", 0), ext.get("ListenOverflows", 0), ext.get("ListenDrops", 0),
        ext.get("TCPSynRetrans", 0),
    )


# ---- netlink sock_diag inside another namespace ---------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.setns.restype = ctypes.c_int


def _socket_in_netns(ns_fd: int) -> socket.socket:
    """A NETLINK_SOCK_DIAG socket created in the namespace of `ns_fd` (see the module docstring)."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            own = os.open(_OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            result["error"] = e
            return
        try:
            if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")
            try:
                result["sock"] = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                               NETLINK_SOCK_DIAG)
            finally:
                # Not strictly needed (the thread ends now), but leave it as it came.
                _libc.setns(own, CLONE_NEWNET)
        except OSError as e:
            result["error"] = e
        finally:
            os.close(own)

    t = threading.Thread(target=run, name="nn-listenq-setns", daemon=True)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


# netlink and inet_diag wire formats (uapi linux/netlink.h, linux/inet_diag.h, linux/sock_diag.h)
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_INET_DIAG_REQ_V2 = struct.Struct("=BBBxI48x")  # family, protocol, ext, pad, states, inet_diag_sockid (any)
_INET_DIAG_MSG = struct.Struct("=BBBB2H16s16sI8sIIIII")  # family, state, timer, retrans, sport, dport (be),
# src, dst, if, cookie, expires, rqueue, wqueue, uid, inode
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300


def _dump_listeners(sock: socket.socket, family: int) -> list[ListenSocket]:
    """One inet_diag dump of the LISTEN TCP sockets of ``family``, read straight off the netlink
    socket: a few hundred bytes per listener, where pyroute2's parser cost ~1.5 ms a namespace and
    ~10 MiB of agent RSS for its import alone."""
    req = _INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 1 << TCP_LISTEN_STATE)
    sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req)
    out: list[ListenSocket] = []
    while True:
        data = sock.recv(65536)
        if not data:
            return out
        at = 0
        while at + _NLMSGHDR.size <= len(data):
            length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, at)
            if length < _NLMSGHDR.size:
                raise OSError(errno.EPROTO, f"sock_diag: malformed netlink message (length {length})")
            body = at + _NLMSGHDR.size
            if kind == _NLMSG_DONE:
                return out
            if kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, body)[0]
                if code:
                    raise OSError(code, f"sock_diag: {os.strerror(code)}")
            elif length - _NLMSGHDR.size >= _INET_DIAG_MSG.size:
                fam, state, _t, _r, sport, _dport, src, _dst, _if, _ck, _exp, rqueue, wqueue, _uid, inode = \
                    _INET_DIAG_MSG.unpack_from(data, body)
                if state == TCP_LISTEN_STATE:
                    addr = socket.inet_ntop(fam, src[:4] if fam == socket.AF_INET else src)
                    out.append(ListenSocket(family=fam, addr=addr, port=socket.ntohs(sport),
                                            queue_len=rqueue, backlog_max=wqueue, inode=inode))
            at += (length + 3) & ~3


def _query_listeners(sock: socket.socket) -> list[ListenSocket]:
    try:
        return [ls for family in (socket.AF_INET, socket.AF_INET6) for ls in _dump_listeners(sock, family)]
    finally:
        sock.close()


def read_netns(pid: int, proc: str = "/proc") -> ListenQueueSnapshot | None:
    """Listen queues and TCP counters of <pid>'s network namespace; None if the process is gone."""
    try:
        ns_fd = os.open(PID_NS_NET.under(proc, pid=pid), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise
    try:
        netns = os.fstat(ns_fd).st_ino
        counters = read_counters(pid, proc)
        if counters is None:
            return None
        if netns == os.stat(_OWN_NETNS).st_ino:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        else:
            sock = _socket_in_netns(ns_fd)
        listeners = _query_listeners(sock)
    finally:
        os.close(ns_fd)
    return ListenQueueSnapshot(pid, netns, time.monotonic(), listeners, counters)


def read_local_addrs(pid: int, proc: str = "/proc") -> frozenset[str]:
    """The addresses local to <pid>'s network namespace (IPv4 from net/fib_trie's `/32 host LOCAL`
    entries, IPv6 from net/if_inet6), read from /proc without entering the namespace; empty if gone."""
    try:
        ipv4 = PID_NET_FIB_TRIE.read(_host(proc), pid=pid)
    except OSError:
        return frozenset()
    try:
        return ipv4 | PID_NET_IF_INET6.read(_host(proc), pid=pid)
    except OSError:
        return ipv4


# ---- owners: which cgroup's tasks live in which network namespace --------------------------------

# A cgroup subtree is searched this deep for a task (pod -> container -> maybe a nested cgroup).
_MAX_DEPTH = 3


def first_pid(cgroup_dir: Path) -> int | None:
    """A task of the cgroup or of one of its descendants (breadth first), or None if it has none."""
    level = [cgroup_dir]
    for _ in range(_MAX_DEPTH + 1):
        below: list[Path] = []
        for d in level:
            try:
                for pid in CGROUP_PROCS.read(d, 2):
                    return pid
                below.extend(Path(e.path) for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
            except (OSError, ValueError):
                continue
        level = below
    return None


def pids_of(cgroup_dir: Path) -> list[int]:
    """Every task of the cgroup and its descendants (for finding a socket's owner; bounded depth)."""
    out: list[int] = []
    level = [cgroup_dir]
    for _ in range(_MAX_DEPTH + 1):
        below: list[Path] = []
        for d in level:
            try:
                out.extend(CGROUP_PROCS.read(d, 2))
                below.extend(Path(e.path) for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
            except (OSError, ValueError):
                continue
        level = below
    return out


def socket_owners(inodes: set[int], pids: list[int], proc: str = "/proc") -> dict[int, int]:
    """Socket inode -> the first of `pids` holding it open (one pass over their /proc/<pid>/fd links,
    stopping once every inode is found). A pid whose fds cannot be read (another uid: the directory
    is 0500, see docs/runbooks.md) is skipped."""
    want = {f"socket:[{i}]": i for i in inodes}
    found: dict[int, int] = {}
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                inode = want.get(os.readlink(f"{fd_dir}/{name}"))
            except OSError:
                continue
            if inode is not None and inode not in found:
                found[inode] = pid
                if len(found) == len(want):
                    return found
    return found


@dataclass(frozen=True)
class NetnsReading:
    """One namespace in a :class:`ListenReport`: its listeners and counters, who lives in it."""

    snapshot: ListenQueueSnapshot
    owners: tuple[str, ...]  # owner cgroup paths whose tasks are in this namespace
    shared: bool  # the node's own namespace, or several owners: a listener's owner needs its fd
    local_addrs: frozenset[str]
    # ListenOverflows since the previous read of this namespace (None: first read of it)
    overflows_delta: int | None
    # socket inode -> owner, for the full listeners of a shared namespace whose holder was found
    socket_owners: dict[int, str]
    # The listeners were dumped in this read (else they are the last dump's, snapshot.monotonic_s old:
    # nothing overflowed since, so no listener was full for a SYN in between); counters are always new.
    dumped: bool = True

    @property
    def netns(self) -> int:
        return self.snapshot.netns

    def owner_of(self, listener: ListenSocket) -> str | None:
        if not self.shared:
            return self.owners[0] if self.owners else None
        return self.socket_owners.get(listener.inode)


@dataclass(frozen=True)
class ListenReport:
    """One read of the owners' listen queues (see :class:`ListenWatch`)."""

    monotonic_s: float
    reason: str  # "connect trouble" | "cadence"
    namespaces: dict[int, NetnsReading]  # netns inode ->
    errors: tuple[str, ...] = ()  # "listenq: <reason> (netns <inode>, pid <pid>)"


# Without connect trouble, listen queues are read this often (a slow census for the metrics).
CADENCE_S = 30.0
# With connect trouble in every tick, no more often than this: the cost of a read grows with the
# namespaces on the node, and a listener that stays full is still full 5 s later.
TROUBLE_SPACING_S = 5.0
# A read takes each namespace's counters (~0.2 ms); the sock_diag dump of its listeners (setns thread,
# netlink dump) only when ListenOverflows moved since the last read — a full accept queue counts every
# SYN it drops there — or on first sight, and otherwise this often (for the fill metric).
DUMP_MAX_AGE_S = 120.0


class ListenWatch:
    """Reads the listen queues of the owners' network namespaces when asked to and it is due.

    Owners are cgroup paths (the caller's workloads: pod cgroups); knowing nothing of pods, this maps
    each owner to its namespace through a task of its cgroup (``/proc/<pid>/ns/net``), cached per owner
    and checked (one stat) when used. One read covers each distinct namespace once: its TCP counters
    always, its listeners (sock_diag, the costly part) only when it overflowed since (DUMP_MAX_AGE_S).
    """

    def __init__(self, proc: str, cgroup_dir, cadence_s: float = CADENCE_S,
                 trouble_spacing_s: float = TROUBLE_SPACING_S, dump_max_age_s: float = DUMP_MAX_AGE_S) -> None:
        self.proc = proc
        self.cgroup_dir = cgroup_dir  # owner path -> Path of its cgroup directory (or None)
        self.cadence_s = cadence_s
        self.trouble_spacing_s = trouble_spacing_s
        self._owner_ns: dict[str, tuple[int, int]] = {}  # owner -> (pid, netns inode)
        self._overflows: dict[int, int] = {}  # netns inode -> ListenOverflows at its last read
        # netns inode -> (last dump, its local addresses, owners of its full listeners)
        self._dumps: dict[int, tuple[ListenQueueSnapshot, frozenset[str], dict[int, str]]] = {}
        self.dump_max_age_s = dump_max_age_s
        self.dumps = 0  # namespaces whose listeners were dumped (sock_diag), all reads together
        self.last_read_s: float | None = None
        self.reads = 0

    def due(self, trouble: bool, now: float | None = None) -> str | None:
        """Why a read is due now ("connect trouble", "cadence"), or None."""
        now = time.monotonic() if now is None else now
        since = None if self.last_read_s is None else now - self.last_read_s
        if trouble and (since is None or since >= self.trouble_spacing_s):
            return "connect trouble"
        if since is None or since >= self.cadence_s:
            return "cadence"
        return None

    def _netns_of(self, owner: str) -> tuple[int, int] | None:
        cached = self._owner_ns.get(owner)
        if cached is not None:
            with contextlib.suppress(OSError):
                if os.stat(PID_NS_NET.under(self.proc, pid=cached[0])).st_ino == cached[1]:
                    return cached
        directory = self.cgroup_dir(owner)
        pid = first_pid(directory) if directory is not None else None
        if pid is None:
            self._owner_ns.pop(owner, None)
            return None
        try:
            found = (pid, os.stat(PID_NS_NET.under(self.proc, pid=pid)).st_ino)
        except OSError:
            self._owner_ns.pop(owner, None)
            return None
        self._owner_ns[owner] = found
        return found

    def _read_one(self, ino: int, pid: int, own: tuple[str, ...], shared: bool, now: float) -> NetnsReading | None:
        """One namespace: its counters (two small /proc files), and its listeners over sock_diag only
        when something overflowed since the last read, on first sight, or every DUMP_MAX_AGE_S."""
        counters = read_counters(pid, self.proc)
        if counters is None:
            return None  # the task exited since the stat: next read
        before = self._overflows.get(ino)
        delta = None if before is None else counters.listen_overflows - before
        last = self._dumps.get(ino)
        if last is not None and not delta and now - last[0].monotonic_s < self.dump_max_age_s \
                and last[0].pid == pid:
            snap, addrs, owners_of = dataclasses.replace(last[0], counters=counters), last[1], last[2]
            return NetnsReading(snap, own, shared, addrs, delta, owners_of, dumped=False)
        snap = read_netns(pid, self.proc)
        if snap is None or snap.netns != ino:
            return None  # the task left or exited between the stat and the read: next read
        if before is not None:
            delta = snap.counters.listen_overflows - before
        owners_of: dict[int, str] = {}
        # Only full listeners are looked for (a walk of the owners' open files): they are what the
        # join names and what the metrics of a shared namespace can attribute.
        wanted = {s.inode for s in snap.full}
        if shared and wanted:
            for owner in own:
                directory = self.cgroup_dir(owner)
                pids = pids_of(directory) if directory is not None else []
                for inode in socket_owners(wanted - owners_of.keys(), pids, self.proc):
                    owners_of[inode] = owner
                if len(owners_of) == len(wanted):
                    break
        addrs = read_local_addrs(pid, self.proc)
        self._dumps[ino] = (snap, addrs, owners_of)
        self.dumps += 1
        return NetnsReading(snap, own, shared, addrs, delta, owners_of)

    def read(self, owners, reason: str = "asked") -> ListenReport:
        owners = list(owners)
        errors: list[str] = []
        members: dict[int, list[str]] = {}
        pid_of: dict[int, int] = {}
        for owner in owners:
            found = self._netns_of(owner)
            if found is None:
                continue
            pid, ino = found
            members.setdefault(ino, []).append(owner)
            pid_of.setdefault(ino, pid)
        for gone in set(self._owner_ns) - set(owners):
            del self._owner_ns[gone]
        try:
            node_ns = os.stat(PID_NS_NET.under(self.proc, pid=1)).st_ino
        except OSError:
            node_ns = None
        namespaces: dict[int, NetnsReading] = {}
        started = time.monotonic()
        for ino, pid in pid_of.items():
            own = tuple(sorted(members[ino]))
            try:
                reading = self._read_one(ino, pid, own, shared=ino == node_ns or len(own) > 1, now=started)
            except Exception as e:  # one namespace (EPERM, a netlink parse error) must not stop the others
                why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
                errors.append(f"listenq: {why} (netns {ino}, pid {pid})")
                continue
            if reading is not None:
                namespaces[ino] = reading
        self._dumps = {ino: d for ino, d in self._dumps.items() if ino in namespaces}
        self._overflows = {ino: r.snapshot.counters.listen_overflows for ino, r in namespaces.items()}
        now = time.monotonic()
        self.last_read_s = now
        self.reads += 1
        return ListenReport(now, reason, namespaces, tuple(errors))
