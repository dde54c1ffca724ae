"""accel's C++ meta functions (csrc/aten/meta_functions.cpp) of operators without a structured one:
layer norm and its backward, where, masked_fill (and in place), index_select, embedding's
backward, dropout's backward, constant padding, _safe_softmax, relu (and in place), bernoulli_
and exponential_; and arange, whose values decide its length. A signature's first call computes
its results with them, straight into accel memory, so they must lay results out exactly as the
CPU kernel does and raise its errors at the call; new shapes of a family that ran do not wait
for the stream. A convolutional network's (convolution, batch norm): test_meta_functions_cnn.py."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import LAUNCH_BLOCKING, on, pending_behind_a_sleep, skip_unless_host_first_calls

A = torch.ops.aten


@pytest.fixture(autouse=True)
def host_executor() -> None:
    # The subject is the host executor's first calls (the cuda executor's kernels allocate
    # their own results; without an executor the CPU fallback runs the CPU's own calls).
    skip_unless_host_first_calls()


def check_like_cpu(op: Callable[..., Any], *args: Any, exact: bool = True) -> None:
    """op on accel gives the CPU's results: sizes, strides and dtypes, values bit for bit (but
    for layer norm's statistics of a reduced-precision input, float as CUDA's are: see
    csrc/aten/norm.cpp). Not `exact`: values within the dtype's tolerance (reductions over rows:
    accel runs small calls on one thread, the CPU's call here may split them over several)."""
    expected = op(*args)
    got = op(*on("accel", list(args)))
    if op is A.native_layer_norm and args[0].dtype in (torch.bfloat16, torch.float16):
        expected = (expected[0], expected[1].float(), expected[2].float())
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if e is None:  # a gradient output_mask leaves out
            assert g is None
            continue
        assert g.device.type == "accel"
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype)
        if exact:
            torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0, equal_nan=True)
        else:  # rounding at the input's precision: bfloat16's in mixed-precision layer norm
            low = any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)
            tol = 1.6e-2 if low else 1e-5
            torch.testing.assert_close(g.cpu(), e, rtol=tol, atol=tol, equal_nan=True)


def layer_norm_cases() -> list[tuple[Any, ...]]:
    g = torch.Generator().manual_seed(0)

    def r(*s: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*s, generator=g).to(dtype)

    cases: list[tuple[Any, ...]] = [
        (r(2, 5, 8), [8], r(8), r(8), 1e-5),
        (r(2, 5, 8), [5, 8], r(5, 8), None, 1e-5),
        (r(3, 8), [8], None, None, 1e-6),
        (r(8, 5, 2).transpose(0, 2), [8], r(8), r(8), 1e-5),  # not contiguous
        (r(1, 1, 6), [6], r(6), r(6), 1e-5),  # leading 1s
        (r(0, 4), [4], r(4), r(4), 1e-5),  # no rows
        (r(4, 6, dtype=torch.bfloat16), [6], r(6), r(6), 1e-5),  # mixed: float statistics
        (r(4, 6, dtype=torch.bfloat16), [6], r(6, dtype=torch.bfloat16), None, 1e-5),
        (r(3, 6, dtype=torch.float64), [6], r(6, dtype=torch.float64), None, 1e-5),
    ]
    return cases


@pytest.mark.parametrize("case", range(9))
def test_layer_norm_and_its_backward_like_the_cpu(case: int) -> None:
    x, shape, w, b, eps = layer_norm_cases()[case]
    check_like_cpu(A.native_layer_norm, x, shape, w, b, eps)
    out, mean, rstd = A.native_layer_norm(x, shape, w, b, eps)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    for mask in ([True, w is not None, b is not None], [True, False, False]):
        check_like_cpu(
            A.native_layer_norm_backward, grad, x, shape, mean, rstd, w, b, mask, exact=False
        )


