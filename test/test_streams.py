"""Streams through torch.accel, torch.Stream and torch.accelerator."""

from __future__ import annotations

import pytest
import torch

import torch_accel
from helpers import assert_same


def test_default_and_current_streams():
    s0 = torch.accel.default_stream(0)
    assert s0.stream_id == 0 and s0.device == torch.device("accel:0")
    assert torch.accel.current_stream() == s0
    assert torch.accel.default_stream(1).device_index == 1
    assert torch.accelerator.current_stream() == s0


def test_stream_context_and_set_stream():
    s = torch.accel.Stream()
    assert isinstance(s, torch.Stream)
    assert s.stream_id != 0 and s.device.type == "accel"
    with torch.accel.stream(s):
        assert torch.accel.current_stream() == s
        assert torch.accelerator.current_stream() == s
        x = torch.full((1000,), 3.0, device="accel")
    assert torch.accel.current_stream() == torch.accel.default_stream()
    s.synchronize()
    assert s.query()
    assert x.sum().item() == 3000
    torch.accel.set_stream(s)
    try:
        assert torch.accel.current_stream() == s
    finally:
        torch.accel.set_stream(torch.accel.default_stream())
    with torch.accel.stream(None):  # no-op
        assert torch.accel.current_stream() == torch.accel.default_stream()


def test_stream_context_on_another_device_restores_both_devices():
    s1 = torch.accel.Stream(device=1)
    assert s1.device_index == 1
    with torch.accel.stream(s1):
        assert torch.accel.current_device() == 1
        assert torch.accel.current_stream() == s1
        y = torch.ones(4, device="accel")
    assert y.device == torch.device("accel:1")
    assert torch.accel.current_device() == 0
    assert torch.accel.current_stream(1) == torch.accel.default_stream(1)


def test_generic_torch_stream_and_priorities():
    s = torch.Stream(device="accel:1", priority=-1)
    assert s.device == torch.device("accel:1")
    s2 = torch.accel.Stream(priority=-2)
    assert s2.device_index == 0
    # torch.cuda.Stream's priority and priority_range: lower is higher, out-of-range clamps.
    least, greatest = torch.accel.Stream.priority_range()
    assert least == 0 and greatest < 0
    assert s2.priority == max(-2, greatest)
    assert torch.accel.Stream(priority=-100).priority == greatest
    assert torch.accel.Stream(priority=5).priority == least
    assert torch.accel.Stream.priority.__get__(s) == max(-1, greatest)  # a plain torch.Stream's
    assert torch.accel.default_stream().priority == 0
    wrapped = torch.accel.Stream(stream_id=s.stream_id, device_index=1, device_type=s.device_type)
    assert wrapped == s
    s.synchronize()
    assert s.query()


def test_streams_have_native_handles():
    # The driver's handle (cudaStream_t on the cuda driver), what Inductor and NCCL are given.
    a, b = torch.accel.Stream(), torch.accel.Stream()
    handles = {s.native_handle for s in (a, b, torch.accel.default_stream(0))}
    assert len(handles) == 3 and 0 not in handles
    assert a.native_handle == a.native_handle
    with torch.accel.stream(a):
        assert torch.accel.current_stream().native_handle == a.native_handle
    assert torch.accel.default_stream(1).native_handle not in handles


def test_wait_stream_orders_work_between_streams():
    producer, consumer = torch.accel.Stream(), torch.accel.Stream()
    base = torch.arange(100_000, dtype=torch.float32)
    with torch.accel.stream(producer):
        x = base.to("accel")
        for _ in range(5):
            x.mul_(2)
    consumer.wait_stream(producer)
    with torch.accel.stream(consumer):
        y = x + 1
    consumer.synchronize()
    assert_same(y, base * 32 + 1)


def test_fills_are_enqueued_and_synchronize_completes_them():
    # (That query() is False while a task runs is checked deterministically, with a gate, by
    # the runtime's C++ tests; from Python only timing could show it.)
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        x = torch.ones(2_000_000, device="accel")
        for i in range(20):
            x.fill_(float(i))
    s.synchronize()
    assert s.query()
    assert x.sum().item() == 19.0 * 2_000_000


def test_invalid_streams_are_rejected():
    with pytest.raises(RuntimeError, match="invalid device index 4"):
        torch.accel.Stream(device=4)
    with pytest.raises(ValueError, match="Expected an accel device"):
        torch.accel.current_stream("cpu")
    bogus = torch.accel.Stream(stream_id=(123456 << 32) | 1, device_index=0, device_type=20)
    with pytest.raises(RuntimeError, match="is not a valid stream"):
        bogus.synchronize()


def test_external_stream_of_an_accel_handle_is_that_stream():
    a = torch.accel.Stream(device=1)
    ext = torch.accel.ExternalStream(a.native_handle, device=1)
    assert isinstance(ext, torch.accel.Stream) and isinstance(ext, torch.Stream)
    assert ext == a and ext.stream_id == a.stream_id and ext.device_index == 1
    assert torch.accel.get_stream_from_external(a.native_handle, 1) == a
    # Work on the wrapper is work on the stream: ordered with another stream by wait_stream.
    base = torch.arange(10_000, dtype=torch.float32)
    with torch.accel.stream(ext):
        x = base.to("accel:1") * 3
    consumer = torch.accel.Stream(device=1)
    consumer.wait_stream(a)
    with torch.accel.stream(consumer):
        y = x + 1
    consumer.synchronize()
    assert_same(y, base * 3 + 1)


def test_external_stream_refuses_what_it_cannot_wrap():
    a = torch.accel.Stream(device=1)
    with pytest.raises(RuntimeError, match="not of a stream of device 0"):
        torch.accel.ExternalStream(a.native_handle, device=0)
    with pytest.raises(RuntimeError, match="null handle"):
        torch.accel.ExternalStream(0)
    if torch_accel.driver() == "host":
        # A handle that no live accel stream has: the host driver has no other streams.
        with pytest.raises(NotImplementedError, match="cannot adopt a stream it did not create"):
            torch.accel.ExternalStream(0x1234)
