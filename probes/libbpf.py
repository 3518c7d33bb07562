# SPDX-License-Identifier: Apache-2.0
"""A thin, typed ctypes layer over the system libbpf (`libbpf.so.1`).

Only what the probes need: open an object, set read-only config (`const volatile` globals) before
load, choose which programs load, attach, read maps (batched), poll ring buffers, and read the
kernel's per-program run-time statistics. Errors become :class:`BpfError` with the failing call and
errno — never a segfault from a NULL pointer: every pointer-returning call is checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from probes.cgroupfiles import PROC_SELF_FDINFO
from probes.host import HostPaths

# A descriptor of this process is in this process's /proc, whatever HostPaths the agent reads the host by.
_OWN_HOST = HostPaths()

log = logging.getLogger(__name__)

# enum bpf_map_type values we care about (uapi/linux/bpf.h)
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_PERCPU_ARRAY = 6
BPF_MAP_TYPE_LRU_PERCPU_HASH = 10
BPF_F_MMAPABLE = 1 << 10  # an array userspace may mmap (include/uapi/linux/bpf.h)
PERCPU_MAP_TYPES = frozenset({BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_LRU_PERCPU_HASH})
BPF_STATS_RUN_TIME = 0
BTF_KIND_STRUCT = 4
BTF_KIND_TYPEDEF = 8
BTF_KIND_VAR = 14
BTF_KIND_DATASEC = 15
BPF_ANY = 0


class BpfError(OSError):
    """A libbpf call failed. `str()` is one line naming the call and the reason."""

    def __init__(self, call: str, err: int, detail: str = "") -> None:
        err = abs(err) or errno.EINVAL
        super().__init__(err, f"{call}: {os.strerror(err)}{' (' + detail + ')' if detail else ''}")
        self.call = call


class LibbpfMissing(RuntimeError):
    pass


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size_or_type", ctypes.c_uint32)]


class _BtfVarSecinfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _BtfMember(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32), ("offset", ctypes.c_uint32)]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _OpenOpts(ctypes.Structure):
    """The head of struct bpf_object_open_opts up to btf_custom_path (libbpf >= 0.5); `sz` says
    where it ends, so libbpf treats the later fields as unset."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("_attach_prog_fd", ctypes.c_uint32),  # removed field, kept as a stub by libbpf
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
    ]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
