# SPDX-License-Identifier: Apache-2.0
"""PSI: parsing, node and per-cgroup readings, rates, and kernel triggers (temp-dir hosts + real kernel)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from probes.cgroupfiles import parse_pressure
from probes.cgroupfs import discover
from probes.cgroupwatch import CgroupWatch
from probes.host import HostPaths
from probes.psi import (
    CgroupPsiSource,
    PsiLine,
    PsiReading,
    PsiTriggerWatcher,
    cgroup_psi_scope,
    cgroup_psi_source,
    has_cap_sys_resource,
    psi_rate,
    read_cgroup_pressure,
    read_cgroup_psi,
    read_node_psi,
    validate_trigger,
)
from testkit.sandbox import OwnedCgroup
from tests.conftest import readline_within
from tests.helpers_actuators import fake_v2_host
from tests.test_reclaim import PAGE_CACHE_WORKLOAD

CPU_TEXT = (
    "some avg10=2.54 avg60=1.51 avg300=1.65 total=9347134\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
IO_TEXT = (
    "some avg10=0.45 avg60=0.51 avg300=0.50 total=3309703\n"
    "full avg10=0.45 avg60=0.50 avg300=0.48 total=3152095\n"
)
IRQ_TEXT = "full avg10=1.09 avg60=1.08 avg300=1.46 total=80506377366\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pressure_text(some_total: int, full_total: int | None = None) -> str:
    text = f"some avg10=1.00 avg60=0.50 avg300=0.10 total={some_total}\n"
    if full_total is not None:
        text += f"full avg10=0.50 avg60=0.20 avg300=0.05 total={full_total}\n"
    return text


def make_v2_cgroup(root: Path, rel: str, pressure: str | None = "1") -> Path:
    d = root / "sys/fs/cgroup" / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    if pressure is not None:
        write(d / "cgroup.pressure", f"{pressure}\n")
    if pressure != "0":  # the kernel hides the pressure files of a cgroup with PSI off
        for r, total in (("cpu", 1000), ("memory", 20), ("io", 300)):
            write(d / f"{r}.pressure", pressure_text(total, total // 2))
    return d


@pytest.fixture
def v2_host(tmp_path: Path) -> Path:
    write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n")
    make_v2_cgroup(tmp_path, "/")
    for r, text in (("cpu", CPU_TEXT), ("memory", pressure_text(0, 0)), ("io", IO_TEXT)):
        write(tmp_path / "proc/pressure" / r, text)
    return tmp_path


@pytest.fixture
def hybrid_host(tmp_path: Path) -> Path:
    cg = tmp_path / "sys/fs/cgroup"
    for ctrl in ("cpu", "cpuacct", "memory"):
        (cg / ctrl).mkdir(parents=True)
    write(cg / "unified/cgroup.controllers", "\n")
    make_v2_cgroup(tmp_path, "/unified/system.slice/app.service")
    write(
        tmp_path / "proc/42/cgroup",
        "3:memory:/kubepods/pod1/c1\n2:cpuacct:/kubepods/pod1/c1\n1:cpu:/kubepods/pod1/c1\n"
        "0::/system.slice/app.service\n",
    )
    return tmp_path


# -- parser -------------------------------------------------------------------------------------


def test_parse_two_lines() -> None:
    lines = parse_pressure(IO_TEXT)
    assert lines["some"] == PsiLine(0.45, 0.51, 0.50, 3309703)
    assert lines["full"] == PsiLine(0.45, 0.50, 0.48, 3152095)


def test_parse_missing_full_and_irq_full_only() -> None:
    assert set(parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")) == {"some"}
    assert parse_pressure(IRQ_TEXT) == {"full": PsiLine(1.09, 1.08, 1.46, 80506377366)}


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "\n\n",
        "hello world\n",
        "some avg10=1.0 avg60=1.0 total=5\n",  # avg300 missing
        "some avg10=x avg60=1.0 avg300=1.0 total=5\n",
        "some avg10=1.0 avg60=1.0 avg300=1.0 total=-5\n",
        "some avg10=nan avg60=1.0 avg300=1.0 total=5\n",
        "some avg10=1.0 avg60=1.0 avg300=1.0 total=5.5\n",
        "partial avg10=1.0 avg60=1.0 avg300=1.0 total=5\n",
        "some avg10=1.0 avg60=1.0 avg300=1.0 tot",  # truncated mid-read
    ],
)
def test_parse_garbage_yields_nothing(garbage: str) -> None:
    assert parse_pressure(garbage) == {}


def test_parse_keeps_good_lines_around_garbage_and_ignores_new_keys() -> None:
    text = "garbage line\nsome avg10=3.00 avg60=2.00 avg300=1.00 total=10 avg1=9.9\n\x00\xff\nfull oops\n"
    assert parse_pressure(text) == {"some": PsiLine(3.0, 2.0, 1.0, 10)}


def test_parse_first_duplicate_wins() -> None:
    text = pressure_text(5) + pressure_text(9)
    assert parse_pressure(text)["some"].total_us == 5


def test_read_cgroup_pressure_bad_inputs(tmp_path: Path) -> None:
    assert read_cgroup_pressure(tmp_path, "cpu") is None  # missing
    write(tmp_path / "io.pressure", "junk\n")
    assert read_cgroup_pressure(tmp_path, "io") is None
    (tmp_path / "memory.pressure").mkdir()
    assert read_cgroup_pressure(tmp_path, "memory") is None  # EISDIR: unreadable, no traceback
    write(tmp_path / "irq.pressure", IRQ_TEXT)
    reading = read_cgroup_pressure(tmp_path, "irq")
    assert reading is not None and reading.resource == "irq" and reading.some is None
    assert reading.full is not None and reading.full.total_us == 80506377366


# -- node PSI -----------------------------------------------------------------------------------


def test_node_psi_reports_missing_irq(v2_host: Path) -> None:
    node = read_node_psi(HostPaths.under(v2_host))
    assert set(node.readings) == {"cpu", "memory", "io"}
    assert node.get("cpu") == PsiReading("cpu", *parse_pressure(CPU_TEXT).values())
    assert set(node.unavailable) == {"irq"}
    assert "/proc/pressure/irq absent" in node.unavailable["irq"]
    assert "CONFIG_IRQ_TIME_ACCOUNTING" in node.unavailable["irq"]


def test_node_psi_with_irq_and_a_malformed_file(v2_host: Path) -> None:
    write(v2_host / "proc/pressure/irq", IRQ_TEXT)
    write(v2_host / "proc/pressure/memory", "this is not psi\n")
    node = read_node_psi(HostPaths.under(v2_host))
    assert node.readings["irq"].some is None and node.readings["irq"].full is not None
    assert set(node.unavailable) == {"memory"}
    assert "no parsable" in node.unavailable["memory"]


def test_node_psi_without_psi(tmp_path: Path) -> None:
    node = read_node_psi(HostPaths.under(tmp_path))
    assert node.readings == {}
    assert set(node.unavailable) == {"cpu", "memory", "io", "irq"}
    assert all("CONFIG_PSI" in reason for reason in node.unavailable.values())


# -- per-cgroup PSI on temp-dir hosts -------------------------------------------------------------


def test_v2_cgroup_psi(v2_host: Path) -> None:
    make_v2_cgroup(v2_host, "/kubepods.slice/kubepods-pod1.slice")
    layout = discover(HostPaths.under(v2_host))
    source = cgroup_psi_source(layout, "/kubepods.slice/kubepods-pod1.slice")
    assert source.available and source.reason is None
    assert source.cgroup_dir == v2_host / "sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice"
    readings = read_cgroup_psi(source.cgroup_dir)
    assert set(readings) == {"cpu", "memory", "io"}
    assert readings["cpu"].some == PsiLine(1.0, 0.5, 0.1, 1000)
    assert readings["io"].full is not None and readings["io"].full.total_us == 150


def test_cgroup_pressure_zero_means_psi_off(v2_host: Path) -> None:
    d = make_v2_cgroup(v2_host, "/kubepods.slice/quiet", pressure="0")
    source = cgroup_psi_source(discover(HostPaths.under(v2_host)), "/kubepods.slice/quiet")
    assert not source.available
    assert source.cgroup_dir == d
    assert "cgroup.pressure = 0" in (source.reason or "")
    assert read_cgroup_psi(d) == {}


def test_kernel_without_cgroup_pressure_file_counts_as_on(v2_host: Path) -> None:
    make_v2_cgroup(v2_host, "/old-kernel", pressure=None)  # before 6.1 there is no cgroup.pressure
    assert cgroup_psi_source(discover(HostPaths.under(v2_host)), "/old-kernel").available


def test_missing_cgroup_and_v1_only_host(v2_host: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    source = cgroup_psi_source(discover(HostPaths.under(v2_host)), "/gone.slice")
    assert source == CgroupPsiSource(None, source.reason) and "does not exist" in (source.reason or "")
    assert read_cgroup_psi(v2_host / "sys/fs/cgroup/gone.slice") == {}

    v1_root = tmp_path_factory.mktemp("v1host")
    (v1_root / "sys/fs/cgroup/cpu,cpuacct").mkdir(parents=True)
    source = cgroup_psi_source(discover(HostPaths.under(v1_root)), "/anything")
    assert not source.available and "only in v2" in (source.reason or "")


def test_psi_scope_per_layout(hybrid_host: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    unified = hybrid_host / "sys/fs/cgroup/unified"
    no_psi = cgroup_psi_scope(discover(HostPaths.under(hybrid_host)))
    assert no_psi.startswith(f"none: no pressure files in {unified}")
    make_v2_cgroup(hybrid_host, "/unified")
    assert cgroup_psi_scope(discover(HostPaths.under(hybrid_host))).startswith("unified tree only")

    pure_v2 = tmp_path_factory.mktemp("purev2")
    write(pure_v2 / "sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    make_v2_cgroup(pure_v2, "/")
    assert cgroup_psi_scope(discover(HostPaths.under(pure_v2))) == "every cgroup (pure v2)"

    v1_only = tmp_path_factory.mktemp("v1only")
    (v1_only / "sys/fs/cgroup/cpu,cpuacct").mkdir(parents=True)
    assert cgroup_psi_scope(discover(HostPaths.under(v1_only))).startswith("none: no cgroup v2")


# -- rates --------------------------------------------------------------------------------------


def reading(some_total: int, full_total: int | None = None, resource: str = "cpu") -> PsiReading:
    full = None if full_total is None else PsiLine(0, 0, 0, full_total)
    return PsiReading(resource, PsiLine(0, 0, 0, some_total), full)


def test_rate_from_totals() -> None:
    rate = psi_rate(reading(1_000_000, 0), reading(1_250_000, 100_000), elapsed_s=1.0)
    assert rate.some == pytest.approx(0.25)
    assert rate.full == pytest.approx(0.10)
    assert not rate.reset
    assert psi_rate(reading(0), reading(500_000), 2.0).full is None  # no "full" line: no full rate


def test_rate_counter_going_backwards_resets() -> None:
    rate = psi_rate(reading(5_000_000, 10), reading(1_000, 0), elapsed_s=1.0)
    assert rate.reset and rate.some is None and rate.full is None
    # Only "full" going back is a reset too: the group was recreated.
    assert psi_rate(reading(10, 10), reading(20, 5), 1.0).reset


def test_rate_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        psi_rate(reading(0), reading(1), 0.0)
    with pytest.raises(ValueError, match="different resources"):
        psi_rate(reading(0, resource="cpu"), reading(1, resource="io"), 1.0)


# -- trigger rules and watcher (no kernel) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "privileged", "message"),
    [
        (("some", 100_000, 400_000), True, "outside 500 ms..10 s"),
        (("some", 100_000, 11_000_000), True, "outside 500 ms..10 s"),
        (("some", 0, 1_000_000), True, "must be > 0"),
        (("full", 2_000_000, 1_000_000), True, "<= the window"),
        (("some", 150_000, 1_000_000), False, "multiples of 2 s"),
        (("avg", 150_000, 1_000_000), True, "'some' or 'full'"),
        (("some", 1.5, 1_000_000), True, "must be an int"),
    ],
)
def test_trigger_validation(args: tuple, privileged: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_trigger(*args, privileged=privileged)


def test_trigger_validation_accepts_kernel_rules() -> None:
    validate_trigger("some", 150_000, 1_000_000, privileged=True)
    validate_trigger("full", 500_000, 500_000, privileged=True)
    validate_trigger("some", 100_000, 4_000_000, privileged=False)
    validate_trigger("full", 50_000, 2_000_000, privileged=False, resource="irq")
    with pytest.raises(ValueError, match="irq"):
        validate_trigger("some", 50_000, 2_000_000, privileged=True, resource="irq")


def test_has_cap_sys_resource(tmp_path: Path) -> None:
    # This machine's root has every capability but CAP_SYS_RESOURCE (bit 24).
    host = HostPaths.under(tmp_path)
    write(host.proc / "1/status", "Name:\tx\nCapEff:\t000001fffeffffff\n")
    write(host.proc / "2/status", "CapEff:\t0000000001000000\n")
    write(host.proc / "3/status", "CapEff:\tzz\n")
    assert not has_cap_sys_resource(host, 1)
    assert has_cap_sys_resource(host, 2)
    assert not has_cap_sys_resource(host, 3)
    assert not has_cap_sys_resource(host, 4)  # missing


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_watcher_missing_file_ends_cleanly(tmp_path: Path) -> None:
    with PsiTriggerWatcher(privileged=True) as watcher:
        trigger = watcher.add(tmp_path / "gone/cpu.pressure", "some", 150_000, 1_000_000)
        events = watcher.wait(5.0)  # returns at once: nothing is left that could wake it
        assert [(e.trigger, e.ended) for e in events] == [(trigger, True)]
        assert "cannot open" in (events[0].reason or "")
        assert watcher.active == [] and watcher.wait(0.01) == []


def test_watcher_validates_before_opening_and_releases_fds(tmp_path: Path) -> None:
    target = write(tmp_path / "cpu.pressure", "")
    before = open_fds()
    watcher = PsiTriggerWatcher(privileged=False)
    with pytest.raises(ValueError, match="multiples of 2 s"):
        watcher.add(target, "some", 50_000, 500_000)
    assert target.read_text() == ""  # nothing written
    watcher.add(target, "some", 50_000, 2_000_000)
    assert target.read_bytes() == b"some 50000 2000000\0"  # NUL-terminated spec
    assert len(watcher.active) == 1 and open_fds() != before
    watcher.close()
    assert watcher.active == [] and open_fds() == before


# -- real kernel --------------------------------------------------------------------------------

# Prints a line once its interpreter has started: under TCG, Python's start (reading modules from the
# shared root) takes seconds, during which the process sleeps on I/O and contends for no CPU.
BUSY_LOOP = ("import sys, time\nprint('spinning', flush=True)\nend = time.monotonic() + float(sys.argv[1])\n"
             "while time.monotonic() < end:\n    pass\n")


def spawn_busy(cg: OwnedCgroup, seconds: float, cpu: int | None = None) -> subprocess.Popen:
    """A bounded busy loop that joins `cg` (and optionally one CPU) before it execs."""

    def join() -> None:
        cg.add_pid(os.getpid())
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)], preexec_fn=join, stdout=subprocess.PIPE,
                            text=True)


def wait_spinning(procs: list[subprocess.Popen]) -> None:
    """Return once every busy loop has said it spins (past its interpreter's start)."""
    for p in procs:
        assert readline_within(p, 6) == "spinning", "busy loop did not start"


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=5)


