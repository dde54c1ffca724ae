"""Generates accel's operator registrations and docs/ops.md from yaml/accel_functions.yaml.

Every entry names an ATen operator and its tier. Operator schemas, in-place and out= variants
and C++ signatures come from PyTorch's own native_functions.yaml (through torchgen), so one
entry covers the functional, in-place and out= forms of an operator and a native kernel with
the wrong signature fails to compile. accel's own operators (`op: accel::<name>`) carry their
schema in the entry; they are defined in the `accel` namespace (torch.ops.accel) with their
kernel for accel tensors, and for CPU tensors where the entry says `cpu: true`. A malformed
entry fails the build with a message naming the entry.

    python codegen/gen_accel.py --yaml yaml/accel_functions.yaml --out-dir build/generated \
        --docs docs/ops.md --torch-dir <site-packages>/torch
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from native_functions import (
    COMPOSITE_KEYS,
    IMPLICIT_KEYS,
    UNDERLYING_KEY,
    NativeFunctions,
    dispatcher_type,
    is_view,
    linked_variants,
    load_native_functions,
    members_of,
    meta_function,
    returns_new_or_written_tensors,
    same_inputs,
    signature,
)
from own_ops import EntryError, OwnOperator, cpp_string, expand_own, render_own, render_own_docs

TIERS = ("native", "underlying", "cpu_fallback", "error")
DRIVERS = ("host", "cuda", "level_zero")
VARIANTS = ("functional", "inplace", "mutable", "out")
KEYS = {
    "op", "tier", "kernel", "variants", "drivers", "dtypes", "cpu_op", "sync", "metadata_only",
    "out_equivalent", "structured_meta", "into", "widen", "cuda_like", "cuda_like_when",
    "contiguous_results", "reason",
}  # fmt: skip
# c10::ScalarType values.
DTYPES = {
    "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
    "float64": 7, "complex32": 8, "complex64": 9, "complex128": 10, "bool": 11, "bfloat16": 15,
}  # fmt: skip
CPP_TIER = {
    "native": "Tier::Native",
    "underlying": "Tier::Underlying",
    "cpu_fallback": "Tier::CpuFallback",
    "error": "Tier::Error",
}


@dataclass
class Registration:
    """One registered operator (an entry expands to up to three: its variants)."""

    name: str  # "add.Tensor"
    tiers: dict[str, str]
    kernel: str = ""
    cpu_op: str = ""
    out_variant: str = ""
    functional: str = ""  # out= forms with several outputs: the functional form to run
    meta: str = ""  # C++ body of a function computing the results on meta tensors ("" = none)
    meta_header: str = ""
    sync: bool = False
    metadata_only: bool = False
    contiguous_results: bool = False  # results contiguous, whatever layout the CPU kernel chose
    dtypes: list[str] = field(default_factory=list)
    reason: str = ""
    signature: str = ""  # native: the C++ declaration
    typed: str = ""  # underlying: the C++ function type of its typed entry ("" = boxed only)
    entry: str = ""  # the yaml entry it comes from (for docs)
    into: str = ""  # underlying functional/mutable form: the task function writing the results
    widen: dict[str, str] = field(default_factory=dict)  # dtype the CPU lacks: dtype it runs in
    cuda_like: str = ""  # function handling calls CUDA's kernel takes and the CPU's refuses
    cuda_like_when: str = ""  # whether cuda_like acts on a call ("": it may act on any)


# Operators whose CPU kernels make tensors accel cannot hold (quantized, mkldnn) or nested ones:
# they are left to the CPU fallback, which refuses the former with the reason and runs the
# latter on accel memory (csrc/aten/fallback.cpp, direct_call.cpp).
NOT_DENSE_PREFIXES = (
    "to_mkldnn", "quantize_per", "_make_per_", "_nested", "fbgemm_", "_fbgemm",
)  # fmt: skip
# Dense-argument operators that make sparse tensors: the fallback runs the CPU's kernel on accel
# memory and makes its sparse result an accel one (csrc/aten/sparse.cpp, direct_call.cpp).
SPARSE_MAKERS = ("to_sparse", "_to_sparse")
# Sparse tensors' structural operators, registered for accel's sparse keys with ATen's own
# device-independent kernels in csrc/aten/sparse.cpp.
SPARSE_STRUCTURAL = {"_sparse_coo_tensor_with_dims", "_sparse_coo_tensor_with_dims_and_tensors"}


def unregistered(nf: NativeFunctions, registered: set[str]) -> list[tuple[str, str]]:
    """Operators with kernels of their own in PyTorch (not views, not composite) that accel
    registers nothing for, and what happens when they are called on accel."""
    out = []
    for name, f in sorted(nf.functions.items()):
        keys = nf.kernels[name]
        if name in registered or is_view(f) or keys & COMPOSITE_KEYS:
            continue
        dense = {k for k in keys if not k.startswith(("Sparse", "Quantized", "Nested", "Mkldnn"))}
        if not dense:
            continue  # kernels for sparse/quantized/nested tensors only (see direct_call.cpp)
        if name.startswith("_nested"):
            why = "runs on accel memory through the nested-tensor path (csrc/aten/direct_call.cpp)"
        elif name in SPARSE_STRUCTURAL:
            why = "ATen's own kernel, registered for accel's sparse keys (csrc/aten/sparse.cpp)"
        elif name.startswith(SPARSE_MAKERS) and "CPU" in dense:
            why = "makes sparse tensors: the executor device's kernel on accel memory (sparse.cpp)"
        elif name.startswith(NOT_DENSE_PREFIXES):
            why = "makes tensors accel cannot hold (quantized, mkldnn): refused"
        else:
            why = f"no CPU kernel (PyTorch has {', '.join(sorted(dense))}): refused"
        out.append((name, why))
    return out


def default_registrations(nf: NativeFunctions, listed: set[str]) -> list[Registration]:
    """Every operator the yaml does not list that has a CPU kernel runs underlying on the host
    driver, and on cuda if it has a CUDA kernel: views and implicit composites excepted
    (PyTorch decomposes those into other operators, autograd included; views alias, and the
    fallback computes them from metadata). An explicit composite with a CPU kernel of its own
    (addr, native_layer_norm) runs that kernel, as on the CPU, rather than its decomposition."""
    out = []
    for name, f in sorted(nf.functions.items()):
        keys = nf.kernels[name]
        if name in listed or is_view(f) or keys & IMPLICIT_KEYS:
            continue
        if keys & COMPOSITE_KEYS and UNDERLYING_KEY["host"] not in keys:
            continue
        if name.startswith(NOT_DENSE_PREFIXES + SPARSE_MAKERS):
            continue
        tiers = {
            d: "underlying" if UNDERLYING_KEY.get(d) in keys else "cpu_fallback" for d in DRIVERS
        }
        # Only operators the host driver runs: the fallback explains what has no CPU kernel.
        if tiers["host"] != "underlying":
            continue
        members = members_of(name, nf)
        v = next((k for k, m in members.items() if m is f), "")  # "": a mutable form
        out_variant, functional = linked_variants(v, f, members, False, "")
        out.append(
            Registration(
                name, tiers, out_variant=out_variant, functional=functional, entry="(default)"
            )  # fmt: skip
        )
    return out


def check_function_name(key: str, value: Any) -> None:
    """Raises unless `value` (the entry's `key`, if given) names a C++ function in accel::aten."""
    if value and not re.fullmatch(r"[A-Za-z_]\w*", str(value)):
        raise EntryError(f"'{key}' must name a C++ function in accel::aten, not {value!r}")


def expand(entry: dict[str, Any], nf: NativeFunctions, torch_dir: Path) -> list[Registration]:
    functions = nf.functions
    unknown = set(entry) - KEYS
    if unknown:
        raise EntryError(f"unknown key(s) {sorted(unknown)}; known keys: {sorted(KEYS)}")
    op = entry.get("op")
    if not isinstance(op, str) or not op:
        raise EntryError("missing 'op'")
    if op not in functions:
        raise EntryError(f"unknown operator '{op}' (not in PyTorch's native_functions.yaml)")
    tier = entry.get("tier")
    if tier not in TIERS:
        raise EntryError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
    drivers = entry.get("drivers", {}) or {}
    if not isinstance(drivers, dict):
        raise EntryError("'drivers' must map driver names to tiers")
    for d, t in drivers.items():
        if d not in DRIVERS:
            raise EntryError(f"unknown driver '{d}'; use one of {', '.join(DRIVERS)}")
        if t not in TIERS or t == "native":
            raise EntryError(f"driver '{d}': tier must be underlying, cpu_fallback or error")
    tiers = {d: drivers.get(d, tier) for d in DRIVERS}
    dtypes = entry.get("dtypes", []) or []
    for dt in dtypes:
        if dt not in DTYPES:
            raise EntryError(f"unknown dtype '{dt}'; use one of {', '.join(DTYPES)}")
    kernel = entry.get("kernel", "")
    cpu_op = entry.get("cpu_op", "")
    sync = bool(entry.get("sync", False))
    metadata_only = bool(entry.get("metadata_only", False))
    contiguous_results = bool(entry.get("contiguous_results", False))
    if contiguous_results and tier != "underlying":
        raise EntryError("'contiguous_results' applies to underlying operators")
    out_equivalent = bool(entry.get("out_equivalent", False))
    structured_meta = bool(entry.get("structured_meta", True))
    into = entry.get("into", "")
    widen = entry.get("widen", {}) or {}
    if not isinstance(widen, dict):
        raise EntryError("'widen' must map dtypes to the dtypes they are computed in")
    for a, b in widen.items():
        if a not in DTYPES or b not in DTYPES:
            raise EntryError(f"widen: unknown dtype in {a}: {b}; use {', '.join(DTYPES)}")
        if b in widen:
            raise EntryError(f"widen: {b} is widened itself")
    if widen and tier != "underlying":
        raise EntryError("'widen' applies to underlying operators")
    cuda_like = entry.get("cuda_like", "")
    if cuda_like and tier != "underlying":
        raise EntryError("'cuda_like' applies to underlying operators")
    check_function_name("cuda_like", cuda_like)
    cuda_like_when = entry.get("cuda_like_when", "")
    if cuda_like_when and not cuda_like:
        raise EntryError("'cuda_like_when' says when the 'cuda_like' function acts: give both")
    check_function_name("cuda_like_when", cuda_like_when)
    if sync and metadata_only:
        raise EntryError("'sync' and 'metadata_only' exclude each other")
    reason = entry.get("reason", "")

    if tier == "native":
        if not kernel:
            raise EntryError("a native operator needs 'kernel' (the C++ function implementing it)")
        if entry.get("variants") not in (None, ["functional"]):
            raise EntryError(
                "a native entry registers exactly its operator; list variants separately"
            )
        if dtypes or cpu_op or sync or metadata_only or out_equivalent:
            raise EntryError(
                "'dtypes', 'cpu_op', 'sync', 'metadata_only' and 'out_equivalent' apply to "
                "underlying operators"
            )
        if not structured_meta or into:
            raise EntryError("'structured_meta' and 'into' apply to underlying operators")
        f = functions[op]
        # `drivers` may give other drivers another tier (CUDA's own kernel where the host's is
        # an accel kernel): the registration then chooses per driver at run time.
        return [Registration(op, tiers, kernel=kernel, signature=signature(f, kernel),
                             entry=op, reason=entry.get("reason", ""))]  # fmt: skip
    if kernel:
        raise EntryError("'kernel' is only for the native tier")
    if tier in ("error", "cpu_fallback") and not reason:
        article = "an" if tier == "error" else "a"
        raise EntryError(f"{article} {tier} entry needs a 'reason' users will read")
    if tier != "underlying" and (not structured_meta or into):
        raise EntryError("'structured_meta' and 'into' apply to underlying operators")
    check_function_name("into", into)
    if into and cpu_op:
        raise EntryError("'into' and 'cpu_op' exclude each other")
    if tier != "underlying" and (cpu_op or sync or metadata_only or dtypes or out_equivalent):
        raise EntryError(
            "'cpu_op', 'sync', 'metadata_only', 'dtypes' and 'out_equivalent' apply to "
            "underlying operators"
        )
    if is_view(functions[op]):
        raise EntryError("view operators must be native (they alias storage)")

    members = members_of(op, nf)
    # A cpu_op runs in place of the functional form only.
    variants = entry.get("variants", ["functional"] if cpu_op else list(members))
    for v in variants:
        if v not in VARIANTS:
            raise EntryError(f"unknown variant '{v}'; use functional, inplace or out")
        if v not in members:
            raise EntryError(f"'{op}' has no {v} variant")
    if out_equivalent:
        fn, fo = members.get("functional"), members.get("out")
        if fn is None or fo is None or not same_inputs(fn, fo) or len(fo.func.returns) != 1:
            raise EntryError("'out_equivalent' needs a functional form and a one-output out= form")
        if fn.structured_delegate == fo.func.name:
            raise EntryError("'out_equivalent' is implied: the functional form is structured")
        if cpu_op:
            raise EntryError("'out_equivalent' and 'cpu_op' exclude each other")
    if cpu_op:
        if cpu_op not in functions:
            raise EntryError(f"unknown cpu_op '{cpu_op}'")
        if variants != ["functional"]:
            raise EntryError("'cpu_op' replaces the functional form only (variants: [functional])")
        a = [(x.name, str(x.type)) for x in functions[op].func.arguments.flat_all]
        b = [(x.name, str(x.type)) for x in functions[cpu_op].func.arguments.flat_all]
        if a != b:
            raise EntryError(f"cpu_op '{cpu_op}' takes other arguments than '{op}'")

    out: list[Registration] = []
    for v in variants:
        f = members[v]
        shape_f = functions[cpu_op] if cpu_op else f
        meta_header, meta_body = (
            meta_function(shape_f, torch_dir / "include", torch_dir / "lib")
            if structured_meta
            else ("", "")
        )
        name = str(f.func.name)
        out_variant, functional = ("", "")
        if "underlying" in tiers.values():
            out_variant, functional = linked_variants(v, f, members, out_equivalent, cpu_op)
        if not structured_meta:
            out_variant = ""  # the meta shape is not final: never run the out= form
        out.append(
            Registration(
                name,
                tiers,
                cpu_op=("aten::" + cpu_op) if cpu_op else "",
                out_variant=out_variant,
                functional=functional,
                sync=sync,
                metadata_only=metadata_only,
                contiguous_results=contiguous_results,
                meta=meta_body,
                meta_header=meta_header,
                into=into if v in ("functional", "mutable") else "",
                widen=dict(widen),
                cuda_like=str(cuda_like),
                cuda_like_when=str(cuda_like_when),
                dtypes=list(dtypes),
                reason=reason,
                entry=op,
            )  # fmt: skip
        )
    return out


def typed_entry(r: Registration, nf: NativeFunctions) -> str:
    """The C++ function type of the typed entry of an underlying operator that can run
    asynchronously (csrc/aten/typed_kernel.h: its tensor arguments are not copied), else ""."""
    f = nf.functions[r.name]
    if r.kernel or "underlying" not in (r.tiers["host"], r.tiers["cuda"]):
        return ""
    if r.sync or r.metadata_only or not returns_new_or_written_tensors(f):
        return ""
    return dispatcher_type(f)


def write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def typed_parts_of(boxed: list[Registration], parts: int) -> list[list[int]]:
    """The indices (in `boxed`) of the typed registrations, split into `parts` groups for files
    of their own: each signature's registrations in one group (its template instances are
    compiled once), the groups balanced by signatures, then registrations. In RegisterAccel.cpp
    they took 3m54s of one core, nine times any other file of the build, and set its time on a
    machine with many cores; in eight files 26 to 29 s each (37 s for RegisterAccel.cpp)."""
    by_signature: dict[str, list[int]] = {}
    for i, r in enumerate(boxed):
        if r.typed:
            by_signature.setdefault(r.typed, []).append(i)
    groups: list[list[int]] = [[] for _ in range(max(parts, 1))]
    load = [0.0] * len(groups)
    for _, members in sorted(by_signature.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        k = min(range(len(groups)), key=lambda j: (load[j], j))
        groups[k] += members
        load[k] += 1 + 0.2 * len(members)
    return [sorted(g) for g in groups]


def render_typed_part(boxed: list[Registration], indices: list[int], k: int, n: int) -> str:
    lines = [
        "// Generated by codegen/gen_accel.py from yaml/accel_functions.yaml. Do not edit.",
        f"// Typed entries of underlying operators (csrc/aten/typed_kernel.h), part {k + 1} of",
        f"// {n}: their template instances compile in files of their own, side by side.",
    ]
    if not indices:
        return "\n".join(lines + ["// (none in this part)", ""])
    lines += [
        "#include <torch/library.h>",
        "",
        '#include "aten/typed_kernel.h"',
        '#include "aten/underlying.h"',
        "",
        "namespace accel::aten {",
        "",
        "extern const OpConfig kOperatorConfigs[];  // RegisterAccel.cpp",
        "",
        "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {",
    ]
    for i in indices:
        r = boxed[i]
        lines.append(
            f"  m.impl({cpp_string(r.name)}, make_typed_kernel<{r.typed}>(kOperatorConfigs[{i}]));"
        )
    lines += ["}", "", "}  // namespace accel::aten", ""]
    return "\n".join(lines)


def render_cpp(
    regs: list[Registration], own: list[OwnOperator], parts: int = 1
) -> tuple[str, str, list[str]]:
    """The header of native kernels, RegisterAccel.cpp, and the `parts` files of typed
    entries."""
    header = [
        "// Generated by codegen/gen_accel.py from yaml/accel_functions.yaml. Do not edit.",
        "// The native kernels, declared with the dispatcher signatures of their operators.",
        "#pragma once",
        "",
        "#include <ATen/core/Tensor.h>",
        "#include <ATen/core/stack.h>",
        "",
        "#include <vector>",
        "",
        "namespace c10 {",
        "class OperatorHandle;",
        "}  // namespace c10",
        "",
        "namespace accel::aten {",
    ]
    header += [f"{r.signature};" for r in regs if r.kernel]
    header += [f"{o.signature};" for o in own]
    header += [
        f"void {r.into}(torch::jit::Stack& args, const std::vector<at::Tensor>& results);"
        for r in regs
        if r.into
    ]
    header += [
        f"bool {name}(const c10::OperatorHandle& op, torch::jit::Stack* stack);"
        for name in sorted({r.cuda_like for r in regs if r.cuda_like})
    ]
    header += [
        f"bool {name}(const c10::OperatorHandle& op, const torch::jit::Stack& stack);"
        for name in sorted({r.cuda_like_when for r in regs if r.cuda_like_when})
    ]
    header += ["}  // namespace accel::aten", ""]

    # Boxed kernels: every non-native operator, and native ones another driver runs otherwise.
    boxed = [r for r in regs if not r.kernel or set(r.tiers.values()) != {"native"}]
    headers = sorted({r.meta_header for r in boxed if r.meta_header})
    cpp = [
        "// Generated by codegen/gen_accel.py from yaml/accel_functions.yaml. Do not edit.",
        "#include <ATen/core/stack.h>",
        "#include <torch/library.h>",
        "",
        *[f"#include <{h}>" for h in headers],
        "",
        '#include "AccelNativeFunctions.h"',
        '#include "aten/underlying.h"',
        "",
        "namespace accel::aten {",
        "namespace {",
        "",
        "using torch::jit::Stack;",
        "",
    ]
    for i, r in enumerate(boxed):
        if r.meta:
            cpp += [f"// {r.name}", f"void meta_{i}(Stack* stack) {{", f"  {r.meta}", "}", ""]
        if r.widen:
            pairs = ", ".join(f"{DTYPES[a]}, {DTYPES[b]}" for a, b in r.widen.items())
            cpp += [f"const int8_t widen_{i}[] = {{{pairs}, -1}};  // {r.name}", ""]
    cpp += [
        "}  // namespace",
        "",
        "// The configurations, by index; the typed entries' files refer to them.",
        "extern const OpConfig kOperatorConfigs[];",
        "constinit const OpConfig kOperatorConfigs[] = {",
    ]
    for i, r in enumerate(boxed):
        mask = sum(1 << DTYPES[d] for d in r.dtypes)
        meta = f"&meta_{i}" if r.meta else "nullptr"
        t = r.tiers
        cpp.append(
            f"    {{{cpp_string('aten::' + r.name)}, {CPP_TIER[t['host']]}, "
            f"{CPP_TIER[t['cuda']]}, {CPP_TIER[t['level_zero']]}, {cpp_string(r.cpu_op)}, "
            f"{cpp_string(r.out_variant)}, {cpp_string(r.functional)}, "
            f"{'true' if r.sync else 'false'}, "
            f"{'true' if r.metadata_only else 'false'}, "
            f"{'true' if r.contiguous_results else 'false'}, {mask}ull, {meta}, "
            f"{'&' + r.into if r.into else 'nullptr'}, "
            f"{f'widen_{i}' if r.widen else 'nullptr'}, "
            f"{'&' + r.cuda_like if r.cuda_like else 'nullptr'}, "
            f"{'&' + r.cuda_like_when if r.cuda_like_when else 'nullptr'}, "
            f"{cpp_string(r.reason)}}},"
        )
    if not boxed:
        # C++ has no empty arrays: one unused entry.
        tiers = ", ".join(["Tier::CpuFallback"] * 3)
        cpp.append(
            f'    {{"", {tiers}, "", "", "", false, false, false, 0ull, nullptr, nullptr, nullptr, '
            'nullptr, nullptr, ""}},'
        )
    cpp += ["};", "", "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {"]
    boxed_ids = {id(r) for r in boxed}
    for r in regs:
        if r.kernel and id(r) not in boxed_ids:
            cpp.append(f"  m.impl({cpp_string(r.name)}, TORCH_FN(accel::aten::{r.kernel}));")
    for i, r in enumerate(boxed):
        if r.typed:
            continue  # in the typed entries' files
        native = (
            f", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(accel::aten::{r.kernel}))"
            if r.kernel
            else ""
        )
        cpp.append(f"  m.impl({cpp_string(r.name)}, make_kernel(kOperatorConfigs[{i}]{native}));")
    cpp += ["}", "", "}  // namespace accel::aten"]
    cpp += render_own(own)
    groups = typed_parts_of(boxed, parts)
    parts = [render_typed_part(boxed, g, k, len(groups)) for k, g in enumerate(groups)]
    return "\n".join(header), "\n".join(cpp + [""]), parts


def render_docs(
    regs: list[Registration], missing: list[tuple[str, str]], own: list[OwnOperator]
) -> str:
    counts = {t: sum(1 for r in regs if r.tiers["host"] == t) for t in TIERS}
    lines = [
        "# Operator coverage",
        "",
        "Generated by `codegen/gen_accel.py` from `yaml/accel_functions.yaml` at build time;",
        "do not edit. Tiers (see DESIGN.md): **native** (an own kernel), **underlying** (the",
        "ATen kernel of the device underneath, run on accel memory without copying, in stream",
        "order), **cpu_fallback** (inputs copied to the CPU and results back), **error**",
        "(refused, with the reason). Every operator with a kernel of the device underneath (CPU",
        "for `host`, CUDA for `cuda`) is underlying unless the yaml says otherwise (`default`",
        "in the notes); views are computed from metadata and alias accel memory; composite",
        "operators decompose into these. Operators listed nowhere take the CPU fallback. The",
        "`cuda` column is the tier on the cuda driver, whose executor runs ATen's CUDA kernels",
        "on accel memory in accel stream order (`csrc/aten/executor.h`): written and built, but",
        "it has not run on a GPU yet.",
        "The `level_zero` driver does not exist yet; its column shows the tier declared.",
        "",
        f"Registered operators: {len(regs)} ({counts['native']} native, {counts['underlying']} "
        f"underlying, {counts['cpu_fallback']} cpu_fallback, {counts['error']} error on the host "
        "driver).",
        "",
    ]
    lines += render_own_docs(own)
    declined = [r for r in regs if r.tiers["host"] in ("cpu_fallback", "error")]
    if declined:
        lines += ["## What does not run underlying on the host driver, and why", ""]
        lines += [f"- `{r.name}` ({r.tiers['host']}): {r.reason}" for r in declined]
        lines += [""]
    if missing:
        lines += [
            "## Operators accel registers nothing for, and why",
            "",
            "They are not composite (PyTorch does not decompose them), so a call on accel takes",
            "the path named here; on the host driver none of them runs the copying fallback.",
            "",
        ]
        lines += [f"- `{name}`: {why}" for name, why in missing]
        lines += [""]
    lines += [
        "## Every registered operator",
        "",
        "| operator | host | cuda | level_zero | notes |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(regs, key=lambda r: r.name):
        notes = ["default"] if r.entry == "(default)" else []
        if r.kernel:
            notes.append(f"kernel `{r.kernel}`")
        if r.out_variant:
            notes.append(f"runs `{r.out_variant[6:]}`")
        if r.cpu_op:
            notes.append(f"runs `{r.cpu_op[6:]}` on the CPU")
        if r.functional:
            notes.append(f"runs `{r.functional[6:]}` and copies into the outputs")
        if r.into:
            notes.append(f"task `{r.into}` writes the results")
        if r.sync:
            notes.append(
                "synchronizes: a data-dependent result shape, or data checks raised at the call"
            )
        if r.metadata_only:
            notes.append("reads metadata only: runs on the caller")
        if r.contiguous_results:
            notes.append("results contiguous (what PyTorch's meta functions say for accel)")
        if r.dtypes:
            notes.append("dtypes: " + ", ".join(r.dtypes) + " (others: cpu_fallback)")
        if r.widen:
            notes.append("computes " + ", ".join(f"{a} in {b}" for a, b in r.widen.items()))
        if r.cuda_like:
            notes.append(f"`{r.cuda_like}` takes what CUDA's kernel takes and the CPU's does not")
        if r.reason:
            notes.append(r.reason)
        t = r.tiers
        lines.append(
            f"| `{r.name}` | {t['host']} | {t['cuda']} | {t['level_zero']} | {'; '.join(notes)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yaml", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--docs", required=True)
    parser.add_argument("--torch-dir", required=True, help="the installed torch package")
    parser.add_argument(
        "--typed-parts",
        type=int,
        default=8,
        help="how many files the typed entries go into (RegisterAccelTyped<k>.cpp)",
    )
    args = parser.parse_args(argv)

    with open(args.yaml) as fh:
        entries = yaml.safe_load(fh) or []
    if not isinstance(entries, list):
        print(f"{args.yaml}: expected a list of entries", file=sys.stderr)
        return 1
    nf = load_native_functions()
    regs: list[Registration] = []
    own: list[OwnOperator] = []
    seen: dict[str, str] = {}
    errors = []
    for i, entry in enumerate(entries, 1):
        label = entry.get("op", "?") if isinstance(entry, dict) else "?"
        try:
            if not isinstance(entry, dict):
                raise EntryError("each entry must be a mapping with 'op' and 'tier'")
            if str(label).startswith("accel::"):
                if label in seen:
                    raise EntryError(f"'{label}' is already defined")
                seen[label] = label
                own.append(expand_own(entry))
                continue
            for r in expand(entry, nf, Path(args.torch_dir)):
                if r.name in seen:
                    raise EntryError(f"'{r.name}' is already registered by entry '{seen[r.name]}'")
                seen[r.name] = label
                regs.append(r)
        except EntryError as e:
            errors.append(f"{args.yaml}: entry {i} (op: {label}): {e}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    regs += default_registrations(nf, set(seen))
    for r in regs:
        r.typed = typed_entry(r, nf)
    header, cpp, parts = render_cpp(regs, own, args.typed_parts)
    out_dir = Path(args.out_dir)
    write_if_changed(out_dir / "AccelNativeFunctions.h", header)
    write_if_changed(out_dir / "RegisterAccel.cpp", cpp)
    for k, part in enumerate(parts):
        write_if_changed(out_dir / f"RegisterAccelTyped{k}.cpp", part)
    missing = unregistered(nf, {r.name for r in regs})
    write_if_changed(Path(args.docs), render_docs(regs, missing, own))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    sys.exit(main())
