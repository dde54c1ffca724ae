"""Triton's compiler backend for the ``accel`` target (the package docstring says why).

Triton imports this module while it discovers its backends, and takes the one concrete
BaseBackend subclass it holds as the backend's compiler; an import error here would break Triton
for every device, so a Triton without CUDA's backend (a ROCm build) gets a compiler that
supports no target instead.
"""

from __future__ import annotations

from typing import Any

from triton.backends.compiler import BaseBackend, GPUTarget

try:
    # The module, not the class: a second concrete subclass here would confuse Triton.
    from triton.backends.nvidia import compiler as _nvidia
except ImportError:  # no CUDA backend in this Triton
    _nvidia = None

_REFUSAL = (
    "accel's Triton kernels are CUDA kernels, for a compute capability such as 90; got the "
    "target {target!r} (is accel on the cuda driver?)"
)

if _nvidia is not None:

    class AccelCUDABackend(_nvidia.CUDABackend):
        """CUDA's compilation for kernels targeted at accel devices on the cuda driver."""

        @staticmethod
        def supports_target(target: GPUTarget) -> bool:
            return target.backend == "accel"

        def __init__(self, target: GPUTarget) -> None:
            if not isinstance(target.arch, int):
                raise ValueError(_REFUSAL.format(target=target))
            super().__init__(target)
            # From here on, CUDA's: options, passes and the binary are those of this arch.
            self.target = GPUTarget("cuda", target.arch, target.warp_size)

else:

    class AccelCUDABackend(BaseBackend):  # type: ignore[no-redef]
        """Without Triton's CUDA backend no accel kernel compiles: supports no target."""

        @staticmethod
        def supports_target(target: GPUTarget) -> bool:
            return False

        def _absent(self, *args: Any) -> Any:
            raise RuntimeError("accel's Triton kernels need Triton's CUDA backend")

        hash = parse_options = add_stages = load_dialects = get_module_map = _absent
