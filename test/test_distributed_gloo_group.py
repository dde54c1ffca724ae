"""Accel tensors in a process group created with backend "gloo" alone: accl joins the group at
its first collective on accel tensors (csrc/distributed/gloo_groups.h), so every collective the
accl tests run works there too. Ranks are spawned as in test_distributed.py, whose helpers and
workers these tests reuse."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import BackendConfig

import torch_accel
from torch_accel import distributed as accel_dist

pytestmark = [
    pytest.mark.skipif(not accel_dist.is_available(), reason="no Gloo in this torch"),
    pytest.mark.skipif(
        torch_accel.is_available() and torch_accel.driver() == "cuda",
        reason="two ranks share accel:0, which NCCL refuses",
    ),
]

from test_distributed import _collectives, ref, run_ranks  # noqa: E402
from test_distributed_training import _dtensor, run_ddp_example  # noqa: E402

TIMEOUT_S = 17.0


def _gloo_alone(rank: int, world: int) -> None:
    dev = torch.device("accel", 0)
    world_group = dist.group.WORLD
    assert dist.get_backend() == "gloo"
    # What reaches the group's backend without an operator sees PyTorch's error until the
    # first collective on accel tensors.
    with pytest.raises(RuntimeError, match="No backend type associated with device type accel"):
        world_group._get_backend(dev)

    t = ref(rank).to(dev)
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), torch.stack([ref(r) for r in range(world)]).sum(0))
    inner = accel_dist.inner_backend()
    assert isinstance(inner, dist.ProcessGroupGloo)
    assert inner.options._timeout == timedelta(seconds=TIMEOUT_S)  # the group's own timeout
    assert dist.get_backend() == "gloo"

    # CPU tensors still go to the group's Gloo, accel tensors to accl: every collective.
    c = ref(rank)
    dist.all_reduce(c)
    torch.testing.assert_close(c, torch.stack([ref(r) for r in range(world)]).sum(0))
    _collectives(rank, world)

    # A subgroup gets its own accl backend; functional collectives reach it too.
    sub = dist.new_group(ranks=list(range(world)), backend="gloo")
    t = ref(rank).to(dev)
    out = funcol.all_reduce(t, "sum", sub)
    torch.testing.assert_close(out.cpu(), torch.stack([ref(r) for r in range(world)]).sum(0))
    assert accel_dist.inner_backend(sub) is not inner


def _send_first(rank: int, world: int) -> list[float] | None:
    """A send/recv pair as the group's first accel call (both ranks of the group take part)."""
    dev = torch.device("accel", 0)
    if rank == 0:
        dist.send(torch.full((3,), 5.0, device=dev), dst=1)
        return None
    t = torch.empty(3, device=dev)
    dist.recv(t, src=0)
    return t.cpu().tolist()


def _creator_fails(rank: int, world: int) -> str:
    """An error while accl's backend is created reaches the caller; the group stays usable and
    the next collective creates it."""
    dev = torch.device("accel", 0)
    os.environ["ACCEL_DIST_CHECK"] = "maybe"
    t = torch.ones(4, device=dev)
    try:
        dist.all_reduce(t)
        raise AssertionError("no error from the backend's creator")
    except ValueError as e:
        message = str(e)
    os.environ["ACCEL_DIST_CHECK"] = "1"
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), torch.full((4,), float(world)))
    return message


def test_gloo_alone_gives_accel_collectives_to_accl() -> None:
    run_ranks(_gloo_alone, backend="gloo", timeout_s=TIMEOUT_S)


def test_point_to_point_first_and_dtensor_on_a_gloo_group() -> None:
    assert run_ranks(_send_first, backend="gloo") == [None, [5.0, 5.0, 5.0]]
    run_ranks(_dtensor, backend="gloo")


def test_an_error_creating_the_backend_reaches_the_caller() -> None:
    for message in run_ranks(_creator_fails, backend="gloo"):
        assert "ACCEL_DIST_CHECK" in message, message


# The debug modes run test_distributed_training.py's torchrun examples (three interpreters each);
# this one differs only in how the group is made, which the rank tests here check in every mode.
# DDP only: FSDP2's collectives (all_gather_into_tensor, reduce_scatter_tensor) are among every
# collective _gloo_alone runs on such a group, and test_distributed_training.py runs the FSDP2
# example (19 s each on 2 cores).
@pytest.mark.default_only
def test_ddp_example_with_gloo_alone_matches_one_process() -> None:
    out = run_ddp_example(2, ["--backend", "gloo"], 180, GLOO_SOCKET_IFNAME="lo")
    assert "CPU fallback" not in out


def test_gloo_alone_still_leaves_accel_out_upstream() -> None:
    # Fails once PyTorch maps accel for "gloo" itself (pytorch/pytorch#184010, #100958): then
    # csrc/distributed/gloo_groups.* and these tests can go.
    devices = BackendConfig(dist.Backend("gloo")).get_device_backend_map()
    assert "accel" not in devices, devices
    assert "accel" not in dist.Backend.backend_capability["gloo"]
