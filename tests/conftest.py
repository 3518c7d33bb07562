# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the product's tests: owned test cgroups that are always removed, a scratch disk, a veth pair.
The session-wide hooks (root checks, cleanup at exit) are in the repository's conftest.py; the helpers the
bench shares (sandbox, timing, tools) in testkit/."""

from __future__ import annotations

import os
import selectors
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from testkit.sandbox import OwnedCgroup
from testkit.timing import slowdown
from testkit.tools import require_tool


def readline_within(p: subprocess.Popen, timeout: float) -> str:
    """A line from `p` within `timeout` seconds on the reference machine (longer on a slower one:
    an interpreter starts ~10 times slower in a TCG guest)."""
    timeout *= slowdown()
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output from {p.args[-3:]} within {timeout} s")
    return p.stdout.readline().strip()


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
