"""The host executor's threads: which kernels of the underlying tier run on one thread and which
on the CPU's OpenMP threads, and how many OpenMP teams the process keeps
(csrc/aten/underlying_task.cpp, rt::give_back_openmp_team)."""

from __future__ import annotations

import os

import pytest
import torch

_PRODUCTS = r"""
import torch
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)

def r(*shape):
    return torch.randn(*shape, generator=g)

cases = {  # name: (operator, CPU arguments)
    "decoder step": (torch.addmm, (r(768), r(2, 256), r(256, 768))),
    "batched": (torch.bmm, (r(8, 2, 64), r(8, 64, 512))),
    "vector": (torch.mv, (r(768, 256), r(256))),
    "large weight": (torch.mm, (r(2, 1024), r(1024, 1024))),
    "many rows": (torch.mm, (r(64, 1024), r(1024, 1024))),
}
for name, (op, args) in cases.items():
    expected = op(*args)  # the CPU's own call first: one MKL line
    on_accel = [a.to("accel") for a in args]
    torch.accel.synchronize()
    got = [op(*on_accel) for _ in range(3)]  # the first on the caller, then two tasks
    for r in got:
        torch.testing.assert_close(r.cpu(), expected)
"""


def test_small_matrix_products_run_on_one_thread_and_large_ones_on_all(run_python) -> None:
    # Judged by multiply-adds and operand sizes, not by elements: a decoder's step multiplies two
    # rows by a weight of many elements. Its product on MKL's two threads took 68 us on the
    # stream worker here, 14 us on one, and HF generate() with GPT-2 ran 1.7x slower than the
    # CPU (csrc/aten/underlying_task.cpp, kSerialMacs). MKL_VERBOSE prints each call's threads.
    import torch_accel

    if torch_accel.executor()[0] != "host" or not torch.backends.mkl.is_available():
        pytest.skip("the rule is the host executor's, observed through MKL's verbose output")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: MKL runs every product on one thread")
    run = run_python(_PRODUCTS, MKL_VERBOSE="1")
    assert run.returncode == 0, run.stderr[-3000:]
    calls = [line for line in run.stdout.splitlines() if "NThr:" in line]
    # In order: per case the CPU's call, then accel's three (MKL's column-major names: the
    # result's columns first).
    signatures = {
        "decoder step": "SGEMM(N,N,768,2,256,",
        "batched": "SGEMM_BATCH(",
        "vector": "SGEMV(t,256,768,",
        "large weight": "SGEMM(N,N,1024,2,1024,",
        "many rows": "SGEMM(N,N,1024,64,1024,",
    }
    threads: dict[str, list[int]] = {}
    for line in calls:
        name = next((n for n, s in signatures.items() if s in line), None)
        assert name is not None, line
        threads.setdefault(name, []).append(int(line.rsplit("NThr:", 1)[1].split()[0]))
    assert {n: len(t) for n, t in threads.items()} == dict.fromkeys(signatures, 4), calls
    assert threads["many rows"] == [2, 2, 2, 2]  # the premise: MKL takes both threads
    for small in ("decoder step", "batched", "vector"):
        assert threads[small][1:] == [1, 1, 1], (small, threads)
    # Two rows, but a weight of 1M elements: one core's caches do not hold it.
    assert threads["large weight"][1:] == [2, 2, 2], threads


def test_kernels_above_atens_grain_size_split_their_work_as_the_cpus() -> None:
    # Kernels but matrix products run serially on the worker below ATen's grain size (32768
    # elements) and on its threads above it, as on the CPU: a sum then rounds as the CPU's does.
    # The limit was 512K elements for memory-bound kernels, which kept medium tensors on one
    # core (ConvNeXt-Atto's training step at 0.76x the CPU's) and rounded their sums as the CPU
    # on one thread (csrc/aten/underlying_task.cpp, kSerialNumel).
    import torch_accel

    if torch_accel.executor()[0] != "host":
        pytest.skip("the rule is the host executor's")
    if (os.cpu_count() or 1) < 2 or torch.get_num_threads() < 2:
        pytest.skip("one thread: every kernel runs serially")
    g = torch.Generator().manual_seed(0)
    split = 0  # sums whose value depends on the CPU's threads
    for n in (40_000, 100_000, 150_000, 300_000):
        for _ in range(4):
            x = torch.randn(n, generator=g)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                serial = x.sum()
            finally:
                torch.set_num_threads(threads)
            expected = x.sum()
            got = x.to("accel").sum().cpu()
            assert torch.equal(got, expected), (n, got.item(), expected.item(), serial.item())
            split += int(not torch.equal(serial, expected))
    assert split > 0  # the premise: some of these sums round differently on one thread


_TEAMS = r"""
import collections, json, os, time, torch
torch.set_num_threads(2)

def threads():  # by name: a thread's name is its creator's until it sets its own
    names = collections.Counter()
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/comm") as f:
            names[f.read().strip()] += 1
    return names

with open("/proc/self/comm") as f:
    caller = f.read().strip()
torch.ones(4, device="accel").sum().item()
seen = {"start": threads()}
a = torch.randn(2048, 2048, device="accel")
# First calls of their signatures, large enough for threads:
assert (a @ a).isfinite().all().item()
seen["first calls"] = threads()
b = a @ a  # a task of a good part of a second
seen["worker busy"] = threads()
torch.accel.synchronize()
time.sleep(0.5)
seen["worker idle"] = threads()
assert (torch.ones(1 << 22) * 2).sum().item() == 2 << 22  # the CPU: a team for this thread
seen["cpu work"] = threads()
(a * 3).sum().item()
seen["accel work"] = threads()
print(json.dumps({"caller": caller, "seen": seen}))
"""


def test_the_process_keeps_one_openmp_team_the_busy_stream_workers(run_python) -> None:
    # Each thread that runs an OpenMP region keeps a team, and beyond as many team threads as
    # cores libgomp stops letting them spin between regions: every region then waits for its
    # threads to wake (a 1x1 convolution on accel took 451 us with the caller's team, 146 us
    # without; ResNet-18 trained 0.68x as fast as the CPU). So the calls accel runs
    # synchronously run on the stream's worker too, a thread launching accel work gives its
    # idle team back, and so does a worker idle for 100 ms (rt::give_back_openmp_team).
    import json

    import torch_accel

    if torch_accel.executor()[0] != "host":
        pytest.skip("the host executor's threads")
    run = run_python(_TEAMS)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    caller, seen = out["caller"], out["seen"]
    worker = next(n for n in seen["start"] if n.startswith("accel-d0"))
    count = {stage: (names.get(caller, 0), names.get(worker, 0)) for stage, names in seen.items()}
    start_caller, start_worker = count["start"]
    # The first calls' kernels ran on the worker, whose team holds one more thread of its name
    # while it computes (the caller has none), and none once it has been idle a while.
    assert count["first calls"][0] == start_caller, count
    assert count["worker busy"] == (start_caller, start_worker + 1), count
    assert count["worker idle"] == (start_caller, start_worker), count
    # The CPU's own kernels on the caller: its team, until it launches accel work again.
    assert count["cpu work"] == (start_caller + 1, start_worker), count
    assert count["accel work"][0] == start_caller, count
