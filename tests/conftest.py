# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: root/kernel checks and owned test cgroups that are always removed."""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.sandbox import OwnedCgroup, cleanup_prefix

# cpu.shares of this process's nn-test-<pid> directory while a test's pods interfere on purpose: 16
# times a nice-0 task's, so a CPU hog in a test pod gets ~16/17 of its CPU against one other task or
# cgroup at the root (other test runs, CI load), not half, and stays the main neighbour the test
# builds. Only ever written on that directory, which this process created.
SHIELD_SHARES = 16384


# A fixed amount of pure-Python work, and the seconds it takes on the reference machine (2 cores of the
# developers' kind, quiet: 0.095-0.10 s of CPU). Tests that wait for Python processes to do something
# (an agent starting, a detection) scale their deadlines by how much slower this machine runs it now:
# a TCG guest (the VM lane) about 10 times, a loaded CI host 2-3 times. Never below 1.
_CALIBRATION_LOOPS = 1_000_000
_CALIBRATION_REFERENCE_S = 0.1


@functools.cache
def slowdown() -> float:
    """How many times slower than the reference machine this one runs Python now (≥ 1); the median
    of three timings of the same loop, measured once per session."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        x = 0
        for i in range(_CALIBRATION_LOOPS):
            x += i * i % 7
        times.append(time.perf_counter() - start)
    return max(1.0, sorted(times)[1] / _CALIBRATION_REFERENCE_S)


def readline_within(p: subprocess.Popen, timeout: float) -> str:
    """A line from `p` within `timeout` seconds on the reference machine (longer on a slower one:
    an interpreter starts ~10 times slower in a TCG guest)."""
    timeout *= slowdown()
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output from {p.args[-3:]} within {timeout} s")
    return p.stdout.readline().strip()


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A TERM (a cancelled CI job, scripts/ci-under-load.sh stopped) ends the session the way Ctrl-C
    # does, so fixture teardown still removes the owned test cgroups; Python's default for TERM is
    # to die on the spot and leave them behind.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _term_as_interrupt)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: loads BPF programs and creates cgroups on the real kernel")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _remove_owned_cgroups_at_exit():
    yield
    if os.geteuid() == 0:
        cleanup_prefix()


@pytest.fixture
def make_cgroup(request: pytest.FixtureRequest):
    """make_cgroup(name, controllers=("cpu",)) -> OwnedCgroup, removed at teardown even on failure."""
    created: list[OwnedCgroup] = []

    def factory(name: str, controllers=("cpu",)) -> OwnedCgroup:
        base = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name)[:40]
        cg = OwnedCgroup(f"{base}-{name}", controllers).create()
        created.append(cg)
        return cg

    yield factory
    for cg in reversed(created):
        cg.remove()


def shield(cg: OwnedCgroup, shares: int = SHIELD_SHARES) -> Callable[[], None]:
    """Give the nn-test-<pid> directory above `cg` `shares` of CPU weight (cpu.weight on v2);
    returns the function that puts the old value back (a no-op once the directory is gone)."""
    top = cg.path("cpu")
    while top.name != cg.prefix:
        top = top.parent
    path, value = top / "cpu.shares", str(shares)
    if not path.exists():
        path, value = top / "cpu.weight", str(max(1, min(10000, shares * 100 // 1024)))
    old = path.read_text().strip()
    path.write_text(value)

    def restore() -> None:
        with contextlib.suppress(OSError):  # removed with the last test cgroup below it
            path.write_text(old)

    return restore


def _fs_type(path: Path) -> str:
    """Filesystem type of the mount holding `path` (longest mount point prefix in /proc/mounts)."""
    best, fstype = "", ""
    real = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt, typ = line.split()[1], line.split()[2]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, typ
    return fstype


# Filesystems whose pages a memory cgroup cannot reclaim from its reader: tmpfs pages are not
# reclaimable without swap (and are charged to their writer), an overlay over tmpfs is tmpfs, and
# reads through 9p or virtiofs (the VM lane's shared root) leave no page cache charged to the reader.
NOT_A_DISK = ("tmpfs", "ramfs", "overlay", "9p", "virtiofs")


@pytest.fixture
def disk_dir(tmp_path: Path):
    """A directory on a disk filesystem, whose page cache is charged to the reader and reclaimable."""
    if _fs_type(tmp_path) not in NOT_A_DISK:
        yield tmp_path
        return
    # The VM lane's scratch disk (scripts/vm/run.sh --disk: ext4 on a virtio disk) when there is one.
    d = Path(tempfile.mkdtemp(prefix="nn-reclaim-", dir=os.environ.get("NN_VM_DISK") or "/var/tmp"))
    if _fs_type(d) in NOT_A_DISK:
        os.rmdir(d)
        pytest.skip("no disk-backed temp directory: page cache would not be reclaimable "
                    "(in the VM lane: scripts/vm/run.sh --disk SIZE)")
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def cgroup_tids(cg: OwnedCgroup, controller: str = "cpu") -> list[int]:
    """The thread ids in one of our cgroups: v1's `tasks`, v2's `cgroup.threads` (v2 has no `tasks`)."""
    d = cg.path(controller)
    name = "tasks" if (d / "tasks").exists() else "cgroup.threads"
    return [int(t) for t in (d / name).read_text().split()]


def read_terminal(leader: int, timeout: float = 120.0) -> bytes:
    """Everything written to a pty until the child closes it (EIO or EOF), or ``timeout`` seconds."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    return out


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh test installs it)")
    return path


@pytest.fixture
def veth_pair():
    """Namespaces nn-test-<pid>-a/-b joined by a veth pair (10.211.0.1/30 ↔ 10.211.0.2/30), always removed."""
    require_tool("ip")
    pid = os.getpid()
    ns_a, ns_b = f"nn-test-{pid}-a", f"nn-test-{pid}-b"
    dev_a, dev_b = f"nnv{pid}a"[:15], f"nnv{pid}b"[:15]
    created: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    try:
        for ns in (ns_a, ns_b):
            ip("netns", "add", ns)
            created.append(ns)
        ip("link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
        for ns, dev, addr in ((ns_a, dev_a, "10.211.0.1/30"), (ns_b, dev_b, "10.211.0.2/30")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield {"a": ns_a, "b": ns_b, "dev_a": dev_a, "dev_b": dev_b, "dst": "10.211.0.2"}
    finally:
        for ns in reversed(created):  # deleting a namespace removes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=10)
