"""Compiling Inductor's C++ kernels for accel and launching them on accel streams.

Inductor's C++ backend emits ``async_compile.cpp_pybinding(arg_types, source)``, a Python
binding that runs the kernel on the calling thread. For accel tensors that would race with the
stream (the kernel reads memory that queued work has not written yet). Accel's wrapper emits
``accel_cpp_kernel(arg_types, source)`` instead: the same source plus a trampoline taking the
arguments as 64-bit words, compiled through Inductor's C++ code cache (shared between processes),
and a launcher from ``torch_accel._C`` that enqueues the kernel on the current accel stream.

Kernels compile as the CPU's do: with more than one compile thread
(``torch._inductor.config.compile_threads``), in Inductor's compile pool while the wrapper
module goes on defining the others, each a future that the module's ``async_compile.wait``
resolves into its kernel. Compiled one after the other, the 31 kernels of a small Llama's
``generate()`` took 30 s of a 55 s first call against the CPU's 7 s of 33 s.
"""

from __future__ import annotations

import ctypes
from typing import Any

from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from torch._inductor.codecache import CppCodeCache, LambdaFuture, _get_cpp_prefix_header

from torch_accel import _C


class _KernelCache(CppCodeCache):
    """Inductor's C++ code cache with the flags and the precompiled header of its own kernel
    bindings (no libtorch: the kernels need none; the same vectorization flags)."""

    cache: dict[str, Any] = {}
    cpp_compile_command_flags = {"include_pytorch": False, "shared": True}

    @classmethod
    def _get_uncompiled_header(cls, device: str) -> str | None:
        # The kernels' prefix header, precompiled once, as for the CPU's kernel bindings: each
        # kernel compiled in 0.75 s with it, 1.5 s without (Inductor's CppCodeCache itself
        # precompiles nothing).
        return _get_cpp_prefix_header(device)


_POINTER_TYPES = ("*",)
_INT_TYPES = ("int64_t", "int32_t", "int", "long", "bool", "uint64_t", "uint32_t", "size_t")
_FLOAT_TYPES = ("double", "float")


def _kind(arg_type: str) -> str:
    t = arg_type.replace("const ", "").strip()
    if t.endswith(_POINTER_TYPES):
        return "p"
    if t in _INT_TYPES:
        return "i"
    if t in _FLOAT_TYPES:
        return "f"
    raise NotImplementedError(
        f"torch_accel: an Inductor kernel argument of type {arg_type!r} cannot be launched on "
        "accel yet"
    )


def _word(arg_type: str, kind: str, i: int) -> str:
    if kind == "p":
        return f"reinterpret_cast<{arg_type}>(w[{i}])"
    if kind == "i":
        return f"static_cast<{arg_type}>(static_cast<int64_t>(w[{i}]))"
    return f"static_cast<{arg_type}>(accel_word_double(w[{i}]))"


def trampoline(arg_types: list[str]) -> tuple[str, str]:
    """The C++ source of ``accel_kernel_packed(const uint64_t*)`` calling ``kernel``, and the
    argument kinds for the launcher."""
    kinds = [_kind(t) for t in arg_types]
    args = ",\n      ".join(
        _word(t, k, i) for i, (t, k) in enumerate(zip(arg_types, kinds, strict=True))
    )
    src = f"""
#include <cstdint>
#include <cstring>
static inline double accel_word_double(uint64_t v) {{
  double d;
  std::memcpy(&d, &v, sizeof d);
  return d;
}}
extern "C" void accel_kernel_packed(const uint64_t* w) {{
  kernel(
      {args});
}}
"""
    return src, "".join(kinds)


class AccelKernel:
    """A compiled kernel: calling it enqueues the kernel on the current accel stream."""

    def __init__(self, library: Any, kinds: str, name: str = "inductor kernel") -> None:
        self._library = library  # kept: the code lives in it
        address = ctypes.cast(library.accel_kernel_packed, ctypes.c_void_p).value
        assert address is not None
        self._launch = _C._InductorLauncher(address, kinds, name)

    def __call__(self, *args: Any) -> None:
        self._launch(*args)


def accel_cpp_kernel(name: str, arg_types: list[str], source: str) -> AccelKernel | LambdaFuture:
    """What accel's generated wrapper code calls in place of ``async_compile.cpp_pybinding``:
    the kernel, or (several compile threads) a future of it, as ``cpp_pybinding`` returns."""
    extra, kinds = trampoline(list(arg_types))
    if get_compile_threads() <= 1:
        return AccelKernel(_KernelCache.load(source + extra), kinds, name)
    library = _KernelCache.load_async(source + extra, submit_fn=AsyncCompile.submit)
    return LambdaFuture(lambda: AccelKernel(library(), kinds, name))
