"""accel in Lightning: ``Trainer(accelerator="accel", strategy="single_accel", devices=1)``.

Lightning lists its accelerators and strategies in registries that other packages may extend
(``AcceleratorRegistry.register``, ``StrategyRegistry.register``); torch_accel registers there
once a package's connector is imported (``MODULES``), without importing Lightning itself.

- ``accelerator="accel"``: accel devices for the Trainer and for Fabric (``devices=N`` or a list
  of indices, ``"auto"`` for all of them).
- ``strategy="ddp_accel"`` (``ddp_spawn_accel``, ``ddp_fork_accel``): DDP over accel devices.
  Lightning's own DDP strategies create a ``torch.cuda.Stream`` for any device but the CPU; the
  Trainer's accel accelerator refuses them with an error that names these (Fabric's accelerator
  has no hook that sees the strategy: there the error is torch.cuda's).
- ``strategy="single_accel"``: one accel device. Lightning's automatic strategy picks a device
  for one CUDA or MPS device only and puts any other accelerator's single device on the CPU
  (``_choose_strategy`` in its accelerator connector); accel's accelerator refuses that device
  with an error that names this strategy.
- Mixed precision: Lightning makes its ``MixedPrecision`` plugin autocast ``"cuda"`` for every
  accelerator but the CPU and MPS, which leaves a model on accel in float32. The Trainer's accel
  accelerator gives every strategy the same plugin for ``"accel"`` when it sets up, and Fabric's
  accel strategies do so as they receive it.

The unified ``lightning`` package and the standalone ``pytorch_lightning`` and
``lightning_fabric`` have distinct classes: each gets its own (``_fabric.build``,
``_trainer.build``; ``fabric``, ``trainer``, ``standalone_fabric``, ``standalone_trainer``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

ACCELERATOR = "accel"
SINGLE_DEVICE_STRATEGY = "single_accel"
# Lightning's DDP strategies wrap the model in DistributedDataParallel on a new torch.cuda.Stream
# whenever the device is not the CPU; accel's give DDP no device_ids instead (the model's device
# is the one DDP uses then, and Lightning moves the batches), one name per start method.
DDP_STRATEGIES = (("ddp_accel", "popen"), ("ddp_spawn_accel", "spawn"), ("ddp_fork_accel", "fork"))


# accel's module for each Lightning package, made once the module that imports the package's
# registries (its connector) has been imported: the unified package's and the standalone ones'.
MODULES = {
    "lightning.fabric.connector": "torch_accel.lightning.fabric",
    "lightning.pytorch.trainer.connectors.accelerator_connector": "torch_accel.lightning.trainer",
    "lightning_fabric.connector": "torch_accel.lightning.standalone_fabric",
    "pytorch_lightning.trainer.connectors.accelerator_connector": (
        "torch_accel.lightning.standalone_trainer"
    ),
}


def register(after_import: Callable[[str, Callable[[], None]], None]) -> None:
    """Makes accel's classes for each Lightning package right after its connector's import."""
    for trigger, module in MODULES.items():
        after_import(trigger, functools.partial(importlib.import_module, module))


def bind(module: str, *classes: type) -> SimpleNamespace:
    """Names ``classes`` (made in a function) as attributes of ``module``, where pickle finds
    them."""
    for cls in classes:
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
    return SimpleNamespace(**{cls.__name__: cls for cls in classes})


def fill_registries(accelerators: Any, strategies: Any, classes: SimpleNamespace) -> None:
    """Puts accel's accelerator and strategies in a Lightning package's registries."""
    if ACCELERATOR not in accelerators:
        classes.AccelAccelerator.register_accelerators(accelerators)
    if SINGLE_DEVICE_STRATEGY not in strategies:
        classes.SingleAccelStrategy.register_strategies(strategies)
    if DDP_STRATEGIES[0][0] not in strategies:
        classes.DDPAccelStrategy.register_strategies(strategies)


def parse_devices(devices: Any, error: type[Exception]) -> list[int]:
    """The accel indices a ``devices=`` flag selects (an int count, -1 for all, a list of
    indices, or a string of either), checked against the devices there are."""
    count = torch.accel.device_count()
    given = devices
    if isinstance(devices, str):
        text = devices.strip()
        try:
            if "," in text:
                devices = [int(part) for part in text.split(",") if part.strip()]
            else:
                devices = int(text)
        except ValueError:
            raise error(f"devices={given!r} is not a count or a list of accel indices") from None
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise error(f"devices={given!r} is not a count or a list of accel indices")
    if isinstance(devices, int):
        if devices == -1:
            devices = count
        if devices < 1:
            raise error(f"devices={given!r}: give a count above 0, -1 for all, or indices")
        if devices > count:
            raise error(f"devices={given!r}: there are {count} accel devices")
        return list(range(devices))
    indices = list(devices)
    if not indices or any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
        raise error(f"devices={given!r} is not a list of accel indices")
    if len(set(indices)) != len(indices):
        raise error(f"devices={given!r} names a device twice")
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise error(f"devices={given!r}: accel has devices 0 to {count - 1}, not {bad}")
    return indices


def setup_device(device: torch.device, error: type[Exception]) -> None:
    if device.type != ACCELERATOR:
        raise error(
            f"accel's Lightning accelerator was given device {device}: with one device Lightning's "
            "automatic strategy chooses one only for CUDA and MPS and puts other accelerators' "
            f"models on the CPU. Pass strategy={SINGLE_DEVICE_STRATEGY!r} (with devices=1 or "
            f"devices=[index]), or strategy={DDP_STRATEGIES[0][0]!r} with devices=N for N > 1"
        )
    if device.index is not None:
        torch.accel.set_device(device.index)


def single_device(devices: list[torch.device], error: type[Exception]) -> list[torch.device]:
    if len(devices) != 1 or devices[0].type != ACCELERATOR:
        names = ", ".join(str(d) for d in devices)
        raise error(
            f"strategy={SINGLE_DEVICE_STRATEGY!r} runs on one accel device, and the accelerator "
            f"and devices flags give {len(devices)} ({names}; devices='auto' counts every accel "
            "device): pass accelerator='accel' with devices=1 or devices=[index], or use "
            f"strategy={DDP_STRATEGIES[0][0]!r} for several"
        )
    return list(devices)


class OneDevice:
    """The part of ``single_accel`` that Fabric's and the Trainer's strategies share (put before
    their ``SingleDeviceStrategy``): the device is the one the accelerator's ``devices`` flag
    selects, which Lightning hands to strategies with ``parallel_devices``, or ``device``."""

    strategy_name = SINGLE_DEVICE_STRATEGY

    error: type[Exception]  # the package's MisconfigurationException

    def __init__(self, device: Any = None, **kwargs: Any) -> None:
        super().__init__(device="cpu" if device is None else device, **kwargs)  # type: ignore[call-arg]
        self._devices = [] if device is None else single_device([torch.device(device)], ValueError)

    @property
    def parallel_devices(self) -> list[torch.device]:
        return self._devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        self._devices = single_device(devices, self.error)

    @property
    def root_device(self) -> torch.device:
        if self._devices:
            return self._devices[0]
        return torch.device(ACCELERATOR, torch.accel.current_device())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__)


class DDPOnAccel:
    """The part of accel's DDP strategies that Fabric's and the Trainer's share (put before
    their ``DDPStrategy``): one registry name per start method (``DDP_STRATEGIES``). Each still
    gives DDP no device_ids through its package's own method name."""

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, start_method in DDP_STRATEGIES:
            strategy_registry.register(
                name,
                cls,
                description=f"DDP on accel devices, start_method {start_method!r}",
                start_method=start_method,
            )


def on_accel(plugin: Any, mixed_precision: type) -> Any:
    """Lightning's MixedPrecision plugin for accel in place of the one its connector made for
    CUDA (any other plugin unchanged)."""
    if type(plugin) is mixed_precision and plugin.device == "cuda":
        return mixed_precision(plugin.precision, ACCELERATOR)
    return plugin
