# SPDX-License-Identifier: Apache-2.0
"""GPU collector: absent NVML on this machine, and the mapping logic against a stand-in NVML."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from probes.gpu import NVIDIA_CONTROL_DEVICE, GpuCollector


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_no_nvml_here_is_not_present_once_and_never_fails(caplog):
    if _nvml_works():
        pytest.skip("this node has a working NVML: the not-present path cannot be exercised for real")
    caplog.set_level(logging.INFO, logger="probes.gpu")
    gpu = GpuCollector()
    assert gpu.status.state == "off" and gpu.status.reason.startswith("not present")
    assert gpu.collect() == [] and gpu.collect() == []
    assert sum("gpu: off" in r.message for r in caplog.records) == 1
    gpu.close()


def test_a_node_without_an_nvidia_device_does_not_import_nvml():
    """pynvml is 4 MiB of the agent's RSS for good once imported: without /dev/nvidiactl, where NVML
    cannot start, it is not imported at all."""
    if NVIDIA_CONTROL_DEVICE.exists():
        pytest.skip("this node has an NVIDIA control device")
    code = ("import sys; from probes.gpu import GpuCollector; g = GpuCollector(); "
            "print(g.status.reason); print('pynvml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.splitlines()
    assert out == [f"not present: no {NVIDIA_CONTROL_DEVICE} (no NVIDIA driver or device visible here)", "False"], out


class _FakeNvml:
    """Speaks pynvml's call names; one GPU running this test process."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise self.NVMLError("GPU is lost")
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=3 << 30, total=16 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=1 << 30), SimpleNamespace(pid=2**22 + 7, usedGpuMemory=None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-1234"

    def nvmlDeviceGetName(self, h):
        return "Tesla T4"


def test_devices_and_processes_mapped_to_cgroups():
    gpu = GpuCollector(nvml_loader=_FakeNvml)
    assert gpu.status.state == "on"
    (dev,) = gpu.collect()
    assert (dev.uuid, dev.name, dev.utilization_gpu_percent, dev.memory_total_bytes) == ("GPU-1234", "Tesla T4", 87, 16 << 30)
    mine, gone = dev.processes
    assert mine.pid == os.getpid() and mine.cgroups  # this process's real /proc/self/cgroup
    assert "cpu" in mine.cgroups or "" in mine.cgroups
    assert gone.cgroups == {}  # a pid that exited is reported without cgroups, not an error


def test_driver_failure_turns_the_collector_off_with_a_reason():
    gpu = GpuCollector(nvml_loader=lambda: _FakeNvml(fail_after=1))
    assert gpu.status.state == "on"
    assert gpu.collect() == []
    assert gpu.status.state == "off" and "GPU is lost" in gpu.status.reason
