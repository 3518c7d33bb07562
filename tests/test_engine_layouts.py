# SPDX-License-Identifier: Apache-2.0
"""The engine checks each probe's declared map layouts against the object's BTF, and loads objects
against a given BTF file (--btf) for kernels without /sys/kernel/btf/vmlinux."""

from __future__ import annotations

import ctypes
import inspect
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import probes.reclaim as reclaim
import probes.runqlat as runqlat
import probes.softirq as softirq
import probes.tcpconnect as tcpconnect
from probes.collect import NodeCollector
from probes.engine import (
    BTF_FILE_ENV,
    OBJECT_DIR,
    LibbpfEngine,
    ProbeError,
    ProbeOffCode,
    check_btf_file,
    layout_mismatches,
    layout_size,
)
from probes.host import HostPaths
from probes.libbpf import BpfObject
from testkit.bpf_maps import BPF_MAP_TYPE_RINGBUF

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
# module, its probe class, its object file
PROBES = {
    "runqlat": (runqlat, runqlat.RunqLatProbe, "runqlat.bpf.o"),
    "softirq": (softirq, softirq.SoftirqProbe, "softirq.bpf.o"),
    "reclaim": (reclaim, reclaim.ReclaimProbe, "reclaim.bpf.o"),
    "tcpconnect": (tcpconnect, tcpconnect.TcpConnectProbe, "tcpconnect.bpf.o"),
}


# Maps a module names only to size them (map_sizes), never reads.
SIZED_ONLY = {"fallback_queued_ns", "task_run_delay"}


@pytest.fixture(autouse=True)
def _no_btf_file(monkeypatch):
    monkeypatch.delenv(BTF_FILE_ENV, raising=False)


def test_layout_size_takes_structs_sizes_and_ctypes():
    class Pair(ctypes.Structure):
        _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint32)]

    assert layout_size(struct.Struct("<QII")) == 16
    assert layout_size(24) == 24
    assert layout_size(Pair) == 16


@pytest.mark.parametrize("name", sorted(PROBES))
def test_every_declaration_matches_the_object(name):
    """Each probe's MAP_LAYOUTS against its object's BTF (no load), and every map the module names
    is declared (ring buffers excepted: their records are not in the object's BTF)."""
    module, _, object_file = PROBES[name]
    with BpfObject(OBJECT_DIR / object_file) as obj:
        assert layout_mismatches(obj, module.MAP_LAYOUTS) == []
        maps = {m.name for m in obj.maps() if m.type != BPF_MAP_TYPE_RINGBUF and "." not in m.name}
    named = set(re.findall(r'"([a-z_]+)"', inspect.getsource(module))) | {"drops"}  # drops: probes/base.py
    undeclared = (maps & named) - set(module.MAP_LAYOUTS) - SIZED_ONLY
    assert not undeclared, f"{name} reads {sorted(undeclared)} without declaring their layout"


@pytest.mark.parametrize("name", sorted(PROBES))
def test_every_probe_loads_with_its_declarations_on_this_kernel(name):
    _, probe_class, _ = PROBES[name]
    with probe_class() as probe:
        assert probe.status.state in ("on", "degraded"), probe.status.line()


def test_an_array_prefix_reads_the_same_without_batch_ops(monkeypatch):
    """A kernel without BPF_MAP_LOOKUP_BATCH (EINVAL) gets the same bytes from one lookup per entry."""
    import errno

    from probes.libbpf import BpfError, BpfMap

    with runqlat.RunqLatProbe() as probe:
        batched = probe.probe.map_array_prefix("runq_cpu", 1)
        drops = probe.read_drops()

        def no_batch(self, batch):
            raise BpfError("bpf_map_lookup_batch", errno.EINVAL)
            yield  # a generator, as the real one

        monkeypatch.setattr(BpfMap, "_batches", no_batch)
        lookups: list[str] = []
        real_lookup = BpfMap.lookup
        monkeypatch.setattr(BpfMap, "lookup", lambda self, key: (lookups.append(self.name), real_lookup(self, key))[1])
        looked_up = probe.probe.map_array_prefix("runq_cpu", 1)
        # every CPU's state, 8-byte aligned, as the batched read gives it (its counters move between reads)
        assert len(looked_up) == len(batched) > 0 and "runq_cpu" in lookups
        assert probe.read_drops() == drops and "drops" in lookups  # read entry by entry, the same counts


