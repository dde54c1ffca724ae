"""Random number generation state of accel devices (mirrors torch.cuda.random)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_accel.accel._utils import _lazy_device_index

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


def _generator(device: Any = None) -> torch.Generator:
    from torch_accel import accel

    index = _lazy_device_index(device)
    generators = accel.default_generators
    if not 0 <= index < len(generators):
        raise RuntimeError(
            f"accel: invalid device index {index}: there are {len(generators)} accel devices"
        )
    return generators[index]


def get_rng_state(device: Any = "accel") -> torch.Tensor:
    """The generator state of ``device`` as a uint8 tensor (seed and offset, 16 bytes)."""
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    from torch_accel import accel

    return [get_rng_state(i) for i in range(accel.device_count())]


def set_rng_state(new_state: torch.Tensor, device: Any = "accel") -> None:
    """Restores a state returned by :func:`get_rng_state`."""
    with torch._C._DisableFuncTorch():
        state = new_state.clone(memory_format=torch.contiguous_format)
    _generator(device).set_state(state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def _get_rng_state_offset(device: Any = "accel") -> int:
    """The Philox offset of ``device``'s default generator (torch.cuda._get_rng_state_offset)."""
    return _generator(device).get_offset()


def _set_rng_state_offset(offset: int, device: Any = "accel") -> None:
    """Sets the Philox offset of ``device``'s default generator (torch.cuda's counterpart)."""
    _generator(device).set_offset(offset)


def manual_seed(seed: int) -> None:
    """Seeds the generator of the current device; before accel starts, of the device current
    when it starts (the seed waits for it, as torch.cuda's does)."""
    from torch_accel import accel

    seed = int(seed)
    accel._lazy_call(lambda: _generator().manual_seed(seed), seed=True)


def manual_seed_all(seed: int) -> None:
    """Seeds the generators of all accel devices (when accel starts, if it has not yet:
    torch.manual_seed calls this and starts nothing, as with CUDA)."""
    from torch_accel import accel

    seed = int(seed)

    def apply() -> None:
        for index in range(accel.device_count()):
            _generator(index).manual_seed(seed)

    accel._lazy_call(apply, seed_all=True)


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic random number."""
    from torch_accel import accel

    accel._lazy_call(lambda: _generator().seed())


def seed_all() -> None:
    """Seeds every device's generator with the same non-deterministic random number."""
    from torch_accel import accel

    def apply() -> None:
        value = _generator(0).seed()
        for index in range(1, accel.device_count()):
            _generator(index).manual_seed(value)

    accel._lazy_call(apply)


def initial_seed() -> int:
    """The seed of the current device's generator."""
    return _generator().initial_seed()
