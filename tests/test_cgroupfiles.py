# SPDX-License-Identifier: Apache-2.0
"""probes/cgroupfiles.py: cgroup files the probes and the actuators both read are declared once, so the
same bad text gives the same one-line parse error on both sides (the probes skip it, the actuators
report it), on v1 and v2 spellings alike. Temp file trees only: no real cgroup is touched."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from actuators.cgroupfile import CgroupFileError, CgroupFiles
from probes.cgroupfiles import (
    CPU_MAX,
    CPUSET_CPUS,
    CPUSET_EFFECTIVE_CPUS,
    CgroupFileParseError,
    CpuMax,
    parse_cpu_list,
)
from probes.cgroupfs import discover
from probes.cgroupwatch import CgroupWatch
from probes.cpuacct import CgroupCpuReader, read_cgroup_cpu
from testkit.cpu_reasons import cpu_stat_unavailable_reason
from tests.helpers_actuators import fake_v1_host, fake_v2_host

CG = "kubepods.slice/kubepods-besteffort.slice"


def _parse_error(file, version: int, *texts: str) -> str:
    with pytest.raises(CgroupFileParseError) as e:
        file.parse(version, *texts)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_declarations_name_both_spellings():
    assert CPU_MAX.names(1) == ("cpu.cfs_quota_us", "cpu.cfs_period_us") and CPU_MAX.names(2) == ("cpu.max",)
    assert CPUSET_CPUS.names(1) == CPUSET_CPUS.names(2) == ("cpuset.cpus",)
    assert CPUSET_EFFECTIVE_CPUS.names(1) == ("cpuset.effective_cpus",)
    assert CPUSET_EFFECTIVE_CPUS.names(2) == ("cpuset.cpus.effective",)
    assert CPU_MAX.parse(2, "max 100000\n") == CpuMax(None, 100000)
    assert CPU_MAX.parse(2, "50000 100000") == CpuMax(50000, 100000)
    assert CPU_MAX.parse(1, "-1\n", "100000\n") == CpuMax(None, 100000)
    assert CPU_MAX.parse(1, "30000\n", "50000\n").cores == 0.6
    assert parse_cpu_list("0-2,5,4\n") == (0, 1, 2, 4, 5)


@pytest.mark.parametrize("bad", ["lots 100000", "50000 0", "max", "-1 100000", "1 2 3"])
def test_bad_cpu_max_same_error_from_probe_and_actuator_v2(tmp_path: Path, bad: str) -> None:
    paths = fake_v2_host(tmp_path, ["kubepods.slice", CG])
    (tmp_path / "sys/fs/cgroup" / CG / "cpu.max").write_text(bad + "\n")
    expected = _parse_error(CPU_MAX, 2, bad + "\n")
    layout = discover(paths)

    # The probes skip the value (no reading rather than a guess) and say why in the parser's words.
    assert read_cgroup_cpu(layout, "/" + CG) is None
    assert CgroupCpuReader(layout, "/" + CG).read() is None
    reason = cpu_stat_unavailable_reason(layout, "/" + CG)
    assert reason is not None and reason.endswith(": " + expected)

    # The actuators surface it as one line: the file's path, then the same words.
    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpu_max(CG)
    assert str(e.value) == f"{tmp_path / 'sys/fs/cgroup' / CG / 'cpu.max'}: {expected}"


def test_bad_cfs_quota_same_error_from_probe_and_actuator_v1(tmp_path: Path) -> None:
    paths = fake_v1_host(tmp_path, ["kubepods", "kubepods/besteffort"])
    cg = "kubepods/besteffort"
    (tmp_path / "sys/fs/cgroup/cpu" / cg / "cpu.cfs_quota_us").write_text("fifty\n")
    expected = _parse_error(CPU_MAX, 1, "fifty\n", "100000\n")

    # The probe reads usage and skips the bandwidth it cannot parse (no quota, no throttling).
    stat = CgroupCpuReader(discover(paths), "/" + cg).read()
    assert stat is not None and stat.quota_us is None and stat.period_us is None

    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpu_max(cg)
    assert str(e.value) == f"{tmp_path / 'sys/fs/cgroup/cpu' / cg / 'cpu.cfs_quota_us'}: {expected}"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("bad", ["1,x,3", "0-100000000", "3-1", "0x3"])
def test_bad_cpu_list_skipped_by_the_watch_reported_by_the_actuator(tmp_path: Path, version: int, bad: str) -> None:
    if version == 2:
        paths = fake_v2_host(tmp_path, ["kubepods.slice", CG])
        cg, cg_dir = CG, tmp_path / "sys/fs/cgroup" / CG
    else:
        paths = fake_v1_host(tmp_path, ["kubepods", "kubepods/besteffort"])
        cg, cg_dir = "kubepods/besteffort", tmp_path / "sys/fs/cgroup/cpuset/kubepods/besteffort"
    (effective,) = CPUSET_EFFECTIVE_CPUS.names(version)
    (configured,) = CPUSET_CPUS.names(version)
    expected = _parse_error(CPUSET_CPUS, version, bad)
    assert _parse_error(CPUSET_EFFECTIVE_CPUS, version, bad) == expected

    # The collector's watch: a good list is read, a bad one is skipped (the last good value stays).
    (cg_dir / effective).write_text("0-1\n")
    watch = CgroupWatch(discover(paths), slow_refresh_ticks=1, slow_files_turns=1)  # its cpuset every tick
    watch.set_listed(["/" + cg])
    watch.tick()
    assert watch.cpus["/" + cg] == (0, 1)
    (cg_dir / effective).write_text(bad + "\n")
    watch.tick()
    assert watch.cpus["/" + cg] == (0, 1)
    watch.close()

    (cg_dir / configured).write_text(bad + "\n")
    with pytest.raises(CgroupFileError) as e:
        CgroupFiles(paths).read_cpus(cg)
    assert str(e.value) == f"{cg_dir / configured}: {expected}"


# -- one table of kernel files (issue 27) ------------------------------------------------------------

RUNTIME = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = ("probes", "detector", "actuators", "noisyneighbor")
CGROUP_FILE_NAME = re.compile(r"^(cpu|cpuacct|cpuset|memory|io|irq|cgroup|pids|hugetlb|blkio)\.[a-z_.]+$|^tasks$")


def _runtime_sources():
    for pkg in RUNTIME_PACKAGES:
        for path in sorted((RUNTIME / pkg).rglob("*.py")):
            if path.name != "cgroupfiles.py":
                yield path, ast.parse(path.read_text())


def test_every_declared_file_has_a_name_and_a_parser_function():
    """Parsers are functions of the table, never import strings: the table imports no probe and no actuator."""
    from probes import cgroupfiles as table

    assert len(table.CGROUP_FILES) >= 20 and len(table.KERNEL_FILES) >= 15
    for name, f in table.CGROUP_FILES.items():
        assert f.names(1) or f.names(2), name
        assert callable(f.parse_v1) and callable(f.parse_v2), name
    for name, f in table.KERNEL_FILES.items():
        assert f.root in ("proc", "sys") and (callable(f.parse) or f.parse is None), name
    imported = {n.module for n in ast.walk(ast.parse((RUNTIME / "probes/cgroupfiles.py").read_text()))
                if isinstance(n, ast.ImportFrom)}
    assert {m for m in imported if m and m.split(".")[0] in RUNTIME_PACKAGES} == set()
    assert "importlib" not in (RUNTIME / "probes/cgroupfiles.py").read_text()


def test_every_declared_file_is_used_by_the_runtime():
    """A declaration nobody reads is a stale row of the table (issue 42 found 9)."""
    from probes import cgroupfiles as table

    used = {node.id for path, tree in _runtime_sources() for node in ast.walk(tree) if isinstance(node, ast.Name)}
    used |= {node.attr for path, tree in _runtime_sources() for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    grouped = {"MEMORY_PRESSURE", "IO_PRESSURE", "IRQ_PRESSURE", "CPU_PRESSURE"}  # read through PRESSURE[resource]
    assert {*table.CGROUP_FILES, *table.KERNEL_FILES} - used - grouped == set()
    assert "PRESSURE" in used


def test_every_cgroup_file_the_runtime_spells_is_declared():
    """A reader may spell a name (probe modules keep their hot paths), but only a declared one: a new
    file is added to probes/cgroupfiles.py with its v1/v2 names and its parser."""
    from probes import cgroupfiles as table

    declared = {n for f in table.CGROUP_FILES.values() for n in (*f.v1_names, f.v2_name) if n}
    spelled = {(str(path.relative_to(RUNTIME)), node.value) for path, tree in _runtime_sources()
               for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and CGROUP_FILE_NAME.match(node.value)}
    assert {(where, name) for where, name in spelled if name not in declared} == set()


def test_the_parser_copies_are_gone():
    """One parser each: cpu.max (was also in probes/cpuacct.py), `key value` counters (cpuacct.py and
    memstat.py each had a copy), /proc/stat (probes/snapshot.py and actuators/suppress.py), cpu lists
    (actuators/mitigate.py had one without the MAX_CPUS guard), cgroup.procs (read and split in
    probes/listenq.py); issue 42's: memory limits and integers (memstat.py's _v2_limit and _int_or_none,
    cpuacct.py's _parse_int: parse_limit and parse_int through the declared files), the cpu list format
    (noisyneighbor/diagnose.py's _cpu_list: format_cpu_list)."""
    copies = {"parse_cpu_max", "parse_keyed_counters", "parse_flat_keyed", "parse_proc_stat", "parse_cpu_ranges",
              "parse_cpu_list", "netdev_packets", "parse_netdev_packets",
              "_v2_limit", "_int_or_none", "_parse_int", "_cpu_list", "format_cpu_list"}
    defined = {(str(path.relative_to(RUNTIME)), node.name) for path, tree in _runtime_sources()
               for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in copies}
    assert defined == set()
    procs = {str(path.relative_to(RUNTIME)) for path, tree in _runtime_sources() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value == "cgroup.procs"}
    assert procs == set()  # every reader goes through CGROUP_PROCS (actuators: CGROUP_PROCS)


def test_proc_stat_ticks_for_suppress_are_what_the_old_reader_computed(tmp_path: Path):
    from probes.host import HostPaths
    from probes.procstat import ProcStatReader

    paths = HostPaths.under(tmp_path)
    paths.proc.mkdir(parents=True)
    (paths.proc / "stat").write_text(
        "cpu  100 5 50 1000 20 3 7 1 0 0\ncpu0 50 2 25 500 10 1 3 1 0 0\ncpu1 50 3 25 500 10 2 4 0 0 0\n"
        "cpu2 x 1\nintr 1 2 3\n")
    # busy = total - idle - iowait over the eight fields; CPUs counted by their lines (a bad line skipped)
    assert ProcStatReader(paths).node_ticks(read_now=True) == (166, 1186, 2)


def test_a_task_file_the_kernel_would_not_write_reads_as_gone(tmp_path: Path):
    from actuators.mitigate import task_sched

    (tmp_path / "7").mkdir()
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12], fields[38] = "300", "100", "1"
    (tmp_path / "7/stat").write_text("7 (a (b) c) " + " ".join(fields) + "\n")
    (tmp_path / "7/status").write_text("Name:\tx\nCpus_allowed_list:\t0-1,3\n")
    policy, cpu_s, cpus = task_sched(tmp_path, 7)
    assert (policy, cpus) == (1, {0, 1, 3}) and cpu_s > 0
    (tmp_path / "7/status").write_text("Cpus_allowed_list:\t0-100000000\n")  # past MAX_CPUS: refused, not built
    assert task_sched(tmp_path, 7) is None


