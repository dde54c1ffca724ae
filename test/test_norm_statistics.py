"""Normalization statistics as CUDA returns them: batch norm's in eval and training mode, layer
norm's of half-precision inputs. PyTorch's meta functions (hence fake tensors, torch.compile and
graph capture) describe CUDA's, the CPU kernels differ; accel returns CUDA's and its backward
takes them. Values are compared with the CPU's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers import assert_same

ACCEL = torch.device("accel")


def _batch_norm_eval(device: str, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, ...]]:
    """Every batch norm operator in eval mode, functional and out=, on one device (the same
    values on every device: see _BN_STATS)."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    stats = torch.float64 if dtype == torch.float64 else torch.float32
    w, b, mean, var = (t.to(device, stats) for t in _BN_STATS)
    args = (x, w, b, mean, var)
    aten = torch.ops.aten

    def out(op: torch._ops.OpOverload, *rest: object) -> tuple[torch.Tensor, ...]:
        names = [a.name for a in op._schema.arguments if a.is_out]
        dtypes = (dtype, stats, stats)  # the CPU kernel takes statistics of that dtype only
        outs = {
            n: torch.empty(0, device=device, dtype=d) for n, d in zip(names, dtypes, strict=True)
        }
        return op(*args, *rest, **outs)

    return {
        "native_batch_norm": aten.native_batch_norm(*args, False, 0.1, 1e-5),
        "native_batch_norm.out": out(aten.native_batch_norm.out, False, 0.1, 1e-5),
        "legit": aten._native_batch_norm_legit(*args, False, 0.1, 1e-5),
        "legit.out": out(aten._native_batch_norm_legit.out, False, 0.1, 1e-5),
        "legit_functional": aten._native_batch_norm_legit_functional(*args, False, 0.1, 1e-5),
        "no_training": aten._native_batch_norm_legit_no_training(*args, 0.1, 1e-5),
        "no_training.out": out(aten._native_batch_norm_legit_no_training.out, 0.1, 1e-5),
        # its kernel calls the CPU's batch norm on any device (cuda's fails); accel's follows
        # PyTorch's decomposition
        "no_update": aten._batch_norm_no_update(*args, 0.1, 1e-5),
    }


