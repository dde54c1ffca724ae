"""Bad input from Python: refused at the call with the CPU's (or CUDA's) error, the device
usable afterwards. Each case was once accepted, or refused late."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

ACCEL = torch.device("accel")


def _usable() -> None:
    torch.accel.synchronize()
    assert torch.ones(3, device=ACCEL).sum().item() == 3.0


def test_out_overlapping_input_is_refused() -> None:
    x = torch.arange(6.0, device=ACCEL)
    idx = torch.tensor([1, 0], device=ACCEL)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        torch.index_select(x, 0, idx, out=x)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))  # untouched
    _usable()


def test_copy_with_partial_overlap_is_refused_like_cpu() -> None:
    cpu = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="single memory location") as expected:
        cpu[1:].copy_(cpu[:-1])
    x = torch.arange(6.0, device=ACCEL)
    with pytest.raises(RuntimeError, match="single memory location") as actual:
        x[1:].copy_(x[:-1])
    assert str(actual.value).splitlines()[0] == str(expected.value).splitlines()[0]
    x.copy_(x)  # the same memory: nothing to do
    x[:3].copy_(x[3:])  # disjoint parts of one storage are fine
    torch.testing.assert_close(x.cpu(), torch.tensor([3.0, 4, 5, 3, 4, 5]))
    _usable()


def test_foreach_refuses_cpu_tensors_with_elements() -> None:
    a = [torch.ones(3, device=ACCEL)]
    with pytest.raises(RuntimeError, match="only as 0-dim scalar inputs"):
        torch._foreach_add_(a, [torch.ones(3)])
    torch.testing.assert_close(a[0].cpu(), torch.ones(3))
    _usable()


def test_generator_of_another_device_type_is_refused() -> None:
    with pytest.raises(RuntimeError, match="Expected a 'accel' device type for generator"):
        torch.randn(3, device=ACCEL, generator=torch.Generator())
    g = torch.Generator(device=ACCEL).manual_seed(3)
    first = torch.randn(3, device=ACCEL, generator=g).cpu()
    g.manual_seed(3)
    torch.testing.assert_close(torch.randn(3, device=ACCEL, generator=g).cpu(), first)


def test_zero_dim_cpu_out_is_refused() -> None:
    out = torch.zeros(())
    with pytest.raises(RuntimeError, match="only as 0-dim scalar inputs"):
        torch.add(torch.ones((), device=ACCEL), 1, out=out)
    assert out.item() == 0.0
    # A 0-dim CPU tensor as an input is a scalar, as on CUDA.
    r = torch.ones(2, device=ACCEL) + torch.tensor(2.0)
    torch.testing.assert_close(r.cpu(), torch.full((2,), 3.0))


def test_argument_checks_of_cpu_kernels_raise_at_the_call() -> None:
    # CUDA checks these arguments before launching: so does accel (the first call of each
    # signature runs on the caller).
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.zeros(1, device=ACCEL).expand(6).bernoulli_()
    mask = torch.ones(4, dtype=torch.bool, device=ACCEL)
    with pytest.raises(RuntimeError, match="Number of elements of source"):
        torch.zeros(4, device=ACCEL).masked_scatter_(mask, torch.ones(2, device=ACCEL))
    _usable()


def test_bad_arguments_of_view_operators_raise_the_cpus_error() -> None:
    """Views without an accel kernel are computed on meta tensors; the meta kernel's argument
    checks are the call's errors (they were reported as accel lacking a kernel)."""
    for call in (lambda t: t.unfold(0, 5, 1), lambda t: t.diagonal(dim1=0, dim2=0)):
        with pytest.raises(RuntimeError) as cpu:
            call(torch.randn(3))
        with pytest.raises(type(cpu.value)) as accel:
            call(torch.randn(3, device=ACCEL))
        assert not isinstance(accel.value, NotImplementedError)
        assert str(accel.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    _usable()


def test_checks_of_float_arguments_raise_at_the_call() -> None:
    # A call with new floating-point values runs first on the caller, like any new signature:
    # kernels check them (CUDA checks them before launching).
    x = torch.zeros(4, device=ACCEL)
    x.bernoulli_(0.5)
    with pytest.raises(RuntimeError, match="expects p to be in"):
        x.bernoulli_(1.5)
    x.uniform_(0.0, 1.0)
    with pytest.raises(RuntimeError, match="from=2 > to=1"):
        x.uniform_(2.0, 1.0)
    _usable()


def test_float_arguments_that_change_every_call_give_cpu_results() -> None:
    # A learning rate that changes every step: after a few values the operator keys its calls
    # on the types of its float arguments (so they stay asynchronous); results stay exact.
    torch.manual_seed(0)
    x, g = torch.randn(64), torch.randn(64)
    xa, ga = x.to(ACCEL), g.to(ACCEL)
    for step in range(40):
        lr = 0.1 / (step + 1)
        x.add_(g, alpha=-lr)
        xa.add_(ga, alpha=-lr)
        x.mul_(1.0 - lr * 0.01)
        xa.mul_(1.0 - lr * 0.01)
    torch.testing.assert_close(xa.cpu(), x, rtol=0, atol=0)


def test_fill_and_zero_of_an_expanded_tensor() -> None:
    # Allowed on the CPU and CUDA: every element is the same memory.
    base = torch.zeros(1, device=ACCEL)
    base.expand(3).fill_(2.0)
    assert base.item() == 2.0
    base.expand(3).zero_()
    assert base.item() == 0.0


def test_deterministic_mode_fills_uninitialized_memory() -> None:
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.utils.deterministic.fill_uninitialized_memory
        assert torch.empty(4, device=ACCEL).isnan().all().item()
        e = torch.empty(2, 3, dtype=torch.int64, device=ACCEL)
        assert (e == torch.iinfo(torch.int64).max).all().item()
        s = torch.empty_strided((2, 2), (1, 2), dtype=torch.int32, device=ACCEL)
        assert (s == torch.iinfo(torch.int32).max).all().item()
        r = torch.zeros(2, device=ACCEL)
        r.resize_(5)
        torch.testing.assert_close(r[:2].cpu(), torch.zeros(2))
        assert r[2:].isnan().all().item()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    "fn",
    [
        lambda out: torch.ones(4, 3, out=out),
        lambda out: torch.zeros(4, 3, out=out),
        lambda out: torch.full((4, 3), 2.0, out=out),
        lambda out: torch.softmax(torch.arange(12.0).view(4, 3).to(out.device), 0, out=out),
        lambda out: torch.log_softmax(torch.arange(12.0).view(4, 3).to(out.device), 1, out=out),
    ],
    ids=["ones", "zeros", "full", "softmax", "log_softmax"],
)
def test_out_tensors_of_the_right_size_keep_their_strides(fn) -> None:
    expected = torch.empty(3, 4).t()
    fn(expected)
    out = torch.empty(3, 4, device=ACCEL).t()
    fn(out)
    assert out.stride() == expected.stride() == (1, 4)
    torch.testing.assert_close(out.cpu(), expected)