RINGBUF_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _sig(lib: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


class Libbpf:
    """The loaded shared library with prototypes declared. One per process (see :func:`libbpf`)."""

    def __init__(self, path: str | None = None) -> None:
        name = path or ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            self.lib = ctypes.CDLL(name, use_errno=True)
        except OSError as e:
            raise LibbpfMissing(f"libbpf shared library not found ({name}): install libbpf1") from e
        L, vp, cp, i, u32, sz = self.lib, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
        _sig(L, "bpf_object__open_file", vp, cp, vp)
        _sig(L, "bpf_object__load", i, vp)
        _sig(L, "bpf_object__close", None, vp)
        _sig(L, "bpf_object__find_program_by_name", vp, vp, cp)
        _sig(L, "bpf_object__find_map_by_name", vp, vp, cp)
        _sig(L, "bpf_object__next_program", vp, vp, vp)
        _sig(L, "bpf_object__next_map", vp, vp, vp)
        _sig(L, "bpf_object__btf", vp, vp)
        _sig(L, "bpf_program__name", cp, vp)
        _sig(L, "bpf_program__section_name", cp, vp)
        _sig(L, "bpf_program__set_autoload", i, vp, ctypes.c_bool)
        _sig(L, "bpf_program__autoload", ctypes.c_bool, vp)
        _sig(L, "bpf_program__fd", i, vp)
        _sig(L, "bpf_program__attach", vp, vp)
        _sig(L, "bpf_link__destroy", i, vp)
        _sig(L, "bpf_map__name", cp, vp)
        _sig(L, "bpf_map__fd", i, vp)
        _sig(L, "bpf_map__type", i, vp)
        _sig(L, "bpf_map__key_size", u32, vp)
        _sig(L, "bpf_map__value_size", u32, vp)
        _sig(L, "bpf_map__max_entries", u32, vp)
        _sig(L, "bpf_map__map_flags", u32, vp)
        _sig(L, "bpf_map__set_max_entries", i, vp, u32)
        _sig(L, "bpf_map__initial_value", vp, vp, ctypes.POINTER(sz))
        _sig(L, "bpf_map_lookup_elem", i, i, vp, vp)
        _sig(L, "bpf_map_update_elem", i, i, vp, vp, ctypes.c_uint64)
        _sig(L, "bpf_map_lookup_and_delete_elem", i, i, vp, vp)
        _sig(L, "bpf_map_delete_elem", i, i, vp)
        _sig(L, "bpf_map_get_next_key", i, i, vp, vp)
        _sig(L, "bpf_map_lookup_batch", i, i, vp, vp, vp, vp, ctypes.POINTER(u32), ctypes.POINTER(_BatchOpts))
        _sig(L, "bpf_enable_stats", i, i)
        _sig(L, "ring_buffer__new", vp, i, RINGBUF_SAMPLE_FN, vp, vp)
        _sig(L, "ring_buffer__poll", i, vp, i)
        _sig(L, "ring_buffer__consume", i, vp)
        _sig(L, "ring_buffer__free", None, vp)
        _sig(L, "libbpf_num_possible_cpus", i)
        _sig(L, "libbpf_set_print", vp, _PRINT_FN)
        _sig(L, "btf__load_vmlinux_btf", vp)
        _sig(L, "btf__parse", vp, cp, vp)
        _sig(L, "btf__free", None, vp)
        _sig(L, "btf__find_by_name_kind", i, vp, cp, u32)
        _sig(L, "btf__type_by_id", ctypes.POINTER(_BtfType), vp, u32)
        _sig(L, "btf__name_by_offset", cp, vp, u32)
        self._print_cb = _PRINT_FN(self._on_print)  # keep a reference: libbpf holds the pointer
        self.lib.libbpf_set_print(self._print_cb)
        self._libc = ctypes.CDLL(None)
        self.last_messages: list[str] = []  # libbpf's own words for the last failure (verifier log)

    def _on_print(self, level: int, fmt: bytes | None, va_list: int | None) -> int:
        # libbpf formats with printf; on x86_64 a va_list parameter is a pointer, so vsnprintf can
        # render it. Elsewhere we keep the raw format string rather than guess the ABI.
        if fmt is None:
            return 0
        if platform.machine() == "x86_64" and va_list:
            buf = ctypes.create_string_buffer(4096)
            self._libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), ctypes.c_char_p(fmt), ctypes.c_void_p(va_list))
            text = buf.value.decode(errors="replace").rstrip()
        else:
            text = fmt.decode(errors="replace").rstrip()
        if text:
            self.last_messages.append(text)
            del self.last_messages[:-400]
            log.debug("libbpf: %s", text)
        return 0

    @property
    def possible_cpus(self) -> int:
        n = self.lib.libbpf_num_possible_cpus()
        if n <= 0:
            raise BpfError("libbpf_num_possible_cpus", n)
        return n


_LIBBPF: Libbpf | None = None


def libbpf() -> Libbpf:
    global _LIBBPF  # the shared library is process-wide state by nature; loaded once
    if _LIBBPF is None:
        _LIBBPF = Libbpf()
    return _LIBBPF


def _check_ptr(ptr: int | None, call: str) -> int:
    if not ptr:
        raise BpfError(call, ctypes.get_errno() or errno.ENOENT)
    return ptr


# ---------------------------------------------------------------------------------------------
# Kernel feature probing through vmlinux BTF
# ---------------------------------------------------------------------------------------------


