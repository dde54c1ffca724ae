"""The accel runtime from Python (torch_accel._C._rt, below the PyTorch device).

Allocates device memory, copies data in, runs y += a * x on two streams at once, times each
stream with events, copies the results back and checks them against numpy. Runs on the
default driver (`host` on a machine without a GPU).

    python examples/runtime_streams.py
"""

from __future__ import annotations

import sys

import numpy as np

import torch_accel
from torch_accel._C import _rt


def main() -> int:
    print(
        f"torch_accel {torch_accel.__version__}: runtime {torch_accel.runtime_version()}, "
        f"driver '{torch_accel.driver()}', {torch_accel.device_count()} device(s)"
    )
    for d in range(torch_accel.device_count()):
        p = torch_accel.get_device_properties(d)
        print(
            f"  accel:{d}  {p['name']}  {p['total_memory'] / 2**30:.1f} GiB  "
            f"{p['compute_units']} compute units"
        )

    n = 1 << 22  # 4M float32 values (16 MiB) per buffer
    rng = np.random.default_rng(0)
    streams = [_rt.Stream(device=0), _rt.Stream(device=0)]
    alphas = [0.5, -2.0]
    inputs, outputs, events = [], [], []
    for stream, alpha in zip(streams, alphas, strict=True):
        x_host = rng.standard_normal(n, dtype=np.float32)
        y_host = rng.standard_normal(n, dtype=np.float32)
        x = _rt.DeviceBuffer(x_host.nbytes, stream=stream)
        y = _rt.DeviceBuffer(y_host.nbytes, stream=stream)
        start, end = _rt.Event(enable_timing=True), _rt.Event(enable_timing=True)
        start.record(stream)
        x.copy_from_host(x_host, stream=stream, non_blocking=True)
        y.copy_from_host(y_host, stream=stream, non_blocking=True)
        for _ in range(10):
            _rt.axpy(alpha, x, y, stream=stream)
        end.record(stream)
        inputs.append((x_host, y_host))
        outputs.append(y)
        events.append((start, end))
        # Both streams now hold queued work; this thread only enqueued it.

    ok = True
    for i, (stream, alpha) in enumerate(zip(streams, alphas, strict=True)):
        stream.synchronize()
        result = np.empty(n, dtype=np.float32)
        outputs[i].copy_to_host(result, stream=stream)
        x_host, y_host = inputs[i]
        expected = y_host.copy()
        for _ in range(10):
            expected += np.float32(alpha) * x_host
        error = float(np.max(np.abs(result - expected)))
        start, end = events[i]
        print(
            f"stream {i}: copy in + 10 x axpy on {n} floats took "
            f"{start.elapsed_time(end):.2f} ms, max |error| vs numpy = {error:.2e}"
        )
        ok = ok and error <= 1e-5 * max(1.0, float(np.max(np.abs(expected))))

    stats = torch_accel._C.memory_stats(0)
    print(
        f"device 0 memory: {stats['allocated_bytes.all.current'] / 2**20:.0f} MiB allocated, "
        f"{stats['reserved_bytes.all.current'] / 2**20:.0f} MiB reserved"
    )
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
