"""PyTorch's own Inductor tests over accel: ``make inductor-sweep``.

test/inductor/test_torchinductor.py (v2.6.0, fetched with the other PyTorch test files by
pytorch_suites/fetch.py) holds about 700 device-generic compile tests in its ``CommonTemplate``,
which PyTorch copies into a CPU and a GPU class. This module copies them into a class for accel:
each test's inputs and module go to accel, torch.compile (Inductor) runs them, and
``check_model`` compares the compiled results (and gradients) with eager accel. About 35 minutes
on 2 cores, so not part of ``make test``; test_compile_modes.py keeps a test for each defect this
sweep found.

KNOWN lists the tests that fail on accel with the reason; they run as expected failures, so one
that starts to pass fails the sweep and leaves the list. Reasons start with a category as in
pytorch_suites/known_failures.yaml: CUDA (the test assumes that a device other than the CPU is a
GPU: CUDA tensors, Triton code, kernel counts of Triton's fusion), UNSUPPORTED, DRIFT (fails on
the CPU with torch 2.11 too: a v2.6.0 test against a newer torch).

    .venv/bin/python -m pytest -q test/inductor_sweep.py [-k name]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pytorch_suites"))
import fetch  # noqa: E402  (pytorch_suites/fetch.py)

SUITE = Path(
    os.environ.get("PYTORCH_SUITES_DIR")
    or Path.home() / ".cache" / "torch_accel" / f"pytorch-suites-{fetch.VERSION.split('+')[0]}"
).expanduser()
fetch.fetch(SUITE, Path(os.environ.get(fetch.CACHE_ENV) or fetch.DEFAULT_CACHE))
sys.path.insert(0, str(SUITE / "inductor"))

from test_torchinductor import (  # noqa: E402
    CommonTemplate,
    TestFailure,
    check_model,
    clone_preserve_strides,
    copy_tests,
)
from torch._inductor.test_case import TestCase  # noqa: E402

import torch_accel  # noqa: E402, F401

_GPU_COUNT = "CUDA: the test expects the kernel count of Triton's fusion on any device but the CPU"
_CUDA_TENSORS = "CUDA: the test makes its tensors on GPU_TYPE (cuda) for any device but the CPU"
_CUDA_KERNEL = "CUDA: the test runs a kernel PyTorch has for CUDA only"
_TRITON_CODE = "CUDA: the test reads Triton code for any device but the CPU"
_DRIFT = "DRIFT: fails on the CPU with torch 2.11 too"
KNOWN: dict[str, str] = {
    "test_scheduler_vertical_fusion1": f"{_GPU_COUNT} (accel's is the CPU's, 2)",
    "test_softmax_one_kernel_loop": _GPU_COUNT,
    "test_softmax_one_kernel_persist": _GPU_COUNT,
    "test_neg_index": _TRITON_CODE,
    "test_batch_norm_2d_2": _CUDA_TENSORS,
    **{
        f"test_unspec_inputs_{dtype}": _CUDA_TENSORS
        for dtype in ("float16", "float32", "float64", "int16", "int32", "int64", "int8", "uint8")
    },
    "test_cudnn_rnn": f"{_CUDA_KERNEL} (cuDNN's RNN)",
    "test_scaled_dot_product_efficient_attention": f"{_CUDA_KERNEL} (memory-efficient attention)",
    "test_philox_rand": "CUDA: functionalized random operators use CUDA's Philox generator",
    "test_functionalize_rng_wrappers": (
        "UNSUPPORTED: make_fx of torch._prims.rng_prims' operators on accel (their proxy-mode "
        "kernels call the BackendSelect function directly, which knows cpu/cuda/hpu/xpu only; "
        "_torch_fixes.py covers their BackendSelect and fake kernels, which torch.compile uses)"
    ),
    "test_add_complex4": _DRIFT,
    "test_fractional_max_pool2d2": _DRIFT,
    "test_linear_mixed_dtype": _DRIFT,
    "test_low_memory_max_pool": _DRIFT,
    "test_max_pool2d6": _DRIFT,
    "test_max_pool2d8": _DRIFT,
    "test_should_pad_bench_for_bmm": _DRIFT,
}


def check_model_accel(self: Any, model: Any, example_inputs: Any, kwargs: Any = None,
                      *, copy_to_gpu: bool = True, check_lowp: bool = True,
                      **options: Any) -> None:  # fmt: skip
    """The template's ``common``: the module and the inputs on accel, then ``check_model``
    (compiled against eager on the same tensors). ``check_lowp`` (PyTorch's GPU runner checks
    float16 too) is not run: accel's half precision is the CPU's kernels'."""
    if hasattr(model, "to"):
        model = model.to(device="accel")
    if copy_to_gpu:
        example_inputs = tuple(clone_preserve_strides(x, device="accel") for x in example_inputs)
    check_model(self, model, example_inputs, kwargs or {}, **options)


class AccelTests(TestCase):
    common = check_model_accel
    device = "accel"


copy_tests(
    CommonTemplate,
    AccelTests,
    "accel",
    test_failures={name: TestFailure(("accel",)) for name in KNOWN},
)
assert set(KNOWN) <= {n for n in vars(CommonTemplate) if n.startswith("test_")}, "KNOWN: unknown"
assert torch.accel.is_available(), "the sweep needs an accel device"  # type: ignore[attr-defined]
