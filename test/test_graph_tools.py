"""Graph debug dumps, parallel branches, capture rules for other threads' allocations, the C++
graph class, and torch.accelerator.Graph: values compared against eager runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torch_accel
from helpers import capture_while_another_thread_runs
from torch_accel import _C

ACCEL = torch.device("accel")


def _branches(x: torch.Tensor) -> torch.Tensor:
    """Two branches on side streams, forked from and joined into the current stream."""
    cur = torch.accel.current_stream()
    s1, s2 = torch.accel.Stream(), torch.accel.Stream()
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    with torch.accel.stream(s1):
        a = (x * 2).sin()
    with torch.accel.stream(s2):
        b = (x * 3).cos()
    cur.wait_stream(s1)
    cur.wait_stream(s2)
    return a + b


def _dot_edges(text: str) -> set[tuple[str, str]]:
    labels = dict(re.findall(r'(n\d+) \[label="\d+: ([^"]*)"\]', text))
    return {(labels[a], labels[b]) for a, b in re.findall(r"(n\d+) -> (n\d+);", text)}


def test_branches_replay_to_the_eager_values_and_dump_as_a_fork_and_join(tmp_path: Path) -> None:
    x = torch.randn(256, device=ACCEL)
    g = torch.accel.AccelGraph()
    g.enable_debug_mode()
    with torch.accel.graph(g):
        out = _branches(x)
    for _ in range(3):
        new = torch.randn(256)
        x.copy_(new)
        g.replay()
        torch.testing.assert_close(out.cpu(), (new * 2).sin() + (new * 3).cos())
    path = tmp_path / "graph.dot"
    g.debug_dump(str(path))
    text = path.read_text()
    assert text.startswith("digraph")
    edges = _dot_edges(text)
    # The branches are independent; both feed the add on the origin stream.
    assert ("aten::mul.Tensor", "aten::sin") in edges
    assert ("aten::mul.Tensor", "aten::cos") in edges
    assert {("aten::sin", "aten::add.Tensor"), ("aten::cos", "aten::add.Tensor")} <= edges
    assert ("aten::sin", "aten::cos") not in edges and ("aten::cos", "aten::sin") not in edges


def test_debug_dump_needs_debug_mode_as_on_cuda(tmp_path: Path) -> None:
    x = torch.ones(4, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        y = x + 1
    with pytest.raises(RuntimeError, match="enable_debug_mode"):
        g.debug_dump(str(tmp_path / "g.dot"))
    kept = torch.accel.AccelGraph(keep_graph=True)
    with torch.accel.graph(kept):
        y = x * 3
    kept.debug_dump(str(tmp_path / "kept.dot"))
    assert "aten::mul.Tensor" in (tmp_path / "kept.dot").read_text()
    kept.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 3.0))
    empty = torch.accel.AccelGraph()
    empty.enable_debug_mode()
    with pytest.raises(torch_accel.AccelError, match="the graph is empty"):
        empty.debug_dump(str(tmp_path / "empty.dot"))


def test_another_threads_allocation_follows_the_capture_mode() -> None:
    def allocate() -> None:
        # A new 48 MiB segment: the cache was emptied, so this asks the driver.
        t = torch.empty(12 << 20, device=ACCEL)
        del t

    for mode, refused in (("global", True), ("thread_local", False), ("relaxed", False)):
        torch.accel.empty_cache()
        capture_error, error, replay_matches_eager = capture_while_another_thread_runs(
            mode, allocate
        )
        if capture_error is not None:
            assert refused, mode
            assert "invalidated by allocating" in str(capture_error)
        assert (error is not None) == refused, (mode, error)
        if refused:
            assert isinstance(error, torch_accel.CaptureError)
            assert "new device memory" in str(error)
        else:
            replay_matches_eager()


def test_memory_tools_are_safe_during_capture() -> None:
    x = torch.ones(1024, device=ACCEL)
    side = torch.accel.Stream()
    used = torch.empty(1024, device=ACCEL)
    used.record_stream(side)
    del used  # its free waits for an event on `side`
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        y = x + 1
        big = torch.empty(16 << 20, device=ACCEL)  # a new segment for the graph's pool
        big.fill_(2.0)
        z = y * big[:1024]
        torch.accel.empty_cache()  # frees nothing while capturing, and raises nothing
        stats = torch.accel.memory_stats()
    assert stats["reserved_bytes.all.current"] > 0
    g.replay()
    torch.testing.assert_close(z.cpu(), torch.full((1024,), 4.0))


def test_the_cpp_graph_class_captures_and_replays() -> None:
    # torch_accel._C._AccelGraph is the C++ class of csrc/device/graph.h, as C++ users see it.
    x = torch.ones(4, device=ACCEL)
    s = torch.accel.Stream()
    g = _C._AccelGraph()
    pool = _C._AccelGraph.pool_handle()
    s.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(s):
        g.capture_begin(pool, "global")
        y = (x * 5).exp()
        g.capture_end()
    assert g.num_nodes() == 2
    assert g.pool() == pool
    for k in (1.0, 2.0):
        x.fill_(k)
        g.replay()
        torch.testing.assert_close(y.cpu(), torch.full((4,), 5.0 * k).exp())
    with pytest.raises(RuntimeError, match="debug mode is off"):
        g.debug_dump("/tmp/unused.dot")
    g.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        g.replay()


def test_torch_accelerator_graph_is_detected_at_run_time() -> None:
    # PyTorch 2.12 adds torch.accelerator.Graph; with 2.11 there is nothing to register with,
    # and importing accel must not fail for that.
    available = hasattr(torch.accelerator, "Graph")
    assert _C._register_accelerator_graph() is available
    if available:  # pragma: no cover - torch 2.12 and later
        x = torch.ones(4, device=ACCEL)
        g = torch.accelerator.Graph()
        s = torch.accel.Stream()
        with torch.accel.stream(s):
            g.capture_begin()
            y = x + 1
            g.capture_end()
        g.replay()
        torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))


def _arith(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Additions, subtractions, products and quotients of every operand kind and form."""
    y = x * 1.0001 + 0.25  # Python scalars (wrapped numbers)
    y = y - w  # tensor operands
    y = y / (w + 3.0)
    y = y * torch.tensor(0.5, dtype=torch.float64)  # a 0-dim CPU tensor of another dtype
    y = torch.add(y, 2)  # an int scalar
    y.mul_(w)  # in place
    y.sub_(1.5)
    torch.div(y, 7.0, out=out)  # out=
    return out * out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_replayed_arithmetic_matches_eager_bit_for_bit(dtype: torch.dtype) -> None:
    # These replay through accel's own elementwise kernels (aten/replay_kernels.h): the values
    # must be exactly those of eager execution, which runs ATen's kernels.
    x = torch.randn(1000, device=ACCEL, dtype=dtype)
    w = torch.randn(1000, device=ACCEL, dtype=dtype)
    out = torch.empty(1000, device=ACCEL, dtype=dtype)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        result = _arith(x, w, out)
    for _ in range(3):
        x.copy_(torch.randn(1000, dtype=dtype))
        w.copy_(torch.randn(1000, dtype=dtype))
        g.replay()
        expected = _arith(x, w, torch.empty_like(out))
        assert torch.equal(result.cpu(), expected.cpu())
        assert torch.equal(result.cpu(), _arith(x.cpu(), w.cpu(), torch.empty(1000, dtype=dtype)))