def raw_totals(path: Path) -> dict[str, int]:
    return {kind: line.total_us for kind, line in parse_pressure(path.read_text()).items()}


def require_unified_tree() -> None:
    if discover().v2 is None:
        pytest.skip("no cgroup v2 hierarchy on this host: no per-cgroup PSI")


@pytest.mark.vm
@pytest.mark.root
def test_node_psi_matches_the_files_read_back_to_back() -> None:
    paths = HostPaths()
    if not (paths.proc / "pressure").is_dir():
        pytest.skip("kernel without PSI")
    for _ in range(3):
        before = {r: raw_totals(paths.proc / "pressure" / r) for r in ("cpu", "memory", "io")}
        node = read_node_psi(paths)
        after = {r: raw_totals(paths.proc / "pressure" / r) for r in ("cpu", "memory", "io")}
        for r in ("cpu", "memory", "io"):
            probe = node.readings[r]
            assert probe.some is not None and probe.full is not None  # both lines at node level
            assert before[r]["some"] <= probe.some.total_us <= after[r]["some"]
            assert before[r]["full"] <= probe.full.total_us <= after[r]["full"]
        assert node.readings["cpu"].full.total_us == 0  # node-level cpu "full" is undefined: always 0
    if (paths.proc / "pressure/irq").exists():
        assert "irq" in node.readings
    else:
        assert "CONFIG_IRQ_TIME_ACCOUNTING" in node.unavailable["irq"]


