"""The underlying tier: ATen CPU kernels on accel memory, in stream order, without copies."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_accel
from helpers import assert_same


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(4, 5, generator=g),
        "b": torch.randn(4, 5, generator=g),
        "row": torch.randn(5, generator=g),  # broadcasts against a
        "pos": torch.rand(4, 5, generator=g) + 0.1,
        "i": torch.randint(-5, 5, (4, 5), generator=g),
        "mask": torch.rand(4, 5, generator=g) > 0.5,
        "m1": torch.randn(3, 4, generator=g),
        "m2": torch.randn(4, 6, generator=g),
        "b1": torch.randn(2, 3, 4, generator=g),
        "b2": torch.randn(2, 4, 5, generator=g),
        "idx": torch.tensor([3, 0, 2, 0], dtype=torch.long),
    }


Case = Callable[[dict[str, torch.Tensor]], object]

# Each case runs on CPU tensors and on accel copies; results must agree.
CASES: dict[str, Case] = {
    # pointwise with broadcasting and type promotion
    "add": lambda t: t["a"] + t["row"],
    "add_alpha": lambda t: torch.add(t["a"], t["b"], alpha=2.5),
    "sub_int_float": lambda t: t["i"] - t["a"],
    "mul_scalar": lambda t: t["a"] * 3,
    "div": lambda t: t["a"] / t["pos"],
    "div_floor_int": lambda t: torch.div(t["i"], 3, rounding_mode="floor"),
    "pow": lambda t: t["pos"] ** t["b"],
    "maximum": lambda t: torch.maximum(t["a"], t["row"]),
    "minimum": lambda t: torch.minimum(t["a"], t["b"]),
    "where": lambda t: torch.where(t["mask"], t["a"], t["row"]),
    "clamp": lambda t: t["a"].clamp(-0.5, 0.5),
    "comparisons": lambda t: (t["a"] < t["b"], t["a"] >= 0, t["i"] == 2, t["a"] != t["b"]),
    "logical": lambda t: (t["mask"] & (t["a"] > 0), t["mask"].logical_or(t["a"] > 0), ~t["mask"]),
    "unary": lambda t: [
        f(t["pos"]) for f in (torch.exp, torch.log, torch.sqrt, torch.rsqrt, torch.tanh)
    ],
    "activations": lambda t: [
        f(t["a"]) for f in (torch.sigmoid, torch.relu, F.gelu, F.silu, torch.abs, torch.neg)
    ],
    "trig": lambda t: [f(t["a"]) for f in (torch.sin, torch.cos, torch.erf)],
    "ternary": lambda t: (
        torch.addcmul(t["a"], t["b"], t["pos"], value=0.5),
        t["a"].lerp(t["b"], 0.3),
    ),
    # reductions
    "sum_mean": lambda t: (t["a"].sum(), t["a"].sum(1), t["a"].mean(0, keepdim=True)),
    "amax_amin": lambda t: (t["a"].amax(1), t["a"].amin(0)),
    "argmax": lambda t: (t["a"].argmax(), t["a"].argmin(1)),
    "var_std": lambda t: (t["a"].var(0), t["a"].std(1, correction=0)),
    "norm": lambda t: (t["a"].norm(), torch.linalg.vector_norm(t["a"], 3, dim=1)),
    "cumsum_prod": lambda t: (t["a"].cumsum(1), t["pos"].prod(0)),
    "any_all": lambda t: (t["mask"].any(), t["mask"].all(1)),
    "int_sum": lambda t: t["i"].sum(),  # int64 result
    # matrix products
    "mm": lambda t: t["m1"] @ t["m2"],
    "bmm": lambda t: torch.bmm(t["b1"], t["b2"]),
    "addmm": lambda t: torch.addmm(t["m2"][0], t["m1"], t["m2"], beta=0.5),
    "baddbmm": lambda t: torch.baddbmm(t["b1"].new_zeros(2, 3, 5), t["b1"], t["b2"], alpha=2),
    "matmul": lambda t: torch.matmul(t["b1"], t["m2"]),
    "linear": lambda t: F.linear(t["a"], t["b2"][0, :3], t["row"][:3]),
    # softmax and norms
    "softmax": lambda t: (t["a"].softmax(1), t["a"].log_softmax(0)),
    "layer_norm": lambda t: F.layer_norm(t["a"], (5,), t["row"], t["pos"][0]),
    "rms_norm": lambda t: F.rms_norm(t["a"], (5,), t["pos"][0]),
    # indexing
    "embedding": lambda t: F.embedding(t["idx"], t["a"]),
    "index_select": lambda t: t["a"].index_select(0, t["idx"]),
    "gather": lambda t: t["a"].gather(1, t["idx"].view(4, 1).expand(4, 3) % 5),
    "scatter": lambda t: t["a"].new_zeros(4, 5).scatter(1, t["idx"].view(4, 1) % 5, t["a"]),
    "scatter_add": lambda t: t["a"].new_zeros(5, 5).scatter_add(0, t["i"].abs() % 5, t["a"]),
    "index_add": lambda t: t["a"].new_zeros(5, 5).index_add(0, t["idx"], t["a"]),
    "index": lambda t: t["a"][t["idx"]],
    "index_put": lambda t: t["a"].clone().index_put_((t["idx"],), t["row"], accumulate=True),
    "masked_fill": lambda t: t["a"].masked_fill(t["mask"], -1.0),
    # building and reordering
    "cat_stack": lambda t: (torch.cat([t["a"], t["b"]], 1), torch.stack([t["a"], t["b"]])),
    "split_chunk": lambda t: [c * 1 for c in t["a"].split(2) + t["a"].chunk(3, 1)],
    "flip_roll": lambda t: (t["a"].flip(0), t["a"].roll(2, 1)),
    "tril_triu": lambda t: (t["a"].tril(), t["a"].triu(1)),
    "sort_topk": lambda t: (t["a"].sort(1), t["a"].topk(2, 1)),
    "like": lambda t: (
        torch.ones_like(t["a"]),
        torch.zeros_like(t["i"]),
        torch.full_like(t["a"], 7),
    ),
    # losses
    "cross_entropy": lambda t: F.cross_entropy(t["a"], t["idx"] % 5),
    "nll_loss": lambda t: F.nll_loss(t["a"].log_softmax(1), t["idx"], reduction="sum"),
    "mse": lambda t: F.mse_loss(t["a"], t["b"]),
    # attention, convolution, pooling
    "sdpa": lambda t: F.scaled_dot_product_attention(
        t["b1"][:, None], t["b1"][:, None], t["b1"][:, None], is_causal=True
    ),
    "conv2d": lambda t: F.conv2d(t["b1"][None], t["b1"][:, None, :2, :2].repeat(1, 2, 1, 1)),
    "max_pool": lambda t: F.max_pool2d(t["b1"][None], 2),
    "avg_pool": lambda t: F.adaptive_avg_pool2d(t["b1"][None], 1),
}


def to_accel(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.to("accel")
    return value


def check_same(actual: object, expected: object) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert_same(actual, expected, exact=False)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)  # type: ignore[arg-type]
        for x, y in zip(actual, expected, strict=True):  # type: ignore[call-overload]
            check_same(x, y)
    else:
        assert actual == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_listed_ops_match_cpu_without_fallback(name: str, no_fallback: None) -> None:
    cpu = inputs()
    expected = CASES[name](cpu)
    actual = CASES[name]({k: to_accel(v) for k, v in cpu.items()})
    check_same(actual, expected)


@pytest.mark.parametrize("name", ["add", "softmax", "mm", "layer_norm", "sort_topk", "index"])
def test_forced_fallback_gives_the_same_results(name: str) -> None:
    cpu = inputs(1)
    expected = CASES[name](cpu)
    check_same(CASES[name]({k: to_accel(v) for k, v in cpu.items()}), expected)
    torch_accel._C._set_force_fallback(True)
    try:
        torch.accel.reset_fallback_stats()
        forced = CASES[name]({k: to_accel(v) for k, v in cpu.items()})
        assert torch.accel.fallback_stats() != {}  # it really went through the fallback
    finally:
        torch_accel._C._set_force_fallback(False)
    check_same(forced, expected)


def test_backward_of_listed_ops(no_fallback: None) -> None:
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(6, 8, generator=g)
    w0 = torch.randn(8, 8, generator=g)
    idx0 = torch.randint(0, 8, (6,), generator=g)
    grads = {}
    for dev in ("cpu", "accel"):
        x = x0.to(dev).detach().requires_grad_()
        w = w0.to(dev).detach().requires_grad_()
        emb = torch.randn(10, 8, generator=torch.Generator().manual_seed(3)).to(dev)
        emb.requires_grad_()
        h = F.layer_norm(x @ w + F.embedding(idx0.to(dev) % 10, emb), (8,))
        h = F.rms_norm(F.gelu(h), (8,))
        q = h.view(1, 2, 3, 8)
        h = F.scaled_dot_product_attention(q, q, q).reshape(6, 8)
        loss = F.cross_entropy(h.log_softmax(1).softmax(1), idx0.to(dev))
        loss.backward()
        grads[dev] = (loss.detach(), x.grad, w.grad, emb.grad)
    for a, c in zip(grads["accel"], grads["cpu"], strict=True):
        assert_same(a, c, exact=False)


def test_inplace_and_out_variants_write_into_their_arguments(no_fallback: None) -> None:
    a = torch.arange(6.0, device="accel").view(2, 3)
    ptr = a.data_ptr()
    assert a.add_(1).data_ptr() == ptr
    a.mul_(torch.tensor(2.0))  # a CPU scalar tensor
    a.clamp_(max=10)
    assert a.data_ptr() == ptr
    assert_same(a, ((torch.arange(6.0).view(2, 3) + 1) * 2).clamp(max=10))
    # out= of the right size is written in place
    out = torch.empty(2, 3, device="accel")
    out_ptr = out.data_ptr()
    r = torch.mul(a, 3, out=out)
    assert r is out and out.data_ptr() == out_ptr
    assert_same(out, a.cpu() * 3)
    # out= of size 0 is resized like on the CPU
    out = torch.empty(0, device="accel")
    torch.matmul(a, a.T, out=out)
    assert out.shape == (2, 2)
    assert_same(out, a.cpu() @ a.cpu().T)
    # in-place through a non-contiguous view writes through to the base
    base = torch.zeros(4, 4, device="accel")
    base[:, 1].add_(torch.arange(4.0, device="accel"))
    expected = torch.zeros(4, 4)
    expected[:, 1] = torch.arange(4.0)
    assert_same(base, expected)
    # multi-output out= forms
    values, indices = (
        torch.empty(0, device="accel"),
        torch.empty(0, dtype=torch.long, device="accel"),
    )
    torch.sort(a, 1, descending=True, out=(values, indices))
    ev, ei = torch.sort(a.cpu(), 1, descending=True)
    assert_same(values, ev)
    assert_same(indices, ei)


def test_out_argument_with_wrong_dtype_raises_the_cpu_error() -> None:
    a = torch.ones(3, device="accel")
    with pytest.raises(
        RuntimeError, match="result type Float can't be cast to the desired output type Long"
    ):
        torch.add(a, a, out=torch.empty(3, dtype=torch.int64, device="accel"))
    assert_same(a + 1, torch.full((3,), 2.0))


def _resize_warnings(fn: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "was resized" in str(w.message)]


@pytest.mark.parametrize(
    "op",
    [
        # Meta functions in Python (torch/_meta_registrations.py), which warn through Python
        lambda t, out: torch.linalg.eigvalsh(t, out=out),
        lambda t, out: torch.linalg.inv(t, out=out),
        lambda t, out: torch.cholesky_inverse(t, out=out),
        # and in C++
        lambda t, out: torch.mul(t, 2, out=out),
    ],
    ids=["eigvalsh", "inv", "cholesky_inverse", "mul"],
)
def test_out_arguments_resize_warn_and_keep_strides_like_the_cpu(
    op: Callable[[torch.Tensor, torch.Tensor], object], no_fallback: None
) -> None:
    g = torch.randn(4, 4, dtype=torch.float64)
    t = g @ g.mT + torch.eye(4, dtype=torch.float64)  # symmetric positive definite
    expected = torch.empty(0, dtype=t.dtype)
    op(t, expected)
    for make_out in (
        lambda device: torch.empty(3, 5, dtype=t.dtype, device=device),  # resized: one warning
        # of the right shape, strided: kept as it is
        lambda device: torch.empty(
            *expected.shape[:-1], 2 * expected.shape[-1], dtype=t.dtype, device=device
        )[..., ::2],
    ):
        out_cpu, out = make_out("cpu"), make_out("accel")
        cpu_warnings = _resize_warnings(lambda: op(t, out_cpu))  # noqa: B023
        assert _resize_warnings(lambda: op(t.to("accel"), out)) == cpu_warnings  # noqa: B023
        assert (out.shape, out.stride()) == (out_cpu.shape, out_cpu.stride())
        assert_same(out, out_cpu)


def test_empty_out_arguments_take_the_cpu_kernels_shapes_and_strides(no_fallback: None) -> None:
    """Found by PyTorch's test_ops.py (test_out): an empty out= tensor was sized from the meta
    function even where the CPU kernel leaves it alone (of the right shape already: a batch of
    zero linear systems). (Batch norm's statistics in eval mode, which the CPU kernel leaves
    empty, are CUDA's on accel: test_norm_statistics.py.)"""
    torch.manual_seed(0)
    a, b = torch.randn(0, 5, 5), torch.randn(0, 5)
    x = torch.randn(3, 2, 4)
    w, bias, mean, var = torch.randn(2), torch.randn(2), torch.zeros(2), torch.ones(2)

    def calls(device: str) -> list[torch.Tensor]:
        def on(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, copy=True)  # training updates the running statistics

        solved = torch.empty(0, 5, device=device)  # the right shape, contiguous strides
        torch.linalg.solve(on(a), on(b), out=solved)
        results = [solved]
        normed = [torch.empty(0, device=device) for _ in range(3)]
        args = (on(x), on(w), on(bias), on(mean), on(var))
        torch.native_batch_norm(*args, True, 0.1, 1e-5, out=normed)
        results += normed
        return results

    # Three times: the first call of a signature runs on the caller, later ones as tasks
    # sized from what the first did.
    for _ in range(3):
        expected, got = calls("cpu"), calls("accel")
        assert [(t.shape, t.stride()) for t in got] == [(t.shape, t.stride()) for t in expected]
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)


