"""Accel's vectorized C++ code for the operations where Inductor's is slower than ATen's kernels.

Inductor vectorizes ``erf`` as ATen's ``Vectorized::erf`` (Abramowitz and Stegun's 7.1.26 with
Sleef's 1-ulp ``exp``), which made a compiled ``gelu`` slower than eager's, whose GELU is oneDNN's
JIT kernel with a short exponential polynomial: on 4096x1024 floats (AMD EPYC, AVX-512, 2 cores)
eager 0.52-0.55 ms, Inductor's kernel 0.685 ms (the CPU's compiled gelu 0.75 ms). Accel's kernels
compute the same formula in the same order with ATen's ``exp_u20`` (a degree-5 polynomial, at
most 20 ulp; AVX2 and AVX-512 have it, the generic ``Vectorized`` maps ``std::exp``): 0.58-0.59 ms.
The result's error stays Inductor's own (5.1e-7 absolute against float64 for both, the formula's
1.5e-7 plus float rounding; test_compile_fused.py). In one process, 15 alternating rounds:
gelu 0.643 against 0.779 ms (median), the bias+GELU+residual+layer norm block of
benchmarks/compile.py only 1.455 against 1.500 ms (its layer norm and memory traffic dominate;
eager 2.53 ms).

Inductor's extension point for this is ``CppScheduling.kernel_proxy_cls`` and the proxy's kernel
classes (see ``CppKernelProxy``); nothing of torch is patched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.codegen.cpp import (
    CppKernelProxy,
    CppTile2DKernel,
    CppTile2DOverrides,
    CppVecKernel,
    CppVecOverrides,
)

# erf(x) = sign(x) (1 - t P(t) exp(-x^2)), t = 1 / (1 + p |x|): ATen's vectorized formula and
# operation order (so erf(0) is exactly 0 and the sign is x's), its exponential exp_u20.
_ERF = (
    "[](auto x) {{ using V = decltype(x); const V one(1.0f); const V neg_zero(-0.0f); "
    "auto t = one / at::vec::fmadd(V(0.3275911f), x.abs(), one); "
    "auto r = at::vec::fmadd(V(1.061405429f), t, V(-1.453152027f)); "
    "r = at::vec::fmadd(r, t, V(1.421413741f)); "
    "r = at::vec::fmadd(r, t, V(-0.284496736f)); "
    "r = at::vec::fmadd(r, t, V(0.254829592f)); "
    "auto e = (neg_zero ^ (x * x)).exp_u20(); "
    "return (x & neg_zero) ^ at::vec::fmadd((neg_zero ^ e) * t, r, one); }}({x})"
)


def _fast_ops(self: Any) -> Any:
    """Replaces ``erf`` on an overrides instance (CppVecOverrides.__new__ binds its own
    methods to the instance, so a subclass's method alone would not be used)."""
    inductor_erf = self.erf

    def erf(x: Any) -> Any:
        if getattr(x, "is_vec", False) and getattr(x, "dtype", None) == torch.float32:
            return _ERF.format(x=x)
        return inductor_erf(x)

    self.erf = erf
    return self


class AccelVecOverrides(CppVecOverrides):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _fast_ops(super().__new__(cls, *args, **kwargs))


class AccelTile2DOverrides(CppTile2DOverrides):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _fast_ops(super().__new__(cls, *args, **kwargs))


class AccelVecKernel(CppVecKernel):
    overrides = AccelVecOverrides  # type: ignore[assignment]


# Also an AccelVecKernel: Inductor's proxy asserts that a reduction's main kernel, which is the
# 2D-tiled one when two loops are tiled, is an instance of its vec_kernel_cls (CppTile2DKernel
# derives from CppVecKernel for the same reason).
class AccelTile2DKernel(CppTile2DKernel, AccelVecKernel):
    overrides = AccelTile2DOverrides  # type: ignore[assignment]


class AccelKernelProxy(CppKernelProxy):
    vec_kernel_cls = AccelVecKernel
    tile2d_kernel_cls = AccelTile2DKernel