@pytest.mark.vm
@pytest.mark.root
def test_real_cgroup_psi_of_a_busy_cgroup(make_cgroup) -> None:
    require_unified_tree()
    cg = make_cgroup("psi", ("unified",))
    proc = spawn_busy(cg, 0.5)
    try:
        layout = discover()
        source = cgroup_psi_source(layout, "/" + str(cg.path("unified").relative_to(layout.v2.mount)))
        assert source.available, source.reason
        assert source.cgroup_dir == cg.path("unified")
        readings = read_cgroup_psi(source.cgroup_dir)
        assert {"cpu", "memory", "io"} <= set(readings)
        assert all(r.some is not None and r.full is not None for r in readings.values())
    finally:
        stop_all([proc])


@pytest.mark.vm
@pytest.mark.root
def test_trigger_fires_on_cpu_stall_and_ends_when_cgroup_removed(make_cgroup) -> None:
    require_unified_tree()
    cg = make_cgroup("stall", ("unified",))
    watcher = PsiTriggerWatcher()
    # Without CAP_SYS_RESOURCE (root on this machine lacks it) only 2 s windows are allowed, and
    # such triggers are evaluated by the 2 s averaging worker rather than the psimon thread.
    stall_us, window_us = (50_000, 500_000) if watcher.privileged else (100_000, 2_000_000)
    window_s = window_us / 1e6
    cpu = max(os.sched_getaffinity(0))
    with watcher:
        trigger = watcher.add(cg.path("unified") / "cpu.pressure", "some", stall_us, window_us)
        assert watcher.active == [trigger]
        assert watcher.wait(0) == []  # quiet cgroup: nothing yet
        # Three busy loops on one CPU keep two of them runnable-but-waiting: "some" CPU stall.
        procs = [spawn_busy(cg, window_s + 3, cpu) for _ in range(3)]
        try:
            wait_spinning(procs)
            start = time.monotonic()
            fired = []
            while not fired and time.monotonic() - start < window_s + 3:
                fired = [e for e in watcher.wait(0.5) if not e.ended]
            assert fired, "trigger did not fire under a CPU stall"
            latency = fired[0].at - start
            assert latency <= window_s + 1.0, f"fired after {latency:.2f} s for a {window_s} s window"
            assert fired[0].trigger == trigger
        finally:
            stop_all(procs)

        # Removing the cgroup while wait() blocks wakes it with POLLERR: the watch ends, no raise.
        remover = threading.Timer(0.2, cg.remove)
        remover.start()
        try:
            blocked_at = time.monotonic()
            events = []
            while not any(e.ended for e in events) and time.monotonic() - blocked_at < 5:
                events += watcher.wait(5)
        finally:
            remover.join()
        ended = [e for e in events if e.ended]
        assert len(ended) == 1 and ended[0].trigger == trigger
        assert "was removed" in (ended[0].reason or "")
        assert ended[0].at - blocked_at < 2.0
        assert watcher.active == [] and watcher.wait(0.01) == []


