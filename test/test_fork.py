"""Fork safety: a child forked after the parent initialized accel gets a clear error."""

from __future__ import annotations

import multiprocessing as mp

import torch


def _child(queue) -> None:
    queue.put((torch.accel.is_initialized(), torch.accel._is_in_bad_fork()))
    try:
        torch.ones(2, device="accel")
        queue.put("no error")
    except RuntimeError as e:
        queue.put(str(e))
    try:
        torch.accel.init()
        queue.put("no error")
    except RuntimeError as e:
        queue.put(str(e))


def test_forked_child_cannot_use_accel_but_the_parent_can():
    torch.ones(1, device="accel").add_(1)  # the parent initializes accel
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    state = queue.get(timeout=120)
    op_error = queue.get(timeout=120)
    init_error = queue.get(timeout=120)
    child.join(timeout=120)
    assert child.exitcode == 0
    assert state == (False, True)
    for error in (op_error, init_error):  # the message torch.cuda gives, naming the fix
        assert "Cannot re-initialize accel in forked subprocess" in error
        assert "'spawn' start method" in error
    assert torch.accel.is_initialized() and not torch.accel._is_in_bad_fork()
    assert (torch.ones(3, device="accel") * 2).sum().item() == 6


def _spawn_child(queue) -> None:
    queue.put((torch.ones(4, device="accel") + 1).sum().item())


def test_spawned_child_can_use_accel():
    torch.ones(1, device="accel")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_spawn_child, args=(queue,))
    child.start()
    assert queue.get(timeout=300) == 8.0
    child.join(timeout=120)
    assert child.exitcode == 0


def test_counting_devices_starts_nothing_so_forked_children_can_use_accel(run_python):
    # torch.cuda.device_count() counts without initializing CUDA; so does accel's, so a process
    # may count devices (to size a worker pool, as torch.multiprocessing users do) and then
    # fork workers that use them.
    code = """
import os, torch, torch_accel
counts = (torch.accel.device_count(), torch.accelerator.device_count(), torch.accel.is_available(),
          torch.accelerator.is_available())
print(*counts, torch.accel.is_initialized(), torch_accel._C.is_initialized())
pid = os.fork()
if pid == 0:
    ok = (torch.ones(4, device="accel:1") * 3).sum().item() == 12
    os._exit(0 if ok and not torch.accel._is_in_bad_fork() else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), (torch.ones(2, device="accel") + 1).sum().item())
print(torch.accel.device_count(), torch_accel._C.is_initialized())
"""
    result = run_python(code, ACCEL_HOST_DEVICES="3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        *("3", "3", "True", "True", "False", "False"),
        *("0", "4.0"),
        *("3", "True"),
    ]


def test_seeding_starts_nothing_and_the_seeds_apply_when_accel_starts(run_python):
    # torch.cuda queues seeds until CUDA starts; so does accel: torch.manual_seed at the top of a
    # script must not start the device (DeviceMesh then sets each rank's device from LOCAL_RANK
    # only if it has not started; a child forked after the seed must be able to use accel).
    # What the queued seeds give is what the same seeds give after the start: the latest
    # manual_seed_all for every device, then the latest manual_seed for the device current at the
    # start, in the order they were made (torch.cuda's _LazySeedTracker).
    code = """
import os, torch, torch_accel
def draws():
    return [torch.rand(3, device=f"accel:{i}").tolist() for i in range(2)]
torch.manual_seed(7)
torch.accel.manual_seed(11)
torch.accel.manual_seed(12)
started = torch.accel.is_initialized() or torch_accel._C.is_initialized()
pid = os.fork()
if pid == 0:
    os._exit(0 if (torch.ones(4, device="accel") * 3).sum().item() == 12 else 1)
_, status = os.waitpid(pid, 0)
lazy = draws()
seeds = [g.initial_seed() for g in torch.accel.default_generators]
torch.manual_seed(7)
torch.accel.manual_seed(12)
print(started, os.waitstatus_to_exitcode(status), *seeds, lazy == draws())
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "0", "12", "7", "True"]


def test_a_queued_call_that_fails_names_where_it_was_made(run_python):
    code = """
import torch, torch_accel
def bad():
    raise ValueError("no such thing")
torch.accel._lazy_call(bad)
try:
    torch.ones(1, device="accel")
except torch.accel.DeferredAccelCallError as e:
    print("deferred", "no such thing" in str(e), "originally invoked at" in str(e))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["deferred", "True", "True"]


def test_a_count_the_runtime_refuses_reports_why(run_python):
    code = """
import torch, torch_accel
print(torch.accel.device_count(), torch.accel.is_available())
print(torch_accel.init_error())
"""
    result = run_python(code, ACCEL_HOST_DEVICES="banana")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "0 False"
    assert "ACCEL_HOST_DEVICES='banana' must be a whole number" in lines[1]
