# SPDX-License-Identifier: Apache-2.0
"""probes/gpu_pods.py, the GPU-per-pod plugin: off with "no GPU" here (this machine has none), and against
a stand-in NVML with /proc/<pid>/cgroup files in a temp dir, GPU memory per pod on /metrics."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from noisyneighbor.exporter import Exporter, render_text
from probes.cgroupfs import discover
from probes.collect import BPF_PROBES, NodeCollector
from probes.engine import ProbeError
from probes.gpu_pods import (
    CGROUP_GPU_MEMORY,
    CGROUP_GPU_PROCESSES,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    GpuCgroupUse,
    GpuDeviceReader,
    GpuPodsProbe,
    delta,
)
from probes.host import HostPaths
from probes.registry import BY_NAME

POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_0000_4000_8000_00000000000b.slice"
CTR = f"{POD}/cri-containerd-{'ab' * 32}.scope"


class _FakeNvml:
    """pynvml's call names; GPU 0 runs pids 101 and 102 (one container), GPU 1 runs 101 and 999 (exited)."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: int = 2, fail: bool = False):
        self.gpus, self.fail = gpus, fail

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        if self.fail:
            raise self.NVMLError("GPU is lost")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=50, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=4 << 30, total=16 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = {0: [(101, 1 << 30), (102, 2 << 30)], 1: [(101, 512 << 20), (999, 1 << 20)]}[h]
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):
        return "Tesla T4"


def _fake_proc(root: Path) -> HostPaths:
    for pid in (101, 102):  # pid 999 has no /proc entry: it exited
        (root / f"proc/{pid}").mkdir(parents=True)
        (root / f"proc/{pid}/cgroup").write_text(f"0::{CTR}\n")
    return HostPaths.under(root)


def test_no_gpu_on_this_machine_is_off_with_the_reason():
    """Whatever this machine lacks (the pynvml module, the NVML library, a GPU), the plugin does not load
    and the collector reports it off, reason "no GPU (...)", and carries on."""
    with pytest.raises(ProbeError, match=r"^gpu: no GPU \("):
        GpuPodsProbe(nvml_loader=lambda: _FakeNvml(gpus=0))
    collector = NodeCollector(probes=("gpu",)).start()
    try:
        status = collector.status["gpu"]
        if status.state == "on":
            pytest.skip("this machine has a GPU")
        assert status.state == "off" and status.reason.startswith("no GPU ("), status
        snap = collector.collect()
        assert snap.probe("gpu") is None and snap.probe_status["gpu"].state == "off"
    finally:
        collector.close()


def test_registered_but_not_loaded_by_default():
    assert "gpu" in BY_NAME and "gpu" not in BPF_PROBES


def test_gpu_memory_per_pod_from_a_fake_nvml_and_proc(tmp_path):
    paths = _fake_proc(tmp_path)
    collector = NodeCollector(paths, discover(HostPaths()), probes=("gpu",),
                              probe_options={"gpu": {"nvml_loader": _FakeNvml}}).start()
    try:
        assert collector.status["gpu"].state == "on"
        snap = collector.collect()
    finally:
        collector.close()
    gpu = snap.probe("gpu")
    assert gpu.per_cgroup == {CTR: GpuCgroupUse((1 << 30) + (2 << 30) + (512 << 20), 3, (0, 1))}
    assert gpu.drops == {"process_exited": 1}
    assert delta(None, gpu) == gpu.per_cgroup

    exporter = Exporter(node="n1", paths=paths, layout=discover(HostPaths()))
    exporter.update(snap)
    lines = [line for line in render_text(exporter).decode().splitlines() if line.startswith(CGROUP_GPU_MEMORY)]
    assert len(lines) == 1, lines
    assert 'pod_uid="0a1b2c3d-0000-4000-8000-00000000000b"' in lines[0] and 'container_id="abababababab"' in lines[0]
    assert float(lines[0].rsplit(" ", 1)[1]) == (1 << 30) + (2 << 30) + (512 << 20)
    [processes] = [line for line in render_text(exporter).decode().splitlines() if line.startswith(CGROUP_GPU_PROCESSES)]
    assert float(processes.rsplit(" ", 1)[1]) == 3


def test_driver_failure_turns_it_off_with_the_reason(tmp_path):
    nvml = _FakeNvml()
    probe = GpuPodsProbe(_fake_proc(tmp_path), nvml_loader=lambda: nvml)
    assert probe.snapshot().per_cgroup
    nvml.fail = True
    assert probe.snapshot().per_cgroup == {}
    assert probe.status.state == "off" and "GPU is lost" in probe.status.reason
    probe.close()


