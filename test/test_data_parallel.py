"""nn.DataParallel over accel devices, and torch.accel.comm underneath it (torch.cuda.comm's
functions for accel): values and gradients against the same module run on the CPU, the copies'
devices and memory, and the errors torch.cuda.comm gives."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import torch_accel

pytestmark = pytest.mark.skipif(
    torch_accel.device_count() < 2, reason="DataParallel over accel needs two accel devices"
)
A0, A1 = torch.device("accel", 0), torch.device("accel", 1)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
        h = torch.relu(self.bn(self.fc1(x)))
        out = self.fc2(h) * scale
        return {"out": out, "parts": (out.sum(1), h.mean(1))}


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    cpu = _Net()
    return cpu, copy.deepcopy(cpu).to("accel")


@pytest.mark.parametrize("inputs_on", ["accel", "cpu"])
def test_data_parallel_trains_like_the_cpu_per_chunk(inputs_on: str, fallback_mode) -> None:
    fallback_mode("error")
    cpu, acc = _pair()
    dp = nn.DataParallel(acc)
    assert dp.device_ids == [0, 1] and dp.src_device_obj == A0
    x = torch.randn(10, 6)
    out = dp(x.to(inputs_on), scale=0.5)
    # Each replica sees one chunk: the CPU reference runs the chunks one by one (BatchNorm's
    # batch statistics are per chunk), and the module's buffers are replica 0's.
    ref0, ref1 = cpu(x[:5], scale=0.5), None
    running_mean = cpu.bn.running_mean.clone()
    ref1 = cpu(x[5:], scale=0.5)
    assert out["out"].device == A0 and out["parts"][1].device == A0
    torch.testing.assert_close(out["out"].cpu(), torch.cat([ref0["out"], ref1["out"]]))
    torch.testing.assert_close(
        out["parts"][0].cpu(), torch.cat([ref0["parts"][0], ref1["parts"][0]])
    )
    torch.testing.assert_close(acc.bn.running_mean.cpu(), running_mean)
    (out["out"].square().sum() + out["parts"][1].sum()).backward()
    (
        torch.cat([ref0["out"], ref1["out"]]).square().sum()
        + torch.cat([ref0["parts"][1], ref1["parts"][1]]).sum()
    ).backward()
    for (name, p), q in zip(acc.named_parameters(), cpu.parameters(), strict=True):
        assert p.grad is not None and p.grad.device == A0, name
        torch.testing.assert_close(p.grad.cpu(), q.grad, msg=name)


def test_data_parallel_output_device_one_device_and_no_grad() -> None:
    cpu, acc = _pair()
    cpu.eval(), acc.eval()
    x = torch.randn(7, 6)
    with torch.no_grad():
        out = nn.DataParallel(acc, output_device=1)(x.to("accel"))["out"]
        assert out.device == A1 and not out.requires_grad
        torch.testing.assert_close(out.cpu(), cpu(x)["out"])
        # One device: DataParallel moves the module there, as on CUDA.
        one = nn.DataParallel(acc, device_ids=[1])(x.to("accel:0"))["out"]
        assert one.device == A1 and acc.fc1.weight.device == A1
        torch.testing.assert_close(one.cpu(), cpu(x)["out"])
        two = nn.DataParallel(acc, device_ids=[0, 1])
        with pytest.raises(RuntimeError, match="must have its parameters and buffers on device"):
            two(x.to("accel"))


def test_data_parallel_runs_replicas_under_the_callers_autocast() -> None:
    model = nn.Linear(8, 8).to("accel")
    dp = nn.DataParallel(model)
    x = torch.randn(4, 8, device="accel")
    assert dp(x).dtype == torch.float32
    with torch.autocast("accel", dtype=torch.float16):
        assert model(x).dtype == torch.float16
        # parallel_apply's threads enter autocast when torch.is_autocast_enabled() says so
        # (torch_accel/_torch_fixes.py makes it answer for accel, as it does for CUDA)
        out = dp(x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), model(x), atol=1e-2, rtol=1e-2)


def test_hugging_face_model_under_data_parallel_matches_one_device() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=97,
        n_positions=32,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.GPT2LMHeadModel(config).eval().to("accel")
    ids = torch.randint(0, 97, (4, 9), device="accel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gathering the replicas' scalar losses warns, as on CUDA
        out = nn.DataParallel(model)(input_ids=ids, labels=ids)
    ref0 = model(input_ids=ids[:2], labels=ids[:2])
    ref1 = model(input_ids=ids[2:], labels=ids[2:])
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"
    torch.testing.assert_close(out.logits, torch.cat([ref0.logits, ref1.logits]))
    torch.testing.assert_close(out.loss, torch.stack([ref0.loss, ref1.loss]))


def test_comm_broadcast_keeps_the_source_and_copies_elsewhere() -> None:
    src = torch.arange(6.0, device="accel:1").view(2, 3).t()
    a, b, c = torch.accel.comm.broadcast(src, [0, "accel:1", torch.device("accel", 0)])
    assert b is src
    assert a.device == A0 and c.device == A0 and a.data_ptr() != c.data_ptr()
    assert a.is_contiguous()  # as torch.cuda.comm: a new dense tensor
    torch.testing.assert_close(a.cpu(), src.cpu())
    from_cpu = torch.accel.comm.broadcast(torch.ones(3), [0, 1])
    assert [t.device for t in from_cpu] == [A0, A1]
    out = [torch.empty(3, 2, device="accel:0"), torch.empty(3, 2, device="accel:1")]
    assert torch.accel.comm.broadcast(src, out=out)[1] is out[1]
    torch.testing.assert_close(out[1].cpu(), src.cpu())
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        torch.accel.comm.broadcast(src)
    with pytest.raises(RuntimeError, match="output tensor at index 0 has device 'cpu'"):
        torch.accel.comm.broadcast(src, out=[torch.empty(3, 2)])
    with pytest.raises(RuntimeError, match="same shape as the source"):
        torch.accel.comm.broadcast(src, out=[torch.empty(2, 3, device="accel")])
    with pytest.raises(ValueError, match="Expected an accel device"):
        torch.accel.comm.broadcast(src, ["cpu"])


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_comm_broadcast_coalesced_buckets_keep_order_and_drop_history() -> None:
    w = torch.randn(5, 4, device="accel", requires_grad=True)
    tensors = [
        w,
        torch.arange(7, device="accel"),
        torch.randn(300, device="accel"),
        torch.randn(3, dtype=torch.float64, device="accel"),
    ]
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), device="accel")
    for buffer_size in (64, 10485760):  # one bucket per tensor, and one per dtype
        first, second = torch.accel.comm.broadcast_coalesced(
            tensors + [sparse], [0, 1], buffer_size
        )
        assert all(a is b for a, b in zip(first, tensors + [sparse], strict=True))
        assert all(t.device == A1 and not t.requires_grad for t in second)
        for got, want in zip(second, tensors + [sparse], strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want.detach().cpu())
        assert second[-1].is_sparse
        # Each copy has its own version counter, though a bucket's copies share memory (as
        # CUDA's): an in-place change of one does not invalidate another saved for backward.
        versions = [t._version for t in second]
        second[0].add_(1)  # shares its float32 bucket with second[2] (the larger buffer_size)
        assert [t._version for t in second] == [versions[0] + 1] + versions[1:]
    with pytest.raises(RuntimeError, match=r"All tensors must be on devices\[0\] \(accel:1\)"):
        torch.accel.comm.broadcast_coalesced(tensors, [1, 0])


def test_comm_scatter_chunks_views_and_streams() -> None:
    x = torch.arange(20.0, device="accel:0").view(10, 2)
    parts = torch.accel.comm.scatter(x, [0, 1, 1])
    assert [p.shape[0] for p in parts] == [4, 4, 2] and [p.device for p in parts] == [A0, A1, A1]
    assert parts[0].data_ptr() == x.data_ptr()  # the source's own device: a view
    torch.testing.assert_close(torch.cat([p.cpu() for p in parts]), x.cpu())
    by_size = torch.accel.comm.scatter(x, [1, 0], chunk_sizes=[3, 7], dim=0)
    assert [tuple(p.shape) for p in by_size] == [(3, 2), (7, 2)]
    cols = torch.accel.comm.scatter(x, [1, 0], dim=-1)
    torch.testing.assert_close(cols[0].cpu(), x[:, :1].cpu())
    side = [torch.accel.Stream(device=0), torch.accel.Stream(device=1)]
    host = torch.randn(6, 3)
    moved = torch.accel.comm.scatter(host, [0, 1], streams=side)
    for s in side:
        s.synchronize()
    torch.testing.assert_close(torch.cat([m.cpu() for m in moved]), host)
    with pytest.raises(RuntimeError, match="stream at index 0 .* to match the device"):
        torch.accel.comm.scatter(host, [0, 1], streams=[side[1], side[0]])
    with pytest.raises(RuntimeError, match="devices and chunk_sizes to be of same length"):
        torch.accel.comm.scatter(x, [0, 1], chunk_sizes=[10])
    out = [torch.empty(4, 2, device="accel:1"), torch.empty(6, 2, device="accel:0")]
    torch.accel.comm.scatter(x, out=out)
    torch.testing.assert_close(torch.cat([o.cpu() for o in out]), x.cpu())
    with pytest.raises(RuntimeError, match="Total size for output tensors along scatter dim 0"):
        torch.accel.comm.scatter(x, out=[torch.empty(4, 2, device="accel")])


def test_comm_gather_destinations_layouts_and_errors() -> None:
    parts = [torch.randn(2, 3, device="accel:1"), torch.randn(4, 3, device="accel:0")]
    want = torch.cat([p.cpu() for p in parts])
    assert torch.accel.comm.gather(parts).device == A0  # the current device
    torch.testing.assert_close(torch.accel.comm.gather(parts, destination=1).cpu(), want)
    assert torch.accel.comm.gather(parts, destination="cpu").device.type == "cpu"
    with pytest.warns(FutureWarning, match="Using -1 to represent CPU tensor is deprecated"):
        torch.testing.assert_close(torch.accel.comm.gather(parts, destination=-1), want)
    wide = torch.accel.comm.gather([p.t() for p in parts], dim=1, destination=1)
    torch.testing.assert_close(wide.cpu(), want.t())
    images = [
        torch.randn(1, 3, 4, 4, device=f"accel:{i}").to(memory_format=torch.channels_last)
        for i in (0, 1)
    ]
    gathered = torch.accel.comm.gather(images)
    assert gathered.is_contiguous(memory_format=torch.channels_last)
    out = torch.empty(6, 3, device="accel:1")
    assert torch.accel.comm.gather(parts, out=out) is out
    torch.testing.assert_close(out.cpu(), want)
    with pytest.raises(RuntimeError, match="input tensor at index 1 has device 'cpu'"):
        torch.accel.comm.gather([parts[0], torch.randn(4, 3)])
    with pytest.raises(RuntimeError, match=r"Input tensor at index 1 has invalid shape \[4, 2\]"):
        torch.accel.comm.gather([parts[0], torch.randn(4, 2, device="accel")])


def test_torch_nn_parallel_comm_routes_accel_and_leaves_the_cpu_alone() -> None:
    from torch.nn.parallel import comm

    x = torch.randn(4, 2, device="accel")
    assert [p.device for p in comm.scatter(x, [0, 1])] == [A0, A1]
    assert comm.gather(comm.scatter(x, [0, 1]), destination=1).device == A1
    assert comm.broadcast(x, [1])[0].device == A1
    assert comm.broadcast_coalesced([x], [0, 1])[1][0].device == A1
    summed = comm.reduce_add([x, x.to("accel:1")], destination=0)
    torch.testing.assert_close(summed.cpu(), 2 * x.cpu())
    # CPU tensors to CUDA devices stay torch's: CUDA is not there.
    with pytest.raises((RuntimeError, AssertionError, ValueError)):
        comm.broadcast(torch.ones(2), ["cuda:0"])
