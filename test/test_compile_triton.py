"""torch.compile on accel with Triton kernels: the path of the cuda driver, checked without a GPU.

On the cuda driver Inductor generates Triton kernels for accel tensors
(torch_accel/_inductor/triton_scheduling.py), which torch_accel's Triton backend plugin
(_torch_accel_triton) compiles for the accel target as CUDA kernels. Here, on the host driver:

- the values: ACCEL_INDUCTOR_KERNELS=triton runs the same generated code on host-driver accel
  tensors in Triton's interpreter (TRITON_INTERPRET=1, chosen before Triton is imported, so in a
  process of its own, started by the first test; triton_interpreter.py installs a driver that
  answers for the missing GPU and runs libdevice calls with numpy), compared with eager;
- the compilation: in a process without the interpreter, Inductor compiles accel's kernels for
  an sm_90 device through the plugin down to cubins (nothing can load them here);
- the registrations and the errors that say what to do.

What only a GPU shows (kernels launched by Triton's CUDA driver on accel's cudaStream_t) runs
in make test-cuda (test_compile.py and the rest on ACCEL_DRIVER=cuda) and test/gpu_proof.sh.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import triton_interpreter  # test/

import helpers  # test/
import torch_accel  # noqa: F401

pytest.importorskip("triton")
TEST_DIR = Path(__file__).resolve().parent
ON_CUDA = torch_accel.driver() == "cuda"  # Triton kernels on the GPU: the tests below run there
INSIDE = ON_CUDA or (
    triton_interpreter.active() and os.environ.get("ACCEL_INDUCTOR_KERNELS") == "triton"
)
inside = pytest.mark.skipif(not INSIDE, reason="runs in the interpreter's process (first test)")
outside = pytest.mark.skipif(INSIDE, reason="this is the interpreter's process")


@pytest.mark.default_only  # one interpreted run checks the generated code's values
@outside
def test_triton_kernels_in_the_interpreter() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(TRITON_INTERPRET="1", ACCEL_INDUCTOR_KERNELS="triton", ACCEL_DRIVER="host")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(env.get("TMPDIR", "/tmp")) / "accel-triton-interp")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        cwd=TEST_DIR.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    summary = run.stdout.splitlines()[-1]
    assert " passed" in summary and " failed" not in summary, run.stdout[-3000:]


if INSIDE and not ON_CUDA:
    triton_interpreter.install_shim()
    triton_interpreter.install_host_driver()


def _compiled(fn: Any, *args: Any, **options: Any) -> tuple[Any, str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    got, codes = run_and_get_code(torch.compile(fn, **options), *args)
    return got, "\n".join(codes)


def _close(got: Any, expected: Any, **tol: Any) -> None:
    if isinstance(got, (tuple, list)):
        for g, e in zip(got, expected, strict=True):
            _close(g, e, **tol)
        return
    assert got.device.type == "accel"
    torch.testing.assert_close(got.cpu(), expected.cpu(), **tol)


@inside
def test_the_generated_code_is_triton_for_the_accel_device_on_its_stream() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.sin() + y).relu().sum(1)

    x, y = torch.randn(64, 33, device="accel"), torch.randn(64, 33, device="accel")
    got, code = _compiled(f, x, y)
    _close(got, f(x, y))
    assert "@triton.jit" in code
    assert "DeviceProperties(type='accel', index=0" in code
    # Launched on the current accel stream's handle (cudaStream_t on the cuda driver).
    assert "from torch_accel._inductor.device_ops import raw_stream as get_raw_stream" in code
    assert re.search(r"\.run\(.*stream=stream0\)", code)
    assert "accel_cpp_kernel(" not in code and "cpp_pybinding" not in code


FUNCTIONS = {
    "pointwise": lambda x, y: torch.tanh(x) * torch.sigmoid(y) + torch.erf(x) - x.pow(3),
    "rounding_and_nan": lambda x, y: torch.where(x > 0, (x * 3).round(), torch.nan).nan_to_num(7),
    "reductions": lambda x, y: (x.sum(0), y.amax(1), x.mean(), (x * y).var(1), x.argmax(1)),
    "softmax": lambda x, y: torch.softmax(x * 2, -1) + torch.log_softmax(y, 0),
    "layer_norm": lambda x, y: torch.nn.functional.layer_norm(x, x.shape[-1:]) * y,
    "cumsum": lambda x, y: x.cumsum(1) + y.cumprod(0),
    "views_and_cat": lambda x, y: torch.cat([x.t()[:5], y.t()[5:9] * 2]).reshape(-1, 3).T,
    "indexing": lambda x, y: x[x[0].argsort()[:3]] + y[:, [1, 4]].sum(1)[:3, None],
    "matmul_epilogue": lambda x, y: torch.nn.functional.gelu(x @ y.t() + 1) + x.sum(),
}


@inside
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiled_values_match_eager(name: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(24, 16, device="accel"), torch.randn(24, 16, device="accel")
    got, code = _compiled(FUNCTIONS[name], x, y)
    _close(got, FUNCTIONS[name](x, y), rtol=1e-4, atol=1e-4)
    assert "@triton.jit" in code


@inside
def test_combo_kernels_combine_accel_nodes_within_the_argument_limit() -> None:
    # combo_kernels=True puts independent nodes into one Triton kernel on accel as on CUDA (the
    # C++ path leaves accel's nodes out of Inductor's grouping: test_compile_modes.py).
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a.sin() * 2, (b + 1).sum(1), c.relu().cumsum(0), a.amax(0)

    args = [torch.randn(32, 17, device="accel") for _ in range(3)]
    got, code = _compiled(f, *args, options={"combo_kernels": True})
    _close(got, f(*args))
    combo = re.findall(r"def (triton_\w+)\(([^)]*)\):", code)
    merged = [name for name, params in combo if params.count("in_ptr") >= 2]
    assert merged, code[-4000:]
    limit = torch.accel.get_device_properties(0).max_kernel_args
    assert all(len(params.split(",")) <= limit for _, params in combo)


@inside
def test_embedding_scatter_and_inputs_mutated_in_place() -> None:
    def f(w: torch.Tensor, idx: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        e = torch.nn.functional.embedding(idx, w)
        acc.index_add_(0, idx.flatten(), e.flatten(0, 1))
        acc.mul_(0.5)
        return e.sum(-1)

    torch.manual_seed(0)
    w = torch.randn(10, 6, device="accel")
    idx = torch.randint(0, 10, (4, 5), device="accel")
    acc, acc_eager = torch.zeros(10, 6, device="accel"), torch.zeros(10, 6, device="accel")
    got, _ = _compiled(f, w, idx, acc)
    _close(got, f(w, idx, acc_eager), rtol=1e-5, atol=1e-5)
    _close(acc, acc_eager, rtol=1e-5, atol=1e-5)


@inside
def test_dynamic_shapes_compile_once() -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.softmax(x.exp() - 1, -1), backend=counter)
    for n in (8, 13, 21):
        x = torch.randn(n, 7, device="accel")
        torch._dynamo.mark_dynamic(x, 0)
        _close(f(x), torch.softmax(x.exp() - 1, -1), rtol=1e-5, atol=1e-6)
    assert counter.frame_count == 1


@inside
def test_a_second_device_gets_its_guard_and_its_kernels() -> None:
    if torch.accel.device_count() < 2:  # type: ignore[attr-defined]
        pytest.skip("one accel device")
    x = torch.randn(32, 8, device="accel:1")
    got, code = _compiled(lambda t: (t * 2).cos().sum(0), x)
    assert got.device == torch.device("accel:1")
    _close(got, (x * 2).cos().sum(0), rtol=1e-5, atol=1e-5)
    assert "with torch.accel.device(1):" in code
    assert "DeviceProperties(type='accel', index=1" in code


@inside
def test_compiled_kernels_follow_eager_work_on_the_current_stream() -> None:
    # Fed by a matmul each iteration, no synchronization in between, on a side stream too.
    f = torch.compile(lambda t: torch.relu(t) * 2 + 1)
    torch._dynamo.reset()
    a, b = torch.randn(64, 64, device="accel"), torch.randn(64, 64, device="accel")
    side = torch.accel.Stream()  # type: ignore[attr-defined]
    for stream in (torch.accel.current_stream(), side):  # type: ignore[attr-defined]
        with torch.accel.stream(stream):  # type: ignore[attr-defined]
            outs = []
            for i in range(4):
                outs.append(f(a @ b + i))
            expected = [torch.relu(a @ b + i) * 2 + 1 for i in range(4)]
        stream.synchronize()
        for got, want in zip(outs, expected, strict=True):
            _close(got, want, rtol=0, atol=0)


class _TinyLM(torch.nn.Module):
    """Embedding, RMSNorm with a residual, MLP with LayerNorm: an RMSNorm backward fused with
    the embedding's scatter is what a persistent reduction with XBLOCK=1 and atomics makes of it
    (the interpreter mishandled those until the test shim made its arrays contiguous)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32, padding_idx=0)
        self.norm = torch.nn.RMSNorm(32, eps=1e-6)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(32, 48), torch.nn.LayerNorm(48), torch.nn.GELU(),
            torch.nn.Linear(48, 50),
        )  # fmt: skip

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.mlp(self.norm(x) + x)


