# SPDX-License-Identifier: Apache-2.0
"""The probe engine: load a probe's BPF object, pick the attach mode the kernel supports, attach.

`Engine` is the small interface a second backend (a bcc engine for kernels without BTF) implements;
`LibbpfEngine` is the CO-RE backend. Probe modules (runqlat, ...) only use `LoadedProbe`, so their
decoding stays apart from how the programs got into the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol

from probes.host import HostPaths
from probes.libbpf import BpfError, BpfObject, LibbpfMissing, ProgramStats, RingBuffer, VmlinuxBtf

log = logging.getLogger(__name__)

OBJECT_DIR = Path(__file__).parent / "bpf_objects"
# A BTF file describing the running kernel, for kernels without /sys/kernel/btf/vmlinux (`--btf FILE`:
# made by `bpftool gen min_core_btf`, or from BTFHub). Process-wide like NN_BPF_OBJECT_DIR: every
# engine and feature check reads it (see use_btf_file).
BTF_FILE_ENV = "NN_BTF_FILE"
AttachMode = Literal["auto", "tp_btf", "raw_tp"]
# Kernel features a probe flavour may need beyond its tracepoints (checked in vmlinux BTF).
BtfNeed = tuple[str, str]  # ("var", name) or ("member", "struct.member")


class ProbeOffCode(StrEnum):
    """Why a probe is off, for programs: readiness, the agent's degraded status and metric, alerts. The
    message beside it is for people and may change wording; code never reads it."""

    NO_BTF = "no_btf"  # the kernel has no BTF and no --btf file was given: no CO-RE probe can load
    NO_KERNEL_BTF_FOR_TP_BTF = "no_kernel_btf_for_tp_btf"  # tp_btf asked for on a kernel without its own BTF
    OBJECT_MISSING = "object_missing"  # the BPF object was not built
    TRACEPOINT_MISSING = "tracepoint_missing"  # a required tracepoint is not in this kernel
    LAYOUT_MISMATCH = "layout_mismatch"  # the object's map layouts differ from what the decoder reads
    LOAD_FAILED = "load_failed"  # libbpf (or the BTF file) refused: the message has the errno
    UNAVAILABLE = "unavailable"  # anything else a probe needs is missing (a /proc file, a device)


class ProbeError(RuntimeError):
    """A probe cannot run here. The message is one line: what is missing and what is off; `code` says
    the same for programs."""

    def __init__(self, message: str, code: ProbeOffCode = ProbeOffCode.UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code


def btf_file() -> Path | None:
    """The BTF file given with --btf (or $NN_BTF_FILE); None: the kernel's own."""
    path = os.environ.get(BTF_FILE_ENV)
    return Path(path) if path else None


def check_btf_file(path: str | os.PathLike[str]) -> None:
    """Raise ValueError (one line) unless libbpf can parse `path` as BTF."""
    try:
        with VmlinuxBtf(path):
            pass
    except BpfError as e:
        raise ValueError(f"--btf {path}: {e.strerror}") from None
    except LibbpfMissing as e:
        raise ValueError(f"--btf {path}: {e}") from None


def use_btf_file(path: str | os.PathLike[str] | None) -> None:
    """Make every engine of this process relocate against `path` (checked first; None: no change)."""
    if path is None:
        return
    check_btf_file(path)
    os.environ[BTF_FILE_ENV] = os.fspath(Path(path).resolve())


# What a probe's Python decodes, per map: (key layout, value layout), each a struct.Struct, a ctypes
# type or a size in bytes (None: not decoded). The engine checks them against the object's BTF
# before load, so a C struct that changed without its decoder refuses to load, naming the map.
Layout = struct.Struct | int | type
MapLayouts = Mapping[str, tuple[Layout | None, Layout | None]]


def layout_size(layout: Layout) -> int:
    if isinstance(layout, struct.Struct):
        return layout.size
    if isinstance(layout, int):
        return layout
    return ctypes.sizeof(layout)


def layout_mismatches(obj: BpfObject, layouts: MapLayouts) -> list[str]:
    """One line per declared map whose key or value size is not the object's (empty: all match)."""
    found = {m.name: m for m in obj.maps()}
    problems = []
    for name, (key, value) in layouts.items():
        m = found.get(name)
        if m is None:
            problems.append(f"map {name} is decoded but {obj.path.name} has no such map")
            continue
        for what, layout, actual in (("key", key, m.key_size), ("value", value, m.value_size)):
            if layout is not None and layout_size(layout) != actual:
                problems.append(f"map {name} {what}: the decoder reads {layout_size(layout)} bytes, "
                                f"the object's BTF says {actual}")
    return problems


