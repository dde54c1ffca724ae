"""Registration, torch.accel device functions, torch.accelerator, threads, lazy init, autoload."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import torch_accel

# Every torch.cuda name that issue 3 asks torch.accel to provide.
TORCH_CUDA_NAMES = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device",
    "device", "device_of", "synchronize", "Stream", "Event", "current_stream", "default_stream",
    "set_stream", "stream", "get_device_name", "get_device_properties", "get_device_capability",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "get_rng_state_all", "set_rng_state", "set_rng_state_all", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "empty_cache",
]  # fmt: skip


def test_torch_accel_module_has_the_torch_cuda_names():
    assert torch.accel is torch_accel.accel
    missing = [n for n in TORCH_CUDA_NAMES if not hasattr(torch.accel, n)]
    assert missing == []
    for name in TORCH_CUDA_NAMES:
        assert hasattr(torch.cuda, name), name  # the names really are torch.cuda's


def test_legacy_tensor_types_as_torch_cuda():
    import torch_accel.accel.legacy_tensors as legacy

    # Old code picks `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`.
    names = [n for n in dir(torch.cuda) if n.endswith("Tensor")]
    assert len(names) == 10
    for name in names:
        cuda_type, accel_type = getattr(torch.cuda, name), getattr(torch.accel, name)
        assert accel_type.dtype == cuda_type.dtype and not accel_type.is_sparse
    with pytest.warns(UserWarning, match="no longer recommended"):
        legacy._warned = False  # it warns once per process
        x = torch.accel.FloatTensor(2, 3)  # sizes: uninitialized, on the current device
    assert x.shape == (2, 3) and x.dtype == torch.float32 and x.device == torch.device("accel:0")
    y = torch.accel.LongTensor([1, 2, 3])  # data
    assert torch.equal(y.cpu(), torch.tensor([1, 2, 3]))
    with torch.accel.device(1):
        assert torch.accel.DoubleTensor(4).device == torch.device("accel:1")
    assert isinstance(y, torch.accel.LongTensor) and not isinstance(y, torch.accel.FloatTensor)
    assert not isinstance(torch.ones(2), torch.accel.FloatTensor)  # a CPU tensor
    assert isinstance(x, torch.Tensor) and x.type() == "torch.accel.FloatTensor"
    assert torch.ones(2).type("torch.accel.HalfTensor").device.type == "accel"
    assert repr(torch.accel.FloatTensor) == "<class 'torch.accel.FloatTensor'>"


def test_device_type_is_renamed_and_methods_are_generated():
    assert torch._C._get_privateuse1_backend_name() == "accel"
    assert str(torch.device("privateuseone:1")) == "accel:1"
    t = torch.ones(2)
    assert not t.is_accel
    a = t.accel()
    assert a.is_accel and a.device == torch.device("accel:0")
    assert t.accel(1).device == torch.device("accel:1")
    m = torch.nn.Linear(2, 3).accel(1)
    assert all(p.device == torch.device("accel:1") for p in m.parameters())
    s = torch.UntypedStorage(8).accel()
    assert s.is_accel and s.device == torch.device("accel:0")
    seq = pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    moved = seq.accel()
    assert moved.is_accel and moved.data.device.type == "accel"
    torch.testing.assert_close(moved.data.cpu(), seq.data)


def test_device_count_properties_and_capability():
    assert torch.accel.is_available()
    n = torch.accel.device_count()
    assert n >= 1
    props = torch.accel.get_device_properties(n - 1)
    assert props.name == torch.accel.get_device_name(n - 1)
    assert props.multi_processor_count >= 1
    assert props.driver == torch_accel.driver()
    assert torch.accel.get_device_capability(n - 1) == (props.major, props.minor)
    assert props.name in repr(props)
    if props.driver == "host":  # the host driver's defaults
        assert n == 2
        assert props.name == "accel host device 1"
        assert props.total_memory == 4 << 30
        assert (props.major, props.minor) == (1, 0)
    with pytest.raises(RuntimeError, match=f"invalid device index {n}"):
        torch.accel.get_device_properties(n)
    with pytest.raises(RuntimeError, match="invalid device index -1"):
        torch.accel.get_device_properties(-1)  # torch.cuda refuses negative indices too
    assert torch.accel.get_device_properties(None) == torch.accel.get_device_properties(0)
    with pytest.raises(ValueError, match="Expected an accel device"):
        torch.accel.get_device_properties("cuda:0")
    # torch.accelerator's capability: every dtype but the quantized ones (accel has no quantized
    # tensors), for the current device or a valid index; past the last device the error as above.
    dtypes = torch.accelerator.get_device_capability()["supported_dtypes"]
    assert torch.bfloat16 in dtypes and torch.float8_e4m3fn in dtypes and torch.quint8 not in dtypes
    assert torch.accelerator.get_device_capability(n - 1)["supported_dtypes"] == dtypes
    for bad, index in ((n, n), (f"accel:{n + 5}", n + 5)):
        with pytest.raises(RuntimeError, match=f"invalid device index {index}: there are {n}"):
            torch.accelerator.get_device_capability(bad)


def test_device_uuids_are_distinct_and_stable_across_processes(run_python):
    import uuid

    uuids = [torch.accel.get_device_properties(i).uuid for i in range(torch.accel.device_count())]
    assert len(set(uuids)) == len(uuids)
    for u in uuids:
        assert str(uuid.UUID(u)) == u  # torch.cuda's str(uuid) form: 8-4-4-4-12 hex digits
        assert u != str(uuid.UUID(int=0))
        assert u in repr(torch.accel.get_device_properties(uuids.index(u)))
    code = "import torch, torch_accel; print(torch.accel.get_device_properties(1).uuid)"
    same_driver = {k: v for k, v in os.environ.items() if k.startswith("ACCEL_")}
    result = run_python(code, **same_driver)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == uuids[1]  # the same device in another process


def test_current_device_and_context_managers():
    assert torch.accel.current_device() == 0
    torch.accel.set_device(1)
    try:
        assert torch.accel.current_device() == 1
        assert torch.empty(1, device="accel").device == torch.device("accel:1")
        with torch.accel.device(0):
            assert torch.accel.current_device() == 0
            assert torch.empty(1, device="accel").device == torch.device("accel:0")
        assert torch.accel.current_device() == 1
        x = torch.empty(1, device="accel:0")
        with torch.accel.device_of(x):
            assert torch.accel.current_device() == 0
        with torch.accel.device(None):
            assert torch.accel.current_device() == 1
        with torch.accel.device_of(torch.empty(1)):  # a CPU tensor changes nothing
            assert torch.accel.current_device() == 1
    finally:
        torch.accel.set_device(0)
    torch.accel.set_device(-1)  # a negative index does nothing, as in CUDA
    assert torch.accel.current_device() == 0
    # torch.cuda's functions take its device objects as devices too.
    one = torch.accel.device(1)
    assert torch.accel.get_device_name(one) == torch.accel.get_device_name(1)
    assert torch.accel.memory_allocated(one) == torch.accel.memory_allocated(1)
    with torch.accel.device(one):
        assert torch.accel.current_device() == 1
    torch.accel.synchronize(one)
    with pytest.raises(ValueError, match="Expected an accel device"):
        torch.accel.synchronize(object())


def test_torch_accelerator_sees_accel():
    assert torch.accelerator.current_accelerator() == torch.device("accel")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 2
    torch.accelerator.set_device_index(1)
    try:
        assert torch.accelerator.current_device_index() == 1 == torch.accel.current_device()
        with torch.accelerator.device_index(0):
            assert torch.accel.current_device() == 0
        assert torch.accel.current_device() == 1
    finally:
        torch.accelerator.set_device_index(0)
    x = torch.ones(1000, device="accel") * 2
    torch.accelerator.synchronize()
    assert x.sum().item() == 2000


def test_bad_device_index_is_a_clear_error_and_the_device_stays_usable():
    for call in (
        lambda: torch.empty(1, device="accel:5"),
        lambda: torch.ones(2).to("accel:2"),
        lambda: torch.accel.set_device(7),
        lambda: torch.accelerator.set_device_index(3),
    ):
        with pytest.raises(RuntimeError, match=r"invalid device index \d: there are 2 accel"):
            call()
    assert torch.accel.current_device() == 0
    assert torch.ones(3, device="accel").sum().item() == 3


def test_four_threads_switch_devices_concurrently():
    errors: list[str] = []

    def work(seed: int) -> None:
        try:
            for i in range(50):
                d = (seed + i) % 2
                torch.accel.set_device(d)
                t = torch.full((8,), float(i), device="accel")
                if t.device.index != d or torch.accel.current_device() != d:
                    errors.append(f"thread {seed}: expected accel:{d}, got {t.device}")
                if t.sum().item() != 8.0 * i:
                    errors.append(f"thread {seed}: wrong value")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert torch.accel.current_device() == 0  # other threads' devices are their own


def test_initialization_is_lazy(run_python):
    code = """
