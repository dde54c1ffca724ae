"""Graph debug dumps, parallel branches, capture rules for other threads' allocations, the C++
graph class, and torch.accelerator.Graph: values compared against eager runs."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

import torch_accel
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
    x = torch.ones(8, device=ACCEL)
    for mode, refused in (("global", True), ("thread_local", False), ("relaxed", False)):
        errors: list[BaseException] = []

        def allocate(errors: list[BaseException] = errors) -> None:
            try:
                # A new 48 MiB segment: the cache was emptied, so this asks the driver.
                t = torch.empty(12 << 20, device=ACCEL)
                del t
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        torch.accel.empty_cache()
        g = torch.accel.AccelGraph()
        try:
            with torch.accel.graph(g, capture_error_mode=mode):
                y = x * 2
                t = threading.Thread(target=allocate)
                t.start()
                t.join()
        except torch_accel.CaptureError as e:
            assert refused, mode
            assert "invalidated by allocating" in str(e)
        assert bool(errors) == refused, (mode, errors)
        if refused:
            assert isinstance(errors[0], torch_accel.CaptureError)
            assert "new device memory" in str(errors[0])
        else:
            g.replay()
            torch.testing.assert_close(y.cpu(), torch.full((8,), 2.0))


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
