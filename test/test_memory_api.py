"""torch.cuda's memory tools on accel: history, snapshots PyTorch's viewer reads, summaries,
the per-process memory fraction, out-of-memory observers, raw allocations, pinned statistics."""

from __future__ import annotations

import gc
import pickle
import runpy
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torch_accel

ACCEL = torch.device("accel")


@pytest.fixture
def history() -> Iterator[None]:
    torch.accel.memory._record_memory_history(stacks="python", max_entries=10_000)
    try:
        yield
    finally:
        torch.accel.memory._record_memory_history(enabled=None)


def _allocate_in_a_named_function() -> torch.Tensor:
    return torch.empty(300, 1000, device=ACCEL)


def test_history_records_allocations_with_python_frames(history) -> None:
    x = _allocate_in_a_named_function()
    address, size = x.data_ptr(), x.numel() * 4
    del x
    torch.accel.synchronize()
    snap = torch.accel.memory._snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    trace = snap["device_traces"][0]
    alloc = [e for e in trace if e["action"] == "alloc" and e["addr"] == address]
    assert alloc and alloc[-1]["size"] >= size
    names = [f["name"] for f in alloc[-1]["frames"]]
    assert "_allocate_in_a_named_function" in names
    assert any(f["filename"].endswith("test_memory_api.py") for f in alloc[-1]["frames"])
    actions = [e["action"] for e in trace if e["addr"] == address]
    assert "free_requested" in actions and "free_completed" in actions
    seg = snap["segments"][0]
    assert {"address", "total_size", "allocated_size", "segment_type", "blocks", "device"} <= set(
        seg
    )
    for b in seg["blocks"]:
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")


def test_snapshot_blocks_match_live_tensors(history) -> None:
    keep = [torch.empty(1000 * (i + 1), device=ACCEL) for i in range(3)]
    segments = torch.accel.memory_snapshot()
    live = {
        b["address"]: b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"
    }
    for t in keep:
        block = live[t.data_ptr()]
        assert block["requested_size"] == t.numel() * 4
        assert any(f["name"] == "test_snapshot_blocks_match_live_tensors" for f in block["frames"])
    allocated = sum(b["size"] for b in live.values())
    assert allocated == torch.accel.memory_allocated()


