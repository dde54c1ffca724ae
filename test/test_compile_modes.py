"""torch.compile's modes and options on accel, against eager; and graphs of PyTorch's own
Inductor tests (test/inductor/test_torchinductor.py's CommonTemplate, run over accel) that
failed on accel.

``mode="max-autotune"``: Inductor cannot time accel kernels (its benchmarker times every device
but the CPU with CUDA events), so accel offers one choice per matrix product
(torch_accel/_inductor/heuristics.py); with two, the compile raised NoValidChoicesError.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import torch_accel  # noqa: F401

ACCEL = torch.device("accel")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN)


_GEN = torch.Generator().manual_seed(0)
_W, _B = _randn(32, 16), _randn(32)
_CONV_W, _CONV_B = _randn(8, 3, 3, 3), _randn(8)

# Every matrix-product lowering of Inductor that accel reaches: Linear with its broadcast bias
# (addmm, where Inductor has two ATen choices), addmm with a full bias, bmm, baddbmm, a sum of
# two products (mm_plus_mm), convolutions (3x3 and 1x1, which Inductor may lower to a product),
# int8 products.
MATRIX_PRODUCTS = {
    "linear_with_bias": (
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        lambda: (_randn(4, 16), _W, _B),
    ),
    "addmm_vector_bias": (
        lambda b, x, w: torch.addmm(b, x, w).relu(),
        lambda: (_randn(8), _randn(4, 6), _randn(6, 8)),
    ),
    "addmm_matrix_bias": (
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        lambda: (_randn(4, 8), _randn(4, 6), _randn(6, 8)),
    ),
    "bmm": (lambda a, b: torch.bmm(a, b) * 2, lambda: (_randn(3, 4, 5), _randn(3, 5, 6))),
    "baddbmm": (
        lambda c, a, b: torch.baddbmm(c, a, b),
        lambda: (_randn(3, 4, 6), _randn(3, 4, 5), _randn(3, 5, 6)),
    ),
    "mm_plus_mm": (
        lambda a, b, c, d: a @ b + c @ d,
        lambda: (_randn(4, 5), _randn(5, 6), _randn(4, 7), _randn(7, 6)),
    ),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b).relu(),
        lambda: (_randn(2, 3, 10, 10), _CONV_W, _CONV_B),
    ),
    "conv2d_1x1": (
        lambda x, w: F.conv2d(x, w),
        lambda: (_randn(2, 8, 10, 10), _randn(16, 8, 1, 1)),
    ),
    "int8_mm": (
        lambda a, b: torch._int_mm(a, b),
        lambda: (
            torch.randint(-5, 5, (32, 32), dtype=torch.int8, generator=_GEN),
            torch.randint(-5, 5, (32, 32), dtype=torch.int8, generator=_GEN),
        ),
    ),
}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("name", list(MATRIX_PRODUCTS))
def test_max_autotune_compiles_matrix_products_like_eager(name: str) -> None:
    fn, make_args = MATRIX_PRODUCTS[name]
    args = [a.to(ACCEL) for a in make_args()]
    expected = fn(*args)
    # Inductor logs each choice it failed to time ("Runtime error during autotuning") to its
    # own logger, which does not propagate to the root logger (pytest's caplog).
    records = _Records()
    autotune_log = logging.getLogger("torch._inductor.select_algorithm")
    autotune_log.addHandler(records)
    try:
        # Without the graph cache, so that the lowering (where the choices are made) runs.
        with torch._inductor.config.patch(fx_graph_cache=False):
            got = torch.compile(fn, mode="max-autotune")(*args)
    finally:
        autotune_log.removeHandler(records)
    assert got.device == expected.device
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert records.messages == []


def test_max_autotune_trains_a_linear_model_under_autocast() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to(ACCEL)
    reference = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to(ACCEL)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
    x = torch.randn(8, 16, device=ACCEL)
    with torch._inductor.config.patch(fx_graph_cache=False):
        for m in (compiled, reference):
            with torch.autocast("accel", dtype=torch.bfloat16):
                loss = m(x).float().square().mean()
            loss.backward()
            if m is compiled:
                got = loss
    torch.testing.assert_close(got, loss, atol=1e-2, rtol=1e-2)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, atol=1e-2, rtol=1e-2)


def test_combo_kernels_leave_accel_nodes_to_the_cpp_backend() -> None:
    # combo_kernels=True combined accel's C++ nodes as Triton's and failed an assertion
    # ("type(self)=<class 'torch._inductor.scheduler.Scheduler'>"); accel's nodes stay out of
    # combo kernels, as the CPU's do.
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a.sin(), b.cos() * 2, c.relu().sum(), (a + b).exp()

    args = [torch.randn(64, 8, device=ACCEL) for _ in range(3)]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(ACCEL)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(ACCEL)
    reference.load_state_dict(model.state_dict())
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (model, reference)]
    with torch._inductor.config.patch(combo_kernels=True, fx_graph_cache=False):
        for got, expected in zip(torch.compile(f)(*args), f(*args), strict=True):
            torch.testing.assert_close(got, expected)
        step = torch.compile(optimizers[0].step)
        for _ in range(2):
            for m in (model, reference):
                m(args[0]).square().sum().backward()
            step()
            optimizers[1].step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_streams_and_events_trace_into_one_graph() -> None:
    # Dynamo traces torch.Stream, torch.Event, `with stream:` and
    # torch.accelerator.current_stream() on accel (README: torch.compile).
    def f(a: torch.Tensor) -> torch.Tensor:
        side = torch.Stream("accel")
        done = torch.Event("accel")
        b = a * 2
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            c = (b + 1).sin()
            done.record()
        torch.accelerator.current_stream().wait_event(done)
        return c * b

    a = torch.randn(1000, device=ACCEL)
    expected = f(a)
    got = torch.compile(f, fullgraph=True)(a)
    torch.testing.assert_close(got, expected)


def test_a_cpu_scalar_reduced_from_constants_feeds_accel_work() -> None:
    # test_torchinductor.py's test_bernoulli1: the 0-dim CPU product of a constant reaches an
    # accel division; moving it to accel raised "NotImplementedError: Reduction" in Inductor
    # (torch_accel/_inductor/passes.py says why).
    def f(a: torch.Tensor) -> torch.Tensor:
        return a.sum() / torch.prod(torch.tensor(a.size())) + torch.tensor([2.0, 3.0]).amax()

    a = torch.randn(20, 30, device=ACCEL)
    with torch._inductor.config.patch(fx_graph_cache=False):
        got = torch.compile(f)(a)
    assert got.device == a.device
    torch.testing.assert_close(got, f(a))