def test_batch_norm_statistics_written_into_a_lazy_clone_leave_its_source_alone(
    no_fallback: None,
) -> None:
    """native_batch_norm's schema does not mark its running statistics as written. Found by
    PyTorch's test_ops.py (test_cow_input): the update of a copy-on-write clone's statistics
    reached the tensor it was cloned from."""
    x = torch.randn(4, 3)
    for device in ("cpu", "accel"):
        mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
        lazy_mean, lazy_var = torch._lazy_clone(mean), torch._lazy_clone(var)
        torch.native_batch_norm(x.to(device), None, None, lazy_mean, lazy_var, True, 0.5, 1e-5)
        assert torch.equal(mean.cpu(), torch.zeros(3)), device
        assert torch.equal(var.cpu(), torch.ones(3)), device
        torch.testing.assert_close(lazy_mean.cpu(), x.mean(0) * 0.5)
        torch.testing.assert_close(lazy_var.cpu(), x.var(0) * 0.5 + 0.5)


def test_a_kernel_returning_its_argument_returns_the_accel_argument(no_fallback: None) -> None:
    """dequantize's schema says its result is new, but for a float tensor the CPU's (and
    CUDA's) kernel returns the tensor itself. Found by torchao's optimizer states: accel copied
    that result "from the host", reading accel memory as the host's, and raised."""
    x = torch.arange(6.0)
    assert x.dequantize() is x  # the CPU's behaviour
    x_accel = x.to("accel")
    for _ in range(3):  # the first call of the signature, then the later ones
        assert x_accel.dequantize() is x_accel
    strided = x_accel[1::2]  # a view of its own storage: the same view back
    assert strided.dequantize() is strided
    half = x_accel.half()
    new = half.dequantize()  # converted: a new float tensor
    assert new.dtype == torch.float32 and new.data_ptr() != half.data_ptr()
    assert_same(new, x)
    assert_same(x_accel + 1, x + 1)  # the device stays usable