def test_where_and_masked_fill_like_the_cpu() -> None:
    g = torch.Generator().manual_seed(2)
    c = torch.rand(4, 5, generator=g) > 0.5
    x = torch.randn(4, 5, generator=g)
    cases = [
        (c, x, torch.randn(4, 5, generator=g)),
        (c, x.t().contiguous().t(), x),  # a transposed operand: the iterator's order
        (c[:, :1], x.t().contiguous().t(), torch.randn(5, generator=g)),  # broadcast
        (c, x, torch.randn((), generator=g)),  # 0-dim
        (c, x.double(), torch.arange(20).view(4, 5)),  # promotion
        (
            torch.rand(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last) > 0.5,
            torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
            torch.randn(5, generator=g),
        ),  # fmt: skip
        (c[:0], x[:0], x[:0]),  # empty
    ]
    for case in cases:
        check_like_cpu(A.where.self, *case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uint8 conditions are deprecated: the kernel says so
        check_like_cpu(A.where.self, c.to(torch.uint8), x, x)
    for self, mask in [
        (x, c), (x.t(), c.t()), (x, c[0]), (x[0], c), (x.t().contiguous().t(), c),
        (torch.arange(5), c), (x[:, :1].expand(4, 5), c),
    ]:  # fmt: skip
        check_like_cpu(A.masked_fill.Scalar, self, mask, -1.5)


def test_index_select_embedding_and_dropout_backward_pad_safe_softmax_like_the_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10, 6, generator=g)
    ids = torch.randint(0, 10, (7,), generator=g)
    for self, dim, index in [
        (w, 0, ids), (w, 1, ids % 6), (w, -1, (ids % 6).int()), (w.t(), 0, ids % 6),
        (w[:, 0], 0, ids), (torch.tensor(3.0), 0, torch.tensor([0])),
        (w, 0, ids[:0]), (w[:0], 1, ids % 6),
    ]:  # fmt: skip
        check_like_cpu(A.index_select, self, dim, index)
    grad = torch.randn(2, 7, 6, generator=g)
    for indices in (ids.view(1, 7).expand(2, 7), ids.view(1, 7).expand(2, 7).int()):
        for padding_idx, scale in ((-1, False), (3, True)):
            check_like_cpu(A.embedding_dense_backward, grad, indices, 10, padding_idx, scale)
    check_like_cpu(A.embedding_dense_backward, grad.transpose(0, 1), ids.view(7, 1).expand(7, 2),
                   12, -1, False)  # fmt: skip
    mask = torch.rand(3, 4, 5, generator=g) > 0.3
    x = torch.randn(3, 4, 5, generator=g)
    for grad_, mask_ in [(x, mask), (x.transpose(0, 2), mask.transpose(0, 2)), (x, mask[0])]:
        check_like_cpu(A.native_dropout_backward, grad_, mask_, 1.25)
    image = torch.randn(2, 3, 4, 5, generator=g)
    for self, pad, value in [
        (ids.view(1, 7), [0, 1], -100), (x, [1, 2, 0, 1], 0.5), (x, [-1, 0, 2, -2], 0.0),
        (x, [-1, -1], 0.0), (image.to(memory_format=torch.channels_last), [1, 1, 1, 1], 1.0),
        (x.transpose(0, 1), [2, 2], 3.0), (x[:0], [1, 1], 0.0),
    ]:  # fmt: skip
        check_like_cpu(A.constant_pad_nd, self, pad, value)
    scores = torch.randn(2, 3, 4, 4, generator=g)
    scores[0, 0, 1] = float("-inf")  # a fully masked row: zeros, not NaN
    for self, dim, dtype in [
        (scores, -1, None), (scores.transpose(2, 3), -1, None), (scores, 1, torch.float64),
        (scores.bfloat16(), -1, None), (scores.bfloat16(), -1, torch.float32),
    ]:  # fmt: skip
        check_like_cpu(A._safe_softmax, self, dim, dtype)


def test_relu_like_the_cpu() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 5, generator=g)
    for t in (
        x, x.t(), x[:, ::2], x[:0], torch.tensor(-1.5), torch.arange(-3, 3, dtype=torch.int8),
        torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        x.to(torch.bfloat16),
    ):  # fmt: skip
        check_like_cpu(A.relu, t)
    A.relu(on("accel", x))  # the family ran
    raises_like_cpu(A.relu, torch.ones(3, 7, dtype=torch.bool))
    for t in (x, x.t(), x[:, ::2], torch.arange(-3, 3, dtype=torch.int8)):  # in place
        expected = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype).copy_(t)
        got = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="accel").copy_(t)
        assert A.relu_(got) is got
        A.relu_(expected)
        assert got.stride() == expected.stride() and torch.equal(got.cpu(), expected)
    raises_like_cpu(A.relu_, torch.ones(3, 7, dtype=torch.bool))