@pytest.mark.vm
@pytest.mark.root
def test_real_cgroup_pressure_zero_hides_files_and_ends_watch(make_cgroup) -> None:
    require_unified_tree()
    cg = make_cgroup("psioff", ("unified",))
    d = cg.path("unified")
    if not (d / "cgroup.pressure").exists():
        pytest.skip("kernel older than 6.1: no per-cgroup PSI switch")
    layout = discover()
    rel = "/" + str(d.relative_to(layout.v2.mount))
    assert cgroup_psi_source(layout, rel).available
    with PsiTriggerWatcher() as watcher:
        watcher.add(d / "memory.pressure", "some", 100_000, 2_000_000)
        cg.write("unified", "cgroup.pressure", "0")  # our own cgroup only
        source = cgroup_psi_source(layout, rel)
        assert not source.available and "cgroup.pressure = 0" in (source.reason or "")
        assert read_cgroup_psi(d) == {}  # the kernel hides the files
        events = watcher.wait(2)
        assert [e.ended for e in events] == [True]
        assert "cgroup.pressure = 0" in (events[0].reason or "")


# -- per-pod PSI against the kernel's own totals (host and VM lane) -----------------------------

# The pod's page cache far above its limit, so it reclaims its own pages: test_reclaim's workload.
PAGE_CACHE_CHURN = PAGE_CACHE_WORKLOAD


