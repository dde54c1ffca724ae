"""accel on the cuda driver against native PyTorch CUDA on the same GPU (make test-cuda).

Every test here needs ACCEL_DRIVER=cuda and a GPU; elsewhere the module skips, saying why. The
underlying tier runs ATen's CUDA kernels on accel memory with the accel stream current
(csrc/aten/executor.h): results must equal native CUDA's, without the CPU fallback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import torch_accel
from helpers import skip_unless_cuda_driver

ROOT = Path(__file__).resolve().parent.parent

skip_unless_cuda_driver()


@pytest.fixture(autouse=True)
def no_fallback():
    torch.accel.reset_fallback_stats()
    yield


def assert_no_fallback(*allowed: str) -> None:
    stats = {k: v for k, v in torch.accel.fallback_stats().items() if k not in allowed}
    assert stats == {}, f"ran through the CPU fallback: {stats}"


def test_the_driver_is_cuda_and_its_devices_are_the_gpus():
    caps = torch_accel.driver_capabilities()
    assert caps["graphs"] and caps["native_handles"] and not caps["host_accessible_memory"]
    assert torch.accel.device_count() == torch.cuda.device_count()
    props = torch.accel.get_device_properties(0)
    assert props.name == torch.cuda.get_device_name(0)
    assert props.driver == "cuda"
    assert torch.accel.current_stream().native_handle != 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_operators_match_native_cuda(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g).to(dtype)
    w = torch.randn(96, 32, generator=g).to(dtype)
    img = torch.randn(2, 3, 16, 16, generator=g).to(dtype)
    k = torch.randn(4, 3, 3, 3, generator=g).to(dtype)
    idx = torch.tensor([0, 5, 7, 63])

    def run(device: str) -> list[torch.Tensor]:
        a, b, i, c, kk = (t.to(device) for t in (x, w, img, k, idx))
        return [
            a + 1,
            a @ b,
            torch.softmax(a, -1),
            torch.nn.functional.layer_norm(a, (96,)),
            torch.nn.functional.conv2d(i, kk, padding=1),
            a.sum(0),
            a.index_select(0, idx.to(device)),
            torch.cat([a, a], 1).t().contiguous(),
            (a > 0).nonzero(),
        ]

    for accel, native in zip(run("accel"), run("cuda"), strict=True):
        assert accel.device.type == "accel"
        torch.testing.assert_close(accel.cpu(), native.cpu())
    assert_no_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_takes_cudas_fused_kernels(dtype):
    # CUDA's _fused_sdp_choice picks flash / memory-efficient / cuDNN kernels, forward and
    # backward, which run underlying on accel memory.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=g).to(dtype) for _ in range(3))
    grads = {}
    for device in ("cuda", "accel"):
        qd, kd, vd = (t.to(device).requires_grad_() for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
        out.sum().backward()
        grads[device] = [out.detach().cpu(), *(t.grad.cpu() for t in (qd, kd, vd))]
    for a, c in zip(grads["accel"], grads["cuda"], strict=True):
        torch.testing.assert_close(a, c)
    assert_no_fallback()


def test_copies_to_and_from_cuda_are_device_to_device():
    x = torch.arange(24.0, device="cuda").reshape(4, 6)
    a = x.to("accel")
    assert a.device.type == "accel"
    torch.testing.assert_close(a.cpu(), x.cpu())
    back = (a * 2).t().to("cuda")  # non-contiguous source
    torch.testing.assert_close(back, (x * 2).t())
    c = torch.empty(6, 4, device="cuda")
    c.copy_(a.t())
    torch.testing.assert_close(c, x.t())
    assert_no_fallback()


def test_accel_memory_comes_from_accel_allocator_not_torch_cuda():
    torch.cuda.synchronize()
    cuda_before = torch.cuda.memory_allocated()
    accel_before = torch.accel.memory_allocated()
    t = torch.empty(1 << 20, device="accel")
    assert torch.accel.memory_allocated() - accel_before >= t.numel() * 4
    assert torch.cuda.memory_allocated() == cuda_before
    del t


def test_accel_takes_back_memory_torch_cuda_only_caches():
    # Two caches share the GPU: when accel's allocation fails, PyTorch's CUDA allocator gives
    # its unused memory back and accel retries.
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    held = torch.empty(int(free * 0.8), dtype=torch.uint8, device="cuda")
    del held  # cached by PyTorch's allocator, not freed
    assert torch.cuda.memory_reserved() >= int(free * 0.8)
    big = torch.empty(int(free * 0.7), dtype=torch.uint8, device="accel")
    assert torch.cuda.memory_reserved() < int(free * 0.8)
    del big
    torch.accel.empty_cache()


def test_work_runs_in_accel_stream_order_without_host_waits():
    a = torch.ones(1 << 20, device="accel")
    for _ in range(50):
        a = a * 1.01 + 0.5
    expected = torch.ones(1 << 20, device="cuda")
    for _ in range(50):
        expected = expected * 1.01 + 0.5
    side = torch.accel.Stream()
    side.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(side):
        b = a * 2
    torch.accel.current_stream().wait_stream(side)
    torch.testing.assert_close(b.cpu(), (expected * 2).cpu())


def test_a_torch_cuda_stream_wrapped_as_an_accel_stream_orders_accel_work():
    # torch.accel.ExternalStream over torch.cuda's cudaStream_t: accel kernels launched there
    # run on that very stream, ordered with torch.cuda work on it without any event.
    native = torch.cuda.Stream()
    ext = torch.accel.ExternalStream(native.cuda_stream)
    assert ext.native_handle == native.cuda_stream
    assert torch.accel.ExternalStream(native.cuda_stream) == ext
    a = torch.ones(1 << 22, device="accel")
    ext.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(ext):
        for _ in range(20):
            a = a * 1.5 - 0.25
    done = torch.cuda.Event()
    done.record(native)  # recorded on the native stream: covers the accel work on it
    done.synchronize()
    expected = torch.ones(1 << 22, dtype=torch.float32)
    for _ in range(20):
        expected = expected * 1.5 - 0.25
    torch.accel.current_stream().wait_stream(ext)
    torch.testing.assert_close(a.cpu(), expected)
    assert_no_fallback()


def test_sensors_are_nvmls_readings():
    x = torch.empty(256 << 20, dtype=torch.uint8, device="accel")
    assert torch.accel.device_memory_used(0) >= x.numel() + torch.accel.memory_reserved(0) // 2
    assert 0 <= torch.accel.utilization(0) <= 100
    assert 0 <= torch.accel.memory_usage(0) <= 100
    assert 10 <= torch.accel.temperature(0) <= 110
    assert torch.accel.power_draw(0) > 10_000  # mW: an idle H100 or H200 draws more than 10 W
    assert torch.accel.clock_rate(0) > 100
    # NVML lists processes by the host's process ids (a container renumbers its own).
    listing = torch.accel.list_gpu_processes(0).splitlines()
    assert listing[0] == "GPU:0" and len(listing) >= 2
    assert all(line.split()[0] == "process" for line in listing[1:])


def test_random_operators_follow_cuda_philox_seeds():
    # On cuda, accel generators hand CUDA's kernels their (seed, offset) as Philox state: a seed
    # gives torch.cuda's numbers, and the offset advances as CUDA's does.
    torch.cuda.manual_seed(7)
    expected = [torch.randn(100, device="cuda"), torch.rand(50, device="cuda")]
    torch.accel.manual_seed(7)
    got = [torch.randn(100, device="accel"), torch.rand(50, device="accel")]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.cpu(), e.cpu())
    assert (
        torch.accel.default_generators[0].get_offset()
        == torch.cuda.default_generators[0].get_offset()
    )
    assert_no_fallback()


def test_nested_tensors_and_other_libraries_operators_run_cuda_kernels():
    parts = [torch.randn(3, 8), torch.randn(5, 8)]
    nested = {d: torch.nested.nested_tensor([p.to(d) for p in parts]) for d in ("accel", "cuda")}
    out = {d: torch.nn.functional.relu(n * 2) for d, n in nested.items()}
    for a, c in zip(out["accel"].unbind(), out["cuda"].unbind(), strict=True):
        torch.testing.assert_close(a.cpu(), c.cpu())
    torchvision = pytest.importorskip("torchvision")
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    keep = {d: torchvision.ops.nms(boxes.to(d), scores.to(d), 0.5).cpu() for d in ("accel", "cuda")}
    assert keep["accel"].tolist() == keep["cuda"].tolist() == [0, 2]
    assert_no_fallback()


def test_graph_capture_replays_cuda_kernels():
    x = torch.zeros(1000, device="accel")
    graph = torch.accel.AccelGraph()
    side = torch.accel.Stream()
    side.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(side):
        y = x * 2 + 1
    torch.accel.current_stream().wait_stream(side)
    with torch.accel.graph(graph):
        y = x * 2 + 1
    x.fill_(3.0)
    graph.replay()
    torch.testing.assert_close(y.cpu(), torch.full((1000,), 7.0))


def test_random_operators_in_a_graph_draw_per_replay_as_eager_calls_do():
    # On cuda a graph's random operators take Philox offsets as torch.cuda's graphs do (seed and
    # base offset read by the kernels at each replay): replaying from a seed gives the numbers
    # eager calls give from that seed, and each replay advances the generator as a call does.
    x = torch.ones(4096, device="accel")
    mine = torch.Generator("accel")

    def step():
        noise = torch.rand(4096, device="accel", generator=mine)
        return torch.nn.functional.dropout(x, 0.5) * 2 + noise + torch.randn(4096, device="accel")

    def seed():
        torch.accel.manual_seed(11)
        mine.manual_seed(5)

    seed()
    eager = [step().cpu() for _ in range(3)]
    offsets = (torch.accel.default_generators[0].get_offset(), mine.get_offset())
    graph = torch.accel.AccelGraph()
    with torch.accel.graph(graph):
        out = step()
    seed()
    for expected in eager:
        graph.replay()
        torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    assert (torch.accel.default_generators[0].get_offset(), mine.get_offset()) == offsets
    assert not torch.equal(eager[0], eager[1])
    graph.reset()  # the replay state's pinned memory goes back to the cache
    assert_no_fallback()


def test_a_training_step_matches_native_cuda():
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer_lm import BATCH, CONTEXT, VOCAB, TinyLM

    losses = {}
    for device in ("cuda", "accel"):
        torch.manual_seed(0)
        model = TinyLM().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=torch.Generator())
        tokens = tokens.to(device)
        history = []
        for _ in range(3):
            opt.zero_grad()
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            opt.step()
            history.append(loss.item())
        losses[device] = history
    torch.testing.assert_close(losses["accel"], losses["cuda"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_operators_run_their_triton_kernels(dtype):
    """accel's fused operators on the cuda driver (torch_accel/kernels through
    torch_accel/ops/_cuda.py) against the host kernels on the CPU, forward and backward."""
    from torch_accel.ops import flash_attention, qkv_rms_norm_rope, rms_norm_rope

    torch.manual_seed(0)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    x, w = torch.randn(2, 33, 4, 128).to(dtype), torch.randn(128)
    cos, sin = torch.randn(33, 128), torch.randn(33, 128)
    xa = x.to("accel").requires_grad_()
    out = rms_norm_rope(xa, w.to("accel"), cos.to("accel"), sin.to("accel"))
    torch.testing.assert_close(out.cpu().float(), rms_norm_rope(x.float(), w, cos, sin), **tol)
    out.float().sum().backward()
    gx, _ = torch.ops.accel.rms_norm_rope_backward(
        torch.ones_like(x).float(), x.float(), w, cos, sin, 1e-6, False
    )
    torch.testing.assert_close(xa.grad.cpu().float(), gx, **tol)
    qkv = torch.randn(2, 33, 8 * 64).to(dtype)
    q, k, v = qkv_rms_norm_rope(
        *(t.to("accel") for t in (qkv, w[:64], w[64:], cos[:, :64], sin[:, :64])), 4, 2
    )
    eq, ek, ev = qkv_rms_norm_rope(qkv.float(), w[:64], w[64:], cos[:, :64], sin[:, :64], 4, 2)
    for a, e in ((q, eq), (k, ek), (v, ev)):
        torch.testing.assert_close(a.cpu().float(), e, **tol)
    qa, ka, va = (t.to("accel").requires_grad_() for t in (q.detach(), k.detach(), v.detach()))
    o, lse = flash_attention(qa, ka, va, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.detach().cpu().float(), k.detach().cpu().float(), v.detach().cpu().float(),
        is_causal=True, enable_gqa=True,
    )  # fmt: skip
    torch.testing.assert_close(o.cpu().float(), ref, **tol)
    o.float().sum().backward()
    assert qa.grad.shape == qa.shape and ka.grad.shape == ka.shape
    assert_no_fallback()


_EXPANDABLE_ON_CUDA = """
import json
import torch
import torch_accel
caps = torch_accel.driver_capabilities()
a, b = (torch.empty(n << 20, dtype=torch.uint8, device="accel") for n in (3, 5))
x = torch.randn(512, 512, device="accel")
y = (x @ x).cpu()
expected = (x.cpu().to("cuda") @ x.cpu().to("cuda")).cpu()
out = {"virtual_memory": caps["virtual_memory"], "gap": (b.data_ptr() - a.data_ptr()) >> 20,
       "segments": torch.accel.memory_stats()["segment.large_pool.current"],
       "matmul": float((y - expected).abs().max())}
del a, b, x
torch.accel.empty_cache()
out["reserved_after_empty_cache"] = torch.accel.memory_reserved()
print(json.dumps(out))
"""


def test_expandable_segments_map_cuda_memory_as_needed(run_python):
    import json

    result = run_python(
        _EXPANDABLE_ON_CUDA, ACCEL_DRIVER="cuda", PYTORCH_ALLOC_CONF="expandable_segments:True"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["virtual_memory"] and out["gap"] == 3 and out["segments"] == 1
    assert out["matmul"] < 1e-3 and out["reserved_after_empty_cache"] == 0