@dataclass(frozen=True)
class Tracepoint:
    name: str  # e.g. "sched_switch"
    btf_program: str  # program name of the tp_btf variant
    raw_program: str  # program name of the raw_tp variant
    required: bool = True  # without it the probe is off; otherwise it is degraded


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    object_file: str
    tracepoints: tuple[Tracepoint, ...]
    btf_needs: tuple[BtfNeed, ...] = ()  # all must exist, else this spec cannot load here


def missing_btf_features(spec: ProbeSpec) -> list[str]:
    """What of `spec.btf_needs` this kernel's BTF (or the --btf file) lacks (empty: the spec can load)."""
    if not spec.btf_needs:
        return []
    try:
        with VmlinuxBtf(btf_file()) as btf:
            missing = []
            for kind, name in spec.btf_needs:
                if kind == "var" and not btf.has_var(name):
                    missing.append(f"kernel variable {name}")
                elif kind == "member":
                    struct, member = name.split(".", 1)
                    if not btf.struct_has_member(struct, member):
                        missing.append(f"{name}")
            return missing
    except (BpfError, LibbpfMissing) as e:
        return [str(e)]


@dataclass
class ProbeStatus:
    name: str
    state: Literal["on", "degraded", "off"]
    reason: str = ""  # for people: what is missing, in words
    code: ProbeOffCode | None = None  # why it is off, for programs (None unless off)
    attach_mode: str | None = None
    attached: list[str] = field(default_factory=list)
    # Per-CPU maps shrunk to fit the memory budget on this host: map name -> entries it holds.
    capped_maps: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        mode = f" ({self.attach_mode})" if self.attach_mode else ""
        capped = "; ".join(f"{m} holds {n} entries (memory budget)" for m, n in self.capped_maps.items())
        details = "; ".join(x for x in (self.reason, capped) if x)
        return f"{self.name}: {self.state}{mode}{': ' + details if details else ''}"


class LoadedProbe(Protocol):
    status: ProbeStatus

    def map_items(self, name: str, split: bool = True) -> Iterator[tuple[bytes, bytes | list[bytes]]]: ...
    def map_array_values(self, name: str) -> bytes: ...
    def map_array_prefix(self, name: str, n: int) -> bytes: ...
    def map_lookup(self, name: str, key: bytes) -> bytes | list[bytes] | None: ...
    def map_delete(self, name: str, key: bytes) -> bool: ...
    def map_update(self, name: str, key: bytes, value: bytes) -> None: ...
    def map_zero(self, name: str, key: bytes) -> None: ...
    def map_push(self, name: str, value: bytes) -> None: ...
    def map_pop(self, name: str) -> bytes | None: ...
    def map_mmap(self, name: str) -> memoryview | None: ...
    def ring_buffer(self, name: str, callback: Callable[[bytes], None]) -> RingBuffer: ...
    def program_stats(self) -> list[ProgramStats]: ...
    def close(self) -> None: ...


class Engine(Protocol):
    name: str

    def open_probe(
        self,
        spec: ProbeSpec,
        rodata: dict[str, int | bool] | None = None,
        attach_mode: AttachMode = "auto",
        map_sizes: dict[str, int] | None = None,
        layouts: MapLayouts | None = None,
    ) -> LoadedProbe: ...


class LibbpfProbe:
    """A loaded, attached CO-RE object."""

    def __init__(self, obj: BpfObject, status: ProbeStatus) -> None:
        self.obj = obj
        self.status = status
        self._maps: dict[str, object] = {}
        self._mmaps: dict[str, mmap.mmap | None] = {}

    def _map(self, name: str):
        m = self._maps.get(name)
        if m is None:
            m = self._maps[name] = self.obj.map(name)
        return m

    def map_items(self, name: str, split: bool = True) -> Iterator[tuple[bytes, bytes | list[bytes]]]:
        return self._map(name).items(split=split)

    def map_array_values(self, name: str) -> bytes:
        """Every value of an array map in index order, one bytes (see BpfMap.array_values)."""
        return self._map(name).array_values()

    def map_array_prefix(self, name: str, n: int) -> bytes:
        """The first ``n`` values of an array map, one bytes (see BpfMap.array_prefix)."""
        return self._map(name).array_prefix(n)

    def map_lookup(self, name: str, key: bytes) -> bytes | list[bytes] | None:
        return self._map(name).lookup(key)

    def map_delete(self, name: str, key: bytes) -> bool:
        return self._map(name).delete(key)

    def map_take(self, name: str, key: bytes) -> bytes | list[bytes] | None:
        """An entry's value, deleted in the same syscall (None: absent); an OSError where the kernel
        cannot do that for this kind of map (hash maps before Linux 5.14)."""
        return self._map(name).take(key)

    def map_update(self, name: str, key: bytes, value: bytes) -> None:
        """Set a value (per-CPU maps: `value` holds every CPU's, 8-byte aligned, in CPU order)."""
        self._map(name).update(key, value)

    def map_zero(self, name: str, key: bytes) -> None:
        """Set an entry to zeros (per-CPU maps: on every CPU)."""
        self._map(name).update(key, b"")

    def map_push(self, name: str, value: bytes) -> None:
        self._map(name).push(value)

    def map_pop(self, name: str) -> bytes | None:
        """The next value of a queue or stack map, taken out (None: empty)."""
        return self._map(name).pop()

    def map_mmap(self, name: str) -> memoryview | None:
        """A BPF_F_MMAPABLE array's values in place (None: the map is not mmapable here): read, and
        zeroed, without a syscall or a copy, so a tick's cost follows the slots it looks at."""
        if name not in self._mmaps:
            self._mmaps[name] = self._map(name).mmap()
        view = self._mmaps[name]
        return memoryview(view) if view is not None else None

    def ring_buffer(self, name: str, callback: Callable[[bytes], None]) -> RingBuffer:
        return RingBuffer(self._map(name), callback)

    def program_stats(self) -> list[ProgramStats]:
        return self.obj.program_stats()

    def close(self) -> None:
        for view in self._mmaps.values():
            if view is not None:
                with contextlib.suppress(BufferError):  # a view of it is still held: the mapping goes with that
                    view.close()
        self._mmaps.clear()
        self.obj.close()
        self.status.state = "off"