def test_masked_fill_in_place_like_the_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, generator=g)
    c = torch.rand(4, 5, generator=g) > 0.5
    nchw = torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)
    for self, mask in [
        (x, c), (x.t(), c.t()), (x, c[0]), (x, c[:, :1]), (x.t().contiguous().t(), c),
        (x[:, ::2], c[:, :3]), (torch.arange(20).view(4, 5), c), (x[:0], c[:0]),
        (nchw, torch.rand(4, 5, generator=g) > 0.5), (torch.tensor(2.0), torch.tensor(True)),
    ]:  # fmt: skip
        layout = (self.size(), self.stride())
        expected = torch.empty_strided(*layout, dtype=self.dtype).copy_(self)
        got = torch.empty_strided(*layout, dtype=self.dtype, device="accel").copy_(self)
        result = A.masked_fill_.Scalar(got, on("accel", mask), -1.5)
        assert result is got
        A.masked_fill_.Scalar(expected, mask, -1.5)
        assert (got.shape, got.stride(), got.dtype) == (
            expected.shape,
            expected.stride(),
            expected.dtype,
        )
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_masked_fill_in_place_errors_and_warnings_at_the_call_after_its_family_ran() -> None:
    x, c = torch.randn(4, 5), torch.rand(4, 5) > 0.5
    A.masked_fill_.Scalar(on("accel", x), on("accel", c), 0.5)  # the family ran
    for self, mask in [(x, c.float()), (x[0], c), (x, torch.rand(4, 6) > 0.5)]:
        with pytest.raises(Exception) as cpu:
            A.masked_fill_.Scalar(self.clone(), mask, 0.5)
        accel_self = on("accel", self)
        before = accel_self.cpu()
        with pytest.raises(type(cpu.value)) as accel:
            A.masked_fill_.Scalar(accel_self, on("accel", mask), 0.5)
        assert str(cpu.value).split("\n")[0] in str(accel.value)
        assert torch.equal(accel_self.cpu(), before)  # left as it was
    # An expanded self: the CPU's deprecation warning, at the call, for a new shape of the family.
    for device, n in (("cpu", 7), ("accel", 7), ("accel", 8)):
        self = torch.randn(n, 1, device=device).expand(n, 5)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            # (the method: the warnings of torch.ops calls do not reach Python's)
            self.masked_fill_(torch.zeros(n, 5, dtype=torch.bool, device=device), 0.5)
        assert any("masked_fill_ on expanded tensors" in str(w.message) for w in seen), device
    torch.accel.synchronize()
    assert (torch.ones(3, device="accel") + 1).sum().item() == 6


def raises_like_cpu(op: Callable[..., Any], *args: Any) -> None:
    """op raises at the call on accel what it raises on the CPU, and accel works afterwards."""
    with pytest.raises(Exception) as cpu:
        op(*args)
    with pytest.raises(type(cpu.value)) as accel:
        op(*on("accel", list(args)))
    assert str(cpu.value).split("\n")[0] in str(accel.value)
    torch.accel.synchronize()  # nothing failed later either
    assert (torch.ones(3, device="accel") + 1).sum().item() == 6