class VmlinuxBtf:
    """The running kernel's BTF, for feature probes (does tracepoint X have a BTF-typed form?).

    `path`: a BTF file describing the kernel instead (raw BTF or an ELF with a .BTF section, e.g.
    from `bpftool gen min_core_btf` or BTFHub), for kernels without /sys/kernel/btf/vmlinux."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._lib = libbpf()
        if path is None:
            self._btf = self._lib.lib.btf__load_vmlinux_btf()
            if not self._btf:
                raise BpfError("btf__load_vmlinux_btf", ctypes.get_errno(), "kernel without BTF?")
            return
        if not os.path.isfile(path):
            raise BpfError("btf__parse", errno.ENOENT, f"BTF file {path} missing")
        self._btf = self._lib.lib.btf__parse(os.fsencode(path), None)
        if not self._btf:
            err = ctypes.get_errno() or errno.EINVAL
            # libbpf's own codes (4000+: LIBBPF_ERRNO__FORMAT ...) have no strerror text.
            raise BpfError("btf__parse", errno.EINVAL if err >= 4000 else err, f"{path} is not a BTF file")

    def has_btf_tracepoint(self, tracepoint: str) -> bool:
        """tp_btf needs the `btf_trace_<name>` typedef the kernel emits for each raw tracepoint."""
        name = f"btf_trace_{tracepoint}".encode()
        return self._lib.lib.btf__find_by_name_kind(self._btf, name, BTF_KIND_TYPEDEF) > 0

    def has_var(self, name: str) -> bool:
        """A kernel global (e.g. the per-CPU `runqueues`) that BPF can reach as a __ksym."""
        return self._lib.lib.btf__find_by_name_kind(self._btf, name.encode(), BTF_KIND_VAR) > 0

    def struct_has_member(self, struct: str, member: str) -> bool:
        """Config-dependent fields (task_struct.sched_info needs CONFIG_SCHED_INFO)."""
        L = self._lib.lib
        type_id = L.btf__find_by_name_kind(self._btf, struct.encode(), BTF_KIND_STRUCT)
        if type_id <= 0:
            return False
        t = L.btf__type_by_id(self._btf, type_id)
        vlen = t.contents.info & 0xFFFF
        members = ctypes.cast(
            ctypes.addressof(t.contents) + ctypes.sizeof(_BtfType), ctypes.POINTER(_BtfMember * vlen)
        ).contents
        return any(L.btf__name_by_offset(self._btf, m.name_off) == member.encode() for m in members)

    def close(self) -> None:
        if self._btf:
            self._lib.lib.btf__free(self._btf)
            self._btf = None

    def __enter__(self) -> VmlinuxBtf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Objects, programs, maps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramStats:
    name: str
    run_time_ns: int
    run_count: int
    recursion_misses: int


MAX_KEPT_BATCH_BYTES = 256 * 1024  # a map's batch buffers larger than this are not kept between reads


@dataclass
class _BatchBuffers:
    """A map's buffers for BPF_MAP_LOOKUP_BATCH: ``batch`` keys and values, and the two cursors."""

    batch: int
    keys: ctypes.Array[ctypes.c_char]
    values: ctypes.Array[ctypes.c_char]
    in_batch: ctypes.Array[ctypes.c_char]
    out_batch: ctypes.Array[ctypes.c_char]


