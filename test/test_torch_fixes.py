"""torch_accel/_torch_fixes.py: what torch_accel fixes in torch 2.11 where no extension point
reaches, each with a test that fails once the installed torch no longer needs the fix."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch
from torch.utils.dlpack import DLDeviceType

import torch_accel
from torch_accel import _torch_fixes


def test_torch_still_refuses_the_dlpack_device_of_renamed_backends() -> None:
    # Fails once torch tells renamed PrivateUse1 tensors apart itself (pytorch/pytorch#195815):
    # then remove the fix from _torch_fixes.py, and this test.
    t = torch.zeros(2, device="accel")
    try:
        _torch_fixes._original_dlpack_device(t)
    except ValueError as e:
        assert "Unknown device type accel for Dlpack" in str(e)
    else:
        raise AssertionError("torch's __dlpack_device__ takes accel tensors now: drop the fix")


def test_from_dlpack_shares_accel_memory_on_every_device() -> None:
    for index in range(min(2, torch_accel.device_count())):
        x = torch.arange(12.0, device=f"accel:{index}").view(3, 4)[:, 1:]  # strided view
        assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, index)
        y = torch.from_dlpack(x)
        assert y.device == x.device
        assert y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
        y.add_(1)  # one memory
        torch.testing.assert_close(x.cpu(), torch.arange(12.0).view(3, 4)[:, 1:] + 1)


def test_dlpack_of_parameters_capsules_and_other_devices_is_unchanged() -> None:
    p = torch.nn.Parameter(torch.ones(3, device="accel"))
    assert p.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.from_dlpack(p.detach()).device.type == "accel"
    capsule = torch.utils.dlpack.to_dlpack(torch.full((2,), 7.0, device="accel"))
    assert torch.from_dlpack(capsule).cpu().tolist() == [7.0, 7.0]
    assert torch.zeros(1).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.Tensor.__dlpack_device__.__name__ == "__dlpack_device__"


def _flex_inputs(device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(2, 3, 40, 8, dtype=torch.float64, generator=g).to(device).requires_grad_()
        for _ in range(3)
    )


def test_torch_still_refuses_flex_attention_on_renamed_backends() -> None:
    # Fails once torch's flex_attention takes PrivateUse1 inputs itself: then remove the fix
    # from _torch_fixes.py, and this test.
    q, k, v = _flex_inputs("accel")
    try:
        _torch_fixes._original_validate_device(q, k, v)
    except ValueError as e:
        assert "Found input tensors on accel device" in str(e)
    else:
        raise AssertionError("torch's flex_attention takes accel tensors now: drop the fix")


def test_flex_attention_runs_on_accel_forward_and_backward(fallback_mode) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fallback_mode("error")

    def bias(score: torch.Tensor, b: int, h: int, qi: torch.Tensor, ki: torch.Tensor):
        return score + 0.1 * (qi - ki) * (h + 1)

    def causal(b: int, h: int, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return qi >= ki

    q, k, v = _flex_inputs("accel")
    mask = create_block_mask(causal, None, None, 40, 40, device="accel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unfused without torch.compile
        out = flex_attention(q, k, v, score_mod=bias, block_mask=mask)
    # The same attention written out on the CPU
    rq, rk, rv = _flex_inputs("cpu")
    pos = torch.arange(40)
    heads = torch.arange(1, 4).view(3, 1, 1)
    scores = rq @ rk.mT / 8**0.5 + 0.1 * (pos.view(-1, 1) - pos.view(1, -1)) * heads
    scores = scores.masked_fill(pos.view(-1, 1) < pos.view(1, -1), float("-inf"))
    expected = scores.softmax(-1) @ rv
    assert out.device.type == "accel"
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    w = torch.randn(expected.shape, dtype=torch.float64)
    (out * w.to("accel")).sum().backward()
    (expected * w).sum().backward()
    for got, want in ((q, rq), (k, rk), (v, rv)):
        torch.testing.assert_close(got.grad.cpu(), want.grad)
    assert torch.accel.fallback_stats() == {}
    # Other devices get torch's own check: the CPU still refuses backward
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(rq, rk, rv)


@pytest.mark.skipif(
    not _torch_fixes._CPP_FLEX_VEC8, reason="shows where Inductor's vectors hold 8 floats"
)
def test_inductors_flex_template_still_miscomputes_heads_of_16_with_an_8_key_tail() -> None:
    # Fails once Inductor's transposed micro-GEMM handles an 8-column tail on AVX2 (the CPU's
    # own compiled flex_attention is right then): drop _template_defect from _torch_fixes.
    from torch.nn.attention.flex_attention import flex_attention

    errors = []
    for seed in range(3):  # it computes from memory past the row: wrong, but not always alike
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 4, 40, 16, generator=g) for _ in range(3))
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(flex_attention, dynamic=False)(q, k, v)
        errors.append((got - flex_attention(q, k, v)).abs().max().nan_to_num(float("inf")).item())
    torch._dynamo.reset()
    assert max(errors) > 1e-3, f"the CPU's compiled flex_attention is right: {errors}"


def test_torch_still_refuses_rng_state_operators_on_renamed_backends() -> None:
    # Fails once rng_prims saves and restores a PrivateUse1 backend's generator itself
    # (pytorch/pytorch#193113): then remove the fix from _torch_fixes.py, and this test.
    from torch._C import DispatchKey
    from torch._prims.rng_prims import run_and_save_rng_state

    torch_kernel = run_and_save_rng_state.py_kernels[DispatchKey.BackendSelect].torch_kernel
    with pytest.raises(AssertionError, match="Backend not supported"):
        torch_kernel(torch.ops.aten.rand_like.default, torch.zeros(3, device="accel"))


def _checkpointed_dropout(backend: str, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two calls of a block recomputed in the backward (activation checkpointing) with dropout
    inside: the outputs and the input's gradients."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).to(device)

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.relu(lin(x)), p=0.5, training=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)

    fn = f if backend == "eager" else torch.compile(f, backend=backend)
    x = torch.randn(32, 64).to(device).requires_grad_()
    results = []
    for _ in range(2):
        out = fn(x)
        out.backward(torch.ones_like(out))
        results.append((out.detach().cpu(), x.grad.cpu()))
        x.grad = None
    return results


def test_checkpointed_dropout_under_aot_autograd_replays_accels_generator() -> None:
    # AOTAutograd recomputes the dropout in the backward under run_with_rng_state, from the
    # state run_and_save_rng_state saved in the forward: with accel's generator, the backward's
    # mask is the forward's, and everything equals eager checkpointing (same seed). The CPU
    # keeps torch's own kernels, with the same result.
    for device in ("accel", "cpu"):
        torch._dynamo.reset()
        compiled = _checkpointed_dropout("aot_eager", device)
        for (out, grad), (eager_out, eager_grad) in zip(
            compiled, _checkpointed_dropout("eager", device), strict=True
        ):
            torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
            torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)
            # About 3/4 of the outputs are zero (relu, then dropout with p=0.5): dropout dropped.
            assert 0.6 < (out == 0).float().mean() < 0.9


def test_rng_state_operators_save_and_restore_accels_generator() -> None:
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    from torch._subclasses.fake_tensor import FakeTensorMode

    rand_like = torch.ops.aten.rand_like.default
    x = torch.zeros(5, device="accel")
    state, first = run_and_save_rng_state(rand_like, x)
    assert state.device.type == "cpu" and state.dtype == torch.uint8 and state.numel() == 16
    second = torch.rand_like(x)
    # The saved state replays the first draw and leaves the generator where it was.
    after = torch.accel.get_rng_state()
    again = run_with_rng_state(state, rand_like, x)
    assert torch.equal(again.cpu(), first.cpu()) and not torch.equal(first.cpu(), second.cpu())
    assert torch.equal(torch.accel.get_rng_state(), after)
    # Also without a tensor argument (the device given), and under fake tensors (tracing).
    replay = run_with_rng_state(state, torch.ops.aten.rand.default, [5], device="accel")
    assert torch.equal(replay.cpu(), first.cpu())
    # Each device's own generator: accel:1's draw replays, accel:0's generator is untouched.
    on_1 = torch.zeros(5, device="accel:1")
    before_0 = torch.accel.get_rng_state(0)
    state_1, first_1 = run_and_save_rng_state(rand_like, on_1)
    assert torch.equal(run_with_rng_state(state_1, rand_like, on_1).cpu(), first_1.cpu())
    assert torch.equal(torch.accel.get_rng_state(0), before_0)
    with FakeTensorMode() as mode:
        fake_state, fake_out = run_and_save_rng_state(rand_like, mode.from_tensor(x))
        assert fake_out.device == x.device and fake_out.shape == x.shape
        fake_again = run_with_rng_state(fake_state, rand_like, mode.from_tensor(x))
        assert fake_again.device == x.device


def test_torch_still_has_cuda_only_data_parallel_copies() -> None:
    # Fails once torch.nn.parallel.comm copies PrivateUse1 tensors itself
    # (pytorch/pytorch#143239): then remove the comm fix from _torch_fixes.py, and this test.
    x = torch.randn(4, 2, device="accel")
    try:
        _torch_fixes._original_comm["scatter"](x, [0, 1])
    except (RuntimeError, AttributeError) as e:
        assert "NVIDIA driver" in str(e) or "_scatter" in str(e), e
    else:
        raise AssertionError("torch's comm.scatter takes accel tensors now: drop the fix")


def test_comm_fix_keeps_torchs_names_and_documentation() -> None:
    from torch.nn.parallel import comm

    for name in _torch_fixes._COMM_NAMES:
        fixed = getattr(comm, name)
        assert fixed is _torch_fixes._comm_fixes[name]
        assert fixed.__name__ == name and fixed.__doc__ == _torch_fixes._original_comm[name].__doc__


def test_torch_is_autocast_enabled_still_answers_for_cuda_alone() -> None:
    # Fails once torch.is_autocast_enabled() answers for the current accelerator
    # (pytorch/pytorch#191916): then remove the autocast fix from _torch_fixes.py, and this test.
    with torch.autocast("accel", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("accel")
        if _torch_fixes._original_is_autocast_enabled():
            raise AssertionError("torch.is_autocast_enabled() knows accel now: drop the fix")
        assert torch.is_autocast_enabled()
    assert not torch.is_autocast_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not torch.is_autocast_enabled()  # as torch's: CPU autocast is another question
        assert torch.is_autocast_enabled("cpu")


def _encoder(norm_first: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to("accel").eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_fast_paths_step_aside_under_accel_autocast(norm_first: bool) -> None:
    # As under CUDA autocast: nn.TransformerEncoder and nn.MultiheadAttention take their
    # unfused path (each operator autocast), so the result equals the one with the fast path
    # switched off. Before the fix an encoder fed bfloat16 activations raised "expected m1 and
    # m2 to have the same dtype" inside the fused kernel.
    encoder = _encoder(norm_first)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).to("accel").eval()
    proj = torch.nn.Linear(32, 32).to("accel")
    x = torch.randn(2, 7, 32, device="accel")

    def run() -> list[torch.Tensor]:
        with torch.no_grad(), torch.autocast("accel", dtype=torch.bfloat16):
            h = proj(x)  # bfloat16
            return [encoder(h), encoder(x), mha(x, x, x, need_weights=False)[0]]

    got = run()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        unfused = run()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    for a, b in zip(got, unfused, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got[2].dtype == torch.bfloat16  # the output projection ran autocast
    # Outside autocast the fast path runs, and agrees with the unfused one.
    with torch.no_grad():
        fused = encoder(x)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            plain = encoder(x)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)


def test_compiled_code_folds_the_autocast_question_and_recompiles_on_change(run_python) -> None:
    # In a fresh interpreter, so that Dynamo is imported after the fix (its list of functions to
    # fold is built then): the wrapper is folded through the polyfill torch_accel registers.
    code = textwrap.dedent(
        """
        import torch, torch_accel
        import torch._dynamo.testing
        counter = torch._dynamo.testing.CompileCounter()

        @torch.compile(fullgraph=True, backend=counter)
        def f(x):
            return x * 2 if torch.is_autocast_enabled() else x + 1

        t = torch.full((2,), 3.0, device="accel")
        with torch.autocast("accel", dtype=torch.bfloat16):
            a = f(t)
        b = f(t)
        with torch.autocast("accel", dtype=torch.bfloat16):
            c = f(t)
        print(a.tolist(), b.tolist(), c.tolist(), counter.frame_count)
        """
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == "[6.0, 6.0] [4.0, 4.0] [6.0, 6.0] 2"


def test_register_sharding_still_leaves_keyword_tensors_out_of_the_cache_key() -> None:
    # Fails once DTensor's register_sharding keys its cache by keyword-only tensors itself, or
    # takes the key's description (pytorch/pytorch#171248): then register tensor_sharding's rules
    # with it and remove dtensor_cache_key_includes from _torch_fixes.py, and this test.
    import inspect

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.experimental import register_sharding

    assert "schema_info" not in inspect.signature(register_sharding).parameters
    lib = torch.library.Library("accel_fixes_test", "FRAGMENT")
    lib.define("kw(Tensor x, *, Tensor? mask=None) -> Tensor")
    op = torch.ops.accel_fixes_test.kw.default

    @register_sharding(op)
    def _rule(x: object, *, mask: object = None) -> list[tuple[list, list]]:
        return [([Replicate()], [Replicate()] + ([Replicate()] if mask is not None else []))]

    info = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op]
    assert "mask" not in (info.static_kwargkey or [])


def test_accels_attention_sharding_is_keyed_by_its_mask() -> None:
    from torch.distributed.tensor import DTensor

    infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    for op in (
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    ):
        assert infos[op].static_kwargkey == ["attn_mask"], infos[op]