def test_result_dtype_follows_the_default_dtype() -> None:
    # The cache of result metadata keys on the default dtype: int / int is a float of it.
    a = torch.tensor([3], dtype=torch.int32, device=ACCEL)
    torch.set_default_dtype(torch.float64)
    try:
        assert (a / a).dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert (a / a).dtype == torch.float32
    assert torch.arange(3, device=ACCEL).div(2).dtype == torch.float32


def test_negative_host_memory_is_refused(run_python) -> None:
    r = run_python(
        "import torch, torch_accel; torch.ones(1, device='accel')", ACCEL_HOST_MEMORY="-1"
    )
    assert r.returncode != 0
    assert "ACCEL_HOST_MEMORY" in r.stderr and "'-1' is not a size" in r.stderr


def test_in_place_ops_never_resize_self() -> None:
    # atan2_'s meta function resizes self to the broadcast shape; the CPU kernel refuses.
    x = torch.randn(3, device=ACCEL)
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast"):
        x.atan2_(torch.randn(4, 3, device=ACCEL))
    assert x.shape == (3,)
    _usable()


def test_out_of_the_right_element_count_keeps_its_shape() -> None:
    # The CPU kernel resizes an out= tensor only when its element count differs.
    expected = torch.zeros(2, 3)
    torch.logspace(0, 3, 4, base=2, out=expected.narrow(1, 1, 2))
    x = torch.zeros(2, 3, device=ACCEL)
    torch.logspace(0, 3, 4, base=2, device=ACCEL, out=x.narrow(1, 1, 2))
    torch.testing.assert_close(x.cpu(), expected)


def test_reading_a_lazy_clone_keeps_it_lazy() -> None:
    t = torch.tensor([[0.0, 1], [2, 3]], device=ACCEL)
    c = t._lazy_clone()
    torch.testing.assert_close((t + c).cpu(), torch.tensor([[0.0, 2], [4, 6]]))
    assert torch._C._is_cow_tensor(t) and torch._C._is_cow_tensor(c)
    c.add_(1)  # a write gives the clone its own memory
    torch.testing.assert_close(t.cpu(), torch.tensor([[0.0, 1], [2, 3]]))
    torch.testing.assert_close(c.cpu(), torch.tensor([[1.0, 2], [3, 4]]))