# Kernel memory one per-CPU map may take: entries x value size x possible CPUs. Without a cap, a
# 16384-entry map of 344-byte values is 11 MiB on 2 CPUs but 361 MiB on 64 (charged to the agent's
# memory cgroup): on hosts with many CPUs such maps hold fewer entries, and updates past them are
# counted as drops.
PERCPU_MAP_BUDGET_BYTES = 16 << 20


def percpu_map_entries(wanted: int, value_size: int, cpus: int, budget_bytes: int = PERCPU_MAP_BUDGET_BYTES) -> int:
    """How many entries of a per-CPU map fit the budget (at least 1, at most `wanted`)."""
    per_entry = (value_size + 7) // 8 * 8 * max(cpus, 1)
    return max(1, min(wanted, budget_bytes // per_entry))


class LibbpfEngine:
    name = "libbpf"

    def __init__(
        self,
        paths: HostPaths | None = None,
        object_dir: Path | None = None,
        percpu_map_budget_bytes: int = PERCPU_MAP_BUDGET_BYTES,
        btf_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """`btf_path`: relocate against this BTF file (default: --btf / $NN_BTF_FILE, else the kernel's)."""
        self.paths = paths or HostPaths()
        self.object_dir = object_dir or Path(os.environ.get("NN_BPF_OBJECT_DIR", OBJECT_DIR))
        self.percpu_map_budget_bytes = percpu_map_budget_bytes
        self.btf_path = Path(btf_path) if btf_path is not None else btf_file()

    def open_probe(
        self,
        spec: ProbeSpec,
        rodata: dict[str, int | bool] | None = None,
        attach_mode: AttachMode = "auto",
        map_sizes: dict[str, int] | None = None,
        layouts: MapLayouts | None = None,
    ) -> LibbpfProbe:
        """Load and attach. `map_sizes` overrides max_entries (ring buffers: bytes, power of 2);
        `layouts` is what the probe decodes (checked against the object before load)."""
        path = self.object_dir / spec.object_file
        if not path.is_file():
            raise ProbeError(f"{spec.name}: off: BPF object {path} missing (build it with `make bpf`)",
                             ProbeOffCode.OBJECT_MISSING)
        kernel_btf = self.paths.btf_vmlinux.exists()
        if not kernel_btf and self.btf_path is None:
            raise ProbeError(
                f"{spec.name}: off: kernel has no BTF ({self.paths.btf_vmlinux} absent); "
                "CO-RE probes need CONFIG_DEBUG_INFO_BTF or a BTF file for this kernel (--btf FILE)",
                ProbeOffCode.NO_BTF,
            )
        typed = self._typed_tracepoints(spec, kernel_btf)

        mode = attach_mode
        if mode == "tp_btf" and not kernel_btf:  # e.g. runqlat's sched_info flavour: it falls back
            raise ProbeError(f"{spec.name}: off: tp_btf needs the kernel's own BTF ({self.paths.btf_vmlinux} absent)",
                             ProbeOffCode.NO_KERNEL_BTF_FOR_TP_BTF)
        if mode == "auto":
            # One mode per probe: the two variants keep their state in different maps.
            mode = "tp_btf" if all(typed[tp.name] for tp in spec.tracepoints if tp.required) else "raw_tp"
        missing_required = [tp.name for tp in spec.tracepoints if tp.required and not self._exists(tp.name, typed)]
        if missing_required:
            raise ProbeError(f"{spec.name}: off: kernel lacks tracepoint(s) {', '.join(missing_required)}",
                             ProbeOffCode.TRACEPOINT_MISSING)

        try:
            obj = BpfObject(path, btf_custom_path=self.btf_path)
        except (BpfError, LibbpfMissing) as e:
            raise ProbeError(f"{spec.name}: off: {e}", ProbeOffCode.LOAD_FAILED) from None
        mismatches = layout_mismatches(obj, layouts or {})
        if mismatches:
            obj.close()
            raise ProbeError(f"{spec.name}: off: {'; '.join(mismatches)} (rebuild with `make bpf`, or the "
                             "decoder does not follow bpf/*.h)", ProbeOffCode.LAYOUT_MISMATCH)
        status = ProbeStatus(spec.name, "on", attach_mode=mode)
        try:
            self._load_and_attach(obj, spec, mode, typed, status, rodata, map_sizes)
        except BpfError as e:
            obj.close()
            raise ProbeError(f"{spec.name}: off: {e}", ProbeOffCode.LOAD_FAILED) from None
        log.info("%s", status.line())
        return LibbpfProbe(obj, status)

    def _typed_tracepoints(self, spec: ProbeSpec, kernel_btf: bool) -> dict[str, bool]:
        """Which of the probe's tracepoints have a BTF type (what tp_btf programs attach to)."""
        try:
            with VmlinuxBtf(self.btf_path) as btf:
                # Without its own BTF the kernel cannot attach tp_btf programs, whatever the file says.
                return {tp.name: kernel_btf and btf.has_btf_tracepoint(tp.name) for tp in spec.tracepoints}
        except BpfError as e:
            raise ProbeError(f"{spec.name}: off: {e.strerror if self.btf_path else e}",
                             ProbeOffCode.LOAD_FAILED) from None
        except LibbpfMissing as e:
            raise ProbeError(f"{spec.name}: off: {e}", ProbeOffCode.LOAD_FAILED) from None

    def _load_and_attach(self, obj: BpfObject, spec: ProbeSpec, mode: str, typed: dict[str, bool],
                         status: ProbeStatus, rodata: dict[str, int | bool] | None,
                         map_sizes: dict[str, int] | None) -> None:
        """Load the chosen flavour's programs and attach them; a tracepoint that is not there (or not
        attachable in this flavour) degrades the probe, an optional one that fails to attach too."""
        # Only the chosen flavour's programs load; every other program in the object stays off.
        chosen = {tp.btf_program if mode == "tp_btf" else tp.raw_program for tp in spec.tracepoints}
        for prog in obj.program_names():
            if prog not in chosen:
                obj.set_autoload(prog, False)
        wanted: list[Tracepoint] = []
        for tp in spec.tracepoints:
            use = tp.btf_program if mode == "tp_btf" else tp.raw_program
            if not self._exists(tp.name, typed) or (mode == "tp_btf" and not typed[tp.name]):
                obj.set_autoload(use, False)
                status.state, status.reason = "degraded", f"no tracepoint {tp.name}"
                continue
            wanted.append(tp)
        if rodata:
            obj.set_rodata(rodata)
        for map_name, size in (map_sizes or {}).items():
            obj.map(map_name).set_max_entries(size)
        self._cap_percpu_maps(obj, status)
        obj.load()
        for tp in wanted:
            prog = tp.btf_program if mode == "tp_btf" else tp.raw_program
            try:
                obj.attach(prog)
                status.attached.append(tp.name)
            except BpfError as e:
                if tp.required:
                    raise
                status.state, status.reason = "degraded", f"{tp.name} not attached: {e}"

    def _cap_percpu_maps(self, obj: BpfObject, status: ProbeStatus) -> None:
        for m in obj.maps():
            if not m.percpu:
                continue
            fit = percpu_map_entries(m.max_entries, m.value_size, m.possible_cpus, self.percpu_map_budget_bytes)
            if fit < m.max_entries:
                log.info("%s: map %s holds %d entries, not %d: %d MiB per per-CPU map over %d CPUs",
                         status.name, m.name, fit, m.max_entries, self.percpu_map_budget_bytes >> 20, m.possible_cpus)
                m.set_max_entries(fit)
                status.capped_maps[m.name] = fit

    def _exists(self, tracepoint: str, typed: dict[str, bool]) -> bool:
        """A tracepoint exists if it has a BTF typedef, or tracefs lists it (raw_tp-only kernels)."""
        if typed.get(tracepoint):
            return True
        events = self.paths.tracefs / "events"
        if events.is_dir():
            return any((d / tracepoint).is_dir() for d in events.iterdir())
        return True  # cannot tell without BTF or tracefs: let attach decide