def _memory_viz(monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    """Runs PyTorch's viewer as `python -m torch.cuda._memory_viz ARGV` does, in this process
    (each interpreter it started cost an import of torch: 4 of them, 35 s of a debug lane)."""
    monkeypatch.setattr(sys, "argv", ["_memory_viz.py", *argv])
    runpy.run_module("torch.cuda._memory_viz", run_name="__main__", alter_sys=False)


def test_dumped_snapshot_opens_in_pytorchs_viewer(
    history, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    x = _allocate_in_a_named_function()
    y = x * 2
    del x
    path = tmp_path / "snap.pickle"
    torch.accel.memory._dump_snapshot(str(path))
    with path.open("rb") as f:
        assert pickle.load(f)["device_traces"][0]
    for kind in ("trace_plot", "segment_plot"):
        html = tmp_path / f"{kind}.html"
        _memory_viz(monkeypatch, kind, str(path), "-o", str(html))
        text = html.read_text()
        assert "<html" in text.lower() and "snapshot.pickle" in text
    capsys.readouterr()
    _memory_viz(monkeypatch, "stats", str(path))
    assert "total_allocated" in capsys.readouterr().out
    _memory_viz(monkeypatch, "trace", str(path))
    assert "TOTAL MEM" in capsys.readouterr().out
    del y


def _free_in_a_named_function(holder: list[torch.Tensor]) -> None:
    holder.clear()


@pytest.mark.parametrize("context", ["state", "alloc", "all"])
def test_history_context_levels_follow_torch_cuda(context: str) -> None:
    """torch.cuda's `context`: "state" keeps frames only for the blocks allocated now, "alloc"
    also for the trace's events (a free carrying its allocation's), "all" a free its own."""
    torch.accel.memory._record_memory_history(context=context, stacks="python")
    try:
        holder = [_allocate_in_a_named_function()]
        kept = _allocate_in_a_named_function()  # its neighbour: the free merges nothing of it
        address = holder[0].data_ptr()
        _free_in_a_named_function(holder)
        snap = torch.accel.memory._snapshot()
    finally:
        torch.accel.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    by_action = {e["action"]: e for e in trace if e["addr"] == address}
    assert set(by_action) >= {"alloc", "free_requested", "free_completed"}

    def names(entry: dict) -> list[str]:
        return [f["name"] for f in entry["frames"]]

    if context == "state":
        assert all(e["frames"] == [] for e in trace)
    else:
        assert "_allocate_in_a_named_function" in names(by_action["alloc"])
        want = "_free_in_a_named_function" if context == "all" else "_allocate_in_a_named_function"
        for action in ("free_requested", "free_completed"):
            assert want in names(by_action[action]), (action, names(by_action[action]))
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == kept.data_ptr()]
    assert "_allocate_in_a_named_function" in [f["name"] for f in blocks[0]["frames"]]


def test_free_completed_names_the_freed_block_when_it_merges() -> None:
    # The entry used to be written after the block merged with a free neighbour, under the
    # neighbour's address: PyTorch's viewer then never saw that allocation end.
    torch.accel.memory._record_memory_history(stacks="python")
    try:
        a = torch.empty(1000, device=ACCEL)
        b = torch.empty(1000, device=ACCEL)
        address, size = b.data_ptr(), b.untyped_storage().nbytes()
        del a  # free first: b's free merges into it
        del b
        snap = torch.accel.memory._snapshot()
    finally:
        torch.accel.memory._record_memory_history(enabled=None)
    done = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert any(e["addr"] == address and e["size"] >= size for e in done)


def test_segment_and_memory_usage_drawings(
    history, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's drawings pipe stack lines ending in byte counts through flamegraph.pl, which it
    # downloads from GitHub into ~/.cache unless there: a stand-in there echoes its input.
    cache = tmp_path / ".cache"
    cache.mkdir()
    script = cache / "flamegraph.pl"
    script.write_text('#!/bin/sh\necho "<svg>"\ncat\necho "</svg>"\n')
    script.chmod(0o755)
    monkeypatch.setenv("HOME", str(tmp_path))
    x = _allocate_in_a_named_function()
    y = x + 1
    torch.accel.memory._save_segment_usage(str(tmp_path / "segments.svg"))
    torch.accel.memory._save_memory_usage(str(tmp_path / "memory.svg"))
    segments = (tmp_path / "segments.svg").read_text()
    memory = (tmp_path / "memory.svg").read_text()
    assert segments.startswith("<svg>") and memory.startswith("<svg>")
    assert "_allocate_in_a_named_function" in segments
    lines = segments.splitlines()[1:-1]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) >= 2 * 300 * 1000 * 4  # x and y
    assert len(memory.splitlines()) > 2
    del x, y


def test_history_options() -> None:
    with pytest.raises(ValueError, match="enabled"):
        torch.accel.memory._record_memory_history(enabled="sometimes")
    with pytest.raises(ValueError, match="stacks"):
        torch.accel.memory._record_memory_history(stacks="cpp")
    # "state": which allocation each block holds, without the event trace.
    torch.accel.memory._record_memory_history(enabled="state", stacks="python")
    try:
        x = _allocate_in_a_named_function()
        snap = torch.accel.memory._snapshot()
        assert not snap["device_traces"][0]
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == x.data_ptr()]
        assert any(f["name"] == "_allocate_in_a_named_function" for f in blocks[0]["frames"])
    finally:
        torch.accel.memory._record_memory_history(enabled=None)
    # Without history, a snapshot still lists the segments, with no frames.
    y = torch.empty(10, device=ACCEL)
    snap = torch.accel.memory._snapshot()
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == y.data_ptr()]
    assert blocks and blocks[0]["frames"] == []


def test_summary_and_nested_statistics() -> None:
    torch.accel.reset_peak_memory_stats()
    x = torch.empty(1 << 20, device=ACCEL)
    nested = torch.accel.memory_stats_as_nested_dict()
    flat = torch.accel.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    assert nested["num_ooms"] == flat["num_ooms"]
    summary = torch.accel.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    assert "from large pool" in summary
    assert "from large pool" not in torch.accel.memory_summary(abbreviated=True)
    peak = torch.accel.max_memory_allocated()
    assert peak >= 4 << 20 and torch.accel.max_memory_reserved() >= peak
    del x
    torch.accel.reset_max_memory_allocated()
    assert torch.accel.max_memory_allocated() == torch.accel.memory_allocated()