def test_copy_on_write_inputs_that_are_only_read_stay_shared(no_fallback: None) -> None:
    """Found by PyTorch's test_ops.py (test_cow_input): a CPU index (its upload to accel asked
    for the pointer to write), to_sparse's dense input (operators that run their CPU kernel
    through a direct call viewed every argument as written) got memory of their own: an extra
    copy of data nothing wrote."""
    x = torch.randn(5, 5, 5)
    mask = torch.tensor([True, False, True, False, True])
    x_accel = x.to("accel")
    reads = {  # (the argument, what reads it, the expected result)
        "cpu index": (mask, lambda m: x_accel[m], x[mask]),
        "upload": (mask, lambda m: m.to("accel"), mask),
        "to_sparse": (x_accel, lambda t: t.to_sparse().to_dense(), x),
        "to_sparse_csr": (x_accel[0], lambda t: t.to_sparse_csr().to_dense(), x[0]),
    }
    for name, (argument, read, expected) in reads.items():
        lazy = torch._lazy_clone(argument)
        assert torch._C._is_cow_tensor(lazy)
        result = read(lazy)
        assert torch._C._is_cow_tensor(lazy), f"{name}: the input got memory of its own"
        assert_same(result, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("given", ["weight", "bias"])
def test_layer_norm_of_a_reduced_input_with_one_float_parameter(
    dtype: torch.dtype, given: str, no_fallback: None
) -> None:
    """Found by a diffusers sweep (AdaLayerNormContinuous(bias=False) under layerwise casting,
    which keeps norms in float32): the missing parameter was made in the input's dtype next to
    the float one, which ATen's kernel refuses, from the second call on (at the next sync)."""
    torch.manual_seed(0)
    x, p = torch.randn(4, 7, 96).to(dtype), torch.randn(96)
    weight, bias = (p, None) if given == "weight" else (None, p)
    expected = torch.native_layer_norm(x, (96,), weight, bias, 1e-5)
    on = {"weight": None if weight is None else weight.to("accel")}
    on["bias"] = None if bias is None else bias.to("accel")
    for _ in range(3):  # the first call runs on the caller, later ones as tasks
        got = torch.native_layer_norm(x.to("accel"), (96,), on["weight"], on["bias"], 1e-5)
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)  # the statistics in float, as the CPU's