def test_top_gpu_view_from_the_plugins_declared_table(tmp_path):
    """`top --view gpu`: the plugin declares its table (ProbePlugin.top_table); top's one table source
    makes rows from the plugin's delta and names the pod from the path, and the view renders them. Not
    part of `--view all` (the plugin is not loaded by default)."""
    import io
    import json

    from rich.console import Console

    from noisyneighbor.sections import ALL_VIEWS, PROBE_SOURCES, VIEWS, Context, TableSource
    from noisyneighbor.top import Frame, collect, frame_record, views_of
    from noisyneighbor.views import KEYS_HINT, VIEW_HOTKEYS, render_frame

    assert "gpu" in VIEWS and "gpu" not in ALL_VIEWS and "gpu" not in views_of("all")
    assert PROBE_SOURCES["gpu"] is TableSource and VIEW_HOTKEYS["g"] == "gpu" and "[g]pu" in KEYS_HINT

    paths = _fake_proc(tmp_path)
    ctx = Context(paths, discover(HostPaths()), resolver=None)  # type: ignore[arg-type]  # rows named by path
    source = PROBE_SOURCES["gpu"](GpuPodsProbe(paths, nvml_loader=_FakeNvml), ctx)
    try:
        source.start()
        frame: Frame = collect([source])
    finally:
        source.close()
    section = frame.sections["gpu"]
    [row] = section["rows"]
    assert row["cgroup"] == CTR and row["memory_bytes"] == (1 << 30) + (2 << 30) + (512 << 20)
    assert row["processes"] == 3 and row["devices"] == "0,1" and row["pod_uid"] == "0a1b2c3d-0000-4000-8000-00000000000b"
    assert section["drops"] == {"process_exited": 1}

    record = json.loads(json.dumps(frame_record(frame)))
    assert record["gpu"]["rows"][0]["memory_bytes"] == row["memory_bytes"] and "cgroups" not in record

    out = io.StringIO()
    statuses = {"gpu": source.status}
    Console(file=out, width=160).print(render_frame(frame.ts, frame.sections, ["gpu"], statuses))
    text = out.getvalue()
    assert "── gpu: GPU memory per cgroup — gpu: on" in text
    assert "GPU MEMORY▼" in text and "3.50GiB" in text and row["name"] in text and "drops: 1" in text

    out = io.StringIO()  # an interval with no GPU process says so instead of an empty table
    Console(file=out, width=160).print(render_frame(frame.ts, {"gpu": {**section, "rows": []}},
                                                    ["gpu"], statuses))
    assert "nothing this interval: no process holds GPU memory" in out.getvalue()


def _device_lines(snap) -> list[str]:
    """The node's GPU device lines the exporter renders from one snapshot."""
    exporter = Exporter(node="n1")
    exporter.update(snap)
    names = (GPU_UTILIZATION, GPU_MEMORY_USED, GPU_MEMORY_TOTAL)
    return sorted(line for line in render_text(exporter).decode().splitlines() if line.startswith(names))


def test_nvml_is_read_once_a_tick_with_the_plugin_loaded_or_not(tmp_path):
    """The node's GPU device metrics come from the plugin's reading of the tick when it is loaded
    (`--probes ...,gpu`), else from its node reader the agent opens: NVML read once a tick either way, the
    same series (names, labels, values) both ways."""
    from noisyneighbor.agent.loop import open_node_readers, with_node_readings
    from probes.snapshot import NodeSnapshot

    paths = _fake_proc(tmp_path)
    nvml = _FakeNvml()
    reads = []
    count = nvml.nvmlDeviceGetCount
    nvml.nvmlDeviceGetCount = lambda: reads.append(1) or count()  # type: ignore[method-assign]
    probe = GpuPodsProbe(paths, nvml_loader=lambda: nvml)
    reader = GpuDeviceReader(paths, nvml_loader=lambda: nvml)
    try:
        assert "gpu" not in open_node_readers(paths, loaded=("runqlat", "gpu"))  # the probe reads the node
        reads.clear()
        loaded = _device_lines(NodeSnapshot(1.0, 1.0, plugins={"gpu": probe.snapshot()}))
        assert len(reads) == 1
        reads.clear()
        tick = with_node_readings(NodeSnapshot(1.0, 1.0), {"gpu": reader})
        assert len(reads) == 1 and tick.probe("gpu") is None  # a reading, not a loaded probe
        assert _device_lines(tick) == loaded
        assert sorted((line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1])) for line in loaded) == sorted(
            (f'{name}{{node="n1",gpu="{i}",uuid="GPU-{i}",model="Tesla T4"}}', value)
            for i in (0, 1) for name, value in ((GPU_UTILIZATION, 0.5), (GPU_MEMORY_USED, float(4 << 30)),
                                                (GPU_MEMORY_TOTAL, float(16 << 30))))
    finally:
        probe.close()
        reader.close()


def test_the_node_reader_is_off_without_nvml_and_reads_nothing(tmp_path):
    from noisyneighbor.agent.loop import with_node_readings
    from probes.snapshot import NodeSnapshot

    reader = GpuDeviceReader(_fake_proc(tmp_path), nvml_loader=lambda: _FakeNvml(gpus=0))
    assert reader.status.state == "off" and "no GPU" in reader.status.reason
    tick = NodeSnapshot(1.0, 1.0)
    assert with_node_readings(tick, {"gpu": reader}) is tick and _device_lines(tick) == []
