"""Native structural operators and the CPU fallback."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_accel
from helpers import assert_same, same_storage


def test_empty_and_empty_strided():
    torch.accel.reset_fallback_stats()
    e = torch.empty(2, 3, device="accel:1")
    assert e.device == torch.device("accel:1") and e.shape == (2, 3) and e.is_contiguous()
    s = torch.empty_strided((2, 3), (1, 2), device="accel", dtype=torch.float64)
    assert s.stride() == (1, 2) and s.dtype == torch.float64
    cl = torch.empty(2, 3, 4, 5, device="accel", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert torch.accel.fallback_stats() == {}  # all native


def test_views_alias_their_base():
    base = torch.arange(24.0, device="accel")
    v = base.view(4, 6)
    assert same_storage(v, base)
    r = v[1:3, ::2]
    assert same_storage(r, base) and r.storage_offset() == 6
    a = torch.as_strided(base, (3, 3), (4, 1), 2)
    assert same_storage(a, base)
    assert torch.equal(a.cpu(), torch.as_strided(torch.arange(24.0), (3, 3), (4, 1), 2))
    t = v.t()
    rs = t.reshape(24)  # not viewable: copies
    assert not same_storage(rs, base)
    assert torch.equal(rs.cpu(), torch.arange(24.0).view(4, 6).t().reshape(24))
    # Writes through a view are seen by the base.
    v[0].fill_(-1.0)
    expected = torch.arange(24.0)
    expected[:6] = -1
    assert_same(base, expected)


def test_fallback_view_operators_return_real_views():
    base = torch.arange(12.0, device="accel")
    u = base.unfold(0, 4, 2)
    assert same_storage(u, base)
    assert torch.equal(u.cpu(), torch.arange(12.0).unfold(0, 4, 2))
    u[0, 0].fill_(100.0)
    assert base[0].item() == 100.0
    z = torch.randn(3, dtype=torch.complex64)
    real = torch.view_as_real(z.to("accel"))
    assert real.dtype == torch.float32 and real.shape == (3, 2)
    assert torch.equal(real.cpu(), torch.view_as_real(z))


def test_resize_and_set():
    x = torch.arange(6.0, device="accel")
    ptr = x.data_ptr()
    x.resize_(2, 3)
    assert x.shape == (2, 3) and x.data_ptr() == ptr
    assert torch.equal(x.cpu(), torch.arange(6.0).view(2, 3))
    x.resize_(4, 4)  # grows the storage in stream order, keeping the old values
    assert x.shape == (4, 4)
    assert torch.equal(x.view(16)[:6].cpu(), torch.arange(6.0))
    y = torch.empty(0, device="accel")
    y.set_(x)
    assert same_storage(y, x) and y.shape == x.shape
    z = torch.empty(0, device="accel")
    z.set_(x.untyped_storage(), 2, (2, 2), (4, 1))
    assert torch.equal(z.cpu(), x.cpu().view(16)[2:].as_strided((2, 2), (4, 1)))
    w = torch.empty(0, device="accel")
    w.set_(x.untyped_storage())
    assert w.shape == (16,)
    w.set_()
    assert w.numel() == 0
    with pytest.raises(RuntimeError, match="storage is on accel:0 but the tensor is on accel:1"):
        torch.empty(0, device="accel:1").set_(x.untyped_storage())


def test_fill_zero_and_item():
    x = torch.empty(3, 4, device="accel")
    x.fill_(2.5)
    assert_same(x, torch.full((3, 4), 2.5))
    x[:, 1].zero_()  # strided: a kernel, not a memset
    expected = torch.full((3, 4), 2.5)
    expected[:, 1] = 0
    assert_same(x, expected)
    x.zero_()
    assert_same(x, torch.zeros(3, 4))
    x.fill_(torch.tensor(4.0, device="accel"))
    assert x[2, 3].item() == 4.0
    i = torch.tensor([7], dtype=torch.int64, device="accel")
    assert i.item() == 7 and isinstance(i.item(), int)
    b = torch.tensor(True, device="accel")
    assert b.item() is True
    c = torch.tensor(1 + 2j, device="accel")
    assert c.item() == 1 + 2j and c.conj().item() == 1 - 2j
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        x.item()


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a + b * 2,
        lambda a, b: torch.matmul(a, b.t()),
        lambda a, b: torch.cat([a, b], dim=1).sum(dim=0),
        lambda a, b: torch.where(a > 0, a, b).cumsum(1),
        lambda a, b: a.index_select(1, torch.tensor([0, 2], device=a.device)),
        lambda a, b: torch.nn.functional.softmax(a, dim=-1),
        lambda a, b: (a.sort(dim=1).values, a.argmax()),
        lambda a, b: a[a > 0],
    ],
)
def test_fallback_results_match_cpu(fn, force_fallback):
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    expected = fn(a, b)
    actual = fn(a.to("accel"), b.to("accel"))
    if isinstance(expected, tuple):
        for e, r in zip(expected, actual, strict=True):
            assert_same(r, e)
    else:
        assert_same(actual, expected)


def test_in_place_and_out_variants_write_to_accel_tensors():
    a = torch.arange(6.0, device="accel")
    ptr = a.data_ptr()
    a.add_(10).mul_(2)
    assert a.data_ptr() == ptr
    assert_same(a, (torch.arange(6.0) + 10) * 2)
    out = torch.empty(6, device="accel")
    torch.sub(a, 1, out=out)
    assert_same(out, (torch.arange(6.0) + 10) * 2 - 1)
    view = a.view(2, 3)[:, 1]
    view.neg_()
    expected = (torch.arange(6.0) + 10) * 2
    expected[[1, 4]] *= -1
    assert_same(a, expected)


def test_fallback_stats_count_calls_per_operator(force_fallback):
    torch.accel.reset_fallback_stats()
    x = torch.ones(4, device="accel")
    for _ in range(3):
        x = torch.atan2(x, x)
    torch.lgamma(x)
    x.fill_(2.0)  # native: never the fallback
    assert torch.accel.fallback_stats() == {"aten::atan2": 3, "aten::lgamma": 1}
    torch.accel.reset_fallback_stats()
    assert torch.accel.fallback_stats() == {}


def test_fallback_warns_once_per_operator(fallback_mode, force_fallback):
    fallback_mode("warn")
    x = torch.ones(3, device="accel")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.atan2(x, x)
        torch.atan2(x, x)
    messages = [str(w.message) for w in caught if "aten::atan2" in str(w.message)]
    assert len(messages) == 1
    assert "runs on the CPU fallback" in messages[0]
    assert "ACCEL_FALLBACK=silent" in messages[0]


def test_error_mode_refuses_the_fallback(fallback_mode, force_fallback):
    fallback_mode("error")
    x = torch.ones(3, device="accel")
    with pytest.raises(NotImplementedError, match=r"aten::hypot has no accel kernel.*ACCEL"):
        torch.hypot(x, x)
    x.fill_(3.0)  # native operators are unaffected
    fallback_mode("silent")
    assert_same(torch.hypot(x, x), torch.full((3,), 3.0).hypot(torch.full((3,), 3.0)))
    with pytest.raises(ValueError, match="'warn', 'silent' or 'error'"):
        torch_accel._C._set_fallback_mode("loud")


def test_deny_list_and_unsupported_tensors_are_clear_errors():
    # Sparse tensors are supported (test_sparse_tensors.py); quantized ones are not.
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported on accel"):
        torch.empty(2, dtype=torch.qint8, device="accel")
    with pytest.raises(NotImplementedError, match="quantized"):
        torch.quantize_per_tensor(torch.ones(2, device="accel"), 0.1, 0, torch.qint8)
    with pytest.raises(RuntimeError, match="only CPU tensors can be pinned"):
        torch.empty(2, device="accel", pin_memory=True)
    assert torch.accel.fallback_stats().get("aten::_to_sparse", 0) == 0


def test_two_devices_in_one_op_is_an_error_and_devices_stay_usable():
    a, b = torch.ones(3, device="accel:0"), torch.ones(3, device="accel:1")
    with pytest.raises(RuntimeError, match="at least two devices, accel:0 and accel:1"):
        a + b
    with pytest.raises(RuntimeError, match="at least two devices"):
        torch.cat([a, b])
    assert_same(a + a, torch.full((3,), 2.0))
    assert_same(b * 3, torch.full((3,), 3.0))
    # A CPU scalar tensor may be combined with accel tensors, as with CUDA.
    assert_same(a * torch.tensor(5.0), torch.full((3,), 5.0))


def test_fallback_refuses_cpu_tensors_that_are_not_scalars():
    # As on CUDA: no tier moves CPU tensor arguments (other than indices) to the device.
    torch.accel.reset_fallback_stats()
    x = torch.randn(4, 3, device="accel")
    msg = "accel:0 and cpu! .when running aten::_cdist_forward; CPU tensors combine"
    with pytest.raises(RuntimeError, match=msg):
        torch.cdist(x, torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="accel:0 and cpu! .when running aten::searchsorted"):
        torch.searchsorted(torch.arange(5.0, device="accel"), torch.tensor([1.5]))
    with pytest.raises(RuntimeError, match="accel:0 and cpu! .when running aten::cat"):
        torch.cat([x, torch.ones(1, 3)])
    with pytest.raises(RuntimeError, match="accel:0 and cpu! .when running aten::_index_put_impl_"):
        x[torch.tensor([1])] = torch.ones(3)  # the values must be on accel
    assert torch.accel.fallback_stats() == {}
    # CPU indices and 0-dim CPU tensors are accepted, as on CUDA; indices go to the device, so
    # indexing does not take the fallback.
    xc = x.cpu()
    assert_same(x[torch.tensor([2, 0])], xc[torch.tensor([2, 0])])
    x[torch.tensor([1])] = torch.tensor(7.0)
    x[torch.tensor([True, False, False, True])] = torch.ones(3, device="accel")
    x.index_put_((torch.tensor([0, 0]), torch.tensor([2, 2])), torch.tensor(0.5), accumulate=True)
    xc[torch.tensor([1])] = 7.0
    xc[torch.tensor([True, False, False, True])] = torch.ones(3)
    xc.index_put_((torch.tensor([0, 0]), torch.tensor([2, 2])), torch.tensor(0.5), accumulate=True)
    assert_same(x, xc)
    assert torch.accel.fallback_stats() == {}
    torch_accel._C._set_force_fallback(True)
    try:
        assert_same(torch.hypot(x, torch.tensor(2.0)), torch.hypot(xc, torch.tensor(2.0)))
    finally:
        torch_accel._C._set_force_fallback(False)
    assert torch.accel.fallback_stats().get("aten::hypot") == 1  # went through the fallback


def test_results_land_on_the_inputs_device():
    x = torch.arange(4.0, device="accel:1")
    y = torch.exp(x)
    assert y.device == torch.device("accel:1")
    assert torch.accel.current_device() == 0
    z = torch.zeros(3, device="accel:1")
    assert z.device == torch.device("accel:1")
    assert torch.arange(3, device="accel:1").device == torch.device("accel:1")


def test_fallback_results_of_a_python_scalar_first_stay_on_accel():
    x = torch.rand(2, 5) + 1
    acc = x.to("accel")
    r = 5.1 // acc  # floor_divide(wrapped 5.1, x): no accel kernel, first tensor is a CPU scalar
    assert r.device.type == "accel"
    assert_same(r, 5.1 // x)
    assert_same(
        torch.floor_divide(torch.tensor(7.0), acc), torch.floor_divide(torch.tensor(7.0), x)
    )