def test_user_errors_have_the_cpu_messages() -> None:
    a = torch.randn(3, 4, device="accel")
    with pytest.raises(
        RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x4 and 3x4\)"
    ):
        a @ a
    with pytest.raises(RuntimeError, match="The size of tensor a \\(4\\) must match"):
        a + torch.randn(5, device="accel")
    with pytest.raises(RuntimeError, match="found at least two devices, accel:0 and accel:1"):
        a + torch.randn(3, 4, device="accel:1")
    with pytest.raises(RuntimeError, match="found at least two devices, accel:0 and cpu"):
        a + torch.randn(3, 4)
    assert_same(a + torch.tensor(1.0), a.cpu() + 1)  # 0-dim CPU tensors are scalars
    assert_same((a * 2).sum(), a.cpu().mul(2).sum(), exact=False)


def test_random_ops_use_the_accel_generator(no_fallback: None) -> None:
    def draw() -> list[torch.Tensor]:
        torch.accel.manual_seed(123)
        x = torch.empty(1000, device="accel")
        return [
            x.uniform_(-1, 1).clone(),
            x.normal_(2, 0.5).clone(),
            torch.bernoulli(torch.full((1000,), 0.3, device="accel")),
            F.dropout(torch.ones(1000, device="accel"), 0.5),
            torch.randperm(50, device="accel"),
            torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device="accel"), 200, replacement=True),
        ]

    first, second = draw(), draw()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.cpu(), b.cpu())  # reproducible under manual_seed
    u, n, bern, drop, perm, multi = (t.cpu() for t in first)
    assert -1 <= u.min() and u.max() <= 1 and abs(u.mean().item()) < 0.1
    assert abs(n.mean().item() - 2) < 0.1 and abs(n.std().item() - 0.5) < 0.1
    assert abs(bern.mean().item() - 0.3) < 0.06
    assert set(drop.unique().tolist()) == {0.0, 2.0}
    assert sorted(perm.tolist()) == list(range(50))
    assert abs((multi == 2).float().mean().item() - 0.7) < 0.1


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("foreach", [True, False])
def test_optimizers_match_cpu_without_fallback(name: str, foreach: bool, no_fallback: None) -> None:
    params = {}
    for dev in ("cpu", "accel"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        model.to(dev)
        kwargs: dict[str, object] = {"lr": 0.01, "foreach": foreach}
        if name == "SGD":
            kwargs.update(momentum=0.9, weight_decay=1e-3, nesterov=True)
        opt = getattr(torch.optim, name)(model.parameters(), **kwargs)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(dev)
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=foreach)
            opt.step()
        params[dev] = [p.detach() for p in model.parameters()]
    for a, c in zip(params["accel"], params["cpu"], strict=True):
        assert_same(a, c, exact=False)