def _pod_with_a_container(make_cgroup, controllers: tuple[str, ...]) -> tuple[str, Path, OwnedCgroup]:
    """A pod cgroup with one container cgroup below it (tasks live in the container: on v2 a cgroup
    with controllers for its children holds none). Returns the pod's path as the agent names it (its
    path in the cpu hierarchy), the v2 directory holding its pressure files, and the container."""
    layout = discover()
    if layout.v2 is None:
        pytest.skip("no cgroup v2 hierarchy on this host: no per-cgroup PSI")
    # On a hybrid host the pod must exist in the unified tree too (kubelet pods there do not, which
    # is why the agent shows n/a for them); on pure v2 it is one directory.
    wanted = (*controllers, "unified") if layout.v1 else controllers
    ctr = make_cgroup("pod/ctr", wanted)
    cpu_h = layout.hierarchy_for("cpu")
    assert cpu_h is not None
    pod_rel = "/" + str(ctr.path("cpu").parent.relative_to(cpu_h.mount))
    psi_dir = ctr.path("unified" if layout.v1 else "cpu").parent
    if layout.v2.path_of(pod_rel) != psi_dir:
        pytest.skip(f"this process's cgroups differ between the cpu and v2 trees: {pod_rel} is not {psi_dir}")
    return pod_rel, psi_dir, ctr