def test_arithmetic_the_direct_kernels_do_not_take_replays_through_aten() -> None:
    # Broadcasting, strided views, alpha other than 1, rounding modes, bfloat16, mixed dtypes,
    # partially overlapping operands: replayed by ATen's kernels, with eager's values.
    def work(a: torch.Tensor, row: torch.Tensor, h: torch.Tensor) -> list[torch.Tensor]:
        return [
            a + row,  # broadcasting
            a.t() * 2.0,  # strided
            torch.add(a, a, alpha=0.5),
            torch.div(a, 3.0, rounding_mode="floor"),
            h * 3.0,  # bfloat16
            a * a.double(),  # mixed dtypes
            a[:, 1:] + a[:, :-1],  # overlapping inputs of one storage (read only: allowed)
        ]

    a = torch.randn(8, 8, device=ACCEL)
    row = torch.randn(8, device=ACCEL)
    h = torch.randn(8, 8, device=ACCEL, dtype=torch.bfloat16)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        results = work(a, row, h)
    a.copy_(torch.randn(8, 8))
    g.replay()
    for got, want in zip(results, work(a.cpu(), row.cpu(), h.cpu()), strict=True):
        torch.testing.assert_close(got.cpu(), want)


def test_a_graph_keeps_the_memory_of_a_freed_static_input_until_it_goes() -> None:
    # CUDA's replay after the static input was freed and the cache emptied writes memory the
    # driver took back (an illegal address); on accel the graph keeps the segment: the replay
    # writes cached memory and the memory goes back once the graph does.
    torch.accel.synchronize()
    torch.accel.empty_cache()
    reserved0 = torch.accel.memory_reserved()
    x = torch.ones(4 << 20, device=ACCEL)  # 16 MiB: a segment of its own
    torch.accel.synchronize()
    kept = torch.accel.memory_reserved() - reserved0
    assert kept >= 16 << 20
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        x.mul_(2)  # an operator's task
        x[:4].fill_(3)  # and another one
        y = x[:8] + 1  # into the graph's pool
    del x
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() >= reserved0 + kept
    g.replay()  # read and write kept memory, no crash
    torch.accel.synchronize()
    assert y.shape == (8,)
    # A later eager tensor may get that memory (as on CUDA): the graph is what the user misused;
    # the process and the device stay usable.
    z = torch.arange(6, device=ACCEL, dtype=torch.float32)
    assert torch.equal((z * 2).cpu(), torch.arange(6, dtype=torch.float32) * 2)
    del g, y
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() < reserved0 + kept


def test_a_graph_keeps_the_pinned_memory_its_copies_read() -> None:
    # The same for a captured copy out of pinned memory freed after the capture: the host cache
    # keeps the block until the graph goes.
    torch.accel.synchronize()
    _C._host_empty_cache()
    reserved0 = torch.accel.host_memory_stats()["reserved_bytes.current"]
    src = torch.arange(1 << 18, dtype=torch.float32).pin_memory()  # 1 MiB
    dst = torch.empty(1 << 18, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        dst.copy_(src, non_blocking=True)
    del src
    _C._host_empty_cache()
    assert torch.accel.host_memory_stats()["reserved_bytes.current"] == reserved0 + (1 << 20)
    g.replay()
    torch.accel.synchronize()
    assert torch.equal(dst.cpu(), torch.arange(1 << 18, dtype=torch.float32))
    g.reset()
    _C._host_empty_cache()
    assert torch.accel.host_memory_stats()["reserved_bytes.current"] == reserved0