def test_foreach_ops_write_every_tensor(no_fallback: None) -> None:
    xs = [torch.randn(n) for n in (3, 5, 7)]
    ys = [torch.randn(n) for n in (3, 5, 7)]
    ax, ay = [x.to("accel") for x in xs], [y.to("accel") for y in ys]
    ptrs = [t.data_ptr() for t in ax]
    torch._foreach_add_(ax, ay, alpha=2)
    torch._foreach_mul_(ax, 0.5)
    assert [t.data_ptr() for t in ax] == ptrs
    expected = [(x + 2 * y) * 0.5 for x, y in zip(xs, ys, strict=True)]
    for a, e in zip(ax, expected, strict=True):
        assert_same(a, e, exact=False)
    for a, e in zip(torch._foreach_sqrt(torch._foreach_abs(ax)), expected, strict=True):
        assert_same(a, e.abs().sqrt(), exact=False)
    for a, e in zip(torch._foreach_norm(ax), expected, strict=True):
        assert_same(a, e.norm(), exact=False)


def test_listed_ops_keep_results_on_the_callers_device(no_fallback: None) -> None:
    with torch.accel.device(1):
        a = torch.randn(3, 3, device="accel:1")
        r = (a @ a).relu().sum(0)
        assert r.device == torch.device("accel:1")
    b = torch.randn(3, device="accel:1")  # current device 0, tensors on 1
    assert (b * 2).device == torch.device("accel:1")
    assert_same(b * 2, b.cpu() * 2)