def test_memory_fraction_is_enforced_and_observers_see_the_failure() -> None:
    seen: list[tuple[int, int, int, int]] = []
    torch.accel.attach_out_of_memory_observer(lambda *args: seen.append(args))
    total = torch.accel.mem_get_info()[1]
    torch.accel.empty_cache()
    torch.accel.set_per_process_memory_fraction(0.02)
    try:
        assert torch.accel.get_per_process_memory_fraction() == pytest.approx(0.02, rel=1e-6)
        ok = torch.empty(int(total * 0.005), dtype=torch.uint8, device=ACCEL)
        with pytest.raises(torch.OutOfMemoryError, match="per-process memory fraction"):
            torch.empty(int(total * 0.05), dtype=torch.uint8, device=ACCEL)
        device, requested, allocated, free = seen[-1]
        assert (device, requested) == (0, int(total * 0.05))
        assert allocated >= ok.numel() and 0 < free <= total
        del ok
    finally:
        torch.accel.set_per_process_memory_fraction(1.0)
    big = torch.empty(int(total * 0.05), dtype=torch.uint8, device=ACCEL)  # allowed again
    del big
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            torch.accel.set_per_process_memory_fraction(bad)
    with pytest.raises(TypeError, match="callable"):
        torch.accel.attach_out_of_memory_observer(42)


def test_caching_allocator_alloc_and_delete() -> None:
    before = torch.accel.memory_allocated()
    ptr = torch.accel.caching_allocator_alloc(4096)
    assert ptr != 0 and torch.accel.memory_allocated() == before + 4096
    torch.accel.caching_allocator_delete(ptr)
    assert torch.accel.memory_allocated() == before
    with pytest.raises(torch_accel.AccelError, match="double free|not the start"):
        torch.accel.caching_allocator_delete(ptr)
    side = torch.accel.Stream(device=1)
    with pytest.raises(ValueError, match="accel:1"):
        torch.accel.caching_allocator_alloc(64, device=0, stream=side)
    ptr = torch.accel.caching_allocator_alloc(64, device=1, stream=side)
    torch.accel.caching_allocator_delete(ptr)


def test_caching_allocator_can_be_turned_off() -> None:
    assert torch.accel.caching_allocator_enabled()
    torch.accel.empty_cache()
    cached = torch.ones(1000, device="accel:1")  # allocated while caching: cached when freed
    try:
        torch.accel.caching_allocator_enable(False)
        assert not torch.accel.caching_allocator_enabled(0)
        assert not torch.accel.caching_allocator_enabled(1)
        before = torch.accel.memory_reserved(1)
        x = torch.ones(1000, device="accel:1")
        y = torch.ones(1000, device="accel:1")
        # A segment each, of their own size (not a 2 MiB segment they share).
        assert torch.accel.memory_reserved(1) == before + 2 * 4096
        assert torch.accel.memory_stats(1)["segment.all.current"] == 3
        torch.testing.assert_close((x + y).cpu(), torch.full((1000,), 2.0))
        del x, y
        torch.accel.synchronize(1)
        assert torch.accel.memory_reserved(1) == before
    finally:
        torch.accel.caching_allocator_enable(True)
    del cached
    assert torch.accel.memory_reserved(1) == 2 << 20  # the cached small segment


_ALLOCATOR_SETTINGS = """
import torch
import torch_accel
x = torch.empty(100 << 20, dtype=torch.uint8, device="accel")
print(torch_accel._C._get_allocator_settings()["expandable_segments"])
s = torch.accel.memory_stats()
print(s["max_split_size"], s["oversize_allocations.current"], s["oversize_segments.current"])
del x
y = torch.empty(30 << 20, dtype=torch.uint8, device="accel")  # not carved out of the 100 MiB
print(torch.accel.memory_stats()["segment.all.current"])
torch.accel.memory._set_allocator_settings("roundup_power2_divisions:4")
z = torch.empty(1200 << 10, dtype=torch.uint8, device="accel")  # a quarter step: 1.25 MiB
print(torch.accel.memory_stats()["allocated_bytes.all.current"] - (30 << 20))
"""


def test_pytorchs_allocator_settings_apply_to_accel(run_python) -> None:
    # PYTORCH_ALLOC_CONF, PyTorch's device-generic allocator settings, as CUDA reads them.
    result = run_python(_ALLOCATOR_SETTINGS, PYTORCH_ALLOC_CONF="max_split_size_mb:64")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:4] == ["False", f"{64 << 20} 1 1", "2", str(1280 << 10)]