def test_kernel_warnings_reach_python_once_per_call() -> None:
    for device in ("cpu", ACCEL):
        y = torch.empty(5, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                y.random_(0, 2**30)  # beyond float's exact integers: the kernel warns
            torch.accel.synchronize()
        assert len(caught) == 3, (device, [str(w.message) for w in caught])


def test_deterministic_alerts_raise_at_the_call() -> None:
    a = torch.randn(10, device=ACCEL)
    i, v = torch.tensor([0, 0], device=ACCEL), torch.tensor([0.0, 1], device=ACCEL)
    a.put_(i, v)  # the same signature, cached while deterministic mode is off
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="put_ does not have a deterministic"):
            a.put_(i, v)
    finally:
        torch.use_deterministic_algorithms(False)
    a.put_(i, v)
    _usable()


def test_indices_on_another_device_give_atens_error() -> None:
    msg = r"indices should be either on cpu or on the same device as the indexed tensor \(cpu\)"
    with pytest.raises(RuntimeError, match=msg):
        torch.randn(3, 4)[torch.tensor([0, 2], device=ACCEL)]
    msg = r"indices should be either on cpu or on the same device as the indexed tensor \(accel:0\)"
    with pytest.raises(RuntimeError, match=msg):
        torch.randn(3, 4, device="accel:0")[torch.tensor([0, 2], device="accel:1")]
    _usable()


def test_pickling_for_another_process_leaves_cpu_sharing_and_torch_save_alone() -> None:
    # torch.multiprocessing shares accel memory (test_multiprocessing.py); what it pickles for
    # a process is no torch.save pickle, and CPU tensors still go through shared memory.
    import pickle
    from multiprocessing.reduction import ForkingPickler

    x = torch.arange(4.0, device="accel")
    for obj in (x, torch.nn.Parameter(x.clone()), x.untyped_storage()):
        back = pickle.loads(ForkingPickler.dumps(obj))  # this process's own export: itself
        assert back.device == x.device
        assert back.data_ptr() == obj.data_ptr()
        del back
    gc.collect()
    torch.accel.ipc_collect()
    shared = pickle.loads(ForkingPickler.dumps(torch.arange(3.0)))
    assert shared.is_shared() and shared.tolist() == [0.0, 1.0, 2.0]
    again = pickle.loads(pickle.dumps(x))
    assert again.device == x.device and torch.equal(again.cpu(), x.cpu())
    assert again.data_ptr() != x.data_ptr()  # a copy
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


LINALG_ERRORS = {
    # name: (call, bad input) after a first call on a good input (the signature's first call
    # waits for its kernel anyway); the data errors raise at the call, as on the CPU and CUDA
    "cholesky": (torch.cholesky, -torch.eye(4)),
    "eigh": (torch.linalg.eigh, torch.full((4, 4), float("nan"))),
    "svd": (torch.linalg.svd, torch.full((4, 4), float("nan"))),
    "inv_ex": (lambda a: torch.linalg.inv_ex(a, check_errors=True), torch.zeros(4, 4)),
    "cholesky_ex": (lambda a: torch.linalg.cholesky_ex(a, check_errors=True), -torch.eye(4)),
}


@pytest.mark.parametrize("name", LINALG_ERRORS)
def test_linear_algebra_data_errors_raise_at_the_call(name: str) -> None:
    # PyTorch's test_proxy_tensor.py (make_fx of cholesky) saw garbage returned and AccelError
    # at the next synchronization: the kernels check LAPACK's info inside the stream task.
    call, bad = LINALG_ERRORS[name]
    good = 4 * torch.eye(4) + 0.1
    got = call(good.to(ACCEL))
    want = call(good)
    as_tuple = lambda r: r if isinstance(r, tuple) else (r,)  # noqa: E731
    for g, w in zip(as_tuple(got), as_tuple(want), strict=True):
        torch.testing.assert_close(g.cpu(), w)
    with pytest.raises(torch.linalg.LinAlgError) as cpu_error:
        call(bad)
    with pytest.raises(torch.linalg.LinAlgError) as accel_error:
        call(bad.to(ACCEL))
    assert str(accel_error.value) == str(cpu_error.value)
    _usable()
    if name.endswith("_ex"):  # without check_errors: no wait, the info tells
        info = getattr(torch.linalg, name)(bad.to(ACCEL))[1]
        assert info.item() != 0
