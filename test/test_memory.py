"""Memory statistics, the caching allocator seen from PyTorch, OOM, pinned memory."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_accel
from helpers import LAUNCH_BLOCKING, assert_same, pending_behind_a_sleep

MiB = 1 << 20


def _fresh(device: int) -> None:
    gc.collect()  # tensors earlier tests left in reference cycles free now, not mid-test
    torch.accel.synchronize(device)
    torch.accel.empty_cache()
    torch.accel.reset_peak_memory_stats(device)


def test_allocated_reserved_and_peak_follow_tensors():
    _fresh(1)
    base = torch.accel.memory_allocated(1)
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="accel:1")
    assert torch.accel.memory_allocated(1) == base + 3 * MiB
    assert torch.accel.memory_reserved(1) >= torch.accel.memory_allocated(1)
    y = torch.empty(MiB // 4, dtype=torch.float32, device="accel:1")
    peak = torch.accel.max_memory_allocated(1)
    assert peak == base + 4 * MiB
    del x, y
    assert torch.accel.memory_allocated(1) == base
    assert torch.accel.max_memory_allocated(1) == peak
    reserved = torch.accel.memory_reserved(1)
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved(1) < reserved
    torch.accel.reset_peak_memory_stats(1)
    assert torch.accel.max_memory_allocated(1) == base


def test_torch_accelerator_memory_functions_agree():
    _fresh(0)
    x = torch.empty(MiB, dtype=torch.uint8, device="accel:0")
    stats = torch.accelerator.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == torch.accel.memory_allocated(0)
    assert torch.accelerator.memory_allocated(0) == torch.accel.memory_allocated(0)
    assert torch.accelerator.memory_reserved(0) == torch.accel.memory_reserved(0)
    assert torch.accelerator.max_memory_allocated(0) == torch.accel.max_memory_allocated(0)
    free, total = torch.accelerator.get_memory_info(0)
    assert total == 4 << 30 and 0 < free <= total
    assert torch.accel.mem_get_info(0) == (free, total)
    assert torch.accel.memory_stats(0) == dict(sorted(stats.items()))
    del x
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == torch.accel.memory_allocated(0)


def test_out_of_memory_raises_torch_oom_and_memory_can_be_used_after():
    _fresh(1)
    ooms = torch.accel.memory_stats(1)["num_ooms"]  # accumulated: earlier tests' count too
    # torch.accel.OutOfMemoryError is torch's, as torch.cuda.OutOfMemoryError is.
    oom = r"accel out of memory\. Tried to allocate 5\.00 GiB.* on device 1\."
    with pytest.raises(torch.accel.OutOfMemoryError, match=oom):
        torch.empty(5 << 30, dtype=torch.uint8, device="accel:1")
    a = torch.empty(3 << 30, dtype=torch.uint8, device="accel:1")
    with pytest.raises(torch.OutOfMemoryError, match="3.00 GiB allocated"):
        torch.empty(2 << 30, dtype=torch.uint8, device="accel:1")
    del a
    b = torch.empty(2 << 30, dtype=torch.uint8, device="accel:1")
    assert b.numel() == 2 << 30
    del b
    # A size larger than any device (2**60 floats) is out of memory too, as on CUDA; it used to
    # be a RuntimeError that recovery code (batch-size finders) did not recognize.
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 4\.00 EiB"):
        torch.empty(2**60, device="accel:1")
    assert torch.accel.memory_stats(1)["num_ooms"] == ooms + 3


def test_pin_memory_and_is_pinned():
    t = torch.arange(16.0)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned() and torch.equal(p, t)
    e = torch.empty(8, pin_memory=True)
    assert e.is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="accel").pin_memory()
    assert not torch.ones(2, device="accel").is_pinned()


def test_non_blocking_pinned_copies_are_correct_after_synchronize():
    src = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        dev = src.to("accel", non_blocking=True)
        dev.mul_(2)
        back = torch.empty_like(src).pin_memory()
        back.copy_(dev, non_blocking=True)
    s.synchronize()
    torch.testing.assert_close(back, src * 2)


@pytest.mark.parametrize("convert", ["dtype", "layout", "conjugate"])
def test_non_blocking_converting_upload_reads_the_pinned_source_in_stream_order(convert) -> None:
    # test_cuda.py's test_copy_non_blocking_type_conversion: a non-blocking download into pinned
    # memory, then a non-blocking upload of it that converts. The upload must read what the
    # download wrote: CUDA converts on the device for non-blocking copies.
    shape = (2, 3, 4, 5)
    values = torch.arange(120.0).view(shape) + (1j if convert == "conjugate" else 0)
    a = values.to("accel")
    b = torch.zeros(shape, dtype=a.dtype, pin_memory=True)
    dst = {
        "dtype": lambda: torch.empty(shape, dtype=torch.long, device="accel"),
        "layout": lambda: torch.empty(shape, device="accel").to(memory_format=torch.channels_last),
        "conjugate": lambda: torch.empty(shape, dtype=torch.complex64, device="accel"),
    }[convert]()
    torch.accel._sleep(100_000_000)  # the stream is busy for 0.1 s, then downloads
    b.copy_(a, non_blocking=True)
    src = b.conj() if convert == "conjugate" else b
    dst.copy_(src, non_blocking=True)
    want = values.conj() if convert == "conjugate" else values
    assert torch.equal(dst.cpu(), want.to(dst.dtype))


def test_non_blocking_converting_download_into_pinned_memory_does_not_wait() -> None:
    a = torch.arange(1 << 16, dtype=torch.float32, device="accel")
    out = torch.zeros(1 << 16, dtype=torch.float64, pin_memory=True)
    # Once before the timed part: a first call's one-time costs (on the emulated cuda driver,
    # torch's CUDA looking for a GPU) outlasted the 0.1 s sleep after a fresh build.
    out.copy_(a, non_blocking=True)
    torch.accel.synchronize()
    out.zero_()
    if torch_accel.executor()[0] == "none":
        # No executor (the emulated cuda driver's lane): the conversion is a round trip through
        # the host that waits for the stream, as every operator there; only the download queues.
        out.copy_(a, non_blocking=True)
    else:  # converted on the device, then downloaded, both queued behind the sleep
        pending, _ = pending_behind_a_sleep(
            lambda: out.copy_(a, non_blocking=True), torch.accel.current_stream().query
        )
        assert pending != LAUNCH_BLOCKING  # launch-blocking ran it all
    torch.accel.synchronize()
    assert torch.equal(out, torch.arange(1 << 16, dtype=torch.float64))
    pageable = torch.zeros(1 << 16, dtype=torch.float64)
    torch.accel._sleep(50_000_000)
    pageable.copy_(a, non_blocking=True)  # pageable memory: waits, as CUDA's
    assert torch.equal(pageable, torch.arange(1 << 16, dtype=torch.float64))


def test_dataloader_pins_batches_for_accel():
    ds = TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    loader = DataLoader(ds, batch_size=4, pin_memory=True)
    total = torch.zeros(2, device="accel")
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        total += xb.to("accel", non_blocking=True).sum(0)
    torch.accel.synchronize()
    assert_same(total, torch.arange(20.0).view(10, 2).sum(0))


def test_record_stream_keeps_memory_for_the_other_stream():
    side = torch.accel.Stream()
    x = torch.arange(1 << 16, dtype=torch.float32, device="accel")
    side.wait_stream(torch.accel.current_stream())  # x is written on the current stream
    with torch.accel.stream(side):
        y = x * 2  # reads x on another stream
    x.record_stream(side)
    del x  # freed, but not reused before `side` passes this point
    z = torch.zeros(1 << 16, device="accel")
    side.synchronize()
    assert_same(y, torch.arange(1 << 16, dtype=torch.float32) * 2)
    assert_same(z, torch.zeros(1 << 16))


def test_non_blocking_upload_from_pageable_memory_is_staged():
    src = torch.arange(1 << 18, dtype=torch.float32)
    dst = src.to("accel", non_blocking=True)
    src.zero_()  # the caller may reuse the source at once
    torch.accel.synchronize()
    assert_same(dst, torch.arange(1 << 18, dtype=torch.float32))
