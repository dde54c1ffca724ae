"""Inductor's C++ wrapper on accel: ``torch.compile(options={"cpp_wrapper": True})`` and
AOTInductor packages (torch_accel/_inductor/cpp_wrapper.py, csrc/aoti).

Generated kernels run as tasks on the current accel stream (in stream order with eager work,
capturable), extern kernels through accel's C shim; AOTInductor packages compiled for accel load
with ``aoti_load_package`` through the runner accel registers, on any accel device.
"""

from __future__ import annotations

import gc
import re
import shutil

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import helpers
import torch_accel
import torch_accel._inductor
from torch_accel._inductor.cpp_wrapper import INCLUDE, hash_tree, headers_hash
from torch_accel._inductor.passes import AccelPostGradPass

ACCEL = torch.device("accel")
CPP_WRAPPER = {"cpp_wrapper": True}

# The C++ wrapper launches C++ kernels (the host driver's); with Triton kernels (the cuda
# driver's) it refuses, which the test of that runs anywhere.
cpp_kernels = pytest.mark.skipif(
    torch_accel._inductor.kernels() != "cpp",
    reason="Inductor's C++ wrapper on accel needs its C++ kernels (ACCEL_INDUCTOR_KERNELS)",
)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """Extern kernels (linear, conv, sort), fused C++ kernels, a reduction, tied weights."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(idx).transpose(1, 2)
        h = torch.relu(self.bn(self.conv(h))).transpose(1, 2)
        top = torch.sort(h, dim=-1).values[..., -2:].sum()
        return torch.log_softmax(self.head(h), -1), top


def _block() -> Block:
    torch.manual_seed(0)
    return Block().to(ACCEL).eval()


def _tokens(n: int, device: torch.device | str = ACCEL, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(seed)).to(device)


def _assert_same(got, want) -> None:  # type: ignore[no-untyped-def]
    for g, w in zip(got, want, strict=True):
        assert g.device == w.device
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@cpp_kernels
def test_cpp_wrapper_launches_kernels_on_the_stream_and_extern_kernels_through_accels_shim():
    model = _block()
    idx = _tokens(7)
    with torch.no_grad():
        got, (code,) = run_and_get_code(torch.compile(model, options=CPP_WRAPPER), idx)
        _assert_same(got, model(idx))
    # Every generated kernel is launched as a stream task, none called on the calling thread;
    # the matrix product and the convolution go through accel's C shim, on accel buffers.
    calls = [
        line.strip()
        for line in code.splitlines()
        if re.search(r"\bcpp_fused_\w+\(", line) and not line.lstrip().startswith("extern")
    ]
    assert len(calls) >= 2
    assert all(call.startswith("torch_accel_aoti::launch(") for call in calls), calls
    assert "aoti_torch_accel_mm_out(" in code and "aoti_torch_accel_convolution(" in code
    assert "aoti_torch_cpu_" not in code
    assert "cached_torch_device_type_privateuse1" in code
    # The source names the hash of accel's headers, so Inductor's code cache (keyed by source)
    # builds it again once they change.
    assert f"// torch_accel headers {headers_hash()}" in code


def test_accels_headers_key_the_wrappers_and_inductors_cache_entries(tmp_path):
    # Inductor keys a compiled wrapper by its source and command only: after a change of accel's
    # headers (an upgrade of torch_accel), its code cache served wrappers built against the old
    # ones, with or without the FX-graph cache.
    tree = tmp_path / "include"
    shutil.copytree(INCLUDE, tree)
    before = hash_tree(tree)
    assert before == hash_tree(INCLUDE) == headers_hash()
    launcher = tree / "torch_accel_aoti.h"
    original = launcher.read_text()
    launcher.write_text(original + "// changed\n")
    assert hash_tree(tree) != before
    launcher.write_text(original)
    assert hash_tree(tree) == before
    launcher.rename(tree / "moved.h")  # the same bytes under another name
    assert hash_tree(tree) != before
    assert headers_hash() in AccelPostGradPass().uuid()


@cpp_kernels
def test_cpp_wrapper_is_ordered_with_eager_work_on_any_stream_and_device():
    f = torch.compile(lambda t: torch.tanh(t * 2 + 1).sum(0), options=CPP_WRAPPER)
    for device in ("accel:0", "accel:1"):
        a = torch.randn(384, 384, device=device)
        side = torch.accel.Stream(device=torch.device(device))
        side.wait_stream(torch.accel.current_stream(torch.device(device)))  # `a` is written
        with torch.accel.stream(side):
            # Fed by a preceding product, called in a loop without synchronizing: each call
            # must read its own product, and the next product must not overwrite a buffer
            # the compiled kernel still reads.
            outs = [f(a @ a + k) for k in range(4)]
        side.synchronize()
        for k, out in enumerate(outs):
            assert out.device == torch.device(device)
            assert torch.equal(out, f(a @ a + k))


@cpp_kernels
def test_cpp_wrapper_is_captured_into_accel_graphs():
    f = torch.compile(
        lambda t, w, v: torch.relu(t @ w) * 3 - t.sum() + v.sin().mean(), options=CPP_WRAPPER
    )
    x, w = torch.randn(16, 16, device=ACCEL), torch.randn(16, 16, device=ACCEL)
    v = torch.randn(3 << 20, device=ACCEL)  # 12 MiB, a segment of its own, read by a kernel
    f(x, w, v)  # compiled outside the capture
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        out = f(x, w, v)
    for _ in range(2):
        x.copy_(torch.randn(16, 16))
        g.replay()
        expected = torch.relu(x @ w) * 3 - x.sum() + v.sin().mean()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    # The graph keeps the memory its launches read: `v` freed, the cache emptied.
    inputs = [v]
    del v
    helpers.replay_keeps_freed_inputs(g, inputs, 12 << 20)


@cpp_kernels
def test_cpp_wrapper_keeps_accels_own_operators_and_subgraphs():
    from torch_accel.ops import rms_norm_rope

    x, w = torch.randn(2, 5, 4, 8, device=ACCEL), torch.randn(8, device=ACCEL)
    cos, sin = torch.randn(5, 8, device=ACCEL), torch.randn(5, 8, device=ACCEL)

    def f(x, w, cos, sin, flag):  # type: ignore[no-untyped-def]
        y = rms_norm_rope(x, w, cos, sin)
        return torch.cond(flag, lambda t: t.sin().sum(-1), lambda t: t.cos().mean(-1), (y,))

    compiled = torch.compile(f, options=CPP_WRAPPER)
    for flag in (True, False):
        flag_t = torch.tensor(flag, device=ACCEL)
        torch.testing.assert_close(compiled(x, w, cos, sin, flag_t), f(x, w, cos, sin, flag_t))


def test_cpp_wrapper_with_triton_kernels_says_it_is_not_supported(monkeypatch):
    # The wrapper itself (compiling with Triton kernels switches accel's Inductor backend to
    # them for the rest of the process, and needs Triton's interpreter on the host driver).
    from torch_accel._inductor.cpp_wrapper import AccelCppWrapper

    monkeypatch.setenv("ACCEL_INDUCTOR_KERNELS", "triton")
    with pytest.raises(NotImplementedError, match=r"C\+\+ wrapper.*not supported on accel with "
                       r"Triton kernels.*compile without cpp_wrapper"):  # fmt: skip
        AccelCppWrapper()


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One AOTInductor package of Block, with a dynamic sequence length."""
    seq = torch.export.Dim("seq", min=2, max=64)
    exported = torch.export.export(_block(), (_tokens(7),), dynamic_shapes={"idx": {1: seq}})
    path = tmp_path_factory.mktemp("aoti") / "block.pt2"
    return torch._inductor.aoti_compile_and_package(exported, package_path=str(path))


