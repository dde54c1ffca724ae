"""The typed entries of underlying operators (csrc/aten/typed_kernel.h): a call whose signature
was seen before runs asynchronously on the caller's tensors, borrowed rather than copied (a
copy of a tensor Python holds takes the GIL twice in torch 2.11), with every form of result
right; every other call takes the boxed kernel, as before, and so do the calls a yaml `cuda_like`
function acts on (all calls of an operator whose function has no `cuda_like_when`)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch

import torch_accel

Case = Callable[[dict[str, torch.Tensor]], object]


def _inputs(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {
        "a": torch.randn(4, 5, generator=g),
        "b": torch.randn(4, 5, generator=g),
        "w": torch.randn(5, generator=g),
        "running_mean": torch.randn(5, generator=g),
        "running_var": torch.rand(5, generator=g) + 0.5,
        "mean": torch.randn(4, 1, generator=g),
        "rstd": torch.rand(4, 1, generator=g) + 0.5,
        "low": torch.randn(4, 5, generator=g) - 1,
        "high": torch.randn(4, 5, generator=g) + 1,
        "out": torch.empty(4, 5),
        "values": torch.empty(4),
        "indices": torch.empty(4, dtype=torch.long),
    }
    return {k: v.to(device) for k, v in t.items()}


# One case per form of typed entry (the dispatcher signature's return and argument kinds).
CASES: dict[str, Case] = {
    "functional": lambda t: t["a"] + t["b"],
    "scalar_arguments": lambda t: torch.clamp(t["a"], min=-0.5, max=0.5),
    "int_list_argument": lambda t: t["a"].sum(dim=[0], keepdim=True),
    "in_place": lambda t: t["a"].clone().add_(t["b"], alpha=2.0),
    "out": lambda t: torch.mul(t["a"], t["b"], out=t["out"]),
    "tuple_of_new_tensors": lambda t: torch.max(t["a"], dim=1),
    "tuple_of_out_tensors": lambda t: torch.max(t["a"], dim=1, out=(t["values"], t["indices"])),
    "tensor_list_argument": lambda t: torch.cat([t["a"], t["b"]], dim=0),
    "optional_tensor_absent": lambda t: torch.clamp(t["a"], min=t["low"]),
    "optional_tensors_present": lambda t: torch.clamp(t["a"], min=t["low"], max=t["high"]),
    # Operators with a cuda_like function that does nothing to these calls (cuda_like_when).
    "layer_norm": lambda t: torch.ops.aten.native_layer_norm(t["a"], [5], t["w"], t["w"], 1e-5),
    "layer_norm_backward": lambda t: torch.ops.aten.native_layer_norm_backward(
        t["b"], t["a"], [5], t["mean"], t["rstd"], t["w"], t["w"], [True, True, True]
    ),
    # Training: the running statistics are updated in place, the results do not read them.
    "batch_norm_training": lambda t: torch.ops.aten.native_batch_norm(
        t["a"],
        t["w"],
        t["w"],
        t["running_mean"].clone(),
        t["running_var"].clone(),
        True,
        0.1,
        1e-5,
    ),
    "batch_norm_backward": lambda t: torch.ops.aten.native_batch_norm_backward(
        t["b"], t["a"], t["w"], None, None, t["w"], t["high"][0], True, 1e-5, [True, True, True]
    ),
}


def _values(result: object) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result.cpu()]
    return [r.cpu() for r in result]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", CASES)
def test_a_call_seen_before_runs_on_borrowed_arguments(name: str) -> None:
    case = CASES[name]
    t = _inputs("accel")
    # The signature's first call: the boxed kernel, on the caller; where that ran the CPU's own
    # kernel, the second call (the first launch, which waits for its task) is boxed too.
    case(t)
    case(t)
    before = torch_accel._C._typed_calls()
    refcounts = {k: sys.getrefcount(v) for k, v in t.items()}
    result = case(t)
    borrowed, boxed = (x - y for x, y in zip(torch_accel._C._typed_calls(), before, strict=True))
    # Only this call's operator (the in-place case also clones, itself a structural operator).
    assert (borrowed, boxed) == (1, 0), (borrowed, boxed)
    expected = case(_inputs("cpu"))
    for got, want in zip(_values(result), _values(expected), strict=True):
        torch.testing.assert_close(got, want)
    del result
    assert {k: sys.getrefcount(v) for k, v in t.items()} == refcounts


def test_results_written_in_place_are_the_argument_objects() -> None:
    t = _inputs("accel")
    for _ in range(2):
        a = t["a"].clone()
        assert a.add_(t["b"]) is a
        assert torch.mul(t["a"], t["b"], out=t["out"]) is t["out"]
        values, indices = torch.max(t["a"], dim=1, out=(t["values"], t["indices"]))
        assert values is t["values"] and indices is t["indices"]


def test_the_first_call_of_a_signature_takes_the_boxed_kernel() -> None:
    x = torch.randn(3, 7, device="accel")
    before = torch_accel._C._typed_calls()
    y = torch.atan2(x, x.flip(0))  # a shape atan2 has not seen in this process
    after = torch_accel._C._typed_calls()
    assert after[1] - before[1] >= 1
    torch.testing.assert_close(y.cpu(), torch.atan2(x.cpu(), x.cpu().flip(0)))


def test_an_error_in_a_borrowed_call_leaves_the_arguments_intact() -> None:
    a = torch.randn(4, 5, device="accel")
    b = torch.randn(4, 5, device="accel:1")
    a + a  # cached: later calls take the typed entry's asynchronous path
    counts = (sys.getrefcount(a), sys.getrefcount(b))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            a + b
    assert (sys.getrefcount(a), sys.getrefcount(b)) == counts
    torch.testing.assert_close((a + a).cpu(), a.cpu() * 2)
    torch.testing.assert_close((b + b).cpu(), b.cpu() * 2)


def test_batch_norm_in_eval_mode_takes_the_boxed_kernel() -> None:
    # Eval mode returns the statistics it normalized with, as CUDA does (the CPU returns none).
    x, w = torch.randn(4, 5, device="accel"), torch.randn(5, device="accel")
    mean, var = torch.randn(5, device="accel"), torch.rand(5, device="accel") + 0.5
    for _ in range(2):
        before = torch_accel._C._typed_calls()
        _, save_mean, _ = torch.ops.aten.native_batch_norm(x, w, w, mean, var, False, 0.1, 1e-5)
        after = torch_accel._C._typed_calls()
        # (its function computes the statistics with other operators, which may be borrowed)
        assert after[1] > before[1]
        torch.testing.assert_close(save_mean.cpu(), mean.cpu())


def test_a_call_its_cuda_like_function_acts_on_takes_the_boxed_kernel() -> None:
    # A bfloat16 layer norm: the CPU kernel's statistics are bfloat16, CUDA's (accel's) float.
    x = torch.randn(4, 5, dtype=torch.bfloat16, device="accel")
    for _ in range(2):
        before = torch_accel._C._typed_calls()
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [5], None, None, 1e-5)
        after = torch_accel._C._typed_calls()
        # (the function calls the operator again, boxed: more than one boxed call)
        assert after[1] > before[1] and after[0] == before[0]
        assert mean.dtype == rstd.dtype == torch.float32
