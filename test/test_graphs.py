"""Graph capture and replay through torch.accel (AccelGraph, graph, pools), against eager runs."""

from __future__ import annotations

import copy
import gc

import pytest
import torch

import torch_accel
from helpers import capture_while_another_thread_runs

ACCEL = torch.device("accel")


def _eager_step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w + b)
    return torch.softmax(h, dim=-1).sum(0)


def test_replay_recomputes_from_the_current_inputs() -> None:
    torch.manual_seed(0)
    x, w, b = (t.to(ACCEL) for t in (torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)))
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        out = _eager_step(x, w, b)  # signatures seen for the first time during the capture
    assert g.num_nodes() > 0
    for _ in range(3):
        new_x = torch.randn(8, 16)
        x.copy_(new_x)
        g.replay()
        torch.testing.assert_close(out.cpu(), _eager_step(new_x, w.cpu(), b.cpu()))


def test_tensors_made_during_capture_keep_their_address() -> None:
    x = torch.ones(4, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        y = x * 2
        z = y + 1
    addresses = (y.data_ptr(), z.data_ptr())
    for k in range(1, 4):
        x.fill_(float(k))
        g.replay()
        assert (y.data_ptr(), z.data_ptr()) == addresses
        torch.testing.assert_close(z.cpu(), torch.full((4,), 2.0 * k + 1))


def test_every_tier_records_into_the_graph() -> None:
    # Structural ops, fills, copies from pinned memory, _foreach_ ops, underlying ops.
    pinned = torch.zeros(6).pin_memory()
    params = [torch.zeros(3, device=ACCEL), torch.zeros(2, device=ACCEL)]
    grads = [torch.ones(3, device=ACCEL), torch.full((2,), 2.0, device=ACCEL)]
    dst = torch.empty(6, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        dst.copy_(pinned, non_blocking=True)
        view = dst.view(2, 3).t()
        filled = torch.empty(2, device=ACCEL).fill_(5.0)
        torch._foreach_add_(params, grads, alpha=0.5)
        total = view.sum() + filled.sum()
    for step in range(1, 3):
        pinned.copy_(torch.arange(6.0) * step)
        g.replay()
        torch.accel.synchronize()
        torch.testing.assert_close(dst.cpu(), torch.arange(6.0) * step)
        torch.testing.assert_close(total.cpu(), torch.tensor(15.0 * step + 10.0))
        torch.testing.assert_close(params[0].cpu(), torch.full((3,), 0.5 * step))
        torch.testing.assert_close(params[1].cpu(), torch.full((2,), 1.0 * step))


def test_manual_capture_on_a_side_stream() -> None:
    s = torch.accel.Stream()
    x = torch.arange(5.0, device=ACCEL)
    s.wait_stream(torch.accel.current_stream())
    g = torch.accel.AccelGraph(keep_graph=True)
    with torch.accel.stream(s):
        g.capture_begin()
        assert torch.accel.is_current_stream_capturing()
        y = x.pow(2)
        g.capture_end()
    assert not torch.accel.is_current_stream_capturing()
    g.instantiate()
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.arange(5.0) ** 2)


def test_capturing_the_default_stream_is_refused() -> None:
    g = torch.accel.AccelGraph()
    with pytest.raises(torch_accel.CaptureError, match="default stream"):
        g.capture_begin()
    assert not torch.accel.is_current_stream_capturing()


@pytest.mark.parametrize(
    ("work", "names"),
    [
        (lambda x: x.sum().item(), "Tensor.item()"),
        (lambda x: x.cpu(), "pageable host memory"),
        (lambda x: torch.nonzero(x), "aten::nonzero"),
        (lambda x: x[x > 0], "aten::"),
        (lambda x: torch.accel.synchronize(), "device_synchronize"),
    ],
    ids=["item", "pageable_copy", "nonzero", "masked_select", "synchronize"],
)
def test_work_that_cannot_be_captured_names_itself(work, names: str) -> None:
    x = torch.randn(8, device=ACCEL)
    g = torch.accel.AccelGraph()
    with pytest.raises(torch_accel.CaptureError, match=names) as raised:
        with torch.accel.graph(g):
            y = x * 2
            work(y)
    assert isinstance(raised.value, RuntimeError)
    assert not torch.accel.is_current_stream_capturing()
    # The device and the capture stream stay usable; the graph can capture again.
    torch.testing.assert_close((x * 3).cpu(), x.cpu() * 3)
    with torch.accel.graph(g):
        y = x * 2
    g.replay()
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_random_operators_draw_fresh_numbers_on_every_replay() -> None:
    torch.accel.init()  # default_generators fills at initialization, as torch.cuda's
    torch.accel.manual_seed(0)
    gen = torch.accel.default_generators[0]
    x = torch.ones(4000, device=ACCEL)
    g = torch.accel.AccelGraph()
    offset = gen.get_offset()
    with torch.accel.graph(g):
        r = torch.rand(6, device=ACCEL)
        n = torch.randn(6, device=ACCEL)
        d = torch.nn.functional.dropout(x, 0.5)
    assert gen.get_offset() == offset  # the capture draws nothing
    draws = []
    for _ in range(3):
        g.replay()
        draws.append((r.cpu().clone(), n.cpu().clone(), d.cpu().clone()))
    assert gen.get_offset() == offset + 3 * 3  # three draws per replay
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert not torch.equal(draws[a][0], draws[b][0])
        assert not torch.equal(draws[a][2], draws[b][2])
    for rr, _, dd in draws:
        assert ((rr >= 0) & (rr < 1)).all()
        kept = dd > 0
        assert 0.45 < kept.float().mean().item() < 0.55
        torch.testing.assert_close(dd[kept], torch.full_like(dd[kept], 2.0))
    # The seed before a replay decides it, as for eager draws.
    torch.accel.manual_seed(123)
    g.replay()
    first = (r.cpu().clone(), n.cpu().clone())
    torch.accel.manual_seed(123)
    g.replay()
    assert torch.equal(r.cpu(), first[0]) and torch.equal(n.cpu(), first[1])
    # A generator of its own, passed explicitly, numbers its draws separately.
    own = torch.Generator(device=ACCEL).manual_seed(7)
    g2 = torch.accel.AccelGraph()
    g2.register_generator_state(own)  # torch.cuda's code registers it; accel needs not
    with pytest.raises(TypeError, match="accel torch.Generator"):
        g2.register_generator_state(torch.Generator())
    with torch.accel.graph(g2):
        u = torch.rand(5, device=ACCEL, generator=own)
    g2.replay()
    v1 = u.cpu().clone()
    own.manual_seed(7)
    g2.replay()
    assert torch.equal(u.cpu(), v1)
    g2.replay()
    assert not torch.equal(u.cpu(), v1)


@pytest.mark.parametrize(
    ("op", "args", "valid"),
    [
        ("exponential_", (), lambda t: (t > 0).all()),  # Gumbel sampling's
        ("cauchy_", (), lambda t: torch.isfinite(t).all()),
        ("geometric_", (0.3,), lambda t: ((t >= 1) & (t == t.round())).all()),
        ("log_normal_", (), lambda t: (t > 0).all()),
    ],
)
def test_random_operators_whose_meta_is_a_reference_capture_and_do_not_wait(op, args, valid):
    # test_cuda.py's test_graph_rng_distributions: their meta functions (PyTorch's Python
    # references) refuse a generator argument, and the calls ran on the calling thread once the
    # stream drained: synchronizing in eager mode and refused in a capture.
    x = torch.empty(2000, device=ACCEL)
    torch.accel.set_sync_debug_mode("error")
    try:
        getattr(x, op)(*args)  # no synchronization
    finally:
        torch.accel.set_sync_debug_mode("default")
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        getattr(x, op)(*args)
    draws = []
    for _ in range(2):
        g.replay()
        draws.append(x.cpu().clone())
    assert not torch.equal(draws[0], draws[1])
    assert all(valid(d) for d in draws)


def test_the_cpu_fallback_cannot_be_captured(fallback_mode, force_fallback) -> None:
    fallback_mode("silent")
    x = torch.randn(4, device=ACCEL)
    with pytest.raises(torch_accel.CaptureError, match="aten::atan2.*CPU fallback"):
        with torch.accel.graph(torch.accel.AccelGraph()):
            torch.atan2(x, x)


def test_invalidated_manual_capture_reports_at_capture_end() -> None:
    s = torch.accel.Stream()
    x = torch.ones(3, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.stream(s):
        g.capture_begin()
        y = x + 1
        with pytest.raises(torch_accel.CaptureError):
            y.sum().item()
        with pytest.raises(torch_accel.CaptureError, match="invalidated"):
            g.capture_end()
    g.reset()
    torch.testing.assert_close((x + 1).cpu(), torch.full((3,), 2.0))


def test_reads_on_the_host_from_another_stream_during_a_capture_are_refused_unqueued() -> None:
    # Global mode forbids waiting on any stream. The refused copies must not run later into
    # host memory the caller has let go: item() on the default stream during a capture on a
    # side stream used to queue its copy first and corrupt the heap at exit.
    s = torch.accel.Stream()
    x = torch.full((4,), 7.0, device=ACCEL)
    dst = torch.zeros(4)
    g = torch.accel.AccelGraph()
    with torch.accel.stream(s):
        g.capture_begin()
    with pytest.raises(torch_accel.CaptureError, match="pageable host memory"):
        dst.copy_(x)
    with pytest.raises(torch_accel.CaptureError, match=r"Tensor.item\(\)"):
        x.sum().item()
    with torch.accel.stream(s):
        with pytest.raises(torch_accel.CaptureError, match="invalidated"):
            g.capture_end()
    torch.accel.synchronize()
    assert torch.equal(dst, torch.zeros(4))  # the refused copy never ran
    assert x.sum().item() == 28.0


def test_asynchronous_work_on_another_device_during_a_capture_is_not_refused() -> None:
    # The first call of an operator signature used to wait for its task, which a global capture
    # on another device forbids: `torch.fmod(x, 0.7)` on accel:0 raised CaptureError while
    # accel:1 captured.
    if torch.accel.device_count() < 2:
        pytest.skip("needs two accel devices")
    x = torch.randn(37, 3, device="accel:0")
    s = torch.accel.Stream(device="accel:1")
    g = torch.accel.AccelGraph()
    with torch.accel.device(1), torch.accel.stream(s):
        g.capture_begin()
    try:
        y = torch.logaddexp2(x, torch.fmod(x, 0.7))
    finally:
        with torch.accel.device(1), torch.accel.stream(s):
            with pytest.warns(UserWarning, match="graph is empty"):  # the work was elsewhere
                g.capture_end()
    expected = torch.logaddexp2(x.cpu(), torch.fmod(x.cpu(), 0.7))
    torch.testing.assert_close(y.cpu(), expected)


def test_global_mode_refuses_a_synchronize_from_another_thread() -> None:
    for mode, refused in (("global", True), ("thread_local", False), ("relaxed", False)):
        capture_error, error, replay_matches_eager = capture_while_another_thread_runs(
            mode, torch.accel.synchronize
        )
        if capture_error is not None:
            assert refused, mode
        assert (error is not None) == refused, (mode, error)
        if refused:
            assert isinstance(error, torch_accel.CaptureError)
        else:
            replay_matches_eager()


def test_pools_are_shared_and_memory_returns_after_reset() -> None:
    torch.accel.synchronize()
    torch.accel.empty_cache()
    before = torch.accel.memory_reserved()
    x = torch.ones(1 << 16, device=ACCEL)
    pool = torch.accel.graph_pool_handle()
    g1, g2 = torch.accel.AccelGraph(), torch.accel.AccelGraph()
    with torch.accel.graph(g1, pool=pool):
        y = x * 2
    with torch.accel.graph(g2, pool=g1.pool()):
        z = y + 1
    assert g1.pool() == g2.pool() == pool
    g1.replay()
    g2.replay()
    torch.testing.assert_close(z.cpu(), torch.full((1 << 16,), 3.0))
    assert torch.accel.memory_reserved() > before
    del y, z
    g1.reset()
    g2.destroy()
    del x
    gc.collect()
    torch.accel.synchronize()
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() == before


def test_recapture_after_reset_may_write_a_tensor_of_the_old_pool() -> None:
    # test_cuda.py's test_graph_capture_reset_recapture: the first capture's output, kept after
    # reset(), is written by the second capture and then dropped during it. Its pool has no
    # holder then; as CUDA's, its memory stays cached until empty_cache (the host driver
    # released it at once, and the replay wrote to unmapped memory: the process crashed).
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        a = torch.full((1000,), 1.0, device=ACCEL)
        g = torch.accel.AccelGraph()
        g.capture_begin()
        b = a
        for _ in range(10):
            b = b + 1
        g.capture_end()
    torch.accel.current_stream().wait_stream(s)
    g.replay()
    assert b.sum().item() == 11000
    g.reset()
    reserved = torch.accel.memory_reserved()
    with torch.accel.stream(s):
        g.capture_begin()
        b.fill_(2.0)
        for _ in range(10):
            b = b + 2
        g.capture_end()
    torch.accel.current_stream().wait_stream(s)
    g.replay()
    assert b.sum().item() == 22000
    assert torch.accel.memory_reserved() >= reserved  # the old pool's memory is still there
    del b
    g.reset()
    torch.accel.synchronize()
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() < reserved


@pytest.mark.parametrize("name", ["SGD", "Adagrad"])
def test_fused_optimizer_steps_without_a_meta_kernel_capture_and_replay(name: str) -> None:
    # torch has no Meta kernel for _fused_sgd_ and _fused_adagrad_: they synchronized and
    # could not be captured. Replays step as eager steps do (values against the CPU's).
    kwargs = {"lr": 0.1, "fused": True}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    torch.manual_seed(0)
    ref = torch.nn.Parameter(torch.randn(6, 5))
    param = torch.nn.Parameter(ref.detach().to(ACCEL))
    grads = [torch.randn(6, 5) for _ in range(4)]
    ref_opt = getattr(torch.optim, name)([ref], **kwargs)
    opt = getattr(torch.optim, name)([param], **kwargs)
    param.grad = grads[0].to(ACCEL)
    static_grad = param.grad
    opt.step()  # eager first steps (momentum buffers, Adagrad's state) outside the capture
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        opt.step()
    for grad in grads:
        ref.grad = grad
        ref_opt.step()
    for grad in grads[1:]:
        static_grad.copy_(grad)
        g.replay()
    torch.testing.assert_close(param.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)


def test_an_empty_capture_warns_as_torch_cuda() -> None:
    x = torch.ones(3, device=ACCEL)
    capture, side = torch.accel.Stream(), torch.accel.Stream()
    while side == capture:  # streams come from a pool, as torch.cuda's do
        side = torch.accel.Stream()
    g = torch.accel.AccelGraph()
    with pytest.warns(UserWarning, match="graph is empty.*wrong device or stream"):
        with torch.accel.graph(g, stream=capture):
            with torch.accel.stream(side):  # the work goes elsewhere
                x.add_(1)
    torch.accel.synchronize()
    assert torch.equal(x.cpu(), torch.full((3,), 2.0))
    assert g.num_nodes() == 0
    g.replay()  # nothing to run


def test_destroyed_graph_raises_on_use() -> None:
    g = torch.accel.AccelGraph()
    g.destroy()
    g.destroy()  # twice is fine
    for call in (g.replay, g.reset, g.pool, g.instantiate, g.capture_begin):
        with pytest.raises(RuntimeError, match="destroyed"):
            call()


def test_bad_arguments() -> None:
    g = torch.accel.AccelGraph()
    with pytest.raises(ValueError, match="capture_error_mode"):
        g.capture_begin(capture_error_mode="sometimes")
    with pytest.raises(torch_accel.AccelError, match="the graph is empty"):
        g.replay()  # nothing captured yet
    with pytest.raises(torch_accel.AccelError, match="no capture into this graph is underway"):
        g.capture_end()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_graphed_module_trains_like_eager(set_to_none: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    ).to(ACCEL)
    ref = copy.deepcopy(model)
    graphed = torch.accel.make_graphed_callables(model, (torch.randn(8, 16, device=ACCEL),))
    assert graphed is model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for _ in range(4):
        x, y = torch.randn(8, 16, device=ACCEL), torch.randn(8, 4, device=ACCEL)
        for m, o in ((graphed, opt), (ref, opt_ref)):
            o.zero_grad(set_to_none=set_to_none)
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu())
            torch.testing.assert_close(p.detach().cpu(), q.detach().cpu())
    # Evaluation mode was not captured: the module's own forward runs.
    model.eval()
    x = torch.randn(3, 16, device=ACCEL)
    torch.testing.assert_close(model(x).cpu(), ref.eval()(x).cpu())


def test_graphed_functions_and_chained_callables() -> None:
    torch.manual_seed(0)
    w = torch.randn(5, 5, device=ACCEL, requires_grad=True)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (a @ w).tanh(), (a * b).sum()

    lin = torch.nn.Linear(5, 3).to(ACCEL)
    sample_a = torch.randn(4, 5, device=ACCEL, requires_grad=True)
    sample_b = torch.randn(4, 5, device=ACCEL)
    g_fn, g_lin = torch.accel.make_graphed_callables(
        (fn, lin), ((sample_a, sample_b), (torch.randn(4, 5, device=ACCEL, requires_grad=True),))
    )
    a = torch.randn(4, 5, device=ACCEL, requires_grad=True)
    b = torch.randn(4, 5, device=ACCEL)
    h, s = g_fn(a, b)
    out = g_lin(h).sum() + s
    out.backward()
    grads = (a.grad.cpu(), lin.weight.grad.cpu())
    a_ref = a.detach().clone().requires_grad_()
    lin.weight.grad = None
    h_ref, s_ref = (a_ref @ w).tanh(), (a_ref * b).sum()
    (torch.nn.functional.linear(h_ref, lin.weight, lin.bias).sum() + s_ref).backward()
    torch.testing.assert_close(grads[0], a_ref.grad.cpu())
    torch.testing.assert_close(grads[1], lin.weight.grad.cpu())
    with pytest.raises(TypeError, match=r"structured as its sample_args \(2 tensors"):
        g_fn(a)


def test_graphed_callables_take_nested_arguments() -> None:
    # test_cuda.py's test_graph_make_graphed_callables variants pass ({"x": x},)-style samples:
    # torch.cuda flattens them (pytree), and so does accel.
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3).to(ACCEL)

    def fn(inputs: dict, pair: tuple) -> dict:
        return {"y": lin(inputs["x"]) * pair[0], "z": pair[1].sum()}

    sample = ({"x": torch.randn(4, 5, device=ACCEL, requires_grad=True)},
              (torch.randn(4, 3, device=ACCEL), torch.randn(2, device=ACCEL)))  # fmt: skip
    graphed = torch.accel.make_graphed_callables(fn, sample)
    x = torch.randn(4, 5, device=ACCEL, requires_grad=True)
    scale, v = torch.randn(4, 3, device=ACCEL), torch.randn(2, device=ACCEL)
    out = graphed({"x": x}, (scale, v))
    assert set(out) == {"y", "z"}
    out["y"].sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    lin.weight.grad = None
    want = lin(x_ref) * scale
    want.sum().backward()
    torch.testing.assert_close(out["y"].detach().cpu(), want.detach().cpu())
    torch.testing.assert_close(out["z"].cpu(), v.sum().cpu())
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad.cpu())
    with pytest.raises(TypeError, match="structured as its sample_args"):
        graphed(x, (scale, v))


