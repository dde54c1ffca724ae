"""torch.distributed on accel tensors: the ``accl`` process-group backend.

``import torch_accel`` registers it for the ``accel`` device type, so
``init_process_group(backend="cpu:gloo,accel:accl")`` works, and so does a plain
``init_process_group()`` in a process whose accelerator is accel (collectives on accel tensors
then go through ``accl``). On the host driver ``accl`` runs Gloo's collectives on the accel
buffers themselves (CPU views of the same memory, no copies), in stream order: a collective
starts once the work already enqueued on the caller's current stream has run, and
``Work.wait()`` returns once it finished, raising its error (a timeout, a closed connection)
naming it. Before each collective the ranks compare what they are about to do (collective,
dtype, element counts; one small Gloo allgather): a mismatch raises the same ValueError on every
rank instead of Gloo aborting the process (``ACCEL_DIST_CHECK=0`` skips it). Collectives cannot
be captured into an accel graph.
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
    """Whether ``accl`` can run here: torch.distributed with Gloo."""
    return dist.is_available() and dist.is_gloo_available()


def _create_backend(store: dist.Store, rank: int, size: int, timeout: timedelta) -> object:
    """torch.distributed's creator for accl: a c10d Backend (torch._C._distributed_c10d.Backend)
    over a ProcessGroupGloo of the same store, rank and size."""
    if not dist.is_gloo_available():
        raise RuntimeError("accl runs its collectives through Gloo, which this torch lacks")
    inner = dist.ProcessGroupGloo(store, rank, size, timeout)
    return _C._distributed_backend(inner, rank, size, check=_check_enabled())


def _check_enabled() -> bool:
    value = os.environ.get("ACCEL_DIST_CHECK", "1").strip().lower()
    if value not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"ACCEL_DIST_CHECK={value!r} is not a boolean (0 or 1)")
    return value in ("1", "true", "yes", "on")


def inner_backend(group: dist.ProcessGroup | None = None) -> object:
    """The Gloo backend that moves the bytes for ``group``'s accel collectives."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C._distributed_inner_backend(pg._get_backend(torch.device("accel")))


def _register() -> None:
    if not is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["accel"])