@pytest.mark.parametrize(
    "case",
    ["contiguous", "transposed", "no_affine", "bf16_float_params", "bf16", "empty_rows", "3d"],
)
def test_layer_norm_computes_into_its_results(case: str, no_fallback: None) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 8, generator=g)
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    shape: tuple[int, ...] = (8,)
    if case == "transposed":
        x = torch.randn(8, 6, generator=g).T  # not contiguous
    elif case == "no_affine":
        w = b = None
    elif case == "bf16_float_params":
        x = x.bfloat16()
    elif case == "bf16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    elif case == "empty_rows":
        x = torch.randn(0, 8)
    elif case == "3d":
        x, shape = torch.randn(2, 3, 4, 8, generator=g), (4, 8)
        w, b = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    res = {}
    for dev in ("cpu", "accel"):
        xd = x.to(dev).detach().requires_grad_()
        wd = None if w is None else w.to(dev).detach().requires_grad_()
        bd = None if b is None else b.to(dev).detach().requires_grad_()
        out, mean, rstd = torch.native_layer_norm(xd, shape, wd, bd, 1e-5)
        (out.float() * torch.arange(out.numel(), device=dev).view(out.shape)).sum().backward()
        grads = [t.grad for t in (xd, wd, bd) if t is not None]
        res[dev] = [out.detach(), mean, rstd, *grads]
    for i, (a, c) in enumerate(zip(res["accel"], res["cpu"], strict=True)):
        if case == "bf16" and i in (1, 2):
            c = c.float()  # float statistics, as CUDA's (test_norm_statistics.py), the CPU's values
        assert a.shape == c.shape and a.dtype == c.dtype and a.stride() == c.stride()
        if case == "bf16_float_params":
            # The float gradients of the parameters sum bfloat16 products: CPU's kernel splits
            # that sum over its threads even for 6 rows, and a call this small runs on one
            # thread on accel, so they round like bfloat16 apart (within 1%).
            torch.testing.assert_close(a.cpu(), c, rtol=1.6e-2, atol=1e-5)
        else:
            assert_same(a, c, exact=False)