import torch
import torch_accel
print(torch.accel.is_initialized(), torch_accel._C.is_initialized())
x = torch.ones(2, device="accel")
print(torch.accel.is_initialized(), torch_accel._C.is_initialized())
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True", "True"]


_QUEUED_AT_EXIT = """
import torch, torch_accel
F = torch.nn.functional
x = torch.randn(8, 16, 64, 64, device="accel")
w = torch.randn(32, 16, 3, 3, device="accel")
F.conv2d(x, w).sum().item()  # oneDNN's primitive cache, a C++ static, exists from here
torch.accel._sleep(1_000_000)
for _ in range(40):
    y = F.conv2d(x, w)
print("exiting with work queued")
"""


def test_work_queued_at_exit_runs_before_the_libraries_it_calls_go(run_python):
    # A script that ends without synchronizing: its queued kernels run to their end at the
    # interpreter's exit (torch_accel._finish_queued_work). Before, the stream's worker ran them
    # while C++ static destructors freed oneDNN's primitives: SIGSEGV in 2 runs of 3 here, and
    # after every ResNet-18 training step left queued.
    for _ in range(3):
        run = run_python(_QUEUED_AT_EXIT)
        assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
        assert "exiting with work queued" in run.stdout


def test_plain_import_torch_autoloads_and_can_be_disabled(run_python):
    loaded = run_python(
        "import sys, torch; print(hasattr(torch, 'accel'), torch.accel.device_count(), "
        "[m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules])"
    )
    assert loaded.returncode == 0, loaded.stderr
    # Nor does it import Dynamo or Inductor (2 s and more of every import torch): torch_accel
    # registers with them once they are imported (_import_hook.py).
    assert loaded.stdout.split() == ["True", "2", "[]"]
    disabled = run_python(
        "import torch; print(hasattr(torch, 'accel'))", TORCH_DEVICE_BACKEND_AUTOLOAD="0"
    )
    assert disabled.returncode == 0, disabled.stderr
    assert disabled.stdout.strip() == "False"
    # Importing torch_accel first (whose import of torch autoloads it) also works.
    first = run_python("import torch_accel, torch; print(torch.accel.device_count())")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "2"


