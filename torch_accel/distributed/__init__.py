"""torch.distributed on accel tensors: the ``accl`` process-group backend.

``import torch_accel`` registers it for the ``accel`` device type, so
``init_process_group(backend="cpu:gloo,accel:accl")`` works, and so does a plain
``init_process_group()`` in a process whose accelerator is accel (collectives on accel tensors
then go through ``accl``). A group created with ``"gloo"`` alone gets ``accl`` for accel at its
first collective on accel tensors (PyTorch 2.11 maps "gloo" to cpu and cuda only; see
csrc/distributed/gloo_groups.h for how, and what this does not cover).

On the host driver ``accl`` runs Gloo's collectives on the accel buffers themselves (CPU views
of the same memory, no copies), in stream order: a collective starts once the work already
enqueued on the caller's current stream has run, and ``Work.wait()`` returns once it finished,
raising its error (a timeout, a closed connection) naming it. On the cuda driver NCCL runs them
on CUDA views of the accel buffers, from accel's stream, and ``Work.wait()`` orders the
caller's stream after the collective without blocking, as torch.cuda's NCCL backend does.

Before each collective the ranks compare what they are about to do (collective, dtype, element
counts; a small message from each rank to every other, point to point over Gloo on the host): a
mismatch raises the same ValueError on every rank instead of Gloo aborting the process or NCCL
hanging (``ACCEL_DIST_CHECK=0`` skips it). Collectives cannot be captured into an accel graph.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_accel import _C

BACKEND = "accl"

__all__ = ["BACKEND", "inner_backend", "is_available"]


def is_available() -> bool:
    """Whether ``accl`` can run here: torch.distributed with Gloo (the host driver, and the
    cross-rank check), and NCCL where accel runs on the cuda driver."""
    if not (dist.is_available() and dist.is_gloo_available()):
        return False
    return _on_host() or dist.is_nccl_available()


def _on_host() -> bool:
    return _C.executor()[0] != "cuda"


def _create_backend(store: dist.Store, rank: int, size: int, timeout: timedelta) -> object:
    """torch.distributed's creator for accl: a c10d Backend (torch._C._distributed_c10d.Backend)
    over a ProcessGroupGloo (host driver) or a ProcessGroupNCCL (cuda driver) of the same store,
    rank and size."""
    if not dist.is_gloo_available():
        raise RuntimeError("accl runs its collectives through Gloo, which this torch lacks")
    check = _check_enabled()
    if _on_host():
        inner = dist.ProcessGroupGloo(store, rank, size, timeout)
        return _C._distributed_backend(inner, inner if check else None, rank, size)
    if not dist.is_nccl_available():
        raise RuntimeError(
            "accl on the cuda driver runs its collectives through NCCL, which this torch lacks"
        )
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    inner = dist.ProcessGroupNCCL(dist.PrefixStore("accl/nccl", store), rank, size, options)
    # The signatures travel over Gloo on the host: comparing them through NCCL would need the
    # host to wait for the device at every collective.
    checker = (
        dist.ProcessGroupGloo(dist.PrefixStore("accl/check", store), rank, size, timeout)
        if check
        else None
    )
    return _C._distributed_backend(inner, checker, rank, size)


def _check_enabled() -> bool:
    value = os.environ.get("ACCEL_DIST_CHECK", "1").strip().lower()
    if value not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"ACCEL_DIST_CHECK={value!r} is not a boolean (0 or 1)")
    return value in ("1", "true", "yes", "on")


def inner_backend(group: dist.ProcessGroup | None = None) -> object:
    """The backend that moves the bytes for ``group``'s accel collectives (Gloo or NCCL)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C._distributed_inner_backend(pg._get_backend(torch.device("accel")))


def _register() -> None:
    # Not is_available(): asking for the driver here would start the runtime at import.
    if not (dist.is_available() and dist.is_gloo_available()):
        return
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["accel"])
    # Groups whose backend string names nothing for accel ("gloo"): accl joins them at their
    # first collective on accel tensors (csrc/distributed/gloo_groups.h says why and how).
    _C._distributed_set_group_backend_creator(_create_backend)
