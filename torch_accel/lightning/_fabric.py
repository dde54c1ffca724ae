"""accel's accelerator and strategies for a Lightning Fabric package (``lightning.fabric`` or the
standalone ``lightning_fabric``, whose classes are distinct): ``build`` makes them."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import torch

from torch_accel import lightning as common


def build(package: str, module: str) -> SimpleNamespace:
    """The classes for Fabric package ``package``, named as attributes of ``module`` (which
    binds them, so that spawned DDP ranks can unpickle them), registered in its registries."""
    accelerators = importlib.import_module(f"{package}.accelerators")
    precisions = importlib.import_module(f"{package}.plugins.precision")
    strategies = importlib.import_module(f"{package}.strategies")
    error = error_type = importlib.import_module(
        f"{package}.utilities.exceptions"
    ).MisconfigurationException
    MixedPrecision = precisions.MixedPrecision

    class AccelAccelerator(accelerators.Accelerator):
        """accel devices: ``Fabric(accelerator="accel")``."""

        def setup_device(self, device: torch.device) -> None:
            common.setup_device(device, error)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return common.parse_devices(devices, error)

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            indices = common.parse_devices(devices, error)
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

    def precision_on_accel(base: type) -> property:
        """Fabric's ``precision`` property of ``base``, whose setter takes accel's plugin in
        place of the one Lightning's connector made for CUDA."""
        inherited = base.precision
        return property(
            inherited.fget, lambda self, p: inherited.fset(self, common.on_accel(p, MixedPrecision))
        )

    class SingleAccelStrategy(common.OneDevice, strategies.SingleDeviceStrategy):
        """One accel device, the one the accelerator's ``devices`` flag selects (or ``device``)."""

        error = error_type

        precision = precision_on_accel(strategies.SingleDeviceStrategy)

    class DDPAccelStrategy(common.DDPOnAccel, strategies.DDPStrategy):
        """DDP over accel devices (see ``DDP_STRATEGIES``)."""

        precision = precision_on_accel(strategies.DDPStrategy)

        def _determine_ddp_device_ids(self) -> list[int] | None:
            return None

    classes = common.bind(module, AccelAccelerator, SingleAccelStrategy, DDPAccelStrategy)
    common.fill_registries(accelerators.ACCELERATOR_REGISTRY, strategies.STRATEGY_REGISTRY, classes)
    return classes
