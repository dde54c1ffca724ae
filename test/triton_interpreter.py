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

import os


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
    interpreter._accel_shim = True
