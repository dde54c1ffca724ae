"""The runtime seen from Python: import, devices, streams, events, memory, errors."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torch_accel
from torch_accel import _C
from torch_accel._C import _rt

ROOT = Path(__file__).resolve().parents[1]


def test_import_reports_version_and_devices():
    assert torch_accel.__version__ == torch_accel.runtime_version() == "0.1.0"
    assert torch_accel.is_available()
    assert torch_accel.init_error() == ""
    driver = torch_accel.driver()
    assert torch_accel.driver_selection()[-1] == (driver, "selected")
    props = torch_accel.get_device_properties(torch_accel.device_count() - 1)
    assert props["driver"] == driver
    assert props["compute_units"] >= 1
    free, total = _C.mem_get_info(0)
    assert total == props["total_memory"] and 0 <= free <= total
    caps = torch_accel.driver_capabilities()
    assert set(caps) == {
        "graphs",
        "host_functions",
        "timing_events",
        "host_accessible_memory",
        "native_handles",
        "virtual_memory",
        "ipc_memory",
    }
    if driver == "host":  # the host driver's defaults
        assert all(caps.values())
        assert torch_accel.device_count() == 2
        assert props["name"] == "accel host device 1"
        assert total == 4 << 30


def test_the_executor_of_the_host_driver_runs_cpu_kernels():
    if torch_accel.driver() != "host":
        pytest.skip("the host driver's executor")
    assert torch_accel.executor() == ("host", "")


def test_the_cuda_driver_starts_or_says_why(run_python):
    # Where the build has the cuda driver: on a machine with a GPU it starts and reports CUDA's
    # devices; elsewhere (this CI machine) it loads and refuses with CUDA's own reason.
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda_runtime.h"
    if not (ROOT / "torch_accel" / "lib" / "libaccel_driver_cuda.so").exists():
        # A build finds the toolkit where this test looks for it: then the driver must be there.
        assert not toolkit.exists(), f"{toolkit} exists but the package has no cuda driver"
        pytest.skip("this build has no cuda driver (no CUDA toolkit)")
    code = (
        "import torch_accel as t\n"
        "if t.is_available():\n"
        "    p = t.get_device_properties(0)\n"
        "    print('started', t.driver(), p['driver'], p['total_memory'] > 0)\n"
        "else:\n"
        "    print('refused', t.init_error())\n"
    )
    r = run_python(code, ACCEL_DRIVER="cuda")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip()
    if out.startswith("started"):
        assert out == "started cuda cuda True"
    else:
        assert "ACCEL_DRIVER=cuda: the cuda driver cannot be used: " in out
        assert "cudaGetDeviceCount failed: cuda" in out or "no CUDA device is present" in out


def test_driver_selection_says_why_each_driver_was_skipped(run_python):
    code = "import torch_accel; print(torch_accel.driver_selection())"
    lib = ROOT / "torch_accel" / "lib"
    r = run_python(code, ACCEL_DRIVER="auto")
    assert r.returncode == 0, r.stderr
    selection = eval(r.stdout)  # noqa: S307 - a list of tuples of strings printed above
    for name, outcome in selection[:-1]:
        assert name in ("cuda", "level_zero") and outcome.startswith("skipped: ")
        if not (lib / f"libaccel_driver_{name}.so").exists():
            assert "does not exist (this build has no " in outcome
    assert selection[-1][1] == "selected"
    assert selection[-1][0] in ("cuda", "level_zero", "host")
    r = run_python(code, ACCEL_DRIVER="host")
    assert r.stdout.strip() == "[('host', 'selected')]"


def test_a_lost_device_raises_accelerator_error_and_stays_lost(run_python, test_driver, tmp_path):
    # The fragile test driver (the host driver behind the C table) loses its device once the
    # trigger file exists, as a CUDA context dies at an illegal address.
    trigger = tmp_path / "lose"
    code = (
        "import pathlib, torch, torch_accel\n"
        "x = torch.arange(4.0, device='accel')\n"
        "print((x * 2).cpu().tolist())\n"
        f"pathlib.Path({str(trigger)!r}).touch()\n"
        "for step in ('synchronize', 'op after'):\n"
        "    try:\n"
        "        torch.accel.synchronize() if step == 'synchronize' else (x + 1).cpu()\n"
        "        print(step, 'no error')\n"
        "    except torch.AcceleratorError as e:\n"
        "        print(step, 'AcceleratorError:', e)\n"
        "del x\n"
        "print('released')\n"
    )
    r = run_python(code, **test_driver("fragile"), ACCEL_TEST_LOSE_DEVICE=str(trigger))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "[0.0, 2.0, 4.0, 6.0]"
    assert lines[1].startswith("synchronize AcceleratorError: ")
    assert "the fragile driver lost the device: the device fell off the bus" in lines[1]
    assert "restart the process" in lines[1]
    assert lines[2].startswith("op after AcceleratorError: ")
    assert "lost the device earlier (the device fell off the bus" in lines[2]
    assert lines[3] == "released"


def test_a_gpu_fault_on_the_cuda_driver_is_sticky_and_the_process_exits_cleanly(
    run_python, emulated_cuda, tmp_path
):
    # The cuda driver on the emulated CUDA runtime, whose context dies once the trigger file
    # exists (an illegal address in a kernel): CUDA then fails every call, frees, destroys and
    # the process's teardown included, with that error.
    trigger = tmp_path / "fault"
    code = (
        "import pathlib, torch, torch_accel\n"
        "x = torch.arange(4.0, device='accel')\n"
        "s = torch.accel.Stream()\n"
        "print((x * 2).cpu().tolist())\n"
        f"pathlib.Path({str(trigger)!r}).touch()\n"
        "for step in ('synchronize', 'op after', 'stream'):\n"
        "    try:\n"
        "        if step == 'synchronize': torch.accel.synchronize()\n"
        "        elif step == 'op after': (x + 1).cpu()\n"
        "        else: torch.accel.Stream()\n"
        "        print(step, 'no error')\n"
        "    except torch.AcceleratorError as e:\n"
        "        print(step, 'AcceleratorError:', e)\n"
        "del x, s\n"
        "print('released', torch.accel.device_count())\n"
    )
    r = run_python(code, **emulated_cuda, CUDA_EMULATOR_LOSE_DEVICE=str(trigger))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "[0.0, 2.0, 4.0, 6.0]"
    assert lines[1].startswith("synchronize AcceleratorError: ")
    assert "the cuda driver lost the device" in lines[1]
    assert "cudaErrorIllegalAddress" in lines[1], lines[1]
    for line, step in zip(lines[2:4], ("op after", "stream"), strict=True):
        assert line.startswith(f"{step} AcceleratorError: "), line
        assert "lost the device earlier" in line and "cudaErrorIllegalAddress" in line, line
    assert lines[4] == "released 2"
    assert "freeing device memory failed" not in r.stderr


def test_the_cuda_drivers_sensors_come_from_nvml(run_python, emulated_cuda):
    # The cuda driver on the emulated CUDA runtime and its emulated NVML
    # (test/cpp/cuda_emulator/nvml.cpp): readings that differ per device (each accel device
    # found by its PCI bus id), memory in use as the emulator counts it, a sensor the GPU lacks,
    # a process list longer than the driver's first guess.
    code = (
        "import os, torch, torch_accel\n"
        "a = torch.accel\n"
        "before = a.device_memory_used(1)\n"
        "x = torch.ones(1 << 20, device='accel:1')\n"
        "print([(a.utilization(d), a.memory_usage(d), a.temperature(d), a.clock_rate(d))"
        " for d in (0, 1)])\n"
        "print(a.device_memory_used(1) - before >= x.numel() * 4)\n"
        "try:\n"
        "    a.power_draw(0)\n"
        "except NotImplementedError as e:\n"
        "    print('power:', e)\n"
        "lines = a.list_gpu_processes(1).splitlines()\n"
        "print(len(lines), [l.split()[1] for l in lines[1:]].count(str(os.getpid())))\n"
    )
    r = run_python(
        code,
        **emulated_cuda,
        CUDA_EMULATOR_NVML_UNSUPPORTED="power",
        CUDA_EMULATOR_NVML_PROCESSES="20",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "[(10, 5, 40, 1755), (20, 10, 41, 1756)]"
    assert lines[1] == "True"
    assert lines[2].startswith("power: cuda driver: nvmlDeviceGetPowerUsage failed: Not Supported")
    assert "does not report its power draw" in lines[2]
    assert lines[3] == "22 1"  # the header, this process, 20 others

    # Without the NVIDIA driver's library loaded, sensors say where they come from.
    code = (
        "import torch, torch_accel\n"
        "try:\n"
        "    torch.accel.utilization(0)\n"
        "except NotImplementedError as e:\n"
        "    print(e)\n"
    )
    r = run_python(code, **emulated_cuda, CUDA_EMULATOR_NVML="0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "device sensors come from NVML, and nvmlInit failed: Driver Not Loaded" in r.stdout


def test_a_driver_without_an_executor_runs_operators_through_the_host(run_python, test_driver):
    # The limited test driver's memory is not host-accessible and it has no executor for ATen
    # kernels: operators take the CPU fallback, and copies and fills between accel tensors go
    # through the host, each visibly (warned once, counted), with the CPU's values.
    code = (
        "import torch, torch_accel\n"
        "print(torch_accel.executor())\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "a = x.to('accel')\n"
        "y = (a + 1).t().contiguous() * 2\n"
        "z = torch.empty(8, device='accel')[::2].fill_(3.0)\n"
        "print(torch.equal(y.cpu(), ((x + 1).t() * 2)), z.cpu().tolist())\n"
        "print(sorted(torch.accel.fallback_stats()))\n"
        "torch_accel._C._set_fallback_mode('error')\n"
        "try:\n"
        "    a.t().contiguous()\n"
        "except NotImplementedError as e:\n"
        "    print('refused:', e)\n"
    )
    r = run_python(code, **test_driver("limited"))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "('none', 'the limited driver has no executor for ATen kernels yet')"
    assert lines[1] == "True [3.0, 3.0, 3.0, 3.0]"
    names = eval(lines[2])  # noqa: S307 - a list of strings printed above
    assert {"aten::add.Tensor", "aten::copy_", "aten::fill_", "aten::mul.Tensor"} <= set(names)
    assert lines[3].startswith("refused: aten::copy_ has no accel kernel on the limited driver")
    assert "ACCEL_FALLBACK=error forbids copying through the host" in lines[3]
    assert "aten::copy_ has no accel kernel and runs on the CPU fallback" in r.stderr


def test_the_cuda_driver_on_an_emulated_gpu(run_python, emulated_cuda):
    # The cuda driver's own code on the emulated CUDA runtime: device memory the host cannot
    # touch. torch's CUDA finds no GPU here, so there is no executor for ATen's kernels: operators
    # take the visible fallback and torch_accel.executor() says why; copies, streams and events go
    # through the driver in stream order; a nested tensor's metadata needs no kernel (autograd asks
    # for it while recording, where an error used to abort the process).
    code = (
        "import torch, torch_accel, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "print(torch_accel.driver(), torch_accel.driver_capabilities()['host_accessible_memory'])\n"
        "print(torch_accel.executor())\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "a = x.to('accel')\n"
        "s = torch.accel.Stream()\n"
        "s.wait_stream(torch.accel.current_stream())\n"
        "with torch.accel.stream(s):\n"
        "    b = (a * 2).t().contiguous()\n"
        "torch.accel.current_stream().wait_stream(s)\n"
        "print(torch.equal(b.cpu(), (x * 2).t()))\n"
        "parts = [torch.ones(2, 3), torch.ones(4, 3)]\n"
        "nt = torch.nested.nested_tensor(parts, device='accel', requires_grad=True)\n"
        "print(torch.ops.aten._nested_tensor_size(nt).tolist())\n"
        "try:\n"
        "    torch.nn.functional.linear(nt, torch.ones(5, 3, device='accel'))\n"
        "except NotImplementedError as e:\n"
        "    print('refused:', str(e).splitlines()[0])\n"
    )
    r = run_python(code, **emulated_cuda)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "cuda False"
    assert lines[1].startswith("('none', \"torch's CUDA finds no GPU (torch.cuda.is_available()")
    assert lines[2:4] == ["True", "[[2, 3], [4, 3]]"]
    assert lines[4].startswith("refused: aten::linear: the cuda driver has no kernels for it")


def test_device_buffer_round_trip_on_two_streams_with_timing():
    n = 100_000
    data = [np.arange(n, dtype=np.float32) * (i + 1) for i in range(2)]
    streams = [_rt.Stream(), _rt.Stream(device=0, priority=-1)]
    assert streams[1].priority == -1
    results = []
    for stream, x_host in zip(streams, data, strict=True):
        x = _rt.DeviceBuffer(x_host.nbytes, stream=stream)
        y = _rt.DeviceBuffer(x_host.nbytes, stream=stream)
        start, end = _rt.Event(enable_timing=True), _rt.Event(enable_timing=True)
        start.record(stream)
        x.copy_from_host(x_host, stream=stream, non_blocking=True)
        y.copy_from_host(np.ones(n, dtype=np.float32), stream=stream, non_blocking=True)
        _rt.axpy(3.0, x, y, stream=stream)
        end.record(stream)
        results.append((stream, y, start, end))
    for (stream, y, start, end), x_host in zip(results, data, strict=True):
        stream.synchronize()
        assert stream.query()
        out = np.empty(n, dtype=np.float32)
        y.copy_to_host(out, stream=stream)
        np.testing.assert_array_equal(out, 3.0 * x_host + 1.0)
        assert end.query()
        assert start.elapsed_time(end) >= 0.0


def test_events_order_streams():
    producer, consumer = _rt.Stream(), _rt.Stream()
    x = _rt.DeviceBuffer(4 * 1000, stream=producer)
    y = _rt.DeviceBuffer(4 * 1000, stream=producer)
    x.copy_from_host(np.full(1000, 2.0, dtype=np.float32), stream=producer)
    y.copy_from_host(np.zeros(1000, dtype=np.float32), stream=producer)
    ready = _rt.Event()
    _rt.axpy(1.0, x, y, stream=producer)
    ready.record(producer)
    ready.wait(consumer)
    _rt.axpy(1.0, x, y, stream=consumer)  # must see the producer's result
    out = np.empty(1000, dtype=np.float32)
    y.copy_to_host(out, stream=consumer)
    np.testing.assert_array_equal(out, np.full(1000, 4.0, dtype=np.float32))


def test_memory_stats_use_cuda_keys():
    _C.synchronize(1)
    _C.empty_cache(1)
    _C.reset_peak_memory_stats(1)
    _C.reset_accumulated_memory_stats(1)
    stream = _rt.Stream(device=1)
    buf = _rt.DeviceBuffer(1000, stream=stream)
    stats = _C.memory_stats(1)
    assert stats["allocated_bytes.all.current"] == 1024
    assert stats["requested_bytes.all.current"] == 1000
    assert stats["reserved_bytes.small_pool.current"] == 2 << 20
    assert stats["allocation.all.current"] == 1
    assert stats["num_ooms"] == 0
    # The flat key set of torch.cuda.memory_stats (its documented families and pools).
    families = [
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    ]
    expected = {
        f"{f}.{pool}.{metric}"
        for f in families
        for pool in ("all", "small_pool", "large_pool")
        for metric in ("current", "peak", "allocated", "freed")
    }
    expected |= {
        f"{f}.{metric}"
        for f in ("oversize_allocations", "oversize_segments")
        for metric in ("current", "peak", "allocated", "freed")
    }
    expected |= {
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "max_split_size",
    }
    assert set(stats) == expected
    buf.free()
    assert _C.memory_stats(1)["allocated_bytes.all.current"] == 0


def test_out_of_memory_is_torch_out_of_memory_error_and_recoverable():
    stream = _rt.Stream(device=1)
    big = _rt.DeviceBuffer(3 << 30, stream=stream)
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 2\.00 GiB"):
        _rt.DeviceBuffer(2 << 30, stream=stream)
    del big  # freed: the device works again
    again = _rt.DeviceBuffer(2 << 30, stream=stream)
    assert again.nbytes == 2 << 30


def test_bad_input_raises_and_never_crashes():
    with pytest.raises(torch_accel.AccelError, match="invalid device index 5"):
        _C.set_device(5)
    with pytest.raises(torch_accel.AccelError, match="invalid device index 9"):
        _rt.Stream(device=9)
    with pytest.raises(torch_accel.AccelError, match="invalid device index -4"):
        _C.get_device_properties(-4)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        _rt.DeviceBuffer(-1)
    buf = _rt.DeviceBuffer(16)
    with pytest.raises(ValueError, match="has 8 bytes but the device buffer has 16"):
        buf.copy_from_host(np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="not contiguous"):
        buf.copy_from_host(np.zeros(8, dtype=np.float32)[::2])
    with pytest.raises(BufferError, match="not writable"):
        buf.copy_to_host(b"0123456789abcdef")
    other = _rt.DeviceBuffer(32)
    with pytest.raises(ValueError, match="x has 16 bytes, y has 32"):
        _rt.axpy(1.0, buf, other)
    with pytest.raises(ValueError, match="the buffer is on device 0 but the stream is on device 1"):
        _rt.axpy(1.0, buf, buf, stream=_rt.Stream(device=1))
    buf.free()
    assert buf.freed
    with pytest.raises(ValueError, match="already freed"):
        buf.free()
    with pytest.raises(ValueError, match="the buffer was freed"):
        buf.copy_to_host(np.zeros(4, dtype=np.float32))
    start, end = _rt.Event(), _rt.Event()
    start.record()
    end.record()
    with pytest.raises(torch_accel.AccelError, match="created without timing"):
        start.elapsed_time(end)
    # The device is still fine.
    ok = _rt.DeviceBuffer(8)
    ok.copy_from_host(np.ones(2, dtype=np.float32))
    out = np.zeros(2, dtype=np.float32)
    ok.copy_to_host(out)
    np.testing.assert_array_equal(out, np.ones(2, dtype=np.float32))


def test_environment_configures_devices(run_python):
    code = (
        "import torch_accel as t; print(t.device_count(), "
        "t.get_device_properties(2)['total_memory'])"
    )
    result = run_python(code, ACCEL_HOST_DEVICES="3", ACCEL_HOST_MEMORY="256M")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", str(256 << 20)]


def test_unusable_driver_leaves_import_working(run_python):
    code = """
import torch_accel as t
print(t.is_available(), t.device_count())
print(t.init_error())
try:
    t.driver()
except t.AccelError as e:
    print("raised:", e)
"""
    result = run_python(code, ACCEL_DRIVER="bogus")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "False 0"
    assert "ACCEL_DRIVER=bogus" in lines[1] and "libaccel_driver_bogus.so" in lines[1]
    assert lines[2].startswith("raised: the accel runtime failed to start")


def _child_uses_runtime(queue) -> None:
    # Queries that cannot block answer; everything that needs the runtime refuses.
    queue.put((_C.in_bad_fork(), torch_accel.device_count()))
    try:
        _rt.DeviceBuffer(16)
        queue.put("no error")
    except torch_accel.AccelError as e:
        queue.put(str(e))


def test_forked_child_gets_a_clear_error():
    _rt.DeviceBuffer(16)  # the parent has started the runtime
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_uses_runtime, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == (True, 2)
    message = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert "forked after the parent started it" in message
    assert "'spawn'" in message
    assert not _C.in_bad_fork()  # the parent is unaffected


def test_runtime_example_runs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "runtime_streams.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("OK")
    assert "stream 1: copy in + 10 x axpy" in result.stdout