# weight, bias, running_mean, running_var
_BN_STATS = (torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_norm_in_eval_mode_returns_its_statistics_like_cuda(
    dtype: torch.dtype, fallback_mode
) -> None:
    """In eval mode CUDA's batch norm returns the statistics it normalized with (running_mean,
    1/sqrt(running_var + eps)), and PyTorch's meta functions say so for every device but the CPU,
    whose kernel returns empty ones: fake tensors, torch.compile and graph capture expect CUDA's.
    Found by PyTorch's test_decomp.py and test_ops.py (its fake tensor tests)."""
    stats = torch.float64 if dtype == torch.float64 else torch.float32  # the computation dtype
    mean, var = _BN_STATS[2].to(stats), _BN_STATS[3].to(stats)
    expected = (mean, 1 / torch.sqrt(var + 1e-5))
    cpu = _batch_norm_eval("cpu", dtype)
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        fake = _batch_norm_eval("accel", dtype)
    # Twice: the first call of a signature runs on the caller, later ones as stream tasks.
    # (The meta function of _native_batch_norm_legit.out leaves its statistics empty, CUDA's
    # kernel sizes them as it does for the other forms: out= forms are checked against values.)
    for _ in range(2):
        for name, results in _batch_norm_eval("accel", dtype).items():
            assert_same(results[0], cpu[name][0])  # the normalized output: the CPU's
            assert cpu[name][1].shape == (0,), name  # the CPU's statistics
            for got, meta, want in zip(results[1:3], fake[name][1:3], expected, strict=True):
                if not name.endswith(".out"):
                    assert (got.shape, got.dtype) == (meta.shape, meta.dtype), name
                assert_same(got, want.to(got.dtype))
            for got, want in zip(results[3:], cpu[name][3:], strict=True):
                assert_same(got, want)  # new running statistics; the empty reserve


def test_batch_norm_in_eval_mode_captures_and_trains_like_the_cpu(fallback_mode) -> None:
    """Graph capture allocates what the meta functions say; a capture that was the first call
    of an eval-mode signature copied the CPU's 0 statistics into C of them ("The size of tensor
    a (4) must match the size of tensor b (0)"). Gradients in eval mode read the running
    statistics, not the returned ones: they stay the CPU's."""
    x = torch.randn(2, 4, 3, 3)
    bn = nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        bn.running_mean.copy_(_BN_STATS[2])
        bn.running_var.copy_(_BN_STATS[3])
    bn_accel = copy.deepcopy(bn).to(ACCEL)
    static_x = x.to(ACCEL)
    mean_accel, var_accel = (t.to(ACCEL, torch.float64) for t in _BN_STATS[2:])
    graph = torch.accel.AccelGraph()
    stream = torch.accel.Stream()
    stream.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(stream), torch.accel.graph(graph), torch.no_grad():
        # float64 without weight or bias: a signature no call ran before (in this process)
        static_y = torch.ops.aten._native_batch_norm_legit_no_training(
            static_x.double(), None, None, mean_accel, var_accel, 0.1, 1e-5
        )
    torch.accel.current_stream().wait_stream(stream)
    for scale in (1.0, 2.0):
        static_x.copy_(x * scale)
        graph.replay()
        mean, var = (t.double() for t in _BN_STATS[2:])
        expected = torch.ops.aten._native_batch_norm_legit_no_training(
            (x * scale).double(), None, None, mean, var, 0.1, 1e-5
        )
        assert_same(static_y[0], expected[0])
        assert_same(static_y[1], mean)
        assert_same(static_y[2], 1 / torch.sqrt(var + 1e-5))

    xs = [x.clone().requires_grad_(), x.to(ACCEL).requires_grad_()]
    for m, xi in zip((bn, bn_accel), xs, strict=True):
        m(xi).pow(2).sum().backward()
    assert_same(xs[1].grad, xs[0].grad, exact=False)
    assert_same(bn_accel.weight.grad, bn.weight.grad, exact=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("fn", "affine"),
    # (_batch_norm_no_update's backward needs a weight, on the CPU too)
    [("batch_norm", False), ("batch_norm", True), ("no_update", True)],
)
def test_half_precision_batch_norm_in_eval_mode_backpropagates_like_the_cpu(
    dtype: torch.dtype, fn: str, affine: bool, fallback_mode
) -> None:
    """The float statistics of eval mode (test above) reach the backward, whose CPU kernel
    takes them only in its own dtype (half, with half parameters): found by the OpInfo sweep
    ("expected scalar type BFloat16 but found Float")."""
    x = torch.randn(3, 4, 5, dtype=dtype)
    params = [torch.randn(4, dtype=dtype) for _ in range(2)] if affine else [None, None]
    stats = (torch.randn(4, dtype=dtype), torch.rand(4, dtype=dtype) + 0.5)
    dy = torch.randn(3, 4, 5, dtype=dtype)
    grads = {}
    for device in ("cpu", "accel"):
        xd = x.to(device, copy=True).requires_grad_()
        wd, bd = (None if p is None else p.to(device, copy=True).requires_grad_() for p in params)
        mean, var = (t.to(device) for t in stats)
        if fn == "batch_norm":
            y = torch.nn.functional.batch_norm(xd, mean, var, wd, bd, training=False)
        else:
            y = torch.ops.aten._batch_norm_no_update(xd, wd, bd, mean, var, 0.1, 1e-5)[0]
        y.backward(dy.to(device))
        grads[device] = [t.grad for t in (xd, wd, bd) if t is not None]
    for a, c in zip(grads["accel"], grads["cpu"], strict=True):
        assert_same(a, c)


def _batch_norm_train(device: str, dtype: torch.dtype, affine: bool) -> dict[str, list]:
    """Every functional batch norm operator in training mode on one device, with half-precision
    parameters (or none): the results, then the running statistics they updated."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    w, b = (t.to(device, dtype) for t in _BN_STATS[:2]) if affine else (None, None)
    aten = torch.ops.aten

    def call(op: torch._ops.OpOverload, *rest: object, running: bool = True) -> list:
        stats = [t.to(device, dtype) for t in _BN_STATS[2:]] if running else []
        return [*op(x, w, b, *stats, *rest), *stats]

    return {
        "native_batch_norm": call(aten.native_batch_norm, True, 0.1, 1e-5),
        "native_batch_norm.no_running": call(
            aten.native_batch_norm, None, None, True, 0.1, 1e-5, running=False
        ),
        "legit": call(aten._native_batch_norm_legit, True, 0.1, 1e-5),
        "legit.no_stats": call(
            aten._native_batch_norm_legit.no_stats, True, 0.1, 1e-5, running=False
        ),
        "legit_functional": call(aten._native_batch_norm_legit_functional, True, 0.1, 1e-5),
        "with_update": call(aten._batch_norm_with_update, 0.1, 1e-5),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_in_training_mode_returns_float_statistics_like_cuda(
    dtype: torch.dtype, affine: bool, fallback_mode
) -> None:
    """In training mode CUDA returns the batch's mean and 1/std in float for a half-precision
    input, as the meta functions say; the CPU kernel rounds them to the input's dtype unless the
    parameters are float. Found by PyTorch's test_decomp.py (its dtype checks)."""
    cpu = _batch_norm_train("cpu", dtype, affine)
    # (Fake tensors need the parameters: PyTorch's decomposition of _batch_norm_with_update
    # passes a None weight to a binding that takes tensors only.)
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        fake = _batch_norm_train("accel", dtype, True)
    for _ in range(2):  # the first call of a signature runs on the caller, later ones as tasks
        for name, results in _batch_norm_train("accel", dtype, affine).items():
            assert_same(results[0], cpu[name][0])
            for got, meta, want in zip(results[1:3], fake[name][1:3], cpu[name][1:3], strict=True):
                assert want.dtype == dtype, name  # the CPU's rounded statistics
                assert (got.shape, got.dtype) == (meta.shape, meta.dtype), name
                assert got.dtype == torch.float32, name
                assert_same(got, want.float())
            # new running statistics (updated in place or returned); the empty reserve
            for got, want in zip(results[3:], cpu[name][3:], strict=True):
                assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_half_precision_batch_norm_in_training_mode_backpropagates_like_the_cpu(
    dtype: torch.dtype, affine: bool, fallback_mode
) -> None:
    """The float statistics of training mode reach the backward, whose CPU kernel takes them
    only in its own dtype; a module's running statistics stay the CPU's."""
    x = torch.randn(3, 4, 5, dtype=dtype)
    dy = torch.randn(3, 4, 5, dtype=dtype)
    bn = nn.BatchNorm1d(4, affine=affine).to(dtype)
    results = {}
    for device in ("cpu", "accel"):
        m = copy.deepcopy(bn).to(device)
        xd = x.to(device, copy=True).requires_grad_()
        m(xd).backward(dy.to(device))
        results[device] = [
            xd.grad,
            *(p.grad for p in m.parameters()),
            m.running_mean,
            m.running_var,
        ]
    for a, c in zip(results["accel"], results["cpu"], strict=True):
        assert_same(a, c)


def test_batch_norm_in_training_mode_captures_like_the_cpu(fallback_mode) -> None:
    """A graph capture that is the first call of a training signature allocates the float
    statistics the meta function gives; the task writes the CPU kernel's half ones into them."""
    x = torch.randn(2, 3, 7, dtype=torch.float16)
    w, b, *running = (t[:3].to(torch.float16) for t in _BN_STATS)
    static_x, w_accel, b_accel = x.to(ACCEL), w.to(ACCEL), b.to(ACCEL)
    static_running = [t.to(ACCEL) for t in running]
    graph = torch.accel.AccelGraph()
    stream = torch.accel.Stream()
    stream.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(stream), torch.accel.graph(graph):
        # (2, 3, 7) half: a signature no call ran before (in this process). (Without weight the
        # meta function fails, see above: accel then refuses to capture the call.)
        static_y = torch.ops.aten._batch_norm_with_update(
            static_x, w_accel, b_accel, *static_running, 0.1, 1e-5
        )
    torch.accel.current_stream().wait_stream(stream)
    for scale in (1.0, 2.0):
        static_x.copy_(x * scale)
        graph.replay()
        expected = torch.ops.aten._batch_norm_with_update(x * scale, w, b, *running, 0.1, 1e-5)
        assert_same(static_y[0], expected[0])
        for got, want in zip(static_y[1:3], expected[1:3], strict=True):
            assert got.dtype == torch.float32
            assert_same(got, want.float())
        for got, want in zip(static_running, running, strict=True):
            assert_same(got, want)


def test_batch_norm_out_forms_write_the_functional_results(fallback_mode) -> None:
    """out= tensors shaped as the functional form's results (C statistics in eval mode, float
    for half inputs) keep their storage and get its values; the CPU's out= kernel wanted empty
    statistics ("output with shape [4] doesn't match the broadcast shape [0]"). Found by
    PyTorch's test_ops.py (test_out) and test_meta.py."""
    aten = torch.ops.aten
    x = torch.randn(3, 4, 5, device=ACCEL)
    w, b, mean, var = (t.to(ACCEL) for t in _BN_STATS)
    for dtype in (torch.float32, torch.bfloat16):
        for training in (False, True):
            xd, wd, bd = x.to(dtype), w.to(dtype), b.to(dtype)
            call = (xd, wd, bd, mean.to(dtype), var.to(dtype), training, 0.1, 1e-5)
            expected = aten.native_batch_norm(*call)
            outs = [torch.full_like(t, float("nan")) for t in expected]
            ptrs = [t.data_ptr() for t in outs]
            names = ("out", "save_mean", "save_invstd")
            aten.native_batch_norm.out(*call, **dict(zip(names, outs, strict=True)))
            for o, e, p in zip(outs, expected, ptrs, strict=True):
                assert (o.data_ptr(), o.dtype) == (p, e.dtype)
                assert_same(o, e.cpu())
    call = (x, w, b, mean, var, False, 0.1, 1e-5)
    out = torch.empty_like(x)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        stats = [torch.empty(0, device=ACCEL, dtype=torch.long) for _ in range(2)]
        aten.native_batch_norm.out(*call, out=out, save_mean=stats[0], save_invstd=stats[1])
    with pytest.raises(RuntimeError, match="out argument save_mean is on cpu"):
        stats = [torch.empty(0), torch.empty(0, device=ACCEL)]
        aten.native_batch_norm.out(*call, out=out, save_mean=stats[0], save_invstd=stats[1])
    y = aten._native_batch_norm_legit_no_training(x, w, b, mean, var, 0.1, 1e-5)[0]
    assert_same(
        y,
        aten._native_batch_norm_legit_no_training(
            *(t.cpu() for t in (x, w, b, mean, var)), 0.1, 1e-5
        )[0],
    )


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_batch_norm_without_running_statistics_in_eval_mode_raises(path, request) -> None:
    """_batch_norm_no_update normalizes with the running statistics; its CPU kernel reads them
    when they are None and crashes the process (on the CPU device too). Accel raises, also where
    the operator takes the CPU fallback (a driver without an executor: found on the emulated
    cuda driver)."""
    if path == "fallback":
        request.getfixturevalue("force_fallback")
    x = torch.randn(3, 4, 5, device=ACCEL)
    with pytest.raises(RuntimeError, match="running_mean and running_var must be given"):
        torch.ops.aten._batch_norm_no_update(x, None, None, None, None, 0.1, 1e-5)
    y = torch.ops.aten._batch_norm_no_update(
        x, None, None, torch.zeros(4, device=ACCEL), torch.ones(4, device=ACCEL), 0.1, 0.0
    )[0]
    assert_same(y, x.cpu())  # still usable: mean 0, variance 1, no eps


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight", [None, "half", "float"])
def test_layer_norm_statistics_are_float_like_cuda(
    dtype: torch.dtype, weight: str | None, fallback_mode
) -> None:
    """native_layer_norm of a half-precision input returns float mean and rstd, as CUDA and the
    meta function (which torch.compile's generated backward reads by) say, whatever the
    parameters' dtype; the CPU's rounds them to the input's dtype unless a parameter is float.
    The backward takes them back, also in the first call of its signature (the CPU kernel's)."""
    x = torch.randn(4, 6, 8, dtype=dtype)
    w = None if weight is None else torch.randn(8).to(dtype if weight == "half" else torch.float)
    dy = torch.randn(4, 6, 8, dtype=dtype)

    mask = [True, w is not None, w is not None]

    def call(device: str, stats: tuple[torch.Tensor, torch.Tensor] | None = None):  # type: ignore[no-untyped-def]
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        y, mean, rstd = torch.ops.aten.native_layer_norm(on(x), [8], on(w), on(w), 1e-5)
        mean, rstd = (mean, rstd) if stats is None else (on(stats[0]), on(stats[1]))
        grads = torch.ops.aten.native_layer_norm_backward(
            on(dy), on(x), [8], mean, rstd, on(w), on(w), mask
        )
        return y, mean, rstd, grads

    y, mean, rstd, grads = call("cpu")
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        fake = call("accel")
    for _ in range(2):  # the first call of a signature runs on the caller, later ones as tasks
        got = call("accel")
        assert_same(got[0], y)
        for g, f, c in zip(got[1:3], fake[1:3], (mean, rstd), strict=True):
            assert (g.dtype, g.shape) == (f.dtype, f.shape) == (torch.float32, c.shape)
            assert_same(g, c.float())  # the CPU kernel's values
        # The backward from accel's float statistics is the backward from the CPU's.
        given = call("accel", (mean, rstd))[3]
        assert_same(got[3][0], grads[0])
        for g, c in zip(got[3], given, strict=True):
            if c is not None:
                assert_same(g, c.cpu())


def test_layer_norm_out_form_writes_the_functional_results(fallback_mode) -> None:
    """native_layer_norm.out with out= tensors shaped after the functional form's results
    (float statistics of a bfloat16 input) takes them, as CUDA's; the CPU's out= kernel wanted
    bfloat16 ones. Found by PyTorch's test_meta.py (it calls each operator's out= form)."""
    x = torch.randn(4, 6, dtype=torch.bfloat16, device=ACCEL)
    w = torch.randn(6, dtype=torch.bfloat16, device=ACCEL)
    expected = torch.ops.aten.native_layer_norm(x, [6], w, w, 1e-5)
    outs = [torch.full_like(t, float("nan")) for t in expected]
    torch.ops.aten.native_layer_norm.out(
        x, [6], w, w, 1e-5, out0=outs[0], out1=outs[1], out2=outs[2]
    )
    for o, e in zip(outs, expected, strict=True):
        assert o.dtype == e.dtype
        assert_same(o, e.cpu())
