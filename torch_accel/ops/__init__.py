"""accel's own operators, ``torch.ops.accel.*``, with Python wrappers.

The schemas live in ``yaml/accel_functions.yaml`` (the C++ library defines the operators and their
kernels); this package adds what PyTorch's Python side needs: fake kernels (for
``torch.compile`` and meta tensors) and autograd formulas that call the backward operators.
The operators run on accel tensors (and CPU tensors). Under ``torch.autocast`` the rope operators
run in the dtype of their activations (computing in float32 inside) and ``linear_act`` in
autocast's lower precision, as ``F.linear``.
"""

from __future__ import annotations

from torch_accel.ops import _cuda  # noqa: F401  (the cuda driver's implementations)
from torch_accel.ops._attention import flash_attention
from torch_accel.ops._linear import get_linear_kernel, linear_act, linear_kernel
from torch_accel.ops._rope import qkv_rms_norm_rope, rms_norm_rope

__all__ = [
    "flash_attention",
    "get_linear_kernel",
    "linear_act",
    "linear_kernel",
    "qkv_rms_norm_rope",
    "rms_norm_rope",
]
