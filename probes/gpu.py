# SPDX-License-Identifier: Apache-2.0
"""GPU utilisation and memory per device and per process, through NVML (pynvml).

A node without the NVML library or without a GPU is the normal case, not an error: the collector
says "not present" once, with the reason, and stays off. Nothing here can fail the agent: every NVML
call is wrapped, and a GPU that vanishes or a driver error turns the collector off with a reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from probes.cgroupfs import self_cgroups
from probes.host import HostPaths

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None
    cgroups: dict[str, str]  # controller -> path ("" for v2), empty when the pid already exited


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    utilization_gpu_percent: int | None
    utilization_memory_percent: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class GpuStatus:
    state: str  # "on" | "off"
    reason: str = ""

    def line(self) -> str:
        return f"gpu: {self.state}{': ' + self.reason if self.reason else ''}"


# NVML's first open in nvmlInit: without this device node it cannot succeed.
NVIDIA_CONTROL_DEVICE = Path("/dev/nvidiactl")


class NvidiaDeviceAbsent(Exception):
    """No NVIDIA control device here: NVML is not even imported."""


def _load_nvml() -> ModuleType:
    # Checked before the import: importing pynvml costs 4 MiB of RSS for good, on every node without a GPU.
    if not NVIDIA_CONTROL_DEVICE.exists():
        raise NvidiaDeviceAbsent(f"no {NVIDIA_CONTROL_DEVICE} (no NVIDIA driver or device visible here)")
    import pynvml  # nvidia-ml-py; imported lazily so nodes without it pay nothing

    return pynvml


class GpuCollector:
    def __init__(self, paths: HostPaths | None = None, nvml_loader: Callable[[], ModuleType] = _load_nvml) -> None:
        self.paths = paths or HostPaths()
        self.status = GpuStatus("off", "not started")
        self._nvml: ModuleType | None = None
        try:
            nvml = nvml_loader()
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except ImportError:
            self._off("not present: the pynvml module (nvidia-ml-py) is not installed")
            return
        except NvidiaDeviceAbsent as e:
            self._off(f"not present: {e}")
            return
        except Exception as e:  # pynvml raises NVMLError subclasses; a missing library is the common one
            self._off(f"not present: {_nvml_reason(e)}")
            return
        if count == 0:
            self._off("not present: NVML reports no GPU")
            return
        self._nvml = nvml
        self.status = GpuStatus("on", f"{count} GPU(s)")

    def _off(self, reason: str) -> None:
        # Said once at info level: most nodes have no GPU and that is not a problem.
        self.status = GpuStatus("off", reason)
        log.info("%s", self.status.line())

    def collect(self) -> list[GpuDevice]:
        if self._nvml is None:
            return []
        nvml = self._nvml
        try:
            devices = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = _try(lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h))
                mem = _try(lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h))
                procs = []
                for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                    for p in _try(lambda h=handle, g=getter: getattr(nvml, g)(h)) or []:
                        procs.append(GpuProcess(p.pid, getattr(p, "usedGpuMemory", None), self._cgroups_of(p.pid)))
                devices.append(
                    GpuDevice(
                        index=index,
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        utilization_gpu_percent=getattr(util, "gpu", None),
                        utilization_memory_percent=getattr(util, "memory", None),
                        memory_used_bytes=getattr(mem, "used", None),
                        memory_total_bytes=getattr(mem, "total", None),
                        processes=procs,
                    )
                )
            return devices
        except Exception as e:
            self._nvml = None
            self._off(f"NVML failed: {_nvml_reason(e)}")
            return []

    def _cgroups_of(self, pid: int) -> dict[str, str]:
        try:
            return self_cgroups(self.paths, pid)
        except OSError:
            return {}  # exited between NVML's list and our read

    def close(self) -> None:
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)
            self._nvml = None


def _try(call: Callable[[], object]) -> object | None:
    try:
        return call()
    except Exception:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_reason(e: Exception) -> str:
    return str(e).strip() or type(e).__name__
