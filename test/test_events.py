"""Events: record, wait, query, synchronize, elapsed time, through torch.accel and torch.Event."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same


def test_record_synchronize_query_and_elapsed_time():
    start = torch.accel.Event(enable_timing=True)
    end = torch.accel.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    assert start.query()  # never recorded
    start.record()
    x = torch.ones(1_000_000, device="accel")
    for _ in range(10):
        x.fill_(2.0)
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert ms > 0.0
    assert start.elapsed_time(end) == pytest.approx(-end.elapsed_time(start))


def test_a_completed_last_event_leaves_its_stream_idle():
    # test_cuda.py's test_stream_event_nogil and test_events_wait: once the last work recorded on
    # a stream has completed, the stream is idle (cudaStreamQuery), and a synchronized stream's
    # events are complete. The event used to complete before its stream counted the marker done.
    x = torch.ones(1000, device="accel")
    s = torch.accel.current_stream()
    side = torch.accel.Stream()
    busy_after_event = busy_event_after_stream = 0
    for _ in range(500):
        x.add_(1)
        e = torch.accel.Event()
        e.record(s)
        e.synchronize()
        busy_after_event += not s.query()
        with torch.accel.stream(side):
            x.add_(1)
            e2 = side.record_event()
        side.synchronize()
        busy_event_after_stream += not e2.query()
    assert (busy_after_event, busy_event_after_stream) == (0, 0)


def test_elapsed_time_errors_name_the_problem():
    untimed = torch.accel.Event()
    timed = torch.accel.Event(enable_timing=True)
    with pytest.raises(ValueError, match="both events must be recorded"):
        untimed.elapsed_time(timed)
    untimed.record()
    timed.record()
    torch.accel.synchronize()
    with pytest.raises(RuntimeError, match="created without timing"):
        untimed.elapsed_time(timed)


def test_event_wait_orders_streams_and_devices():
    s0, s1 = torch.accel.Stream(device=0), torch.accel.Stream(device=1)
    ready = torch.accel.Event()
    with torch.accel.stream(s0):
        x = torch.full((50_000,), 2.0, device="accel:0")
        x.mul_(3)
        ready.record()
    ready.wait(s1)
    with torch.accel.stream(s1):
        y = x.to("accel:1") + 1  # cross-device copy waits for s0's work
    s1.synchronize()
    assert y.device == torch.device("accel:1")
    assert_same(y, torch.full((50_000,), 7.0))


def test_generic_torch_event():
    e = torch.Event(device="accel", enable_timing=True)
    f = torch.Event(device="accel", enable_timing=True)
    e.record()
    torch.ones(10, device="accel").fill_(1)
    f.record()
    f.synchronize()
    assert e.elapsed_time(f) >= 0.0
    assert e.device.type == "accel"


def test_stream_record_event_and_wait_event():
    s1, s2 = torch.accel.Stream(), torch.accel.Stream()
    with torch.accel.stream(s1):
        x = torch.arange(10.0, device="accel") * 4
    ev = s1.record_event()
    s2.wait_event(ev)
    with torch.accel.stream(s2):
        y = x - 1
    s2.synchronize()
    assert_same(y, torch.arange(10.0) * 4 - 1)


def test_streams_record_accel_events_as_cuda_streams_record_cuda_events():
    # torch.Stream.record_event refuses subclasses of torch.Event ("expected event to be a
    # torch.Event object"); torch.accel.Stream records them, and makes one when given none.
    s1, s2 = torch.accel.Stream(), torch.accel.Stream()
    timed = torch.accel.Event(enable_timing=True), torch.accel.Event(enable_timing=True)
    assert s1.record_event(timed[0]) is timed[0]
    with torch.accel.stream(s1):
        x = torch.arange(10.0, device="accel") * 4
    ev = s1.record_event()
    assert isinstance(ev, torch.accel.Event)
    s1.record_event(timed[1])
    s2.wait_event(ev)
    with torch.accel.stream(s2):
        y = x - 1
    s2.synchronize()
    assert_same(y, torch.arange(10.0) * 4 - 1)
    assert ev.query()
    timed[1].synchronize()  # recorded on s1 after ev: s2's wait for ev does not cover it
    assert timed[0].elapsed_time(timed[1]) >= 0.0
    # A plain torch.Stream keeps torch's rule (the same as for torch.cuda.Event).
    with pytest.raises(RuntimeError, match="expected event to be a torch.Event object"):
        torch.accelerator.current_stream().record_event(torch.accel.Event())
