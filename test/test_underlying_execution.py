"""The underlying tier's execution: ATen CPU kernels run as tasks on accel streams, so their
failures, waits for data and host-side checks behave as CUDA's kernels do (at the call, or at the
next synchronization), and operators that refuse other devices or convert numbers run as the
CPU's."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import assert_same, pending_behind_a_sleep, skip_unless_host_first_calls

LAUNCH_BLOCKING = os.environ.get("ACCEL_LAUNCH_BLOCKING") == "1"
A = torch.ops.aten


def test_asynchronous_kernel_failure_surfaces_at_synchronize_and_device_recovers() -> None:
    a = torch.randn(3, 4, device="accel")
    bad = torch.tensor([7], device="accel")
    # The index is only read by the kernel on the stream: the error comes at the next sync
    # (an AccelError), or at the call itself under ACCEL_LAUNCH_BLOCKING=1 (the CPU's IndexError).
    with pytest.raises((RuntimeError, IndexError), match="index out of range in self"):
        a.index_select(0, bad)
        torch.accel.synchronize()
    # Once the signature is known the call is asynchronous: the error at the sync names the
    # operator and carries no C++ backtrace. (Its first call runs the CPU's kernel on the caller,
    # the second waits for its task, the way later calls run.)
    for _ in range(2):
        a.index_select(0, torch.tensor([1], device="accel"))
    with pytest.raises((RuntimeError, IndexError), match="index out of range in self") as info:
        a.index_select(0, bad).cpu()
    if not LAUNCH_BLOCKING:
        assert "aten::index_select" in str(info.value)
    assert "Exception raised from" not in str(info.value)
    assert_same(a.index_select(0, torch.tensor([2, 0], device="accel")), a.cpu()[[2, 0]])
    with pytest.raises(RuntimeError, match="index 9 is out of bounds"):
        torch.zeros(4, device="accel").scatter_(0, torch.tensor([9], device="accel"), 1.0).cpu()
    assert_same(torch.ones(2, device="accel") * 3, torch.full((2,), 3.0))


def test_a_signatures_first_launch_waits_and_keeps_the_cpus_behaviour() -> None:
    # flip's first call runs the CPU's own kernel on the caller, which takes sub-byte dtypes;
    # later calls run flip into accel's results, whose copy refuses them ("copy_kernel" not
    # implemented for 'UInt1'): the second call failed as a task at the next synchronization.
    # The first launch of a signature now waits for its task, and an operator that writes no
    # argument keeps running the way its first call did.
    for dtype in (torch.uint1, torch.int3, torch.uint7):
        cpu = torch.arange(8, dtype=torch.uint8).view(dtype)[:6].view(3, 2)
        acc = cpu.to("accel")
        for _ in range(3):
            flipped = acc.flip(0)
            assert (
                flipped.cpu().view(torch.uint8).tolist() == cpu.flip(0).view(torch.uint8).tolist()
            )
        torch.accel.synchronize()  # nothing failed on the stream
    # index_select's first call of a signature runs into accel's results as later calls do
    # (its meta function is accel's: csrc/aten/meta_functions.cpp) and waits: an index out of
    # range raises at the call, with the CPU's type. Such an error is the call's own: its
    # signature's next call runs as any first call, and the one after takes the asynchronous
    # typed path.
    import torch_accel

    # (A family, float16 indexed by int32, no other test of the process runs: a family that ran
    # without an error takes new shapes asynchronously, whose errors come at the next
    # synchronization.)
    a = torch.randn(5, 4, device="accel", dtype=torch.float16)
    with pytest.raises(IndexError, match="index out of range in self"):
        a.index_select(0, torch.tensor([0, 9], device="accel", dtype=torch.int32))
    assert_same(
        a.index_select(0, torch.tensor([3, 1], device="accel", dtype=torch.int32)), a.cpu()[[3, 1]]
    )
    index = torch.tensor([4, 0], device="accel", dtype=torch.int32)
    before = torch_accel._C._typed_calls()
    picked = a.index_select(0, index)
    borrowed, boxed = (x - y for x, y in zip(torch_accel._C._typed_calls(), before, strict=True))
    assert (borrowed, boxed) == (1, 0)
    assert_same(picked, a.cpu()[[4, 0]])


def test_data_dependent_ops_wait_for_pending_work(no_fallback: None) -> None:
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        big = torch.randn(512, 512, device="accel")
        x = (big @ big).sum(1)  # queued work the data-dependent ops must wait for
        mask = x > 0
        nz = torch.nonzero(mask)
        sel = torch.masked_select(x, mask)
        uniq = torch.unique(torch.tensor([3, 1, 3, 2, 1], device="accel"))
        filtered = x[mask]
    xc = x.cpu()
    assert torch.equal(nz.cpu(), torch.nonzero(xc > 0))
    assert torch.equal(sel.cpu(), xc[xc > 0])
    assert torch.equal(filtered.cpu(), xc[xc > 0])
    assert torch.equal(uniq.cpu(), torch.tensor([1, 2, 3]))


def test_data_dependent_meta_errors_stay_out_of_python(no_fallback: None) -> None:
    # Under the Python dispatcher (make_fx, export, decomposition checks) a boolean index reaches
    # nonzero's Python meta function, which raises (data-dependent): accel drops that meta
    # computation and runs the CPU kernel, and the Python error must not stay set in the
    # interpreter (it surfaced as "SystemError: ... returned a result with an exception set", or
    # as the NotImplementedError at a later call). Shapes of their own, so the meta runs here.
    from torch._dispatch.python import enable_python_dispatcher

    x = torch.randn(13, 3, dtype=torch.float64)
    mask = torch.tensor([True, False, True] * 4 + [False])
    xa, ma = x.to("accel"), mask.to("accel")
    with enable_python_dispatcher():
        got = xa[ma]
        shape = got.shape  # the next lookup failed (AttributeError) while the error was set
    assert shape == (8, 3)
    assert torch.equal(got.cpu(), x[mask])


def test_data_checks_cuda_makes_on_the_host_raise_at_the_call(no_fallback: None) -> None:
    # segment_reduce (unsafe=False) checks that the lengths cover the data; CUDA reads them on
    # the host, so the error raises at the call, not at a later synchronization. Here too, even
    # queued behind other work, after a first call of the same signature (found by PyTorch's
    # test_segment_reductions.py).
    data = torch.arange(6.0, device="accel")
    first = torch.segment_reduce(data, "sum", lengths=torch.tensor([1, 2, 3], device="accel"))
    assert_same(first, torch.tensor([0.0, 3.0, 12.0]))
    short = torch.tensor([1, 2, 2], device="accel")
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        big = torch.randn(512, 512, device="accel")
        big.matmul(big)
        with pytest.raises(RuntimeError, match="Expected all rows of lengths along axis to sum"):
            torch.segment_reduce(data, "sum", lengths=short)
    s.synchronize()  # nothing left to raise
    assert_same(data + 1, torch.arange(1.0, 7.0))
    # linalg.eig refuses infs and NaNs after reading the input (test_linalg.py's
    # test_eig_with_nan); its results as the CPU's otherwise
    a = torch.randn(2, 5, 5, dtype=torch.float64)
    values, vectors = torch.linalg.eig(a.to("accel"))
    expected_values, expected_vectors = torch.linalg.eig(a)
    assert_same(values, expected_values)
    assert_same(vectors, expected_vectors)
    with torch.accel.stream(s):
        big.matmul(big)
        for bad in (float("inf"), float("nan")):
            a[1, -1, -1] = bad
            with pytest.raises(RuntimeError, match="input tensor should not contain infs or NaNs"):
                torch.linalg.eig(a.to("accel"))
    s.synchronize()


def test_numbers_kernels_cannot_convert_raise_at_the_call(no_fallback: None) -> None:
    # A float beyond float32's range, or a complex number for real tensors: the kernels refuse
    # to convert it on the host (CUDA's raise at the call), so accel raises at the call too,
    # also for a signature already seen, queued behind other work (PyTorch's test_foreach.py).
    a = torch.ones(3, dtype=torch.float16, device="accel")
    b = torch.zeros(3, dtype=torch.float16, device="accel")
    assert_same(torch.lerp(a, b, 0.25), torch.full((3,), 0.75, dtype=torch.float16))
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        big = torch.randn(512, 512, device="accel")
        big.matmul(big)
        for weight in (1e100, 0.5 + 0.25j):
            with pytest.raises(RuntimeError, match="cannot be converted to type float"):
                torch.lerp(a, b, weight)
            with pytest.raises(RuntimeError, match="cannot be converted to type float"):
                torch._foreach_lerp([a], [b], weight)
        with pytest.raises(RuntimeError, match="cannot be converted to type float"):
            torch.clamp(a.float(), min=-1e100)
    s.synchronize()  # nothing left to raise
    assert_same(torch.lerp(a, b, 0.5), torch.full((3,), 0.5, dtype=torch.float16))
    for x in (torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.complex64)):
        # where the number fits: computed, as on the CPU
        w = 1e100 if x.dtype == torch.float64 else 0.5 + 0.25j
        assert_same(
            torch.lerp(x.to("accel"), torch.zeros_like(x, device="accel"), w),
            torch.lerp(x, torch.zeros_like(x), w),
        )


def test_explicit_composites_that_refuse_other_devices_run_the_cpus(no_fallback: None) -> None:
    # torch.mode(out=) is an explicit composite whose device check takes CPU, CUDA and XPU only
    # (found by PyTorch's test_reductions.py): the CPU's runs on accel memory instead.
    x = torch.randint(0, 3, (4, 7), generator=torch.Generator().manual_seed(0)).float()
    values = torch.empty(0, device="accel")
    indices = torch.empty(0, dtype=torch.long, device="accel")
    r = torch.mode(x.to("accel"), 1, out=(values, indices))
    assert r.values is values and r.indices is indices
    expected = torch.mode(x, 1)
    assert_same(values, expected.values)
    assert_same(indices, expected.indices)
    # conj_physical_ calls the unary kernel's dispatch stub for the tensor's device, which
    # has none for accel ("DispatchStub: missing kernel for accel", an internal assert; found by
    # test_ops_gradients.py): in place on accel memory, like the CPU's
    z = torch.randn(5, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    za = z.to("accel")
    assert za.conj_physical_() is za
    assert_same(za, z.conj_physical())
    grads = []
    for t in (z, z.to("accel")):
        leaf = (t * 1j).requires_grad_()
        (leaf.clone().conj_physical_() * torch.arange(5.0, device=t.device)).real.sum().backward()
        grads.append(leaf.grad)
    assert_same(grads[1], grads[0])
    # the functional form stays PyTorch's composite (an alias of a real tensor, differentiable)
    real = torch.ones(3, device="accel", requires_grad=True)
    torch.conj_physical(real).mul(torch.arange(3.0, device="accel")).sum().backward()
    assert_same(real.grad, torch.arange(3.0))


def test_kernels_run_in_stream_order_and_asynchronously() -> None:
    s1, s2 = torch.accel.Stream(), torch.accel.Stream()
    big = torch.randn(1024, 1024, device="accel")
    # The first call of a signature runs on the caller (it records the result metadata);
    # later ones are enqueued.
    with torch.accel.stream(s1):
        (big @ big).mul_(0.5).add_(1.0)
    torch.accel.synchronize()
    with torch.accel.stream(s1):
        y = big @ big  # long enough to still be running below
        running = not s1.query()
        y.mul_(0.5).add_(1.0)  # queued after the product, never before it
        done = torch.accel.Event()
        done.record(s1)
    with torch.accel.stream(s2):
        s2.wait_event(done)
        z = y.sum(0)  # reads y only after s1's work
    if not LAUNCH_BLOCKING:
        assert running  # the call returned before the kernel finished
    expected_y = (big.cpu() @ big.cpu()) * 0.5 + 1.0
    s2.synchronize()
    torch.testing.assert_close(z.cpu(), expected_y.sum(0), rtol=1e-4, atol=1e-2)
    torch.testing.assert_close(y.cpu(), expected_y, rtol=1e-4, atol=1e-3)


def test_later_writes_do_not_overtake_earlier_reads() -> None:
    x = torch.ones(256, 256, device="accel")
    w = torch.randn(256, 256, device="accel")
    reads = [(x @ w).sum() for _ in range(3)]  # each reads x before the write below
    x.zero_()
    total = sum(r.item() for r in reads)
    expected = 3 * (torch.ones(256, 256) @ w.cpu()).sum().item()
    assert total == pytest.approx(expected, rel=1e-4)
    assert x.abs().sum().item() == 0


def test_cpu_arguments_are_read_when_the_call_is_made() -> None:
    # Like a CUDA launch: the CPU scalar is captured at the call, later changes do not leak in.
    host = torch.tensor(2.0)
    a = torch.ones(3, device="accel")
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        torch.randn(512, 512, device="accel").matmul(torch.randn(512, 512, device="accel"))
        r = a * host
    host.fill_(100.0)
    s.synchronize()
    assert_same(r, torch.full((3,), 2.0))


def test_python_numbers_keep_their_weak_type_on_0_dim_tensors(no_fallback: None) -> None:
    # A Python number promotes more weakly than a 0-dim tensor: float32 0-dim + 0.37 computes in
    # float32 on the CPU, float32 0-dim + a float64 0-dim tensor in float64. Queued behind other
    # work, the call's task keeps its own copy of the number, which must stay a wrapped number
    # (PyTorch's test_scatter_gather_ops.py found accel computing the first in float64 there:
    # results one ulp off in about a fifth of the elements).
    x = torch.randn(50, generator=torch.Generator().manual_seed(0))
    ops = [
        lambda t: t + 0.37,
        lambda t: t * 0.37,
        lambda t: t / 0.37,
        lambda t: t.sub_(0.37),
        lambda t: t + torch.tensor(0.37, dtype=torch.float64),  # a tensor: computes in float64
    ]
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        acc = x.to("accel")
        big = torch.randn(1024, 1024, device="accel")
        big.matmul(big)  # what follows waits behind it, as tasks
        got = [[op(acc[i].clone()) for op in ops] for i in range(len(x))]
    s.synchronize()
    for i in range(len(x)):
        for op, r in zip(ops, got[i], strict=True):
            assert_same(r, op(x[i].clone()))
    narrowed = [(x[i] + 0.37).item() != (x[i].double() + 0.37).float().item() for i in range(50)]
    assert any(narrowed)  # the float32 and float64 computations do differ for these elements


def test_first_calls_of_structured_operators_compute_into_accel_memory(no_fallback: None) -> None:
    # The first call of a signature whose C++ meta function is the CPU kernel's own (structured
    # kernels) runs as later calls do, into results allocated in accel memory: no CPU result
    # copied in afterwards (a "Memcpy HtoD" event), which doubled the memory traffic of large
    # first calls (a training step with a new sequence length at each step ran 0.88x to 0.91x
    # the CPU's speed, benchmarks/models.py). Its results are the CPU's, bit for bit, and so are
    # those of the later calls, which it sized.
    from torch.profiler import ProfilerActivity, profile

    skip_unless_host_first_calls()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 300, generator=g)
    on = x.to("accel")
    for n in (997, 998, 997):  # two first calls, then a cached one
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            got = [on[:n] * 2 + 1, torch.log_softmax(on[:n], 1), on[:n].sum(0)]
            torch.accel.synchronize()
        expected = [x[:n] * 2 + 1, torch.log_softmax(x[:n], 1), x[:n].sum(0)]
        for a, e in zip(got, expected, strict=True):
            assert_same(a, e)
            assert torch.equal(a.cpu(), e)
        device_events = [
            e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1
        ]
        assert not [name for name in device_events if "Memcpy" in name], device_events
        for op in ("aten::mul.Tensor", "aten::_log_softmax", "aten::sum.dim_IntList"):
            assert op in device_events, (op, device_events)


def test_first_call_errors_of_structured_kernels_raise_at_the_call(no_fallback: None) -> None:
    # A structured kernel's first call waits for its task: an error its kernel finds (gather's
    # index bounds, read from the data) raises at the call with the CPU's type and message, the
    # signature is not cached (its next call is a first call again), and the device stays usable.
    # Once a call of its family (the same arguments but for their shapes) ran without an error,
    # new shapes run asynchronously: such an error then comes at the next synchronization, as
    # a CUDA kernel's does. Another dtype is another family. The families are of dtypes no other
    # test gathers (int16, int8): a float32 gather elsewhere in the process (graph networks) made
    # the first call here a new shape of a family that had run.
    x = torch.randint(-100, 100, (4, 3), dtype=torch.int16)
    on = x.to("accel")
    bad = torch.tensor([[5, 0, 1]], device="accel")
    for _ in range(2):
        with pytest.raises(
            RuntimeError, match="index 5 is out of bounds for dimension 0 with size 4"
        ):
            torch.gather(on, 0, bad)  # no synchronization: raised by the call itself
    index = torch.tensor([[3, 0, 1]])
    assert_same(torch.gather(on, 0, index.to("accel")), torch.gather(x, 0, index))
    assert_same(on * 3, x * 3)
    wide = torch.tensor([[1, 0, 2], [5, 1, 0]], device="accel")  # a new shape, a bad index
    if not LAUNCH_BLOCKING:
        result = torch.gather(on, 0, wide)  # the family ran: no wait, no error yet
        with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0"):
            result.cpu()
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0 with size 4"):
        torch.gather(on.to(torch.int8), 0, wide)  # int8: a family of its own, at the call
    assert_same(torch.gather(on, 0, wide.clamp(max=3)), torch.gather(x, 0, wide.cpu().clamp(max=3)))


def test_new_shapes_of_a_structured_kernel_run_asynchronously_once_its_family_ran() -> None:
    # Dynamic shapes (batches padded to their longest sequence, a growing KV cache) make most
    # calls the first of their shapes. A structured kernel's results are known from its meta
    # function, and what its kernel checks beyond it depends on the data: once a call of the
    # family ran at the call, later first calls need not wait for their kernel.
    skip_unless_host_first_calls()
    big = torch.randn(1024, 1024, device="accel")
    expected = big.cpu()[:1000] @ big.cpu()
    assert_same(big[:1000] @ big, expected)  # the family's first call: waited for
    s = torch.accel.Stream()
    with torch.accel.stream(s):
        y = big[:999] @ big  # a new shape of that family: long enough to still be running
        running = not s.query()
    if not LAUNCH_BLOCKING:
        assert running  # the call returned before its kernel finished
    s.synchronize()
    assert_same(y, big.cpu()[:999] @ big.cpu())


def test_out_calls_run_as_the_functional_forms_first_calls_do(no_fallback: None) -> None:
    # out= calls whose out= tensors are empty or of the result's size (the CPU kernel resizes
    # those without a warning): the first call of a family waits for its task, raising its
    # errors at the call, and the out= tensor resized or not as the CPU's call leaves it; new
    # shapes of the family do not wait. mul_ of a Scalar is such a call (mul.out into self):
    # dropout of a strided input waited for the stream at every new shape.
    skip_unless_host_first_calls()
    x = torch.randint(-9, 9, (4, 3), dtype=torch.int8)  # int8: families no other test ran
    on = x.to("accel")
    bad = torch.tensor([[5, 0, 1]])
    for device in ("cpu", "accel"):
        out = torch.empty(0, dtype=torch.int8, device=device)
        with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0"):
            torch.gather(x.to(device), 0, bad.to(device), out=out)  # raised by the call
        assert out.shape == (1, 3)  # the meta function resized it, then the kernel raised
    out = torch.empty(0, dtype=torch.int8, device="accel")
    index = torch.tensor([[3, 0, 1]])
    assert torch.gather(on, 0, index.to("accel"), out=out) is out
    assert_same(out, torch.gather(x, 0, index))
    for args, kwargs in (
        ((on, on), {"out": torch.empty(0, dtype=torch.bool, device="accel")}),
        ((on, on[:2]), {"out": torch.empty(0, dtype=torch.int8, device="accel")}),
    ):
        cpu_args = [a.cpu() for a in args]
        cpu_out = torch.empty(0, dtype=kwargs["out"].dtype)
        with pytest.raises(RuntimeError) as cpu:
            torch.mul(*cpu_args, out=cpu_out)
        with pytest.raises(RuntimeError) as accel:
            torch.mul(*args, **kwargs)
        assert str(cpu.value) == str(accel.value)
        assert kwargs["out"].shape == cpu_out.shape == (0,)  # the meta function raised
    # An out= tensor with elements of another count: the CPU kernel's warning and resize.
    for device in ("cpu", "accel"):
        out = torch.zeros(5, dtype=torch.int8, device=device)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            torch.mul(x.to(device), 3, out=out)
        assert torch.equal(out.cpu(), x * 3)
    # New shapes of families that ran do not wait.
    for n in (30, 31):  # the families' first calls (a float16 mul.out, a mul_ of a Scalar)
        a = torch.randn(2, n, 8, dtype=torch.float16, device="accel")
        torch.mul(a, a, out=torch.empty(0, dtype=torch.float16, device="accel"))
        A.mul_.Scalar(a.transpose(0, 1), 1.25)
    lengths = iter(range(32, 60))
    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def prepare() -> None:
        a = torch.randn(2, next(lengths), 8, dtype=torch.float16)
        calls.append((a, a.to("accel"), torch.empty(0, dtype=torch.float16, device="accel")))

    def enqueue() -> None:
        _, a, out = calls[-1]
        torch.mul(a, a, out=out)
        A.mul_.Scalar(a.transpose(0, 1), 1.25)

    pending, _ = pending_behind_a_sleep(
        enqueue, lambda: torch.accel.current_stream().query(), prepare=prepare
    )
    if not LAUNCH_BLOCKING:
        assert pending
    a, on_a, out = calls[-1]
    assert_same(out, a * a)
    assert_same(on_a, a * 1.25)


def test_structured_operators_pytorch_lists_run_as_the_yamls_do() -> None:
    # Operators the yaml does not list (isin, upsampling, special functions) get their C++ meta
    # function as listed ones do: a new shape of a known family does not wait. generate()'s
    # stopping check (isin of the last token of ids whose row stride grows every step) waited
    # for the stream at every step.
    skip_unless_host_first_calls()
    eos = torch.tensor([2, 7], device="accel")

    def last_token(length: int) -> torch.Tensor:  # its row stride is new: a new signature
        return (torch.arange(length, device="accel") % 9).view(1, length)[:, -1:]

    first = last_token(20)
    assert_same(torch.isin(first, eos), torch.isin(first.cpu(), eos.cpu()))  # the family's first
    tokens = iter([last_token(n) for n in range(21, 30)])  # made before the sleeps
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def enqueue() -> None:
        last = next(tokens)
        calls.append((torch.isin(last, eos), last))

    pending, _ = pending_behind_a_sleep(enqueue, lambda: torch.accel.current_stream().query())
    if not LAUNCH_BLOCKING:
        assert pending
    for result, last in calls:
        assert_same(result, torch.isin(last.cpu(), eos.cpu()))


def test_a_signatures_second_call_waits_only_where_it_runs_another_kernel() -> None:
    # group_norm's CPU kernel has no structured meta function: the first call of a signature
    # runs on the caller. Later calls run the same kernel as a task and copy its results as the
    # first call did, so the second (a network's second layer at the first's new size) does not
    # wait; flip, whose task writes into the results, does (see above).
    skip_unless_host_first_calls()
    norm = torch.nn.functional.group_norm
    lengths = iter(range(37, 64))
    calls: list[tuple[torch.Tensor, ...]] = []

    def prepare() -> None:  # a new signature's first call
        x = torch.randn(2, 6, next(lengths), device="accel")
        assert_same(norm(x, 3), norm(x.cpu(), 3))
        calls.append((x,))

    def enqueue() -> None:  # its second call
        calls[-1] = (norm(calls[-1][0], 3), calls[-1][0])

    pending, _ = pending_behind_a_sleep(
        enqueue, lambda: torch.accel.current_stream().query(), prepare=prepare
    )
    if not LAUNCH_BLOCKING:
        assert pending
    result, x = calls[-1]
    assert_same(result, norm(x.cpu(), 3))


def test_attention_at_a_new_sequence_length_does_not_wait() -> None:
    # The CPU's flash attention and its backward have accel's C++ meta functions (yaml `meta`):
    # a decoder's step at a new length (a growing KV cache) ran the kernel on the caller and
    # waited for the stream, and so did training with batches padded to new lengths.
    skip_unless_host_first_calls()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(2, 4, 1, 32, device="accel")
    cache = torch.randn(2, 2, 64, 32, device="accel")
    assert_same(
        sdpa(q, cache[:, :, :20], cache[:, :, :20], enable_gqa=True),
        sdpa(q.cpu(), cache.cpu()[:, :, :20], cache.cpu()[:, :, :20], enable_gqa=True),
    )
    lengths = iter(range(21, 64))
    calls: list[tuple[torch.Tensor, int]] = []

    def enqueue() -> None:  # a length no call used
        n = next(lengths)
        calls.append((sdpa(q, cache[:, :, :n], cache[:, :, :n], enable_gqa=True), n))

    pending, _ = pending_behind_a_sleep(enqueue, lambda: torch.accel.current_stream().query())
    if not LAUNCH_BLOCKING:
        assert pending
    for got, n in calls:
        kv = cache.cpu()[:, :, :n]
        assert_same(got, sdpa(q.cpu(), kv, kv, enable_gqa=True))
    # The backward at new lengths, against the CPU's.
    for n in (30, 41):
        qkv = [torch.randn(2, 4, n, 32, requires_grad=True) for _ in range(3)]
        acc = [t.detach().to("accel").requires_grad_() for t in qkv]
        sdpa(*qkv, is_causal=True).sum().backward()
        sdpa(*acc, is_causal=True).sum().backward()
        for a, c in zip(acc, qkv, strict=True):
            assert a.grad.stride() == c.grad.stride()
            torch.testing.assert_close(a.grad.cpu(), c.grad, rtol=0, atol=0)


def test_kernels_that_conjugate_their_output_lazily_give_the_cpus_values() -> None:
    # linalg_lu_solve with left=False solves the adjoint system and returns its result with the
    # conjugate bit set. Run into accel memory (later calls, out= tensors), the bit went to the
    # CPU view the kernel wrote, not to the accel tensor: the result read as its conjugate.
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex128, generator=gen)
    b = torch.randn(4, 3, dtype=torch.complex128, generator=gen)
    lu, pivots = torch.linalg.lu_factor(a)
    args = (lu.to("accel"), pivots.to("accel"), b.to("accel"))
    for adjoint in (True, False):
        expected = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint)
        assert expected.is_conj()  # the CPU's own result is a conjugate view
        for _ in range(3):  # the first call of the signature, its first launch, a later call
            got = torch.linalg.lu_solve(*args, left=False, adjoint=adjoint)
            torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=1e-12)
        for out in (torch.empty(4, 3, dtype=b.dtype), torch.empty(0, dtype=b.dtype)):
            out = out.to("accel")
            torch.linalg.lu_solve(*args, left=False, adjoint=adjoint, out=out)
            torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=1e-12)


def test_a_structured_kernel_whose_meta_is_not_its_final_shape_runs_as_the_cpus() -> None:
    # isin of a Scalar: its C++ meta function gives [0] and its kernel resizes the result to [].
    # The first call's task refused the prediction (a bug of accel, it said); the CPU's own
    # kernel now decides, and later calls allocate what it returned, without its out= form's
    # resize warnings.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (9, 10, 11):  # new shapes of the family
            test = torch.arange(n) * 3
            for element in (5, 3, 21, 30):
                assert_same(torch.isin(element, test.to("accel")), torch.isin(element, test))
        torch.accel.synchronize()