def test_errors_raise_at_the_call_as_the_cpus_also_in_a_family_that_ran() -> None:
    x, w = torch.randn(3, 8), torch.randn(8)
    # Each error follows a valid call of its family (the same arguments but for shapes), whose
    # new shapes then run without waiting: the meta function's checks are the kernel's.
    A.native_layer_norm(on("accel", x), [8], on("accel", w), None, 1e-5)
    raises_like_cpu(A.native_layer_norm, torch.randn(3, 9), [8], w, None, 1e-5)
    raises_like_cpu(A.native_layer_norm, x, [8], torch.randn(9), None, 1e-5)
    raises_like_cpu(A.native_layer_norm, x.bfloat16(), [8], w, w.double(), 1e-5)  # mixed dtypes
    out, mean, rstd = A.native_layer_norm(x, [8], w, None, 1e-5)
    raises_like_cpu(A.native_layer_norm_backward, out, x, [7], mean, rstd, w, None,
                    [True, True, False])  # fmt: skip
    ids = torch.tensor([1, 2])
    A.index_select(on("accel", x), 0, on("accel", ids))
    raises_like_cpu(A.index_select, x, 0, ids.view(1, 2))
    raises_like_cpu(A.index_select, x, 0, ids.float())
    raises_like_cpu(A.index_select, x, 2, ids)
    raises_like_cpu(A.index_select, torch.randn(0, 3), 0, ids)
    raises_like_cpu(A.index_select, torch.tensor(2.0), 0, ids)
    c = torch.rand(3, 8) > 0.5
    A.where.self(on("accel", c), on("accel", x), on("accel", x))
    raises_like_cpu(A.where.self, c, x, torch.randn(3, 7))
    raises_like_cpu(A.where.self, c.float(), x, x)
    A.masked_fill.Scalar(on("accel", x), on("accel", c), 0.5)
    raises_like_cpu(A.masked_fill.Scalar, x, torch.rand(3, 7) > 0.5, 0.5)
    raises_like_cpu(A.masked_fill.Scalar, x, c.float(), 0.5)
    grad = torch.randn(2, 8)
    A.embedding_dense_backward(on("accel", grad), on("accel", ids), 5, -1, False)
    raises_like_cpu(A.embedding_dense_backward, torch.randn(3, 8), ids, 5, -1, False)
    raises_like_cpu(A.embedding_dense_backward, grad, ids.float(), 5, -1, False)
    raises_like_cpu(A.constant_pad_nd, x, [1, 2, 3], 0.0)
    raises_like_cpu(A.constant_pad_nd, x, [1, 1, 1, 1, 1, 1], 0.0)
    raises_like_cpu(A.native_dropout_backward, x, torch.rand(3, 7) > 0.5, 2.0)


def _layer_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (64,), w, w)


def _where(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(c, x, -x)


def _pad(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 1), value=-100)


def _masked_fill(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(mask, -1e9)


def _masked_fill_in_place(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x).masked_fill_(mask, float("-inf"))  # nn.MultiheadAttention's mask


def _safe_softmax(x: torch.Tensor) -> torch.Tensor:
    return A._safe_softmax(x, -1)


# name: (the call, its arguments at a length)
FAMILIES: dict[str, tuple[Callable[..., torch.Tensor], Callable[[int], list[torch.Tensor]]]] = {
    "native_layer_norm": (_layer_norm, lambda n: [torch.randn(2, n, 64), torch.randn(64)]),
    "where": (_where, lambda n: [torch.ones(n, n, dtype=torch.bool).tril(), torch.randn(2, n, n)]),
    "index_select": (
        torch.nn.functional.embedding,
        lambda n: [torch.arange(n) % 50, torch.randn(50, 32)],
    ),
    "masked_fill": (
        _masked_fill,
        lambda n: [torch.randn(2, n, n), torch.ones(n, n, dtype=torch.bool).triu(1)],
    ),
    "masked_fill_": (
        _masked_fill_in_place,
        lambda n: [torch.randn(2, n, n), torch.ones(n, n, dtype=torch.bool).triu(1)],
    ),
    "constant_pad_nd": (_pad, lambda n: [torch.ones(2, n, dtype=torch.long)]),
    "relu": (torch.relu, lambda n: [torch.randn(2, n, 3).transpose(0, 1)]),
    "relu_": (lambda x: torch.relu_(x * 1), lambda n: [torch.randn(2, n)]),
    "_safe_softmax": (_safe_softmax, lambda n: [torch.randn(2, 4, n, n)]),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_new_shapes_of_a_family_that_ran_do_not_wait(name: str) -> None:
    # A training step or a decoding step at a new sequence length: every call is the first of
    # its shapes. Once a call of the family ran (waited for, its errors at the call), new
    # shapes run asynchronously, as a structured kernel's do.
    op, make = FAMILIES[name]
    op(*on("accel", make(10)))  # the family's first call
    lengths = iter(range(11, 40))
    calls: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    results: list[torch.Tensor] = []

    def prepare() -> None:  # arguments made and moved before the sleep
        args = make(next(lengths))
        calls.append((args, on("accel", args)))

    def enqueue() -> None:
        results.append(op(*calls[-1][1]))

    pending, _ = pending_behind_a_sleep(
        enqueue, lambda: torch.accel.current_stream().query(), prepare=prepare
    )
    if not LAUNCH_BLOCKING:
        assert pending
    for (args, _), result in zip(calls[-len(results) :], results, strict=True):
        torch.testing.assert_close(result.cpu(), op(*args), rtol=0, atol=0)


# arange: its values decide its length. The underlying tier makes the CPU kernel's checks of them
# (csrc/aten/meta_functions.cpp, arange_length) and runs the call as later calls do.
ARANGE_CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((7,), {}),
    ((0, 300), {"dtype": torch.int8}),  # wraps around as the CPU's does
    ((0, 3000), {"dtype": torch.float16}),
    ((10, 0, -3), {}),
    ((5, 5), {}),
    ((0, 1, 0.1), {"dtype": torch.float32}),
    ((0, 10.5), {}),
    ((1, 2, 0.3), {"dtype": torch.bfloat16}),
    ((0.5, 5), {"dtype": torch.int32}),
    ((0, 5, 0.5), {"dtype": torch.int32}),  # the step converts to 0: ten zeros, as the CPU's
    ((True, 5), {}),
    ((0, 2**62, 2**61), {}),
    # PyTorch's meta function gives 4 elements, the CPU kernel's integer arithmetic overflows to
    # 0: the CPU's length is what accel gives.
    ((-(2**63), 2**63 - 1, 2**62), {}),
]
ARANGE_ERRORS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((0, 5, 0), {}),
    ((5, 0, 1), {}),
    ((0, float("inf")), {}),
    ((0, float("nan")), {}),
    ((0, 1e300, 1e-300), {}),
    ((0, 5), {"dtype": torch.bool}),
    ((0, 5), {"dtype": torch.complex64}),
    ((0, 5), {"dtype": torch.float8_e4m3fn}),
    ((0, 5), {"dtype": torch.uint16}),
]