_EXPANDABLE = """
import json
import torch
import torch_accel
torch.accel.memory._record_memory_history(max_entries=1000)
a, b, c = (torch.empty(n << 20, dtype=torch.uint8, device="accel") for n in (3, 5, 4))
snapshot = torch.accel.memory._snapshot()
stats = torch.accel.memory_stats()
out = {"segments": stats["segment.large_pool.current"],
       "reserved": stats["reserved_bytes.large_pool.current"] >> 20,
       "gaps": [(b.data_ptr() - a.data_ptr()) >> 20, (c.data_ptr() - b.data_ptr()) >> 20]}
first = a.data_ptr()
del a, b
d = torch.empty(8 << 20, dtype=torch.uint8, device="accel")  # where a and b were
out["reused"] = d.data_ptr() == first
out["is_expandable"] = [seg["is_expandable"] for seg in snapshot["segments"]]
out["actions"] = sorted({e["action"] for e in snapshot["device_traces"][0]} - {"alloc"})
del c, d
torch.accel.empty_cache()
out["after_empty_cache"] = torch.accel.memory_reserved()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
model = model.to("accel")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
for step in range(3):
    x = torch.randn(32 + 16 * step, 64, device="accel")  # a batch size that varies
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
out["losses"] = losses
out["expandable"] = torch_accel._C._get_allocator_settings()["expandable_segments"]
print(json.dumps(out))
"""


def test_expandable_segments_grow_one_range_per_stream(run_python) -> None:
    import json

    runs = {}
    for conf in ("expandable_segments:True", ""):
        result = run_python(_EXPANDABLE, PYTORCH_ALLOC_CONF=conf)
        assert result.returncode == 0, result.stderr[-2000:]
        runs[conf] = json.loads(result.stdout.strip().splitlines()[-1])
    on, off = runs["expandable_segments:True"], runs[""]
    assert on["expandable"] and not off["expandable"]
    # Blocks back to back, mapped in 2 MiB units: 12 MiB (classic: a 20 MiB segment).
    assert on["segments"] == 1 and on["reserved"] == 12 and on["gaps"] == [3, 5]
    assert on["reused"] and on["after_empty_cache"] == 0
    # What PyTorch's memory viewer expects of expandable segments.
    assert on["is_expandable"] == [True] and on["actions"] == ["segment_map"]
    assert off["is_expandable"] == [False] and off["actions"] == ["segment_alloc"]
    assert off["segments"] == 1 and off["reserved"] == 20
    assert on["losses"] == off["losses"]


_READ_AFTER_FREE = """
import torch
x = torch.arange(1 << 16, dtype=torch.float32, device="accel")
out = torch.empty(1 << 16, device="accel")  # before the free: nothing allocates after it
ptr, nbytes = x.data_ptr(), x.untyped_storage().nbytes()
del x
torch.accel.synchronize()
storage = torch._C._construct_storage_from_data_pointer(ptr, torch.device("accel:0"), nbytes)
stale = torch.empty(0, device="accel").set_(storage, 0, (1 << 16,), (1,))
torch.mul(stale, 1, out=out)
print(float(out.sum().cpu()))
"""


def test_without_caching_a_read_after_free_faults_instead_of_reading_a_recycled_block(
    run_python,
) -> None:
    # The debugging aid: with the cache, a kernel reading freed memory reads whatever the block
    # holds; with ACCEL_NO_MEMORY_CACHING=1 the memory went back to the driver and the read faults.
    # Only while nothing took that memory again: the driver hands freed addresses out anew, as
    # cudaMalloc does (a product allocating its result there first reads that result instead).
    cached = run_python(_READ_AFTER_FREE)
    assert cached.returncode == 0 and float(cached.stdout) == float(sum(range(1 << 16)))
    uncached = run_python(_READ_AFTER_FREE, ACCEL_NO_MEMORY_CACHING="1")
    assert uncached.returncode == -11, (uncached.returncode, uncached.stderr[-500:])


def test_host_memory_statistics() -> None:
    torch.accel.reset_peak_host_memory_stats()
    before = torch.accel.host_memory_stats()
    pinned = torch.empty(1 << 16).pin_memory()
    after = torch.accel.host_memory_stats()
    assert after["allocations.current"] == before["allocations.current"] + 1
    assert after["allocated_bytes.current"] >= before["allocated_bytes.current"] + (1 << 18)
    nested = torch.accel.host_memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["current"] == after["allocated_bytes.current"]
    del pinned
    gc.collect()
    torch.accel.reset_accumulated_host_memory_stats()
    assert torch.accel.host_memory_stats()["allocations.allocated"] == 0


def test_devices_and_usage() -> None:
    assert torch.accel.can_device_access_peer(0, 1)
    assert not torch.accel.can_device_access_peer(0, 0)
    free, total = torch.accel.mem_get_info()
    used = torch.accel.device_memory_used()
    if torch_accel.driver() == "host":
        assert used == total - free
    else:  # NVML's count of every process's use
        assert used >= total - free - (64 << 20)