@cpp_kernels
def test_aot_inductor_package_runs_on_accel(package: str) -> None:
    model = _block()
    loaded = torch._inductor.aoti_load_package(package)
    with torch.no_grad():
        for n in (7, 2, 33):
            _assert_same(loaded(_tokens(n, seed=n)), model(_tokens(n, seed=n)))
        # In stream order with the eager work that produced its input.
        outs = [loaded((_tokens(9) + k) % 50) for k in range(3)]
        for k, out in enumerate(outs):
            _assert_same(out, model((_tokens(9) + k) % 50))


@cpp_kernels
def test_aot_inductor_package_loads_on_another_device(package: str) -> None:
    loaded = torch._inductor.aoti_load_package(package, device_index=1)
    got = loaded(_tokens(5, "accel:1"))
    assert got[0].device == torch.device("accel:1")
    with torch.no_grad():
        _assert_same([t.cpu() for t in got], [t.cpu() for t in _block()(_tokens(5))])


@cpp_kernels
def test_aot_inductor_library_outlives_the_work_it_queued(package: str) -> None:
    # A loader used once and dropped while its kernels are still queued on the stream (the
    # package's library unloaded under them crashed the process), and one whose run a graph
    # captured, replayed after the loader is gone.
    a = torch.randn(512, 512, device=ACCEL)
    _ = a @ a @ a  # keeps the stream busy
    out = torch._inductor.aoti_load_package(package)(_tokens(6))
    gc.collect()
    with torch.no_grad():
        _assert_same(out, _block()(_tokens(6)))

    loaded = torch._inductor.aoti_load_package(package)
    idx = _tokens(6)
    loaded(idx)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        captured = loaded(idx)
    del loaded
    gc.collect()
    idx.copy_(_tokens(6, seed=5))
    g.replay()
    with torch.no_grad():
        _assert_same(captured, _block()(_tokens(6, seed=5)))