def test_graphed_dropout_draws_per_call() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).to(ACCEL)
    x = torch.randn(32, 64, device=ACCEL)
    graphed = torch.accel.make_graphed_callables(model, (x,))
    masks = [(graphed(x) == 0).cpu() for _ in range(3)]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    assert all(0.4 < m.float().mean().item() < 0.6 for m in masks)


def test_modules_with_hooks_cannot_be_graphed() -> None:
    lin = torch.nn.Linear(2, 2).to(ACCEL)
    lin.register_forward_hook(lambda *args: None)
    with pytest.raises(RuntimeError, match="hooks"):
        torch.accel.make_graphed_callables(lin, (torch.randn(1, 2, device=ACCEL),))


def test_capture_across_streams_forks_and_joins() -> None:
    x = torch.ones(1000, device=ACCEL)
    side = torch.accel.Stream()
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g):
        origin = torch.accel.current_stream()
        a = x * 2
        side.wait_stream(origin)  # fork
        with torch.accel.stream(side):
            b = x + 3
        c = a * 10
        origin.wait_stream(side)  # join
        d = b + c
    for k in (1.0, 2.0, 5.0):
        x.fill_(k)
        g.replay()
        torch.testing.assert_close(d.cpu(), torch.full((1000,), 21 * k + 3))
    # A stream that joined the capture and was not joined back is reported at its end.
    g2 = torch.accel.AccelGraph()
    with pytest.raises(torch_accel.CaptureError, match="not joined back"):
        with torch.accel.graph(g2):
            side.wait_stream(torch.accel.current_stream())
            with torch.accel.stream(side):
                x.add(1)
    torch.testing.assert_close((x + 1).cpu(), torch.full((1000,), 6.0))