def test_torch_cuda_memory_names_that_apply_to_accel() -> None:
    x = torch.ones(1000, device="accel")
    for old, new in (
        ("memory_cached", "memory_reserved"),
        ("max_memory_cached", "max_memory_reserved"),
    ):
        with pytest.warns(FutureWarning, match=f"renamed to torch.accel.{new}"):
            assert getattr(torch.accel, old)() == getattr(torch.accel, new)()
    del x
    torch.accel.empty_cache()
    with pytest.warns(FutureWarning, match="renamed to torch.accel.reset_peak_memory_stats"):
        torch.accel.reset_max_memory_cached()
    assert torch.accel.max_memory_reserved() == torch.accel.memory_reserved()
    assert torch.accel.get_allocator_backend() == "native"
    on_cuda = torch_accel.executor()[0] == "cuda"
    assert torch.accel.is_tf32_supported() == (on_cuda and torch.cuda.is_tf32_supported())
    assert torch.accel.get_arch_list() == (torch.cuda.get_arch_list() if on_cuda else [])
    assert torch.accel.get_gencode_flags() == (torch.cuda.get_gencode_flags() if on_cuda else "")
    assert torch.accel.AcceleratorError is torch.AcceleratorError


def _pool_of(t: torch.Tensor) -> tuple[int, int] | None:
    for seg in torch.accel.memory_snapshot():
        if seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]:
            return tuple(seg["segment_pool_id"])
    return None


def test_mem_pool_routes_this_threads_allocations() -> None:
    gc.collect()
    torch.accel.empty_cache()
    before = torch.accel.memory_reserved()
    pool = torch.accel.MemPool()
    assert pool.id[0] == 0 and pool.id[1] > 0 and pool.allocator is None
    assert pool.use_count() == 1
    other: list[torch.Tensor] = []
    with torch.accel.use_mem_pool(pool):
        assert pool.use_count() == 2
        inside = torch.arange(1000.0, device=ACCEL)
        worker = threading.Thread(target=lambda: other.append(torch.ones(1000, device=ACCEL)))
        worker.start()
        worker.join()
    outside = torch.ones(1000, device=ACCEL)
    assert pool.use_count() == 1
    assert _pool_of(inside) == pool.id
    assert _pool_of(other[0]) == (0, 0) and _pool_of(outside) == (0, 0)
    assert [tuple(s["segment_pool_id"]) for s in pool.snapshot()] == [pool.id]
    assert torch.accel.memory_snapshot(mempool_id=pool.id) == pool.snapshot()
    torch.testing.assert_close(inside.cpu(), torch.arange(1000.0))
    # The pool's memory goes back once the pool and its tensors are gone: as CUDA's, a segment
    # whose last tensor goes after the pool stays cached until empty_cache (a graph captured
    # later may still write to it).
    other.clear()
    del pool, outside
    gc.collect()
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() > before
    del inside
    gc.collect()
    assert torch.accel.memory_reserved() > before
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() == before


def test_graphs_capture_into_a_mem_pool() -> None:
    pool = torch.accel.MemPool()
    x = torch.ones(64, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g, pool=pool.id):
        y = x * 4
    assert g.pool() == pool.id and pool.use_count() == 2
    assert _pool_of(y) == pool.id
    x.fill_(2.0)
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((64,), 8.0))
    g.reset()
    assert pool.use_count() == 1


def test_mem_pool_options_and_errors() -> None:
    split = torch.accel.MemPool(no_split=True)
    with torch.accel.use_mem_pool(split):
        a = torch.ones(16, device=ACCEL)
        b = torch.ones(16, device=ACCEL)
    segments = split.snapshot()
    assert len(segments) == 2 and all(len(s["blocks"]) == 1 for s in segments)
    del a, b

    # use_on_oom: an allocation outside the pool that finds no memory takes a free pool block.
    lender = torch.accel.MemPool(use_on_oom=True)
    size = 8 << 20
    with torch.accel.use_mem_pool(lender):
        held = torch.empty(size, dtype=torch.uint8, device=ACCEL)
    address = held.data_ptr()
    del held  # free again, cached in the pool
    torch.accel.empty_cache()
    torch.accel.set_per_process_memory_fraction(1e-6)
    try:
        borrowed = torch.empty(size, dtype=torch.uint8, device=ACCEL)
        assert borrowed.data_ptr() == address
        del borrowed
    finally:
        torch.accel.set_per_process_memory_fraction(1.0)

    with pytest.raises(TypeError, match="AccelPluggableAllocator"):  # test_pluggable_allocator
        torch.accel.MemPool(allocator=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MemPool"):
        with torch.accel.use_mem_pool((0, 1)):  # type: ignore[arg-type]
            pass
