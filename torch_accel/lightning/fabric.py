"""accel's accelerator and single-device strategy for Lightning Fabric."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY, Accelerator
from lightning.fabric.plugins.precision import MixedPrecision, Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy
from lightning.fabric.utilities.exceptions import MisconfigurationException

from torch_accel import lightning as common


class AccelAccelerator(Accelerator):
    """accel devices: ``Fabric(accelerator="accel")``."""

    def setup_device(self, device: torch.device) -> None:
        common.setup_device(device, MisconfigurationException)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return common.parse_devices(devices, MisconfigurationException)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        indices = common.parse_devices(devices, MisconfigurationException)
        return [torch.device(common.ACCELERATOR, i) for i in indices]

    @staticmethod
    def auto_device_count() -> int:
        return torch.accel.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.accel.is_available()

    @staticmethod
    def name() -> str:
        return common.ACCELERATOR

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__)


class SingleAccelStrategy(common.OneDevice, SingleDeviceStrategy):
    """One accel device, the one the accelerator's ``devices`` flag selects (or ``device``)."""

    @property
    def precision(self) -> Precision:
        return SingleDeviceStrategy.precision.fget(self)

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        SingleDeviceStrategy.precision.fset(self, common.on_accel(precision, MixedPrecision))


class DDPAccelStrategy(DDPStrategy):
    """DDP over accel devices (see ``DDP_STRATEGIES``)."""

    def _determine_ddp_device_ids(self) -> list[int] | None:
        return None

    @property
    def precision(self) -> Precision:
        return DDPStrategy.precision.fget(self)

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        DDPStrategy.precision.fset(self, common.on_accel(precision, MixedPrecision))

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        common.register_ddp_strategies(cls, strategy_registry)


def register() -> None:
    if common.ACCELERATOR not in ACCELERATOR_REGISTRY:
        AccelAccelerator.register_accelerators(ACCELERATOR_REGISTRY)
    if common.SINGLE_DEVICE_STRATEGY not in STRATEGY_REGISTRY:
        SingleAccelStrategy.register_strategies(STRATEGY_REGISTRY)
    if common.DDP_STRATEGIES[0][0] not in STRATEGY_REGISTRY:
        DDPAccelStrategy.register_strategies(STRATEGY_REGISTRY)