@cpp_kernels
def test_aot_inductor_package_takes_new_weights_as_cpu_tensors(package: str) -> None:
    # AOTInductor checks new constants against its model's device, the CPU for accel packages
    # (cpp_wrapper.py): weights are given as CPU tensors, copied to accel at the next run.
    loaded = torch._inductor.aoti_load_package(package)
    names = set(loaded.get_constant_fqns())
    halved = _block()
    with torch.no_grad():
        for p in halved.parameters():
            p.mul_(0.5)
    state = {k: v.cpu() for k, v in halved.state_dict().items() if k in names}
    assert "head.weight" in state and "emb.weight" not in state  # one constant for tied weights
    loaded.load_constants(state, check_full_update=True)
    with torch.no_grad():
        _assert_same(loaded(_tokens(7)), halved(_tokens(7)))


@cpp_kernels
def test_aot_inductor_package_on_a_missing_device_says_so(package: str) -> None:
    with pytest.raises(Exception, match=r"accel:9|device|index"):
        torch._inductor.aoti_load_package(package, device_index=9)(_tokens(3, "accel:0"))
    assert torch.equal((torch.ones(2, device=ACCEL) + 1).cpu(), torch.full((2,), 2.0))


_FRESH_PROCESS = """
import torch, torch_accel
from torch._dynamo.utils import counters
loaded = torch._inductor.aoti_load_package({package!r})
logits, top = loaded(torch.arange(10, device="accel").reshape(2, 5))
print(logits.device, repr(logits.sum().item()), repr(top.item()))
x = torch.arange(12.0, device="accel").reshape(3, 4)
f = torch.compile(lambda t: (t @ t.T).relu() + t.sum(), options={{"cpp_wrapper": True}})
print(repr(f(x).sum().item()), counters["inductor"]["fxgraph_cache_hit"])
"""


@cpp_kernels
def test_a_fresh_process_loads_packages_and_graphs_from_inductors_cache(package, run_python):
    # The package in a process that compiled nothing; and a graph compiled here, taken from the
    # FX-graph cache there: that process generates no wrapper code, the cached module itself
    # prepares (accel's headers, libtorch_accel's symbols).
    # Torch 2.11's AOTInductor writes the package's device facts into the process-wide
    # config.aot_inductor.metadata (AotCodeCompiler.compile updates that dict in place), and
    # the config is part of the FX-graph cache key: every graph compiled after a package in this
    # process is keyed apart from a fresh process's. Compiled with the config as a fresh process
    # has it, the graph is what the fresh process looks up. (Fails once torch stops doing so.)
    assert torch._inductor.config.aot_inductor.metadata.get("AOTI_DEVICE_KEY") == "accel"
    x = torch.arange(12.0, device=ACCEL).reshape(3, 4)
    with torch._inductor.config.patch({"aot_inductor.metadata": {}}):
        torch.compile(lambda t: (t @ t.T).relu() + t.sum(), options=CPP_WRAPPER)(x)
    result = run_python(_FRESH_PROCESS.format(package=package))
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        logits, top = _block()(torch.arange(10, device=ACCEL).reshape(2, 5))
    want = ((x @ x.T).relu() + x.sum()).sum().item()
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0][0] == "accel:0"
    assert float(lines[0][1]) == pytest.approx(logits.sum().item(), rel=1e-5)
    assert float(lines[0][2]) == pytest.approx(top.item(), rel=1e-5)
    assert lines[1] == [repr(want), "1"]
