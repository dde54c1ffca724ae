"""torch.multiprocessing of accel tensors: device memory shared with other processes.

A queue, a Pipe or a Process argument pickles an accel tensor's storage as the runtime's export
of its memory (accel::rt::ipc_export: the driver's handle of the segment that holds it, where the
storage lies in it, and a reference counter in the sending process); the receiving process maps
the same memory (no copy: writes on either side are seen by the other once their streams are
synchronized), as CUDA IPC does for CUDA tensors. The sender's work queued on the device's
current stream completes before the export, so the receiver sees what it wrote.

As with CUDA, the sender must keep the tensor alive while receivers use it to get the usual
results; memory it frees while a receiver still holds it is kept out of reuse until every
receiver released it, and returned by ``torch.accel.ipc_collect()`` (or when an allocation runs
out of memory). Children must be spawned (or forkserver): a process forked after accel started
cannot use it, as with CUDA.
"""

from __future__ import annotations

import torch

from torch_accel import _C

__all__ = ["ipc_collect"]


def ipc_collect() -> None:
    """Frees the accel memory this process freed while other processes still used it, once they
    have all released it (``torch.cuda.ipc_collect``)."""
    if torch.accel.is_initialized():
        _C._ipc_collect(-2)


def _rebuild_storage(
    device: int,
    handle: bytes,
    segment_size: int,
    offset: int,
    ref_pid: int,
    ref_fd: int,
    ref_inode: int,
    ref_slot: int,
    nbytes: int,
) -> torch.UntypedStorage:
    torch.accel._lazy_init()
    imported = _C._ipc_import(
        device, handle, segment_size, offset, ref_pid, ref_fd, ref_inode, ref_slot, nbytes
    )
    return imported.untyped_storage()


def _rebuild_empty(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device("accel", device))


def _reduce_storage(storage: torch.UntypedStorage) -> object:
    """torch.multiprocessing's pickling of a storage (a tensor's too: torch pickles tensors of
    devices other than cuda as their storage and metadata): accel memory is exported, other
    devices' storages go as torch sends them."""
    if storage.device.type != "accel":
        from torch.multiprocessing import reductions

        return reductions.reduce_storage(storage)
    if storage.nbytes() == 0:
        return (_rebuild_empty, (storage.device.index,))
    return (_rebuild_storage, (*_C._ipc_export(storage.data_ptr()), storage.nbytes()))


def register_reductions() -> None:
    """Registers _reduce_storage for torch.UntypedStorage with multiprocessing's pickler, where
    torch.multiprocessing registered its own (at import torch)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (its reductions first, so that ours replaces them)

    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