def _watch_between(watch: CgroupWatch, pod_rel: str, psi_dir: Path, resource: str) -> tuple[dict, PsiReading, dict]:
    """The kernel's totals, the agent's reading of them, the kernel's totals again, back to back."""
    before = raw_totals(psi_dir / f"{resource}.pressure")
    watch.tick(psi_every_tick=[pod_rel])
    got = watch.psi[pod_rel][resource]
    after = raw_totals(psi_dir / f"{resource}.pressure")
    return before, got, after


def _assert_between(before: dict, got: PsiReading, after: dict) -> None:
    assert got.some is not None and got.full is not None
    assert before["some"] <= got.some.total_us <= after["some"]
    assert before["full"] <= got.full.total_us <= after["full"]


@pytest.mark.smoke
@pytest.mark.root
@pytest.mark.vm
def test_pod_cpu_psi_is_the_kernels_and_counts_the_stall(make_cgroup) -> None:
    """Three busy loops on one CPU in a pod's container: at every instant two of them wait, so the
    pod's cpu "some" stall grows with wall time whatever else the machine runs. The agent's reading
    of the pod (CgroupWatch, the collector's reader) lies between the kernel's totals read around it."""
    pod_rel, psi_dir, ctr = _pod_with_a_container(make_cgroup, ("cpu",))
    watch = CgroupWatch(discover())
    watch.set_listed({pod_rel})
    cpu = max(os.sched_getaffinity(0))
    window_s = 3.0
    # The loops end by themselves; generous for a slow guest (TCG starts Python in seconds).
    procs = [spawn_busy(ctr, 120, cpu) for _ in range(3)]
    try:
        wait_spinning(procs)  # every loop past its interpreter's start, contending
        assert len(ctr.pids()) == 3
        b0, got0, a0 = _watch_between(watch, pod_rel, psi_dir, "cpu")
        t0 = watch.psi_read_s[pod_rel]
        time.sleep(window_s)
        b1, got1, a1 = _watch_between(watch, pod_rel, psi_dir, "cpu")
        t1 = watch.psi_read_s[pod_rel]
    finally:
        stop_all(procs)
    _assert_between(b0, got0, a0)
    _assert_between(b1, got1, a1)
    stalled_us = got1.some.total_us - got0.some.total_us
    print(f"pod {pod_rel}: cpu some +{stalled_us / 1e3:.0f} ms, full +{(got1.full.total_us - got0.full.total_us) / 1e3:.0f} ms "
          f"in {t1 - t0:.2f} s")
    # Two of the three wait at every instant: "some" is the whole window, less the moments PSI has not
    # folded in yet (per-CPU state is aggregated when a task changes state or on read: no lag on read).
    assert stalled_us >= 0.8 * (t1 - t0) * 1e6
    assert stalled_us <= (a1["some"] - b0["some"])
    rate = psi_rate(got0, got1, t1 - t0)
    assert rate.some is not None and rate.some >= 0.8