@inside
def test_a_training_step_matches_eager() -> None:
    ids = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(1)).to("accel")
    losses = []
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = _TinyLM().to("accel")
        run = torch.compile(model) if compiled else model
        torch._dynamo.reset()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step_losses = []
        for _ in range(3):
            opt.zero_grad()
            logits = run(ids)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            step_losses.append(loss.detach())
        losses.append(torch.stack(step_losses))
        grads.append([p.grad for p in model.parameters()])
    _close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    _close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


@inside
def test_seeded_random_ops_reproduce() -> None:
    f = torch.compile(lambda t: torch.nn.functional.dropout(t, 0.3) + torch.rand_like(t))
    torch._dynamo.reset()
    x = torch.ones(64, 64, device="accel")
    torch.accel.manual_seed(3)  # type: ignore[attr-defined]
    a = f(x)
    torch.accel.manual_seed(3)  # type: ignore[attr-defined]
    b = f(x)
    _close(a, b, rtol=0, atol=0)
    dropped = (a < 1).float().mean().item()
    assert 0.25 < dropped < 0.35, dropped


_LIMITS = (
    textwrap.dedent(
        """
        import re, sys, torch, torch_accel
        sys.path.insert(0, sys.argv[1])
        import triton_interpreter
        triton_interpreter.install_shim()
        triton_interpreter.install_host_driver()

        def widths(code):
            # Pointer arguments of each Triton kernel (its buffers).
            return [len(re.findall(r"\\b(?:in_out|in|out)_ptr\\d+", sig))
                    for sig in re.findall(r"def triton_\\w+\\(([^)]*)\\)", code)]
        """
    )
    + helpers.KERNEL_LIMIT_CHECKS
)