class BpfMap:
    def __init__(self, obj: BpfObject, ptr: int) -> None:
        self._lib = obj._lib
        self._ptr = ptr
        L = self._lib.lib
        self.name: str = L.bpf_map__name(ptr).decode()
        self.type: int = L.bpf_map__type(ptr)
        self.key_size: int = L.bpf_map__key_size(ptr)
        self.value_size: int = L.bpf_map__value_size(ptr)
        # Batch-read buffers, kept between reads: maps are read every tick, and allocating (and zeroing)
        # a batch of per-CPU values each time cost more than the syscall that fills it. None while a
        # read holds them (a nested read of the same map allocates its own).
        self._batch_buffers: _BatchBuffers | None = None

    def _take_buffers(self, batch: int) -> _BatchBuffers:
        """Buffers for ``batch`` entries (capped at the map's size: most maps are small)."""
        batch = max(1, min(batch, self.max_entries or batch))
        cached, self._batch_buffers = self._batch_buffers, None
        if cached is not None and cached.batch == batch:
            return cached
        cursor = max(self.key_size, 8)  # the batch cursor is opaque; hash maps need a bucket index
        return _BatchBuffers(batch, ctypes.create_string_buffer(self.key_size * batch),
                             ctypes.create_string_buffer(self._stride * batch),
                             ctypes.create_string_buffer(cursor), ctypes.create_string_buffer(cursor))

    def _give_back(self, buffers: _BatchBuffers) -> None:
        # Per-CPU values grow with the node's CPUs: a batch of them on a large node is megabytes that
        # would stay resident for every map. Those are allocated per read, as before.
        if len(buffers.values) <= MAX_KEPT_BATCH_BYTES:
            self._batch_buffers = buffers

    @property
    def fd(self) -> int:
        fd = self._lib.lib.bpf_map__fd(self._ptr)
        if fd < 0:
            raise BpfError(f"bpf_map__fd({self.name})", fd, "object not loaded")
        return fd

    @property
    def max_entries(self) -> int:
        return self._lib.lib.bpf_map__max_entries(self._ptr)

    def set_max_entries(self, n: int) -> None:
        err = self._lib.lib.bpf_map__set_max_entries(self._ptr, n)
        if err:
            raise BpfError(f"bpf_map__set_max_entries({self.name})", err)

    @property
    def possible_cpus(self) -> int:
        return self._lib.possible_cpus

    def mmap(self) -> mmap.mmap | None:
        """The values of a loaded BPF_F_MMAPABLE array, mapped shared (None for any other map, or where
        the kernel refuses): value i at i * round_up(value_size, 8). Writable: a freed slot is zeroed
        in place rather than by a syscall per value."""
        if self.type != BPF_MAP_TYPE_ARRAY or not self._lib.lib.bpf_map__map_flags(self._ptr) & BPF_F_MMAPABLE:
            return None
        size = self.max_entries * ((self.value_size + 7) // 8 * 8)
        size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            return mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            log.info("map %s: mmap refused (%s): read with syscalls", self.name, e)
            return None

    @property
    def percpu(self) -> bool:
        return self.type in PERCPU_MAP_TYPES

    @property
    def _stride(self) -> int:
        """Bytes per value in user buffers: per-CPU values are 8-byte aligned, one per possible CPU."""
        if self.percpu:
            return ((self.value_size + 7) // 8 * 8) * self._lib.possible_cpus
        return self.value_size

    def split(self, raw: bytes) -> bytes | list[bytes]:
        """A value as read (per-CPU maps: every CPU's, 8-byte aligned) -> bytes, or one bytes per CPU."""
        if not self.percpu:
            return raw
        aligned = (self.value_size + 7) // 8 * 8
        return [raw[i * aligned : i * aligned + self.value_size] for i in range(self._lib.possible_cpus)]

    def lookup(self, key: bytes) -> bytes | list[bytes] | None:
        """One value (a list of per-CPU values for per-CPU maps), None if absent."""
        kbuf = ctypes.create_string_buffer(key, self.key_size)
        vbuf = ctypes.create_string_buffer(self._stride)
        err = self._lib.lib.bpf_map_lookup_elem(self.fd, kbuf, vbuf)
        if err:
            e = ctypes.get_errno()
            if e == errno.ENOENT:
                return None
            raise BpfError(f"bpf_map_lookup_elem({self.name})", e)
        return self.split(vbuf.raw)

    def take(self, key: bytes) -> bytes | list[bytes] | None:
        """One value taken out with its key in one syscall (BPF_MAP_LOOKUP_AND_DELETE_ELEM; hash maps from
        Linux 5.14: older kernels say EINVAL or ENOTSUPP, raised), None if absent."""
        vbuf = ctypes.create_string_buffer(self._stride)
        if not self._lookup_and_delete(ctypes.create_string_buffer(key, self.key_size), vbuf):
            return None
        return self.split(vbuf.raw)

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Set a value; a short `value` is padded with zeros (b"" zeroes the entry, every CPU's)."""
        kbuf = ctypes.create_string_buffer(key, self.key_size)
        vbuf = ctypes.create_string_buffer(value, max(len(value), self._stride))
        if self._lib.lib.bpf_map_update_elem(self.fd, kbuf, vbuf, flags):
            raise BpfError(f"bpf_map_update_elem({self.name})", ctypes.get_errno())

    def push(self, value: bytes) -> None:
        """Add to a queue or stack map (they have no keys)."""
        vbuf = ctypes.create_string_buffer(value, self.value_size)
        if self._lib.lib.bpf_map_update_elem(self.fd, None, vbuf, BPF_ANY):
            raise BpfError(f"bpf_map_update_elem({self.name})", ctypes.get_errno())

    def pop(self) -> bytes | None:
        """Take the next value of a queue or stack map (None: it is empty)."""
        vbuf = ctypes.create_string_buffer(self.value_size)
        return vbuf.raw if self._lookup_and_delete(None, vbuf) else None

    def _lookup_and_delete(self, kbuf: ctypes.Array | None, vbuf: ctypes.Array) -> bool:
        """BPF_MAP_LOOKUP_AND_DELETE_ELEM into ``vbuf`` (``kbuf`` None: a queue or stack's next value);
        False when there was nothing to take (ENOENT), any other error raised."""
        if self._lib.lib.bpf_map_lookup_and_delete_elem(self.fd, kbuf, vbuf):
            e = ctypes.get_errno()
            if e == errno.ENOENT:
                return False
            raise BpfError(f"bpf_map_lookup_and_delete_elem({self.name})", e)
        return True

    def delete(self, key: bytes) -> bool:
        kbuf = ctypes.create_string_buffer(key, self.key_size)
        if self._lib.lib.bpf_map_delete_elem(self.fd, kbuf):
            e = ctypes.get_errno()
            if e == errno.ENOENT:
                return False
            raise BpfError(f"bpf_map_delete_elem({self.name})", e)
        return True

    def items(self, batch: int = 256, split: bool = True) -> Iterator[tuple[bytes, bytes | list[bytes]]]:
        """All entries, read `batch` at a time with BPF_MAP_LOOKUP_BATCH (one syscall per batch).

        Hash maps change while they are read; the kernel's batch cursor keeps that consistent per
        bucket. Arrays are batched too (tcpconnect's bucket tables are read every snapshot: one
        lookup per entry cost ~2 % of a core at 1 Hz). Falls back to one lookup per key where
        batching is not supported (EINVAL/ENOTSUPP). ``split=False`` gives per-CPU values as read (one
        bytes for all CPUs, see :meth:`split`): comparing those with an earlier read is cheap.
        """
        try:
            yield from self._items_batched(batch, split)
        except BpfError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):  # 524: kernel ENOTSUPP
                raise
            for key, value in self._items_iter():
                yield key, value if split or not self.percpu else b"".join(
                    v.ljust((self.value_size + 7) // 8 * 8, b"\0") for v in value)

    def array_values(self, batch: int = 1024) -> bytes:
        """Every value of an array map, in index order, as one bytes (``value_size`` each): a table
        scanned every tick is read with one syscall per ``batch`` entries and no Python per entry.
        Per-CPU arrays are not for this (use :meth:`items`)."""
        if self.percpu:
            raise BpfError(f"array_values({self.name}): per-CPU map", errno.EINVAL)
        chunks: list[bytes] = []
        try:
            for _, raw_values in self._raw_batches(batch):
                chunks.append(raw_values)
        except BpfError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):
                raise
            chunks = [value for _, value in self._items_iter()]  # type: ignore[misc]
        return b"".join(chunks)

    def array_prefix(self, n: int, batch: int = 256) -> bytes:
        """The first ``n`` values of an array map (per-CPU arrays: every CPU's, 8-byte aligned, as
        :meth:`items` with ``split=False``) as one bytes: a table whose used part is a prefix is read
        with one syscall per ``batch`` entries and no Python per entry."""
        if n <= 0:
            return b""
        chunks: list[bytes] = []
        got = 0
        try:
            for count, raw_values in self._raw_batches(min(batch, n)):
                chunks.append(raw_values)
                got += count
                if got >= n:
                    break
        except BpfError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):  # 524: kernel ENOTSUPP (no batch ops)
                raise
            # As array_values and items do: one lookup per entry where the kernel cannot batch.
            chunks = []
            for _, value in self.items(split=False):
                chunks.append(value)  # type: ignore[arg-type]
                if len(chunks) >= n:
                    break
        return b"".join(chunks)[: n * self._stride]

    def _raw_batches(self, batch: int) -> Iterator[tuple[int, bytes]]:
        """(count, the values read) per BPF_MAP_LOOKUP_BATCH call, keys dropped."""
        for count, _, values in self._batches(batch):
            yield count, values

    def _batches(self, batch: int) -> Iterator[tuple[int, bytes, bytes]]:
        """(count, keys, values) per BPF_MAP_LOOKUP_BATCH call: only the ``count`` entries filled are
        copied out of the (reused) buffers."""
        L = self._lib.lib
        b = self._take_buffers(batch)
        try:
            opts = _BatchOpts(ctypes.sizeof(_BatchOpts), 0, 0)
            key_size, stride, fd = self.key_size, self._stride, self.fd
            first = True
            while True:
                count = ctypes.c_uint32(b.batch)
                err = L.bpf_map_lookup_batch(
                    fd, None if first else b.in_batch, b.out_batch, b.keys, b.values, ctypes.byref(count),
                    ctypes.byref(opts))
                e = ctypes.get_errno() if err else 0
                if err and e != errno.ENOENT:
                    raise BpfError(f"bpf_map_lookup_batch({self.name})", e)
                n = count.value
                yield n, ctypes.string_at(b.keys, n * key_size), ctypes.string_at(b.values, n * stride)
                if err:  # ENOENT: that was the last batch
                    return
                ctypes.memmove(b.in_batch, b.out_batch, len(b.out_batch))
                first = False
        finally:
            self._give_back(b)

    def _items_batched(self, batch: int, split: bool = True) -> Iterator[tuple[bytes, bytes | list[bytes]]]:
        stride, key_size = self._stride, self.key_size
        for count, raw_keys, raw_values in self._batches(batch):
            for i in range(count):
                raw = raw_values[i * stride : (i + 1) * stride]
                yield raw_keys[i * key_size : (i + 1) * key_size], self.split(raw) if split else raw

    def _items_iter(self) -> Iterator[tuple[bytes, bytes | list[bytes]]]:
        L = self._lib.lib
        key = ctypes.create_string_buffer(self.key_size)
        nxt = ctypes.create_string_buffer(self.key_size)
        cur = None
        while L.bpf_map_get_next_key(self.fd, cur, nxt) == 0:
            value = self.lookup(nxt.raw)
            if value is not None:
                yield nxt.raw, value
            ctypes.memmove(key, nxt, self.key_size)
            cur = key


class RingBuffer:
    """Poll a BPF ring buffer; `callback(bytes)` gets each record (copied out of the ring)."""

    def __init__(self, bpf_map: BpfMap, callback: Callable[[bytes], None]) -> None:
        self._lib = bpf_map._lib
        self._callback = callback

        def on_sample(_ctx: int, data: int, size: int) -> int:
            try:
                self._callback(ctypes.string_at(data, size))
            except Exception:  # a decoder bug must not unwind through C frames
                log.exception("ring buffer %s: callback failed", bpf_map.name)
            return 0

        self._cb = RINGBUF_SAMPLE_FN(on_sample)
        self._rb = _check_ptr(self._lib.lib.ring_buffer__new(bpf_map.fd, self._cb, None, None), "ring_buffer__new")

    def poll(self, timeout_ms: int = 0) -> int:
        """Consume what is there, waiting up to timeout_ms for the first record. Returns records seen."""
        n = self._lib.lib.ring_buffer__poll(self._rb, timeout_ms)
        if n < 0 and -n != errno.EINTR:
            raise BpfError("ring_buffer__poll", n)
        return max(n, 0)

    def close(self) -> None:
        if self._rb:
            self._lib.lib.ring_buffer__free(self._rb)
            self._rb = 0


class BpfObject:
    """One `.bpf.o`: open → configure (rodata, autoload, map sizes) → load → attach → read → close."""

    def __init__(self, path: str | os.PathLike[str], btf_custom_path: str | os.PathLike[str] | None = None) -> None:
        """`btf_custom_path`: CO-RE relocations against this BTF file, not /sys/kernel/btf/vmlinux."""
        self._lib = libbpf()
        self.path = Path(path)
        if not self.path.is_file():
            raise BpfError("bpf_object__open_file", errno.ENOENT, f"{self.path} missing: run `make bpf`")
        opts = None
        if btf_custom_path is not None:
            # Kept on self: libbpf copies the string at open, but the options must live until then.
            self._open_opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts), btf_custom_path=os.fsencode(btf_custom_path))
            opts = ctypes.byref(self._open_opts)
        ptr = self._lib.lib.bpf_object__open_file(str(self.path).encode(), opts)
        self._obj = _check_ptr(ptr, f"bpf_object__open_file({self.path.name})")
        self._links: dict[str, int] = {}
        self.loaded = False

    # -- before load --------------------------------------------------------------------------
    def program_names(self) -> list[str]:
        names, prog = [], self._lib.lib.bpf_object__next_program(self._obj, None)
        while prog:
            names.append(self._lib.lib.bpf_program__name(prog).decode())
            prog = self._lib.lib.bpf_object__next_program(self._obj, prog)
        return names

    def _program(self, name: str) -> int:
        return _check_ptr(self._lib.lib.bpf_object__find_program_by_name(self._obj, name.encode()), f"program {name}")

    def set_autoload(self, name: str, autoload: bool) -> None:
        err = self._lib.lib.bpf_program__set_autoload(self._program(name), autoload)
        if err:
            raise BpfError(f"bpf_program__set_autoload({name})", err)

    def map(self, name: str) -> BpfMap:
        return BpfMap(self, _check_ptr(self._lib.lib.bpf_object__find_map_by_name(self._obj, name.encode()), f"map {name}"))

    def maps(self) -> list[BpfMap]:
        """Every map of the object, internal ones (.rodata, .bss) included."""
        out, m = [], self._lib.lib.bpf_object__next_map(self._obj, None)
        while m:
            out.append(BpfMap(self, m))
            m = self._lib.lib.bpf_object__next_map(self._obj, m)
        return out

    def set_rodata(self, values: dict[str, int | bool]) -> None:
        """Set `const volatile` globals before load (found by name in the object's BTF)."""
        L = self._lib.lib
        rodata = None
        m = L.bpf_object__next_map(self._obj, None)
        while m:
            if L.bpf_map__name(m).decode().endswith(".rodata"):
                rodata = m
                break
            m = L.bpf_object__next_map(self._obj, m)
        if rodata is None:
            raise BpfError("set_rodata", errno.ENOENT, "object has no .rodata section")
        size = ctypes.c_size_t()
        image = _check_ptr(L.bpf_map__initial_value(rodata, ctypes.byref(size)), "bpf_map__initial_value")
        layout = self._datasec_layout(".rodata")
        for name, value in values.items():
            if name not in layout:
                raise BpfError("set_rodata", errno.ENOENT, f"no const volatile {name!r} in {self.path.name}")
            offset, var_size = layout[name]
            if offset + var_size > size.value:
                raise BpfError("set_rodata", errno.EINVAL, f"{name} outside .rodata")
            raw = int(value).to_bytes(var_size, "little", signed=int(value) < 0)
            ctypes.memmove(image + offset, raw, var_size)

    def _datasec_layout(self, section: str) -> dict[str, tuple[int, int]]:
        L = self._lib.lib
        btf = _check_ptr(L.bpf_object__btf(self._obj), "bpf_object__btf")
        sec_id = L.btf__find_by_name_kind(btf, section.encode(), BTF_KIND_DATASEC)
        if sec_id <= 0:
            raise BpfError("btf__find_by_name_kind", errno.ENOENT, f"no {section} datasec")
        sec = L.btf__type_by_id(btf, sec_id)
        vlen = sec.contents.info & 0xFFFF
        infos = ctypes.cast(
            ctypes.addressof(sec.contents) + ctypes.sizeof(_BtfType), ctypes.POINTER(_BtfVarSecinfo * vlen)
        ).contents
        layout = {}
        for info in infos:
            var = L.btf__type_by_id(btf, info.type)
            layout[L.btf__name_by_offset(btf, var.contents.name_off).decode()] = (info.offset, info.size)
        return layout

    def load(self) -> None:
        self._lib.last_messages.clear()
        err = self._lib.lib.bpf_object__load(self._obj)
        if err:
            detail = _verifier_summary(self._lib.last_messages)
            raise BpfError(f"bpf_object__load({self.path.name})", err, detail)
        self.loaded = True

    # -- after load ----------------------------------------------------------------------------
    def attach(self, name: str) -> None:
        link = self._lib.lib.bpf_program__attach(self._program(name))
        if not link:
            raise BpfError(f"bpf_program__attach({name})", ctypes.get_errno())
        self._links[name] = link

    def detach(self, name: str) -> None:
        link = self._links.pop(name, None)
        if link:
            self._lib.lib.bpf_link__destroy(link)

    @property
    def attached(self) -> list[str]:
        return list(self._links)

    def program_fd(self, name: str) -> int:
        return self._lib.lib.bpf_program__fd(self._program(name))

    def program_stats(self) -> list[ProgramStats]:
        """Run time and run count per attached program, from the prog fd's fdinfo.

        The kernel only counts while run-time stats are enabled (see :class:`RunTimeStats`).
        """
        stats = []
        for name in self._links:
            fd = self.program_fd(name)
            try:
                fields = PROC_SELF_FDINFO.read(_OWN_HOST, fd=fd)
            except OSError:
                continue
            stats.append(
                ProgramStats(name, fields.get("run_time_ns", 0), fields.get("run_cnt", 0), fields.get("recursion_misses", 0))
            )
        return stats

    def close(self) -> None:
        for name in list(self._links):
            self.detach(name)
        if self._obj:
            self._lib.lib.bpf_object__close(self._obj)
            self._obj = 0

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Interpreter shutdown may have torn down ctypes already; nothing useful to report then.
        with contextlib.suppress(Exception):
            self.close()


def _verifier_summary(messages: list[str]) -> str:
    """The few lines of libbpf's output that say why a load failed (not the whole verifier log)."""
    keep = [m for m in messages if m.startswith("libbpf:") or "invalid" in m or "unknown" in m or "R" in m[:3]]
    return " | ".join(line.strip() for line in keep[-4:])[:600]


class RunTimeStats:
    """Enable the kernel's BPF run-time accounting while this object lives (BPF_ENABLE_STATS).

    Holding the returned fd enables stats without touching the `kernel.bpf_stats_enabled` sysctl,
    and closing it (or process exit) turns them off again: we never leave a global setting changed.
    """

    def __init__(self) -> None:
        fd = libbpf().lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
        if fd < 0:
            raise BpfError("bpf_enable_stats", ctypes.get_errno() or fd)
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