def test_the_read_after_a_stall_is_new_and_the_reads_after_it_are_not(tmp_path: Path) -> None:
    """Pressure files with the text of the last read are not new, except on the one read after the totals
    moved: its rate of 0 is what ends the stall for the detector (else the last rate would stand)."""
    paths = fake_v2_host(tmp_path, ["kubepods.slice", "kubepods.slice/pod"])
    cpu_file = tmp_path / "sys/fs/cgroup/kubepods.slice/pod/cpu.pressure"
    write(cpu_file, pressure_text(1000, 500))
    watch = CgroupWatch(discover(paths), slow_refresh_ticks=1000)
    pod = "/kubepods.slice/pod"
    watch.set_listed({pod})

    def tick() -> bool:
        return pod in watch.tick(psi_every_tick=[pod])

    assert tick()  # first sight
    assert not tick()  # its CPU usage looked at once more (first sight counts as moving): it stood still
    assert not tick()  # the same text: nothing new
    write(cpu_file, pressure_text(3000, 1500))
    assert tick() and watch.psi[pod]["cpu"].some.total_us == 3000  # it stalled
    stalled = watch.psi[pod]
    assert tick() and watch.psi[pod] is not stalled  # standing still after a stall: new (rate 0)
    assert watch.psi[pod]["cpu"] == stalled["cpu"]
    assert not tick() and not tick()  # standing still again: nothing new


@pytest.mark.root
@pytest.mark.vm
def test_an_idle_pods_psi_is_not_new_until_it_stalls(make_cgroup) -> None:
    """A latency-sensitive pod's pressure files are read every tick. While the pod is idle they say the same
    thing tick after tick: the watch keeps the same reading objects (the detector skips them: no row),
    moves only their read time (the next stall's rate is over one tick) and does not call the pod changed.
    The tick its tasks stall, the reading is new and lies between the kernel's totals read around it."""
    pod_rel, psi_dir, ctr = _pod_with_a_container(make_cgroup, ("cpu",))
    watch = CgroupWatch(discover())
    watch.set_listed({pod_rel})
    assert pod_rel in watch.tick(psi_every_tick=[pod_rel])  # first sight: read in full
    watch.tick(psi_every_tick=[pod_rel])  # first sight counts as moving: its CPU usage is read once more
    first = watch.psi[pod_rel]
    for _ in range(3):  # nothing runs in it: no stall, its averages stay 0.00
        t_before = watch.psi_read_s[pod_rel]
        time.sleep(0.05)
        assert pod_rel not in watch.tick(psi_every_tick=[pod_rel])
        assert watch.psi[pod_rel] is first
        assert watch.psi_read_s[pod_rel] > t_before
    cpu = max(os.sched_getaffinity(0))
    procs = [spawn_busy(ctr, 120, cpu) for _ in range(3)]
    try:
        wait_spinning(procs)  # two of the three wait at every instant from here on
        time.sleep(0.5)
        before = raw_totals(psi_dir / "cpu.pressure")
        changed = watch.tick(psi_every_tick=[pod_rel])
        after = raw_totals(psi_dir / "cpu.pressure")
    finally:
        stop_all(procs)
    assert pod_rel in changed
    got = watch.psi[pod_rel]["cpu"]
    assert watch.psi[pod_rel] is not first
    _assert_between(before, got, after)
    assert got.some is not None and first["cpu"].some is not None
    assert got.some.total_us > first["cpu"].some.total_us