# -- the table is the only reader (issue 42, item 3) ---------------------------------------------------

_FILE_CALLS = {"open", "os.open", "io.open", "read_small"}
_FILE_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}

# Where a runtime module may open a file itself. Shrink-only: a new kernel file is a row of the table read
# through its declaration (KernelFile.read / CgroupFile.read / .raw), never a new entry here.
FILE_OPENERS_ALLOWED = {
    # the table's own reader, and the host I/O primitives the per-tick readers are handed
    "probes/cgroupfiles.py:_read_text": "the table's one reader",
    "probes/host.py:read_small": "primitive: a prebuilt path read whole",
    "probes/host.py:HotFiles.read": "primitive: files kept open and pread every tick",
    # per-tick readers: paths built once from the declarations' names (CgroupFile.name), parsed by them
    "probes/cgroupwatch.py:_read_cpuset": "CPUSET_EFFECTIVE_CPUS, hot path",
    "probes/cpuacct.py:CgroupCpuReader._read_v1": "CPUACCT_* / CPU_STAT / CPU_MAX, hot path",
    "probes/cpuacct.py:CgroupCpuReader._read_v2": "CPU_STAT / CPU_MAX, hot path",
    "probes/memstat.py:MemStatReader.read": "MEMORY_* files, hot path",
    # descriptors, not reads: a namespace held for setns(), a PSI trigger held for poll()
    "probes/listenq.py:_socket_in_netns.run": "PID_NS_NET of this thread, for setns()",
    "probes/listenq.py:read_netns": "PID_NS_NET of a task, for setns()",
    "probes/psi.py:PsiTriggerWatcher.add": "a pressure file opened O_RDWR to hold a trigger",
    "probes/cgroup_handle.py:path_by_id": "a hierarchy's mount, the directory open_by_handle_at resolves in",
    # the actuators' write side: files located by CgroupFiles from the declarations, or journaled paths
    "actuators/cgroupfile.py:read_file": "actuator read with one-line errors (CgroupFiles, the journal)",
    "actuators/cgroupfile.py:_write_once": "the one cgroup write",
    # resctrl's filesystem (/sys/fs/resctrl): its formats are actuators/resctrl/schemata.py's
    "actuators/resctrl/fs.py:KernelResctrlFs.read": "resctrl files",
    "actuators/resctrl/fs.py:KernelResctrlFs.write": "resctrl files",
    # not kernel files
    "actuators/journal.py:JournalStore.load": "the actuator journal",
    "actuators/journal.py:JournalStore.save": "the actuator journal (directory fsync)",
    "actuators/manager.py:ActuatorManager._audit_raw": "the audit log",
    "detector/incidents.py:IncidentEngine._emit": "the incident log",
    "detector/batch.py:_load_kubelet_config": "the kubelet's config file",
    "detector/pods/kubelet.py:KubeletPodSource._fetch": "a service account token",
    "detector/policy/loader.py:load_policy": "the policy file",
    "noisyneighbor/agent/auth.py:RequestAuthorizer._post": "a service account token",
    "noisyneighbor/agent/incident_log.py:IncidentLog.write": "the incident log",
    "noisyneighbor/agent/wiring.py:read_own_node": "a service account token",
    "noisyneighbor/cli.py:cmd_diagnose": "the HTML report",
    "noisyneighbor/cli.py:main": "/dev/null",
    "noisyneighbor/kubectl_plugin.py:main": "the kubeconfig",
    "noisyneighbor/kubectl_plugin.py:_token": "a token file",
    "noisyneighbor/kubectl_plugin.py:_diagnose": "the HTML report",
    "noisyneighbor/lifecycle.py:ApiserverAccess.api_client": "a service account token",
    "noisyneighbor/lifecycle.py:_needs_apiserver": "the policy file",
}