@pytest.mark.parametrize("case", range(len(ARANGE_CASES)))
def test_arange_like_the_cpu(case: int) -> None:
    args, kwargs = ARANGE_CASES[case]
    expected = torch.arange(*args, **kwargs)
    got = torch.arange(*args, **kwargs, device="accel")
    assert got.dtype == expected.dtype and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)
    # out=: empty, of the right size, a strided view, and of another count (the CPU's warning).
    for out in (
        torch.empty(0, dtype=expected.dtype),
        torch.empty(expected.numel(), dtype=expected.dtype),
        torch.zeros(2 * expected.numel(), dtype=expected.dtype)[::2],
        torch.zeros(expected.numel() + 3, dtype=expected.dtype),
    ):
        accel_out = on("accel", out)
        with warnings.catch_warnings(record=True) as cpu_warnings:
            warnings.simplefilter("always")
            torch.arange(*args, out=out)
        with warnings.catch_warnings(record=True) as accel_warnings:
            warnings.simplefilter("always")
            torch.arange(*args, out=accel_out)
        assert [str(w.message) for w in accel_warnings] == [str(w.message) for w in cpu_warnings]
        assert accel_out.size() == out.size() and accel_out.stride() == out.stride()
        assert torch.equal(accel_out.cpu(), out)


@pytest.mark.parametrize("case", range(len(ARANGE_ERRORS)))
def test_arange_errors_raise_at_the_call_as_the_cpus(case: int) -> None:
    args, kwargs = ARANGE_ERRORS[case]
    torch.arange(*args[:1], device="accel")  # a call of the same values' types ran before
    with pytest.raises(Exception) as cpu:
        torch.arange(*args, **kwargs)
    with pytest.raises(type(cpu.value)) as accel:
        torch.arange(*args, **kwargs, device="accel")
    assert str(cpu.value).split("\n")[0] in str(accel.value)
    torch.accel.synchronize()
    assert torch.equal(torch.arange(4, device="accel").cpu(), torch.arange(4))


def test_an_int64_arange_whose_step_converts_to_zero_raises() -> None:
    # The CPU's kernel (and CUDA's) divide by the step converted to int64: SIGFPE kills the
    # process there. accel raises, and the device stays usable.
    for args in ((0, 5, 0.5), (0, -1, -0.25)):
        with pytest.raises(RuntimeError, match=r"step must be nonzero: .* is 0 as Long"):
            torch.arange(*args, dtype=torch.int64, device="accel")
        with pytest.raises(RuntimeError, match=r"step must be nonzero: .* is 0 as Long"):
            torch.arange(*args, out=torch.empty(0, dtype=torch.int64, device="accel"))
    assert torch.equal(torch.arange(0, 5, 1.5, dtype=torch.int64, device="accel").cpu(),
                       torch.arange(0, 5, 1.5, dtype=torch.int64))  # fmt: skip