@pytest.mark.root
@pytest.mark.vm
def test_pod_memory_psi_is_the_kernels_and_counts_reclaim(make_cgroup, disk_dir: Path) -> None:
    """A pod at its memory limit re-reading a file three times its size reclaims its own page cache;
    reclaim is a memory stall, so the pod's memory "some" total grows, and the agent's reading lies
    between the kernel's totals read around it."""
    layout = discover()
    mem_h = layout.hierarchy_for("memory")
    if mem_h is None:
        pytest.skip("no memory controller")
    pod_rel, psi_dir, ctr = _pod_with_a_container(make_cgroup, ("cpu", "memory"))
    limit = 48 << 20
    pod_mem = ctr.path("memory").parent
    if mem_h.version == 1:
        (pod_mem / "memory.limit_in_bytes").write_text(str(limit))
    else:
        (pod_mem / "memory.max").write_text(str(limit))
    watch = CgroupWatch(layout)
    watch.set_listed({pod_rel})
    b0, got0, a0 = _watch_between(watch, pod_rel, psi_dir, "memory")
    churn = subprocess.Popen([sys.executable, "-c", PAGE_CACHE_CHURN, str(disk_dir / "churn"), str(3 * limit)],
                             preexec_fn=ctr.preexec)
    try:
        assert churn.wait(timeout=600) == 0, "page cache workload failed (OOM?)"
    finally:
        stop_all([churn])
        (disk_dir / "churn").unlink(missing_ok=True)
    b1, got1, a1 = _watch_between(watch, pod_rel, psi_dir, "memory")
    _assert_between(b0, got0, a0)
    _assert_between(b1, got1, a1)
    stalled_us = got1.some.total_us - got0.some.total_us
    print(f"pod {pod_rel}: memory some +{stalled_us} us, full +{got1.full.total_us - got0.full.total_us} us")
    assert stalled_us > 0, "the pod reclaimed without a memory stall: the test proves nothing"


def test_a_pressure_file_gone_while_psi_is_on_is_its_cgroup_going(tmp_path):
    """rmdir takes a cgroup's files before its directory: a poll that wakes in between finds the directory
    and no pressure file (seen in the VM lane). That is the cgroup going, not some other loss; PSI turned
    off (cgroup.pressure = 0) hides the files too and says so; a file that is still there is an error."""
    from probes.psi import _why_gone

    cg = tmp_path / "pod"
    cg.mkdir()
    assert "was removed" in _why_gone(cg / "cpu.pressure")
    (cg / "cgroup.pressure").write_text("0\n")
    assert "PSI was disabled" in _why_gone(cg / "cpu.pressure")
    (cg / "cgroup.pressure").write_text("1\n")
    (cg / "cpu.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert "kernel reported an error" in _why_gone(cg / "cpu.pressure")
    assert "was removed" in _why_gone(tmp_path / "gone" / "cpu.pressure")


def test_a_cgroup_dropped_from_the_listing_leaves_the_every_tick_psi_list(v2_host: Path) -> None:
    """The watch keeps the every-tick PSI list's watched cgroups between ticks; a cgroup dropped from the
    listing, even one handed as the same set changed in place, is not read (no KeyError) and the one still
    listed is."""
    for rel in ("/kubepods.slice/a", "/kubepods.slice/b"):
        make_v2_cgroup(v2_host, rel)
    watch = CgroupWatch(discover(HostPaths.under(v2_host)))
    listed = {"/kubepods.slice/a", "/kubepods.slice/b"}
    every_tick = frozenset(listed)
    watch.set_listed(listed)
    watch.tick(psi_every_tick=every_tick)
    assert set(watch.psi) == listed
    listed.discard("/kubepods.slice/b")  # the same set object, changed in place
    watch.set_listed(listed)
    watch.tick(psi_every_tick=every_tick)
    watch.tick(psi_every_tick=every_tick)
    assert set(watch.psi) == {"/kubepods.slice/a"}
