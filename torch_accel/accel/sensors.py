"""What a device's sensors read, under torch.cuda's names (nvidia-smi's counters).

On the cuda driver these are NVML's readings of the GPU. On the host driver a device is worker
threads over host memory: it reports its utilization (the share of the last second during which
one of its streams ran a task) and the memory it has mapped; it has no temperature, power or
clock of its own, and cannot tell when its memory is read, so those raise NotImplementedError
saying so (torch.cuda raises when NVML is missing).
"""

from __future__ import annotations

from typing import Any

from torch_accel import _C
from torch_accel.accel._utils import _lazy_device_index

__all__ = [
    "clock_rate",
    "list_gpu_processes",
    "memory_usage",
    "power_draw",
    "temperature",
    "utilization",
]


def _read(sensor: str, device: Any) -> int:
    return int(_C._device_sensor(sensor, _lazy_device_index(device)))


def utilization(device: Any = None) -> int:
    """Percent of the driver's last sample period (host: the last second) during which work ran
    on ``device`` (a kernel on a GPU; a stream task on the host driver)."""
    return _read("utilization", device)


def memory_usage(device: Any = None) -> int:
    """Percent of the last sample period during which ``device``'s memory was read or written
    (NVML's; the host driver cannot tell and raises NotImplementedError)."""
    return _read("memory_utilization", device)


def temperature(device: Any = None) -> int:
    """Temperature of the GPU die in degrees Celsius (NVML's)."""
    return _read("temperature", device)


def power_draw(device: Any = None) -> int:
    """Power drawn by the GPU in milliwatts over the last sample period (NVML's)."""
    return _read("power_draw", device)


def clock_rate(device: Any = None) -> int:
    """Clock of the GPU's multiprocessors in MHz (NVML's)."""
    return _read("clock_rate", device)


def list_gpu_processes(device: Any = None) -> str:
    """The processes using ``device`` and the device memory each holds, in torch.cuda's
    format (the host driver's devices belong to this process alone)."""
    index = _lazy_device_index(device)
    processes = _C._device_processes(index)
    lines = [f"GPU:{index}"]
    if not processes:
        lines.append("no processes are running")
    for pid, used in processes:
        lines.append(f"process {pid:>10d} uses {used / (1024 * 1024):>12.3f} MB GPU memory")
    return "\n".join(lines)