def test_factory_operators_build_on_accel(no_fallback: None) -> None:
    # Operators with no tensor argument: the device argument selects accel; the task builds the
    # result with the CPU kernel in accel memory.
    for dev in ("accel:0", "accel:1"):
        cases = [
            (torch.arange(1, 10, 3, device=dev), torch.arange(1, 10, 3)),
            (torch.arange(5.0, device=dev), torch.arange(5.0)),
            (torch.eye(3, 4, device=dev), torch.eye(3, 4)),
            (torch.linspace(-2, 3, 7, device=dev), torch.linspace(-2, 3, 7)),
            (torch.full((2, 3), 1.5, device=dev), torch.full((2, 3), 1.5)),
            (torch.zeros(4, dtype=torch.int32, device=dev), torch.zeros(4, dtype=torch.int32)),
        ]
        for actual, expected in cases:
            assert actual.device == torch.device(dev)
            assert_same(actual, expected)
    torch.accel.manual_seed(0)
    perm = torch.randperm(20, device="accel")
    assert sorted(perm.tolist()) == list(range(20))


def test_changing_scalars_reuse_the_first_calls_metadata(no_fallback: None) -> None:
    # Learning-rate-like scalars change every call; results follow the values (the cached
    # metadata is keyed on the scalar's type, and on the values where shapes depend on them).
    a = torch.arange(6.0).view(2, 3)
    acc = a.to("accel")
    for lr in (0.1, 0.05, 1e-3, 2.0):
        assert_same(acc * lr, a * lr)
        assert_same(torch.add(acc, acc, alpha=lr), torch.add(a, a, alpha=lr))
    assert_same(acc * 2, a * 2)  # an int scalar: same promotion as on the CPU
    assert_same(acc.long() * 2.5, a.long() * 2.5)  # a float scalar promotes int64 to float
    for end, step in ((5.0, 0.5), (5.0, 0.25), (2.0, 0.3)):
        assert_same(torch.arange(0.0, end, step, device="accel"), torch.arange(0.0, end, step))


def test_attention_picks_the_same_kernel_as_the_cpu(no_fallback: None) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    qa, ka, va = (t.to("accel") for t in (q, k, v))
    # The CPU's flash kernel runs underlying: bit-identical results, forward and backward.
    assert torch.equal(
        F.scaled_dot_product_attention(qa, ka, va, is_causal=True).cpu(),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            grads = []
            for dev in ("cpu", "accel"):
                x = q.to(dev).detach().requires_grad_()
                F.scaled_dot_product_attention(x, k.to(dev), v.to(dev)).sum().backward()
                grads.append(x.grad.cpu())
            assert torch.equal(grads[0], grads[1]), backend
    # A mask whose last dimension is strided (a permuted group mask, an expanded row): the CPU's
    # flash kernel reads it as it is, and so does accel's host executor (PyTorch's rule sends
    # other devices' such masks to the math path, a few ulps from the CPU's result, and refuses
    # them under sdpa_kernel(FLASH_ATTENTION)).
    base = torch.randn(16, 16, 2, generator=g)
    for mask in (base.permute(2, 0, 1).unsqueeze(1), base[:, :1, 0].expand(16, 16)):
        assert mask.stride(-1) != 1
        for backends in (
            [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH],
            [SDPBackend.FLASH_ATTENTION],
        ):
            with sdpa_kernel(backends):
                assert torch.equal(
                    F.scaled_dot_product_attention(qa, ka, va, attn_mask=mask.to("accel")).cpu(),
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                )