def test_arange_at_new_lengths_does_not_wait() -> None:
    # A training step at a new sequence length: arange(seq) and arange(past, past + seq) wait
    # neither for the stream nor at their first values.
    lengths = iter(range(40, 100))
    results: list[tuple[torch.Tensor, torch.Tensor]] = []

    def enqueue() -> None:
        n = next(lengths)
        results.append((torch.arange(n, device="accel"), torch.arange(n)))
        results.append((torch.arange(n, 2 * n, device="accel"), torch.arange(n, 2 * n)))
        out = torch.empty(0, dtype=torch.float32, device="accel")
        results.append((torch.arange(0, n / 4, 0.25, out=out), torch.arange(0, n / 4, 0.25)))

    pending, _ = pending_behind_a_sleep(enqueue, lambda: torch.accel.current_stream().query())
    if not LAUNCH_BLOCKING:
        assert pending
    for got, expected in results:
        assert got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)


# In-place random operators with number parameters: a new shape of a family that ran does not
# wait (PyTorch's structured C++ meta functions; for bernoulli_ and exponential_ accel's
# random_inplace_meta); the parameters' and the dtype's checks raise at the family's first call,
# as the CPU's.
RANDOM_IN_PLACE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "uniform_": lambda t: t.uniform_(-2, 3),
    "normal_": lambda t: t.normal_(1.0, 0.5),
    "bernoulli_": lambda t: t.bernoulli_(0.3),
    "random_": lambda t: t.random_(),
    "random_.from": lambda t: t.random_(-5, 5),
    "random_.to": lambda t: t.random_(7),
    "exponential_": lambda t: t.exponential_(2.0),
    "dropout (strided)": lambda t: torch.nn.functional.dropout(t.t(), 0.2),
}


@pytest.mark.parametrize("name", list(RANDOM_IN_PLACE))
def test_in_place_random_operators_at_new_shapes_do_not_wait(name: str) -> None:
    draw = RANDOM_IN_PLACE[name]
    draw(torch.empty(10, 10, device="accel"))  # the family's first call
    shapes = iter(range(11, 40))
    results: list[torch.Tensor] = []

    def enqueue() -> None:
        results.append(draw(torch.empty(4, next(shapes), device="accel")))

    pending, _ = pending_behind_a_sleep(enqueue, lambda: torch.accel.current_stream().query())
    if not LAUNCH_BLOCKING:
        assert pending
    # Same seed, same numbers, whichever way a call ran (first of its family and waited for,
    # a new shape of the family, a cached shape).
    runs = []
    for _ in range(2):
        torch.accel.manual_seed(11)
        runs.append([draw(torch.empty(3, n, device="accel")).cpu() for n in (50, 51, 52)])
    for first, again in zip(*runs, strict=True):
        assert torch.equal(first, again)
    values = torch.cat([r.flatten() for r in runs[0]])
    if name == "uniform_":
        assert values.min() >= -2 and values.max() < 3
    elif name == "bernoulli_":
        assert set(values.tolist()) <= {0.0, 1.0} and 0.15 < values.mean() < 0.45
    elif name in ("random_.from", "random_.to"):
        assert values.min() >= (-5 if name == "random_.from" else 0) and values.max() < 7
        assert torch.equal(values, values.round())


def test_in_place_random_operators_raise_as_the_cpu_after_their_family_ran() -> None:
    for device in ("cpu", "accel"):
        x = torch.empty(6, 6, device=device)
        x.uniform_(0, 1), x.normal_(0, 1), x.bernoulli_(0.5)  # the families ran
        n = torch.empty(7, 7, device=device)
        with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range"):
            n.uniform_(3, 1)
        with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
            n.normal_(0, -1)
        with pytest.raises(RuntimeError, match="bernoulli_ expects p to be in"):
            n.bernoulli_(1.5)
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            torch.empty(7, 7, dtype=torch.long, device=device).normal_()
        with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
            torch.empty(7, 7, device=device).random_(5, 2)
    # An expanded self: the CPU's kernels refuse it, at the call on accel too.
    for draw in (
        lambda t: t.uniform_(2, 3),
        lambda t: t.bernoulli_(0.5),
        torch.Tensor.exponential_,
    ):
        for device in ("cpu", "accel"):
            t = torch.zeros(5, 1, device=device).expand(5, 4)
            with pytest.raises(RuntimeError, match="more than one element of the written-to"):
                draw(t)
    torch.accel.synchronize()
    assert (torch.ones(3, device="accel") + 1).sum().item() == 6