def test_unusable_runtime_keeps_import_working(run_python):
    code = """
import torch
print(torch.accel.is_available(), torch.accel.device_count())
try:
    torch.ones(2, device="accel")
except RuntimeError as e:
    print("error:", e)
"""
    result = run_python(code, ACCEL_DRIVER="bogus")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "False 0"
    assert "ACCEL_DRIVER=bogus" in lines[1]


def test_bad_fallback_setting_fails_the_import(run_python):
    result = run_python("import torch_accel", ACCEL_FALLBACK="sometimes")
    assert result.returncode != 0
    assert "ACCEL_FALLBACK='sometimes' is not one of" in result.stderr


def test_sensors_and_the_process_list():
    # The host driver: utilization measured from its stream workers (the share of the last
    # second during which a task ran), memory used as mapped; no hardware sensors.
    x = torch.ones(1 << 20, device="accel:1")  # 4 MiB
    try:
        used = torch.accel.device_memory_used(1)
    except NotImplementedError as e:  # a GPU driver without NVIDIA's library (an emulated GPU)
        if torch_accel.driver() == "host" or "NVML" not in str(e):
            raise
        pytest.skip(str(e))
    free, total = torch.accel.mem_get_info(1)
    assert used >= x.numel() * 4
    listing = torch.accel.list_gpu_processes(1).splitlines()
    assert listing[0] == "GPU:1"
    mine = [line for line in listing[1:] if line.split()[1] == str(os.getpid())]
    assert len(mine) == 1 and float(mine[0].split()[3]) * (1 << 20) >= x.numel() * 4
    if torch_accel.driver() != "host":
        assert torch.accel.temperature(1) > 0 and torch.accel.clock_rate(1) > 0
        return
    assert used == total - free
    for name in ("temperature", "power_draw", "clock_rate"):
        with pytest.raises(NotImplementedError, match=f"no {name.replace('_', ' ')} sensor"):
            getattr(torch.accel, name)(1)
    with pytest.raises(NotImplementedError, match="no memory utilization"):
        torch.accel.memory_usage(1)
    with pytest.raises(RuntimeError, match="invalid device index"):
        torch.accel.utilization(5)
    # Busy: about half a second of matrix products on one stream; then idle for a second.
    a = torch.randn(768, 768, device="accel:1")
    torch.accel.synchronize(1)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:
        for _ in range(4):
            a = (a @ a).tanh_()
        torch.accel.synchronize(1)
    assert torch.accel.utilization(1) >= 30
    time.sleep(1.25)
    assert torch.accel.utilization(1) == 0