def _file_openers() -> dict[str, int]:
    """'module:qualname' of every runtime function that opens or reads a file itself -> its first line."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, where: str, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, where, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else None
                if isinstance(f, ast.Attribute):
                    if f.attr in _FILE_METHODS:
                        name = f.attr
                    elif isinstance(f.value, ast.Name) and f"{f.value.id}.{f.attr}" in _FILE_CALLS:
                        name = f"{f.value.id}.{f.attr}"
                    elif f.attr == "read_small":
                        name = f.attr
                if name in _FILE_CALLS or name in _FILE_METHODS:
                    found.setdefault(f"{where}:{'.'.join(scope) or '<module>'}", child.lineno)
            walk(child, where, scope)

    for pkg in RUNTIME_PACKAGES:
        for path in sorted((RUNTIME / pkg).rglob("*.py")):
            walk(ast.parse(path.read_text()), str(path.relative_to(RUNTIME)), [])
    return found


def test_no_runtime_module_opens_a_file_outside_the_table():
    """A /proc, /sys or cgroup file is read through its row of probes/cgroupfiles.py; the few functions
    that open files themselves are listed above with the reason, and the list only shrinks."""
    openers = _file_openers()
    assert {f"{k} (line {v})" for k, v in openers.items() if k not in FILE_OPENERS_ALLOWED} == set()
    assert set(FILE_OPENERS_ALLOWED) - set(openers) == set()  # a stale entry goes: the list only shrinks


def test_the_opener_scan_finds_what_it_must(tmp_path: Path):
    """The scan itself: each way of opening a file is caught (a scan that finds nothing proves nothing)."""
    openers = _file_openers()
    assert openers["probes/cgroupfiles.py:_read_text"] > 0  # os.open
    assert openers["actuators/cgroupfile.py:read_file"] > 0  # open()
    assert openers["actuators/journal.py:JournalStore.load"] > 0  # Path.read_text
    assert openers["probes/memstat.py:MemStatReader.read"] > 0  # read_small


def test_a_row_reads_itself_and_a_gone_task_reads_as_none(tmp_path: Path):
    """KernelFile.read / read_or_none: the parsed value, None when the task exited (ESRCH/ENOENT from the
    kernel), the parser's one-line error when the text is not the kernel's."""
    import subprocess
    import sys

    from probes.cgroupfiles import PID_CGROUP, PID_STAT
    from probes.host import HostPaths

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert PID_STAT.read_or_none(HostPaths(), pid=child.pid) is None  # reaped: /proc/<pid> is gone
    assert PID_STAT.read(HostPaths(), pid="self").cpu_s >= 0
    fake = HostPaths.under(tmp_path)
    (fake.proc / "7").mkdir(parents=True)
    (fake.proc / "7/cgroup").write_text("0::/a.slice\n3:cpu,cpuacct:/b\n1:name=systemd:/c\n")
    assert PID_CGROUP.read(fake, pid=7) == {"": "/a.slice", "cpu": "/b", "cpuacct": "/b"}
    (fake.proc / "7/cgroup").write_text("garbage\n")
    with pytest.raises(CgroupFileParseError) as e:
        PID_CGROUP.read_or_none(fake, pid=7)
    assert "\n" not in str(e.value) and "garbage" in str(e.value)