@pytest.mark.parametrize(("name", "map_name", "corrupt"), [
    ("softirq", "stats", lambda key, value: (key, layout_size(value) - 8)),
    ("runqlat", "cgroup_runq", lambda key, value: (key, layout_size(value) + 8)),
    ("reclaim", "cgroup_reclaim", lambda key, value: (struct.Struct("<QI"), value)),
    ("tcpconnect", "dest_stats", lambda key, value: (key, struct.Struct("<3Q"))),
])
def test_a_corrupted_decoder_size_refuses_the_load_naming_the_map(monkeypatch, name, map_name, corrupt):
    module, probe_class, _ = PROBES[name]
    key, value = module.MAP_LAYOUTS[map_name]
    monkeypatch.setitem(module.MAP_LAYOUTS, map_name, corrupt(key, value))
    with pytest.raises(ProbeError) as exc:
        probe_class()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{name}: off: map {map_name} "), msg
    # both sizes: what Python decodes and what the object says
    declared = [layout_size(x) for x in corrupt(key, value)]
    actual = [layout_size(x) for x in (key, value)]
    which = 0 if declared[0] != actual[0] else 1
    assert f"reads {declared[which]} bytes" in msg and f"says {actual[which]}" in msg, msg


def test_a_refused_layout_turns_the_probe_off_in_the_collector(monkeypatch):
    monkeypatch.setitem(softirq.MAP_LAYOUTS, "stats", (4, 1))
    with NodeCollector(probes=("softirq",)) as collector:
        status = collector.status["softirq"]
    assert status.state == "off" and "map stats" in status.reason and "reads 1 bytes" in status.reason


def test_a_declared_map_the_object_lacks_is_refused(monkeypatch):
    monkeypatch.setitem(softirq.MAP_LAYOUTS, "no_such_map", (4, 8))
    with pytest.raises(ProbeError, match=r"map no_such_map is decoded but softirq\.bpf\.o has no such map"):
        softirq.SoftirqProbe()


# ---- --btf: a BTF file instead of the kernel's -------------------------------------------------------


def test_the_kernels_own_btf_file_as_custom_path_loads(monkeypatch):
    """/sys/kernel/btf/vmlinux is a valid BTF file: given as --btf, CO-RE relocates against it."""
    monkeypatch.setenv(BTF_FILE_ENV, str(VMLINUX_BTF))
    assert LibbpfEngine().btf_path == VMLINUX_BTF
    with softirq.SoftirqProbe() as probe:
        assert probe.status.state == "on", probe.status.line()
        assert probe.probe.obj._open_opts.btf_custom_path == bytes(VMLINUX_BTF)  # type: ignore[attr-defined]
    with runqlat.RunqLatProbe() as probe:
        assert probe.status.state == "on", probe.status.line()


@pytest.mark.parametrize("name", sorted(PROBES))
def test_a_kernel_without_btf_loads_with_a_btf_file(tmp_path, name):
    """The 'kernel has no BTF' check accepts a BTF file; such a kernel cannot attach tp_btf, so every
    probe takes its raw_tp flavour (runqlat's sched_info one is refused and it falls back)."""
    _, probe_class, _ = PROBES[name]
    no_kernel_btf = HostPaths(sys=tmp_path)  # no kernel/btf/vmlinux (and no tracefs: attach decides)
    with pytest.raises(ProbeError, match=r"no BTF.*--btf FILE") as refused:
        probe_class(engine=LibbpfEngine(paths=no_kernel_btf))
    assert refused.value.code == ProbeOffCode.NO_BTF  # what readiness and the degraded metric key on
    engine = LibbpfEngine(paths=no_kernel_btf, btf_path=VMLINUX_BTF)
    with probe_class(engine=engine) as probe:
        assert probe.status.state in ("on", "degraded") and probe.status.attach_mode == "raw_tp", probe.status.line()


@pytest.mark.parametrize("kind", ["missing", "garbage"])
def test_a_bad_btf_file_is_one_clear_line(tmp_path, kind):
    path = tmp_path / "vmlinux.btf"
    if kind == "garbage":
        path.write_bytes(b"not BTF at all\n" * 64)
    with pytest.raises(ProbeError) as exc:
        softirq.SoftirqProbe(engine=LibbpfEngine(btf_path=path))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("softirq: off: ") and str(path) in msg, msg
    assert ("missing" if kind == "missing" else "not a BTF file") in msg
    with pytest.raises(ValueError, match=re.escape(f"--btf {path}: ")):
        check_btf_file(path)


@pytest.mark.parametrize("command", [["top", "--once"], ["diagnose", "--duration", "1"],
                                     ["agent", "--listen", "127.0.0.1:0", "--dry-run"]])
def test_cli_bad_btf_is_one_line_and_exit_2(tmp_path, command):
    garbage = tmp_path / "garbage.btf"
    garbage.write_bytes(b"\0" * 100)
    cli = Path(sys.executable).parent / "noisyneighbor"
    r = subprocess.run([str(cli), *command, "--btf", str(garbage)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a BTF file" in r.stderr, r.stderr
