"""accel's C++ meta functions (csrc/aten/meta_functions.cpp) of a convolutional network's
operators: convolution (convolution_overrideable on accel) and batch norm with its backward. A
signature's first call computes its results with them, so they must lay results out as the CPU
kernel does (convolutions: contiguous, accel's rule) and raise its errors at the call; new shapes
of a family that ran (a CNN at a new image size) do not wait for the stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import LAUNCH_BLOCKING, on, pending_behind_a_sleep, skip_unless_host_first_calls

A = torch.ops.aten


@pytest.fixture(autouse=True)
def host_executor() -> None:
    # The host executor's first calls, as in test_meta_functions.py.
    skip_unless_host_first_calls()


# convolution (convolution_overrideable on accel): accel's results are contiguous; the first
# call of a family waits, its new shapes do not, and shape errors raise at the call.
CONV = torch.nn.functional


def _conv_cases(
    n: int,
) -> list[tuple[Callable[..., torch.Tensor], list[torch.Tensor], dict[str, Any]]]:
    g = torch.Generator().manual_seed(n)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return [
        (CONV.conv2d, [r(2, 3, n, n + 1), r(4, 3, 3, 3), r(4)], {"padding": 1}),
        (CONV.conv2d, [r(1, 4, n, n), r(4, 2, 3, 3)], {"stride": 2, "groups": 2, "dilation": 2}),
        (CONV.conv1d, [r(2, 3, n), r(5, 3, 4)], {"stride": 3}),
        (CONV.conv3d, [r(1, 2, 4, n, n), r(3, 2, 2, 3, 3)], {}),
        (CONV.conv_transpose2d, [r(1, 3, n, n), r(3, 2, 3, 3)], {"stride": 2, "output_padding": 1}),
        (CONV.conv2d, [r(2, 3, n, n).to(memory_format=torch.channels_last), r(6, 3, 1, 1)], {}),
        (CONV.conv2d, [r(2, 4, n, n), r(4, 1, 5, 5)], {"groups": 4, "padding": 2}),  # depthwise 5x5
    ]


def _conv_step(
    op: Callable[..., torch.Tensor], args: list[torch.Tensor], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The convolution's result and its gradients (convolution_backward)."""
    leaves = [a.detach().requires_grad_() for a in args]
    out = op(*leaves, **kwargs)
    out.square().sum().backward()
    return [out.detach(), *[a.grad for a in leaves]]


def test_convolutions_and_backward_like_the_cpu_and_new_shapes_do_not_wait() -> None:
    # The forward's new shapes do not wait; the backward's still do (its first call of each
    # shape runs on the caller: see the README on convolution_backward).
    for n in (9, 10):  # the families' first calls, then new shapes of them
        for op, args, kwargs in _conv_cases(n):
            got = _conv_step(op, on("accel", args), kwargs)
            expected = _conv_step(op, args, kwargs)
            assert got[0].is_contiguous()  # accel's convolutions: contiguous results
            for g_, e in zip(got, expected, strict=True):
                assert g_.shape == e.shape
                torch.testing.assert_close(g_.cpu(), e, rtol=1e-4, atol=1e-4)
    sizes = iter(range(11, 40))
    calls: list[list[tuple[Any, list[torch.Tensor], dict[str, Any]]]] = []
    results: list[torch.Tensor] = []

    def prepare() -> None:
        calls.append([(op, on("accel", a), kw) for op, a, kw in _conv_cases(next(sizes))])

    def enqueue() -> None:
        results[:] = [op(*a, **kw) for op, a, kw in calls[-1]]

    pending, _ = pending_behind_a_sleep(
        enqueue, lambda: torch.accel.current_stream().query(), prepare=prepare
    )
    if not LAUNCH_BLOCKING:
        assert pending
    for (op, args, kwargs), got in zip(calls[-1], results, strict=True):
        expected = op(*[a.cpu() for a in args], **kwargs)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_convolution_backward_of_another_grad_output_runs_as_the_cpus() -> None:
    x, w = torch.randn(1, 2, 8, 8), torch.randn(3, 2, 3, 3)
    args = [[1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True]]
    A.convolution_backward(*on("accel", [torch.randn(1, 3, 6, 6), x, w]), [3], *args)
    for grad_output in (torch.randn(1, 3, 5, 6), torch.randn(1, 3, 6), torch.randn(1, 4, 6, 6)):
        try:
            expected: Any = A.convolution_backward(grad_output, x, w, [3], *args)
        except Exception as e:  # noqa: BLE001
            expected = e
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)) as accel:
                A.convolution_backward(*on("accel", [grad_output, x, w]), [3], *args)
            assert str(expected).split("\n")[0] in str(accel.value)
        else:
            got = A.convolution_backward(*on("accel", [grad_output, x, w]), [3], *args)
            for g_, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g_.cpu(), e, rtol=1e-4, atol=1e-4)
    torch.accel.synchronize()


