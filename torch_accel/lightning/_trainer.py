"""accel's accelerator and strategies for a Lightning Trainer package (``lightning.pytorch`` or
the standalone ``pytorch_lightning``, whose classes are distinct): ``build`` makes them."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import torch

from torch_accel import lightning as common


def build(package: str, fabric: SimpleNamespace, module: str) -> SimpleNamespace:
    """The classes for Trainer package ``package`` (``fabric``: accel's classes for the Fabric
    package it builds on), named as attributes of ``module``, registered in its registries."""
    accelerators = importlib.import_module(f"{package}.accelerators")
    strategies = importlib.import_module(f"{package}.strategies")
    MixedPrecision = importlib.import_module(f"{package}.plugins.precision").MixedPrecision
    error = error_type = importlib.import_module(
        f"{package}.utilities.exceptions"
    ).MisconfigurationException

    class AccelAccelerator(fabric.AccelAccelerator, accelerators.Accelerator):
        """accel devices: ``Trainer(accelerator="accel")``."""

        def setup(self, trainer: Any) -> None:
            strategy = trainer.strategy
            if isinstance(strategy, strategies.DDPStrategy) and not isinstance(
                strategy, DDPAccelStrategy
            ):
                names = ", ".join(repr(name) for name, _ in common.DDP_STRATEGIES)
                raise error(
                    f"Lightning's {type(strategy).__name__} creates a torch.cuda.Stream for models "
                    f"on accel: use strategy={common.DDP_STRATEGIES[0][0]!r} (or {names})"
                )
            # Every strategy's mixed precision autocasts accel, not CUDA (the package's notes).
            strategy.precision_plugin = common.on_accel(strategy.precision_plugin, MixedPrecision)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return torch.accel.memory_stats(device)

    class SingleAccelStrategy(common.OneDevice, strategies.SingleDeviceStrategy):
        """One accel device, the one the accelerator's ``devices`` flag selects (or ``device``)."""

        error = error_type

    class DDPAccelStrategy(common.DDPOnAccel, strategies.DDPStrategy):
        """DDP over accel devices (see ``DDP_STRATEGIES``)."""

        def determine_ddp_device_ids(self) -> list[int] | None:
            return None

    classes = common.bind(module, AccelAccelerator, SingleAccelStrategy, DDPAccelStrategy)
    common.fill_registries(accelerators.AcceleratorRegistry, strategies.StrategyRegistry, classes)
    return classes
