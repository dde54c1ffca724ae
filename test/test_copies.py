"""Copies: host<->accel, within and across accel devices, dtypes, layouts, broadcasting."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same, same_storage


def test_round_trip_every_dtype():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                  torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                  torch.complex64, torch.complex128):  # fmt: skip
        cpu = torch.arange(24).reshape(4, 6).to(dtype)
        acc = cpu.to("accel")
        assert acc.dtype == dtype and acc.device == torch.device("accel:0")
        assert torch.equal(acc.cpu(), cpu), dtype


def test_dtype_conversion_in_every_direction():
    cpu = torch.linspace(-3, 3, 50)
    assert_same(cpu.to("accel", torch.float64), cpu.double())
    acc = cpu.to("accel")
    assert torch.equal(acc.to("cpu", torch.int32), cpu.int())
    assert_same(acc.to(torch.bfloat16), cpu.bfloat16())
    out = torch.empty(50, dtype=torch.float16, device="accel:1")
    out.copy_(acc)
    assert_same(out, cpu.half())


def test_non_contiguous_sources_and_destinations():
    cpu = torch.arange(60.0).reshape(3, 4, 5)
    acc = cpu.to("accel")
    assert_same(acc.permute(2, 0, 1).contiguous(), cpu.permute(2, 0, 1).contiguous())
    assert torch.equal(acc[:, 1:3, ::2].cpu(), cpu[:, 1:3, ::2])
    # Strided destination on accel, from the host and from accel.
    dst = torch.zeros(3, 4, 5, device="accel")
    dst[:, ::2, 1:].copy_(cpu[:, ::2, 1:] + 100)
    expected = torch.zeros(3, 4, 5)
    expected[:, ::2, 1:] = cpu[:, ::2, 1:] + 100
    assert_same(dst, expected)
    dst2 = torch.zeros(5, 3, 4, device="accel")
    dst2.copy_(acc.permute(2, 0, 1))
    assert_same(dst2, cpu.permute(2, 0, 1).contiguous())
    # Strided destination on the host.
    host = torch.zeros(4, 3, 5)
    host.transpose(0, 1).copy_(acc)
    assert torch.equal(host, cpu.transpose(0, 1))


def test_broadcasting_copy_and_scalar_sources():
    dst = torch.empty(4, 3, device="accel")
    dst.copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert_same(dst, torch.tensor([1.0, 2.0, 3.0]).expand(4, 3).contiguous())
    dst.copy_(torch.tensor(7.0))
    assert_same(dst, torch.full((4, 3), 7.0))
    dst.copy_(torch.tensor([[5.0], [6.0], [7.0], [8.0]], device="accel"))
    assert_same(dst, torch.tensor([[5.0], [6.0], [7.0], [8.0]]).expand(4, 3).contiguous())
    # Sources that do not broadcast are refused with the CPU's messages, also into an empty
    # destination (which has nothing to write).
    for shape, source in (((4, 3), torch.ones(5)), ((0,), torch.ones(5)), ((1,), torch.ones(5))):
        with pytest.raises(RuntimeError) as expected:
            torch.empty(shape).copy_(source)
        with pytest.raises(RuntimeError) as actual:
            torch.empty(shape, device="accel").copy_(source.to("accel"))
        assert str(actual.value) == str(expected.value)


def test_copies_between_devices():
    cpu = torch.randn(1000)
    a0 = cpu.to("accel:0")
    a1 = a0.to("accel:1")
    assert a1.device == torch.device("accel:1")
    assert not same_storage(a0, a1)
    assert torch.equal(a1.cpu(), cpu)
    b0 = torch.empty(500, device="accel:0")
    b0.copy_(a1[::2])
    assert torch.equal(b0.cpu(), cpu[::2])
    half = a1.to("accel:0", torch.float16)
    assert torch.equal(half.cpu(), cpu.half())


def test_same_device_copy_is_a_new_buffer():
    a = torch.arange(10.0, device="accel")
    b = a.clone()
    assert not same_storage(a, b)
    b.add_(1)
    assert_same(a, torch.arange(10.0))
    c = torch.empty_like(a)
    c.copy_(a)
    assert_same(c, torch.arange(10.0))


def test_conjugate_and_negative_views_are_materialized():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    za = z.to("accel")
    assert torch.equal(za.conj().cpu(), z.conj())
    out = torch.empty(2, dtype=torch.complex64, device="accel")
    out.copy_(za.conj())
    assert_same(out, z.conj().resolve_conj())
    neg = torch._neg_view(za)
    assert torch.equal(neg.cpu(), -z)


def test_zero_size_and_storage_copies():
    e = torch.empty(0, 3).to("accel")
    assert e.shape == (0, 3) and e.cpu().shape == (0, 3)
    s = torch.UntypedStorage(16)
    s.fill_(7)
    sa = s.accel(1)
    assert sa.device == torch.device("accel:1")
    assert bytes(sa.cpu()) == bytes(s)


def test_internal_overlap_is_refused():
    dst = torch.zeros(1, device="accel").expand(4)
    with pytest.raises(RuntimeError, match="more than one element"):
        dst.copy_(torch.arange(4.0))


def test_foreach_copy_between_devices_copies_each_tensor_like_cuda():
    """_foreach_copy_ of lists on several devices copies tensor by tensor, as CUDA's kernel does
    (tensordict's updates, FSDP2's copy-out and EMA weights take it); the CPU's kernel, which
    accel runs for lists on one device, takes one device."""
    torch.manual_seed(0)
    shapes = [(3,), (2, 5), (4, 1, 2), ()]
    src = [torch.randn(s) for s in shapes]
    cases = [
        ([torch.zeros(s) for s in shapes], [t.to("accel") for t in src]),  # accel -> CPU
        ([torch.zeros(s, device="accel") for s in shapes], src),  # CPU -> accel
        ([torch.zeros(s, device="accel:0") for s in shapes], [t.to("accel:1") for t in src]),
        # mixed: some sources on the CPU, some on accel:1, into accel:0 (float64 to float32)
        (
            [torch.zeros(s, device="accel:0") for s in shapes],
            [t.double().to("accel:1" if i % 2 else "cpu") for i, t in enumerate(src)],
        ),
        ([torch.zeros(s, device="accel") for s in shapes], [t.to("accel") for t in src]),
    ]
    for dst, sources in cases:
        before = [d.device for d in dst]
        torch._foreach_copy_(dst, sources)
        assert [d.device for d in dst] == before
        for d, s in zip(dst, src, strict=True):
            torch.testing.assert_close(d.cpu(), s, rtol=0, atol=0)
    pinned = [t.pin_memory() for t in src]
    dst = [torch.zeros(s, device="accel") for s in shapes]
    torch._foreach_copy_(dst, pinned, non_blocking=True)
    torch.accel.synchronize()
    for d, s in zip(dst, src, strict=True):
        assert_same(d, s)
    with pytest.raises(RuntimeError, match="same number of tensors, got 2 and 1"):
        torch._foreach_copy_([torch.zeros(1), torch.zeros(1)], [torch.ones(1, device="accel")])
    with pytest.raises(RuntimeError, match="same number of tensors, got 2 and 1"):
        torch._foreach_copy_([torch.zeros(1, device="accel")] * 2, [torch.ones(1, device="accel")])


def test_foreach_lists_on_several_devices_run_tensor_by_tensor_like_cuda():
    """_foreach_ lists whose tensors sit on several devices (each index on one device) run each
    tensor's operator on its own device, as CUDA's kernels do on their slow path (PyTorch's
    test_foreach.py checks this for CUDA only: *_tensors_on_different_devices)."""
    torch.manual_seed(0)
    devices = ["accel:0", "cpu", "accel:1"]
    a = [torch.randn(4, 3) for _ in devices]
    b = [torch.randn(4, 3) for _ in devices]
    c = [torch.rand(4, 3) + 0.5 for _ in devices]

    def on(ts):
        return [t.to(d, copy=True) for t, d in zip(ts, devices, strict=True)]

    results = torch._foreach_add(on(a), on(b), alpha=2.0)
    for r, x, y, d in zip(results, a, b, devices, strict=True):
        assert r.device == torch.device(d)
        torch.testing.assert_close(r.cpu(), x + 2.0 * y, rtol=0, atol=0)
    written = on(a)
    torch._foreach_addcdiv_(written, on(b), on(c), value=0.5)
    for w, x, y, z in zip(written, a, b, c, strict=True):
        torch.testing.assert_close(w.cpu(), torch.addcdiv(x, y, z, value=0.5), rtol=0, atol=0)
    written = on(a)
    torch._foreach_mul_(written, [2.0, 3.0, 4.0])
    for w, x, k in zip(written, a, [2.0, 3.0, 4.0], strict=True):
        torch.testing.assert_close(w.cpu(), x * k, rtol=0, atol=0)
    norms = torch._foreach_norm(on(a))
    assert [n.device for n in norms] == [torch.device(d) for d in devices]
    for n, x in zip(norms, a, strict=True):
        torch.testing.assert_close(n.cpu(), torch.linalg.vector_norm(x))
    # an index whose tensors are on two devices is refused as the operator alone refuses it
    with pytest.raises(RuntimeError, match="same device.*accel:0 and cpu"):
        torch._foreach_add([torch.ones(3, device="accel"), torch.ones(2)], [torch.ones(3)] * 2)


_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
EVERY_DTYPE = sorted(
    {d for d in vars(torch).values() if isinstance(d, torch.dtype)} - _QUANTIZED, key=str
)


def _outcome(f, *args):
    """What f(*args) gives: ("ok", the result's bytes) or (the error's type, its message)."""
    try:
        t = f(*args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return type(e), str(e).split("\n")[0]
    return "ok", bytes(t.cpu().contiguous().view(torch.uint8).view(-1))


def _zeros(dtype, *shape):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.zeros(16 * itemsize, dtype=torch.uint8).view(dtype)[:16].view(*shape)


def test_unsupported_conversions_raise_at_the_call_like_the_cpu():
    # The CPU's copy kernel refuses some dtypes (the bit and sub-byte ones, float4): CUDA checks
    # this on the host before it launches a kernel, so accel, whose kernels are the CPU's and
    # run later on the stream's worker, checks at the call too: the CPU's error type and message
    # there, not a failed task at the next synchronization.
    refused = 0
    for src in EVERY_DTYPE:
        cpu = _zeros(src, 4, 4)
        acc = cpu.to("accel")
        for dst in EVERY_DTYPE:
            want = _outcome(cpu.to, dst)
            assert _outcome(acc.to, dst) == want, (src, dst)
            refused += want[0] != "ok"
        # The same dtype in another layout runs the kernel too (no memcpy).
        assert _outcome(acc.t().contiguous) == _outcome(cpu.t().contiguous)
    assert refused > 100  # (the CPU refuses 460 pairs in torch 2.11)
    torch.accel.synchronize()  # nothing failed later on the stream
    pinned = torch.zeros(4, 4).pin_memory()  # a non-blocking upload converts on the device
    with pytest.raises(NotImplementedError, match="not implemented for 'UInt1'"):
        torch.empty(4, 4, dtype=torch.uint1, device="accel").copy_(pinned, non_blocking=True)
    torch.accel.synchronize()


@pytest.mark.parametrize("value", [1, -1, 300, 1.5, 1e300, float("-inf"), 1 + 1j, True])
def test_fill_checks_its_dtype_and_value_at_the_call_like_the_cpu(value):
    for dtype in EVERY_DTYPE:
        want = _outcome(torch.empty(3, dtype=dtype).fill_, value)
        for _ in range(2):  # the second time, a value checked before
            acc = torch.empty(3, dtype=dtype, device="accel")
            assert _outcome(acc.fill_, value) == want, dtype
    torch.accel.synchronize()
