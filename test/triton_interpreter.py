"""Triton's interpreter, which runs accel's Triton kernels (torch_accel/kernels) on CPU tensors,
so that their numbers are checked where no GPU is present.

The interpreter must be chosen (TRITON_INTERPRET=1) before triton is first imported: the
language's own functions (tl.sum's combine function...) are built then. So the kernel tests run
in a process of their own started with it (test_triton_kernels.py does that).

A test-only shim, applied to the interpreter's own patching: Triton 3.6's interpreter holds
kernel scalars as 1-element numpy arrays and converts them with int(), which numpy 2.4 refuses
for arrays with a dim ("only 0-dimensional arrays can be converted"), so a loop bounded by a
runtime argument fails in the interpreter (compiled kernels are not affected). The shim converts
the one element instead; it is needed while the pinned Triton and numpy disagree.
"""

from __future__ import annotations

import math
import os
from typing import Any


def active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def install_shim() -> None:
    from triton.runtime import interpreter

    if getattr(interpreter, "_accel_shim", False):
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _install_libdevice(interpreter)
    _install_contiguous_atomics(interpreter)
    interpreter._accel_shim = True


def _install_contiguous_atomics(interpreter: Any) -> None:
    """Triton 3.6's interpreter runs atomics in C++ over the numpy arrays of the pointers,
    values and mask as if they were contiguous; a mask broadcast from one row ([1, 1] to
    [1, R], numpy's stride-0 view) reads past its element, so only the first element of such an
    atomic_add applied (Inductor's persistent reductions with XBLOCK=1 that scatter, as in an
    embedding's backward fused with RMSNorm's, gave wrong gradients). Test-only: the arrays are
    made contiguous first."""
    import numpy as np

    def contiguous(handle: Any) -> Any:
        data = np.ascontiguousarray(handle.data)
        return interpreter.TensorHandle(data, handle.dtype, handle.attr)

    rmw = interpreter.InterpreterBuilder.create_atomic_rmw
    cas = interpreter.InterpreterBuilder.create_atomic_cas

    def create_atomic_rmw(self, op, ptr, val, mask, sem, scope):  # type: ignore[no-untyped-def]
        return rmw(self, op, contiguous(ptr), contiguous(val), contiguous(mask), sem, scope)

    def create_atomic_cas(self, ptr, cmp, val, sem, scope):  # type: ignore[no-untyped-def]
        return cas(self, contiguous(ptr), contiguous(cmp), contiguous(val), sem, scope)

    interpreter.InterpreterBuilder.create_atomic_rmw = create_atomic_rmw
    interpreter.InterpreterBuilder.create_atomic_cas = create_atomic_cas


def _libdevice_functions() -> dict[str, Any]:
    import numpy as np

    erf, gamma, lgamma = (
        np.vectorize(f, otypes=[float]) for f in (math.erf, math.gamma, math.lgamma)
    )
    return {
        **{
            n: getattr(np, n)
            for n in (
                "exp",
                "exp2",
                "expm1",
                "log",
                "log2",
                "log10",
                "log1p",
                "sqrt",
                "sin",
                "cos",
                "tan",
                "sinh",
                "cosh",
                "tanh",
                "floor",
                "ceil",
                "trunc",
                "fmod",
                "isnan",
                "isinf",
                "signbit",
                "nextafter",
                "copysign",
                "hypot",
                "cbrt",
                "fmax",
                "fmin",
                "ldexp",
            )
        },
        "asin": np.arcsin,
        "acos": np.arccos,
        "atan": np.arctan,
        "atan2": np.arctan2,
        "asinh": np.arcsinh,
        "acosh": np.arccosh,
        "atanh": np.arctanh,
        "rsqrt": lambda x: 1 / np.sqrt(x),
        "pow": np.power,
        "fabs": np.abs,
        "nearbyint": np.rint,
        "rint": np.rint,
        "round": lambda x: np.copysign(np.floor(np.abs(x) + 0.5), x),
        "erf": erf,
        "erfc": lambda x: 1 - erf(x),
        "tgamma": gamma,
        "lgamma": lgamma,
        "isfinited": np.isfinite,
        "finitef": np.isfinite,
    }


def _install_libdevice(interpreter: Any) -> None:
    """Triton 3.6's interpreter runs no libdevice function (``extern_elementwise not supported
    in interpreter mode``; the generic ``tl.extra.libdevice`` stubs return None there), and
    Inductor's Triton kernels call them (``libdevice.exp``, ``tanh``, ``erf``, ``pow``...).
    Test-only: the interpreter's builder evaluates CUDA's libdevice symbols with numpy, and
    each interpreted kernel sees CUDA's libdevice functions behind the generic names."""
    import numpy as np
    import triton.language as tl
    from triton.language.extra import libdevice
    from triton.language.extra.cuda import libdevice as cuda_libdevice

    functions = _libdevice_functions()

    def create_extern_elementwise(self, lib_name, lib_path, symbol, args, ret_type, is_pure):  # type: ignore[no-untyped-def]
        name = symbol.removeprefix("__nv_")
        fn = functions.get(name) or (functions.get(name[:-1]) if name.endswith("f") else None)
        if fn is None:
            raise NotImplementedError(f"libdevice {symbol} in the interpreter (test shim)")
        dtype = getattr(ret_type, "scalar", ret_type)
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*[a.data for a in args]))
        return interpreter.TensorHandle(out.astype(interpreter._get_np_dtype(dtype)), dtype)

    interpreter.InterpreterBuilder.create_extern_elementwise = create_extern_elementwise
    original = interpreter._patch_lang

    def patch_lang(fn):  # type: ignore[no-untyped-def]
        scope = original(fn)
        for name in dir(libdevice):
            member = getattr(cuda_libdevice, name, None)
            if not name.startswith("_") and tl.core.is_builtin(member):
                interpreter._patch_attr(
                    libdevice, name, member, interpreter.interpreter_builder, scope
                )
        return scope

    interpreter._patch_lang = patch_lang


def install_host_driver() -> None:
    """Makes Triton's CUDA backend answer on a machine without a GPU, for Inductor's Triton
    kernels run in the interpreter (ACCEL_INDUCTOR_KERNELS=triton on the host driver).

    Inductor asks Triton's active driver for its target (to key its caches) and activates it at
    the top of every kernel module; without a GPU Triton has no active driver. The one installed
    here (in place of the CUDA driver, which is inactive here) answers an sm_90 target and
    refuses to load or launch a compiled kernel ("no GPU here"): the interpreter runs them
    (TRITON_INTERPRET=1), and without it compilation goes as far as the cubin."""
    import torch
    import triton.backends
    from triton.backends import Backend
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    nvidia = triton.backends.backends["nvidia"]
    if nvidia.driver.is_active():
        return  # a GPU: the real driver

    class InterpreterOnlyDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def _no_gpu(self, *args: object) -> None:
            raise RuntimeError("no GPU here: Triton kernels run in the interpreter only")

        map_python_to_cpp_type = get_benchmarker = _no_gpu

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        @property
        def launcher_cls(self) -> Any:  # loading a compiled kernel asks for it first
            self._no_gpu()

        @property
        def utils(self) -> Any:
            self._no_gpu()

    backend = Backend(compiler=nvidia.compiler, driver=InterpreterOnlyDriver)
    triton.backends.backends["nvidia"] = backend
