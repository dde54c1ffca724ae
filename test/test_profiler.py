"""torch.profiler on accel: device activity through accel's Kineto child profiler (when each
task ran on its stream worker, on a track per stream, linked to the operator that launched it),
memory events, and torch.accel.profiler range markers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_accel  # noqa: F401

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _work(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    x = x + torch.ones(256, device="cpu").to("accel")  # a copy from the host
    y = x @ x
    z = torch.relu(y) + 1
    side.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(side):
        s = z.sum()
    torch.accel.current_stream().wait_stream(side)
    return s


def _profiled(tmp_path: Path, activities: list[ProfilerActivity]) -> tuple[profile, dict, float]:
    x = torch.randn(256, 256, device="accel")
    side = torch.accel.Stream()
    for _ in range(2):  # the first call of each signature runs on the caller (see underlying.cpp)
        _work(x, side)
    torch.accel.synchronize()
    with profile(activities=activities, profile_memory=True) as prof:
        start = time.perf_counter()
        with torch.accel.profiler.range("accel-region"):
            s = _work(x, side)
        torch.accel.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    xc = x.cpu() + 1
    torch.testing.assert_close(s.cpu(), (torch.relu(xc @ xc) + 1).sum(), rtol=1e-4,
                               atol=1e-2)  # fmt: skip
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return prof, json.loads(path.read_text()), wall_us


def test_device_activity_runs_on_stream_tracks_within_the_wall_time(tmp_path: Path) -> None:
    prof, trace, wall_us = _profiled(tmp_path, BOTH)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    names = {e["name"] for e in kernels}
    assert {"aten::mm", "aten::relu", "aten::add.Tensor", "aten::sum.dim_IntList"} <= names, names
    device = torch.accel.current_device()
    assert all(e["pid"] == device for e in kernels)
    by_name = {e["name"]: e for e in kernels}
    # sum ran on the side stream, the others on the default stream: two tracks.
    assert by_name["aten::sum.dim_IntList"]["tid"] != by_name["aten::mm"]["tid"]
    assert by_name["aten::mm"]["tid"] == by_name["aten::relu"]["tid"]
    tracks = {e["tid"] for e in kernels}
    names_of_tracks = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == device
    }
    assert names_of_tracks.get(by_name["aten::mm"]["tid"]) == "default stream"
    assert tracks <= set(names_of_tracks)
    for tid in tracks:
        on_track = sorted((e for e in kernels if e["tid"] == tid), key=lambda e: e["ts"])
        assert sum(e["dur"] for e in on_track) <= wall_us
        for a, b in zip(on_track, on_track[1:], strict=False):  # one stream: no overlap
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    # The host-to-device copy, on the default stream, as a copy event of aten::copy_.
    copies = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert any(e["name"] == "Memcpy HtoD" and e["pid"] == device for e in copies), copies
    assert all(e["tid"] == by_name["aten::mm"]["tid"] for e in copies)
    # Device time is attributed to the operators that launched the work.
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total > 0
    assert averages["aten::copy_"].device_time_total > 0
    # (the innermost operator active at launch gets it: aten::sum or, under
    # ACCEL_LAUNCH_BLOCKING, the out= variant it runs)
    assert any(k.startswith("aten::sum") and v.device_time_total > 0 for k, v in averages.items())
    assert averages["accel-region"].device_time_total >= averages["aten::mm"].device_time_total
    device_events = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert {"aten::mm", "aten::sum.dim_IntList"} <= {e.name for e in device_events}
    # Launch-to-run arrows from the operators to their kernels.
    flows = [e for e in trace["traceEvents"] if e.get("ph") in ("s", "f")]
    assert any(e["ph"] == "f" and e["pid"] == device for e in flows)
    # The range marker and memory of accel.
    assert any(e.get("name") == "accel-region" for e in trace["traceEvents"])
    memory = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    accel_memory = [
        e for e in memory if e["args"].get("Device Type") == int(DeviceType.PrivateUse1)
    ]
    assert accel_memory and any(e["args"]["Bytes"] > 0 for e in accel_memory)
    assert any(e.self_device_memory_usage > 0 for e in prof.key_averages())


def test_cpu_only_profiling_records_no_device_activity(tmp_path: Path) -> None:
    prof, trace, _ = _profiled(tmp_path, [ProfilerActivity.CPU])
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    assert all(e.device_type == DeviceType.CPU for e in prof.events())


def test_range_markers_nest_and_check_their_ids() -> None:
    p = torch.accel.profiler
    assert torch.accel.nvtx is p
    assert p.range_pop() == -1  # nothing open
    assert p.range_push("outer") == 0
    assert p.range_push("inner") == 1
    assert p.range_pop() == 1
    assert p.range_pop() == 0
    rid = p.range_start("free-standing")
    p.range_end(rid)
    with pytest.raises(ValueError, match="no accel profiler range"):
        p.range_end(rid)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with p.range("step {}", 3):
            torch.ones(2, device="accel").add_(1)
        p.mark("done")
    names = {e.name for e in prof.events()}
    assert {"step 3", "done"} <= names


def test_legacy_profiler_times_operators_with_accel_events() -> None:
    # torch.autograd.profiler.profile(use_device="accel") without Kineto: PyTorch's PrivateUse1
    # profiler stubs (timing events on the current stream around each operator).
    x = torch.randn(256, 256, device="accel")
    for _ in range(2):
        x @ x
    with torch.autograd.profiler.profile(use_device="accel") as prof:
        y = x @ x
        torch.accel.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total > 0
    assert averages["aten::matmul"].device_time_total >= averages["aten::mm"].self_device_time_total


def test_a_global_observer_records_the_operator_and_not_its_task(tmp_path: Path) -> None:
    # PyTorch's execution trace observer registers a global RecordFunction callback, which sees
    # every thread: the stream worker's CPU kernel (add.out, named aten::add) is the device work
    # of the accel operator, not a second operator, on a second thread.
    a, b = torch.randn(8, 8, device="accel"), torch.randn(8, 8, device="accel")
    a + b  # the signature's first call, synchronous, before observing
    torch.accel.synchronize()
    path = tmp_path / "et.json"
    observer = torch.profiler.ExecutionTraceObserver().register_callback(str(path))
    observer.start()
    for _ in range(3):
        c = a + b
    torch.accel.synchronize()
    observer.stop()
    observer.unregister_callback()
    torch.testing.assert_close(c.cpu(), a.cpu() + b.cpu())
    names = [n["name"] for n in json.loads(path.read_text())["nodes"]]
    assert names.count("aten::add") == 3, names
    assert names.count("[pytorch|profiler|execution_trace|thread]") == 1, names
