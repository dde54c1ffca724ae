"""accel's accelerator and single-device strategy for Lightning's Trainer."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.accelerators import Accelerator as TrainerAccelerator
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from torch_accel import lightning as common
from torch_accel.lightning import fabric


class AccelAccelerator(fabric.AccelAccelerator, TrainerAccelerator):
    """accel devices: ``Trainer(accelerator="accel")``."""

    def setup(self, trainer: Any) -> None:
        # Every strategy's mixed precision autocasts accel, not CUDA (see the package's notes).
        strategy = trainer.strategy
        if isinstance(strategy, DDPStrategy) and not isinstance(strategy, DDPAccelStrategy):
            names = ", ".join(repr(name) for name, _ in common.DDP_STRATEGIES)
            raise MisconfigurationException(
                f"Lightning's {type(strategy).__name__} creates a torch.cuda.Stream for models on "
                f"accel: use strategy={common.DDP_STRATEGIES[0][0]!r} (or {names})"
            )
        strategy.precision_plugin = common.on_accel(strategy.precision_plugin, MixedPrecision)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return torch.accel.memory_stats(device)


class SingleAccelStrategy(common.OneDevice, SingleDeviceStrategy):
    """One accel device, the one the accelerator's ``devices`` flag selects (or ``device``)."""


class DDPAccelStrategy(DDPStrategy):
    """DDP over accel devices (see ``DDP_STRATEGIES``)."""

    def determine_ddp_device_ids(self) -> list[int] | None:
        return None

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        common.register_ddp_strategies(cls, strategy_registry)


def register() -> None:
    if common.ACCELERATOR not in AcceleratorRegistry:
        AccelAccelerator.register_accelerators(AcceleratorRegistry)
    if common.SINGLE_DEVICE_STRATEGY not in StrategyRegistry:
        SingleAccelStrategy.register_strategies(StrategyRegistry)
    if common.DDP_STRATEGIES[0][0] not in StrategyRegistry:
        DDPAccelStrategy.register_strategies(StrategyRegistry)