def test_convolution_shape_errors_raise_at_the_call_after_the_family_ran() -> None:
    w = torch.randn(4, 3, 3, 3)
    CONV.conv2d(torch.randn(2, 3, 9, 9).to("accel"), w.to("accel"))  # the family ran
    for op, args, kwargs in [
        (CONV.conv2d, [torch.randn(2, 3, 2, 2), w], {}),  # kernel larger than the input
        (CONV.conv2d, [torch.randn(2, 5, 9, 9), w], {}),  # channels
        (CONV.conv2d, [torch.randn(2, 3, 9, 9), w, torch.randn(5)], {}),  # bias
        (CONV.conv2d, [torch.randn(2, 6, 9, 9), torch.randn(4, 3, 3, 3)], {"groups": 3}),
        (CONV.conv_transpose2d, [torch.randn(1, 3, 1, 1), torch.randn(3, 2, 3, 3)], {"padding": 2}),
        (CONV.conv2d, [torch.randn(2, 3, 9, 9), w.double()], {}),
    ]:
        with pytest.raises(Exception) as cpu:
            op(*args, **kwargs)
        with pytest.raises(type(cpu.value)) as accel:
            op(*on("accel", args), **kwargs)
        assert str(cpu.value).split("\n")[0] in str(accel.value)
    torch.accel.synchronize()
    assert (torch.ones(3, device="accel") + 1).sum().item() == 6


def _batch_norm_cases() -> list[tuple[list[Any], bool]]:
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w, b, rm, rv = r(4), r(4), r(4), r(4).abs() + 0.5
    return [  # (input, weight, bias, running_mean, running_var), training
        ([r(2, 4, 5, 6), w, b, rm.clone(), rv.clone()], True),
        ([r(2, 4, 5, 6).to(memory_format=torch.channels_last), w, b, rm.clone(), rv.clone()], True),
        ([r(2, 4, 3, 5, 6).to(memory_format=torch.channels_last_3d), w, b, None, None], True),
        ([r(6, 4), None, None, rm.clone(), rv.clone()], True),
        ([r(2, 4, 7), w, b, None, None], True),
        ([r(4, 2, 5).transpose(0, 1), w, b, rm.clone(), rv.clone()], True),  # not dense
        ([r(2, 4, 5), r(8)[::2], b, rm.clone(), rv.clone()], True),  # strided weight
        ([r(2, 4, 5, 6), w, b, rm.clone(), rv.clone()], False),
        (
            [r(2, 4, 5, 6).to(memory_format=torch.channels_last), w, b, rm.clone(), rv.clone()],
            False,
        ),
    ]


def test_batch_norm_and_its_backward_like_the_cpu() -> None:
    # Layouts and values as the CPU's; in eval mode accel returns the statistics CUDA's kernel
    # does (norm.cpp), so there only the output is compared.
    for args, training in _batch_norm_cases():
        expected = A.native_batch_norm(
            *[a if a is None else a.clone() for a in args], training, 0.1, 1e-5
        )
        got = A.native_batch_norm(*on("accel", args), training, 0.1, 1e-5)
        for k, (g_, e) in enumerate(zip(got, expected, strict=True)):
            if k > 0 and not training:
                continue
            assert (g_.shape, g_.stride(), g_.dtype) == (e.shape, e.stride(), e.dtype), (
                k,
                args[0].stride(),
            )
            torch.testing.assert_close(g_.cpu(), e, rtol=1e-5, atol=1e-5)
        x = args[0]
        for grad_out in (
            torch.randn_like(x),
            torch.randn(x.shape).transpose(0, 1).contiguous().transpose(0, 1),
        ):
            for mask in ([True, True, True], [True, False, False], [False, True, True]):
                stats = list(expected[1:]) if training else [None, None]
                cpu_args = [grad_out, x, args[1], args[3], args[4], *stats, training, 1e-5, mask]
                e_grads = A.native_batch_norm_backward(*cpu_args)
                g_grads = A.native_batch_norm_backward(*on("accel", cpu_args))
                for g_, e in zip(g_grads, e_grads, strict=True):
                    if e is None:
                        assert g_ is None
                        continue
                    assert (g_.shape, g_.stride(), g_.dtype) == (e.shape, e.stride(), e.dtype)
                    torch.testing.assert_close(g_.cpu(), e, rtol=1e-4, atol=1e-4)


def test_batch_norm_at_new_shapes_does_not_wait() -> None:
    bn = torch.nn.BatchNorm2d(4).to("accel")
    x = torch.randn(2, 4, 9, 9, device="accel", requires_grad=True)
    bn(x).sum().backward()  # the families ran
    sizes = iter(range(10, 40))
    inputs: list[torch.Tensor] = []

    def prepare() -> None:
        inputs.append(torch.randn(2, 4, next(sizes), 7, device="accel", requires_grad=True))

    def enqueue() -> None:
        bn(inputs[-1]).square().sum().backward()

    pending, _ = pending_behind_a_sleep(
        enqueue, lambda: torch.accel.current_stream().query(), prepare=prepare
    )
    if not LAUNCH_BLOCKING:
        assert pending
    reference = torch.nn.BatchNorm2d(4)
    x = inputs[-1].detach().cpu().requires_grad_()
    reference(x).square().sum().backward()
    torch.testing.assert_close(inputs[-1].grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