@outside
@pytest.mark.default_only
def test_triton_kernels_stay_within_the_device_limits(run_python, tmp_path: Path) -> None:
    r = run_python(
        _LIMITS.replace("sys.argv[1]", repr(str(TEST_DIR))),
        TRITON_INTERPRET="1",
        ACCEL_INDUCTOR_KERNELS="triton",
        ACCEL_DRIVER="host",
        ACCEL_MAX_KERNEL_BUFFERS="16",
        ACCEL_MAX_KERNEL_ARGS="40",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


_GENERATE = textwrap.dedent(
    """
    import json, re, sys, torch, torch_accel
    sys.path.insert(0, sys.argv[1])
    import triton_interpreter
    triton_interpreter.install_shim()
    triton_interpreter.install_host_driver()
    from torch._inductor.utils import run_and_get_code

    def f(x, y):
        return torch.softmax(x, -1) * torch.erf(y).sum(0), (x @ y.t()).relu()

    x = torch.randn(16, 40, device="accel")
    _, (code,) = run_and_get_code(torch.compile(f), x, x)
    quotes = "'" * 3
    pattern = (r"= async_compile\\.triton\\('(\\w+)', " + quotes + "(.*?)" + quotes
               + r", device_str='accel'\\)")
    found = re.findall(pattern, code, re.S)
    json.dump(dict(found), open(sys.argv[2], "w"))
    print(len(found))
    """
)

_TO_CUBIN = textwrap.dedent(
    """
    import glob, json, sys, torch, torch_accel
    sys.path.insert(0, sys.argv[1])
    import triton_interpreter
    triton_interpreter.install_host_driver()
    from torch._inductor.codecache import PyCodeCache

    for name, src in json.load(open(sys.argv[2])).items():
        # As the cuda driver describes an H100 (the host device reports capability 1.0).
        assert "DeviceProperties(type='accel', index=0" in src, src
        src = src.replace("cc=10, major=1,", "cc=90, major=9,")
        kernel = getattr(PyCodeCache.load(src), name)
        kernel.precompile(warm_cache_only=True)  # compiles; loading needs a GPU
    metas = [json.load(open(p)) for p in glob.glob(sys.argv[3] + "/**/triton_*.json",
                                                   recursive=True)]
    cubins = glob.glob(sys.argv[3] + "/**/triton_*.cubin", recursive=True)
    assert cubins and len(metas) == len(cubins), (cubins, metas)
    print(len(cubins), sorted({(m["target"]["backend"], m["target"]["arch"]) for m in metas}))
    """
)


@outside
@pytest.mark.default_only
def test_accel_kernels_compile_to_cubins_through_the_plugin(run_python, tmp_path: Path) -> None:
    # Inductor's kernels for accel, generated as on the cuda driver, then compiled as Inductor
    # compiles them there (its precompile: triton.compile for GPUTarget("accel", 90, 32)).
    sources, cache = tmp_path / "kernels.json", tmp_path / "triton"
    args = {"sys.argv[1]": repr(str(TEST_DIR)), "sys.argv[2]": repr(str(sources))}
    args["sys.argv[3]"] = repr(str(cache))
    generate, to_cubin = _GENERATE, _TO_CUBIN
    for k, v in args.items():
        generate, to_cubin = generate.replace(k, v), to_cubin.replace(k, v)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "ACCEL_DRIVER": "host"}
    r = run_python(generate, TRITON_INTERPRET="1", ACCEL_INDUCTOR_KERNELS="triton", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert int(r.stdout) >= 2, r.stdout
    r = run_python(to_cubin, TRITON_CACHE_DIR=str(cache), **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    count, targets = r.stdout.split(" ", 1)
    assert int(count) >= 2
    # Compiled for sm_90 by the plugin (CUDA's compiler under the accel target).
    assert targets.strip() in ("[('accel', 90)]", "[('cuda', 90)]"), targets


@outside
def test_triton_loads_the_accel_compiler_plugin_without_torch(run_python) -> None:
    code = textwrap.dedent(
        """
        import sys
        import triton.backends
        print("accel" in triton.backends.backends, "torch_accel" in sys.modules)
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        backend = make_backend(GPUTarget("accel", 90, 32))
        print(type(backend).__name__, backend.target)
        try:
            make_backend(GPUTarget("accel", "gfx942", 64))
        except ValueError as e:
            print("refused:", e)
        """
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "True False"
    assert lines[1] == "AccelCUDABackend GPUTarget(backend='cuda', arch=90, warp_size=32)"
    assert lines[2].startswith("refused: accel's Triton kernels are CUDA kernels")


@outside
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ACCEL_INDUCTOR_KERNELS": "ptx"}, "ACCEL_INDUCTOR_KERNELS='ptx': use one of auto, cpp"),
        (
            {"ACCEL_INDUCTOR_KERNELS": "triton"},
            "only Triton's interpreter can (TRITON_INTERPRET=1",
        ),
    ],
)
def test_the_kernel_choice_says_what_is_wrong(run_python, env: dict, message: str) -> None:
    code = (
        "import torch, torch_accel\n"
        "try:\n"
        "    torch.compile(lambda t: t * 2)(torch.ones(3, device='accel'))\n"
        "except Exception as e:\n"
        "    print(str(e))\n"
        "print(torch.compile(lambda t: t + 1, backend='eager')(torch.ones(2, device='accel')))\n"
    )
    r = run_python(code, ACCEL_DRIVER="host", **env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert message in r.stdout, r.stdout
    assert "tensor([2., 2.], device='accel:0')" in r.stdout  # the device stays usable


@outside
def test_cpp_and_triton_code_are_separate_cache_entries(run_python) -> None:
    # Inductor's caches key accel's graphs by accel's pass (passes.py), which names the language.
    code = (
        "import torch, torch_accel\n"
        "from torch_accel._inductor.passes import AccelPostGradPass\n"
        "print(AccelPostGradPass().uuid()[-1])\n"
    )
    got = {
        r.stdout.strip()
        for r in (
            run_python(code, ACCEL_DRIVER="host"),
            run_python(code, ACCEL_DRIVER="host", ACCEL_INDUCTOR_KERNELS="triton"),
        )
    }
    assert got == {"cpp", "triton"}, got


@inside
def test_flex_attention_forward_and_backward_match_eager() -> None:
    # Inductor's Triton templates (the C++ path serves inference only).
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b: Any, h: Any, q: Any, k: Any) -> Any:
        return q >= k

    torch.manual_seed(0)
    qkv = [torch.randn(1, 2, 128, 16, device="accel") for _ in range(3)]
    mask = create_block_mask(causal, 1, 1, 128, 128, device="accel")
    results = []
    for fn in (flex_attention, torch.compile(flex_attention)):
        torch._dynamo.reset()
        inputs = [t.clone().requires_grad_() for t in qkv]
        out = fn(*inputs, block_mask=mask)
        out.square().sum().backward()
        results.append([out.detach(), *(t.grad for t in inputs)])
    _close(results[1], results[0], rtol=1e-4, atol=1e-4)


@inside
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_min_and_clamp_propagate_nan_as_eager(dtype: torch.dtype) -> None:
    # Issue 12's NaN rows (NaN first, last, in the middle, all NaN, signed zeros, ties) through
    # Inductor's Triton reductions and clamps, against eager on the CPU (NaN handling is in the
    # generated code, triton_helpers' maximum/minimum, which the interpreter runs as written).
    from test_compile_fused import _NAN_ROWS, _reductions, _same

    x = torch.tensor(_NAN_ROWS, dtype=dtype)
    torch._dynamo.reset()
    compiled = torch.compile(_reductions)(x.to("accel"))
    for name, expected in _reductions(x).items():
        # Which of equal extrema (-0.0, 0.0) a reduction returns is unspecified for compiled
        # code: test_compile_fused.py's xfail for the C++ kernels; here the interpreter's.
        zero_sign = name not in ("max", "amax", "min", "amin")
        assert _same(compiled[name], expected, zero_sign), f"compiled {name}: {compiled[name]}"


@outside
def test_a_driver_that_fails_to_start_leaves_import_and_cpu_compiles_working(run_python) -> None:
    # The kernel language is read from the driver while torch_accel is imported (flex_attention's
    # rule) and when Inductor is: a driver that cannot start must not break either.
    if torch.cuda.is_available():
        pytest.skip("the cuda driver starts here")
    code = (
        "import torch, torch_accel\n"
        "print(torch_accel.is_available())\n"
        "print(torch.compile(lambda t: t + 1)(torch.ones(2)))\n"
        "try:\n"
        "    torch.compile(lambda t: t + 1)(torch.ones(2, device='accel'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, str(e).splitlines()[0])\n"
    )
    r = run_python(code, ACCEL_DRIVER="cuda")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[:2] == ["False", "tensor([2., 2.])"], r.stdout
    assert "the accel runtime failed to start: ACCEL_DRIVER=cuda" in lines[2], r.stdout


@outside
def test_registered_before_the_runtime_started_hands_over_to_triton(
    run_python, test_driver
) -> None:
    # Registering with Inductor starts nothing, so an Inductor imported before any accel work
    # gets the C++ scheduling; the first accel compile on a driver whose memory the host cannot
    # touch (the limited test driver) switches accel to Triton's, whose check then speaks.
    code = (
        "import torch, torch_accel\n"
        "import torch._inductor.compile_fx\n"
        "from torch._inductor.codegen.common import get_scheduling_for_device as get\n"
        "print(get('accel').__name__)\n"
        "try:\n"
        "    torch.compile(lambda t: t * 2 + 1)(torch.ones(3, device='accel'))\n"
        "except Exception as e:\n"
        "    print(str(e).splitlines()[0])\n"
        "print(get('accel').__name__)\n"
    )
    r = run_python(code, **test_driver("limited"))
    assert r.returncode == 0, r.stderr[-3000:]
    first, error, last = r.stdout.strip().splitlines()
    assert (first, last) == ("AccelCppScheduling", "AccelTritonScheduling"), r.stdout
    assert "Triton kernels run only where accel's operators run through CUDA" in error
