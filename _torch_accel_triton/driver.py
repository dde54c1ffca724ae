"""Triton's driver entry for the ``accel`` backend: never active (the package docstring says why).

Triton requires each backend to name a driver; kernels compiled for accel are loaded and
launched by Triton's CUDA driver, the active one wherever accel runs on the cuda driver."""

from __future__ import annotations

from typing import Any

from triton.backends.driver import DriverBase


class AccelTritonDriver(DriverBase):
    @classmethod
    def is_active(cls) -> bool:
        return False

    def _inactive(self) -> Any:
        raise RuntimeError(
            "Triton's accel backend only compiles: accel kernels run through Triton's CUDA "
            "driver (accel on the cuda driver)"
        )

    def map_python_to_cpp_type(self, ty: str) -> str:
        return self._inactive()

    def get_current_target(self) -> Any:
        return self._inactive()

    def get_active_torch_device(self) -> Any:
        return self._inactive()

    def get_benchmarker(self) -> Any:
        return self._inactive()
