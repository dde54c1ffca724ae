"""What PyTorch declares about its operators, read through torchgen: the native functions by
name, their groups (functional, inplace, mutable and out= forms), the dispatch keys with a kernel,
C++ dispatcher signatures, and the C++ meta functions libtorch exports. Used by gen_accel.py,
which decides what accel registers; nothing here knows about accel's yaml."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class NativeFunctions:
    """PyTorch's native functions: by name, their groups, and which have which kernels."""

    functions: dict[str, Any]
    groups: dict[str, Any]  # name -> the group (functional/inplace/out) it belongs to
    kernels: dict[str, set[str]]  # name -> dispatch keys with a kernel ("CPU", "CUDA", ...)


# The dispatch key whose ATen kernels a driver runs on its memory (the underlying device);
# level_zero has none in native_functions.yaml (XPU kernels live outside it).
UNDERLYING_KEY = {"host": "CPU", "cuda": "CUDA"}
IMPLICIT_KEYS = {"CompositeImplicitAutograd", "CompositeImplicitAutogradNestedTensor"}
COMPOSITE_KEYS = IMPLICIT_KEYS | {
    "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
}  # fmt: skip


@functools.cache
def load_native_functions() -> NativeFunctions:
    """PyTorch's operators, parsed once per process (3.5 s; callers only read the result)."""
    import torchgen
    from torchgen.gen import get_grouped_native_functions, parse_native_yaml
    from torchgen.model import NativeFunctionsGroup

    root = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native"
    parsed = parse_native_yaml(str(root / "native_functions.yaml"), str(root / "tags.yaml"))
    functions = {str(f.func.name): f for f in parsed.native_functions}
    groups: dict[str, Any] = {}
    for g in get_grouped_native_functions(parsed.native_functions):
        if isinstance(g, NativeFunctionsGroup):
            for f in g.functions():
                groups[str(f.func.name)] = g
    kernels: dict[str, set[str]] = {name: set() for name in functions}
    for key, index in parsed.backend_indices.items():
        for name, f in functions.items():
            # A structured delegate (add.Tensor of add.out) has the kernels of its delegate.
            target = functions[str(f.structured_delegate)] if f.structured_delegate else f
            if index.has_kernel(target) or index.has_kernel(f):
                kernels[name].add(str(key))
    return NativeFunctions(functions, groups, kernels)


def is_view(f: Any) -> bool:
    return any(r.annotation is not None and not r.annotation.is_write for r in f.func.returns)


def signature(f: Any, name: str) -> str:
    from torchgen import local
    from torchgen.api.types import DispatcherSignature

    with local.parametrize(
        use_const_ref_for_mutable_tensors=f.use_const_ref_for_mutable_tensors,
        use_ilistref_for_tensor_lists=False,
    ):
        return DispatcherSignature.from_schema(f.func, symint=False).decl(name=name)


def dispatcher_type(f: Any) -> str:
    """The C++ function type of `f`'s dispatcher signature ("at::Tensor (const at::Tensor &)"),
    as its kernels are registered: without SymInt, as signature(), and with the tensor-list type
    of the other kernels (ITensorListRef for structured operators: c10 refuses a kernel whose
    C++ signature differs from theirs)."""
    from torchgen import local
    from torchgen.api.types import DispatcherSignature

    with local.parametrize(
        use_const_ref_for_mutable_tensors=f.use_const_ref_for_mutable_tensors,
        use_ilistref_for_tensor_lists=f.part_of_structured_group,
    ):
        return DispatcherSignature.from_schema(f.func, symint=False).type()


def returns_new_or_written_tensors(f: Any) -> bool:
    """Whether `f` returns only new tensors (or lists of them) or only tensors it writes in place
    (out=, in-place): the results a typed entry gets from the asynchronous path or from its own
    arguments."""
    returns = f.func.returns
    if not all(r.type.is_tensor_like() for r in returns):
        return False
    written = [r.annotation is not None and r.annotation.is_write for r in returns]
    views = [r.annotation is not None and not r.annotation.is_write for r in returns]
    return not any(views) and (all(written) or not any(written))


def _norm_decl(decl: str) -> str:
    return re.sub(r"\s*=[^,)]*", "", decl).replace("TORCH_API ", "").strip().rstrip(";")


_meta_headers: dict[str, list[str]] = {}
_meta_symbols: dict[str, set[int]] | None = None


def _arity(params: str) -> int:
    """Number of top-level parameters in a demangled parameter list."""
    if not params.strip():
        return 0
    depth, count = 0, 1
    for ch in params:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count


def exported_meta_functions(lib_dir: Path) -> dict[str, set[int]]:
    """at::meta functions libtorch_cpu exports: name -> parameter counts. Headers declare some
    that the library does not define, so a declaration alone is not enough."""
    global _meta_symbols
    if _meta_symbols is None:
        _meta_symbols = {}
        try:
            out = subprocess.run(
                ["nm", "-DC", "--defined-only", str(lib_dir / "libtorch_cpu.so")],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"gen_accel: cannot list libtorch_cpu symbols ({e}); the underlying tier uses "
                  "the dispatcher's meta kernels", file=sys.stderr)  # fmt: skip
            out = ""
        for m in re.finditer(r" at::meta::(\w+)\((.*)\)\s*$", out, re.MULTILINE):
            _meta_symbols.setdefault(m.group(1), set()).add(_arity(m.group(2)))
    return _meta_symbols


def meta_function(f: Any, include_dir: Path, lib_dir: Path) -> tuple[str, str]:
    """(header, C++ statements) calling the C++ meta function of `f` on a boxed stack.

    PyTorch overrides many Meta kernels with Python ones (torch/_meta_registrations.py), which
    cost tens of microseconds per call; the structured C++ meta functions (at::meta::*) compute
    the same result shapes in a few. Empty if `f` has none.
    """
    from torchgen import local
    from torchgen.api import unboxing
    from torchgen.api.types import CppSignatureGroup

    header = f"{f.root_name}_meta_dispatch.h"
    if header not in _meta_headers:
        path = include_dir / "ATen" / "ops" / header
        _meta_headers[header] = (
            [
                _norm_decl(line)
                for line in path.read_text().splitlines()
                if line.startswith("TORCH_API")
            ]
            if path.exists()
            else []
        )
    with local.parametrize(
        use_const_ref_for_mutable_tensors=f.use_const_ref_for_mutable_tensors,
        use_ilistref_for_tensor_lists=f.part_of_structured_group,
    ):
        sig = CppSignatureGroup.from_native_function(f, method=False).most_faithful_signature()
        if _norm_decl(sig.decl()) not in _meta_headers[header]:
            return "", ""
        bindings, code = unboxing.convert_arguments(f)
        if len(bindings) not in exported_meta_functions(lib_dir).get(sig.name(), set()):
            return "", ""
    n = len(bindings)
    args = ", ".join(b.name for b in bindings)
    body = [line for line in code if line.strip()]
    body = [line.replace("peek(stack,", "torch::jit::peek(*stack,") for line in body]
    call = f"at::meta::{sig.name()}({args})"
    if f.func.returns:
        body += [f"auto result_ = {call};", f"torch::jit::drop(*stack, {n});",
                 "torch::jit::pack(*stack, std::move(result_));"]  # fmt: skip
    else:
        body += [f"{call};", f"torch::jit::drop(*stack, {n});"]
    return f"ATen/ops/{header}", "\n  ".join(body)


def same_inputs(functional: Any, out: Any) -> bool:
    """The out= variant takes the functional arguments (plus its outputs)."""
    a = [(x.name, str(x.type)) for x in functional.func.arguments.flat_all]
    b = [
        (x.name, str(x.type))
        for x in out.func.arguments.flat_all
        if x not in out.func.arguments.out
    ]
    return a == b


def members_of(op: str, nf: NativeFunctions) -> dict[str, Any]:
    """The functional, inplace, mutable and out forms of the group `op` belongs to (or just
    `op`). A mutable form writes an argument that is not `self` (rrelu_with_noise's noise)."""
    group = nf.groups.get(op)
    if group is None:
        return {"functional": nf.functions[op]}
    members = {
        "functional": group.functional,
        "inplace": group.inplace,
        "mutable": group.mutable,
        "out": group.out,
    }
    return {k: v for k, v in members.items() if v is not None}


def linked_variants(
    v: str, f: Any, members: dict[str, Any], run_out: bool, cpu_op: str
) -> tuple[str, str]:
    """(out_variant, functional) of an underlying registration of form `v` of an operator.

    Kernels returning several Tensor& must not be called boxed with the only references to
    their outputs on the stack: PyTorch's boxing wrapper keeps the returned references and drops
    the arguments they refer to first. So a functional form runs its out= form only when that
    has a single output, and an out= form with several outputs runs the functional form and
    copies into its outputs. A functional form is known to compute what its out= form computes
    when it is the structured delegate of it, or when the entry says so (`run_out`:
    out_equivalent, the functional kernel is written as a call of the out= kernel); mse_loss.out,
    for one, reduces differently from mse_loss.
    """
    out_variant = ""
    functional = ""
    if (
        v == "functional"
        and not cpu_op
        and "out" in members
        and (run_out or f.structured_delegate == members["out"].func.name)
        and same_inputs(f, members["out"])
        and len(members["out"].func.returns) == 1
    ):
        out_variant = "aten::" + str(members["out"].func.name)
    if (
        v == "out"
        and len(f.func.returns) > 1
        and "functional" in members
        and same_inputs(members["functional"], f)
    ):
        functional = "aten::" + str(members["functional"].func.name)
    return out_variant, functional
