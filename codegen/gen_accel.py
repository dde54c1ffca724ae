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
from own_ops import EntryError, OwnOperator, expand_own
from render_registrations import (
    DTYPES,
    TIERS,
    Registration,
    render_cpp,
    render_docs,
)

DRIVERS = ("host", "cuda", "level_zero")
VARIANTS = ("functional", "inplace", "mutable", "out")
KEYS = {
    "op", "tier", "kernel", "variants", "drivers", "dtypes", "cpu_op", "sync", "metadata_only",
    "out_equivalent", "structured_meta", "into", "widen", "cuda_like", "cuda_like_when",
    "contiguous_results", "meta", "meta_inplace", "reason",
}  # fmt: skip


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


def default_registrations(
    nf: NativeFunctions, listed: set[str], torch_dir: Path
) -> list[Registration]:
    """Every operator the yaml does not list that has a CPU kernel runs underlying on the host
    driver, and on cuda if it has a CUDA kernel: views and implicit composites excepted
    (PyTorch decomposes those into other operators, autograd included; views alias, and the
    fallback computes them from metadata). An explicit composite with a CPU kernel of its own
    (addr, native_layer_norm) runs that kernel, as on the CPU, rather than its decomposition.
    Functional and in-place forms of structured operators (isin, upsampling, special functions)
    get their C++ meta function, as listed ones do: their first calls of a signature compute
    into accel memory, and new shapes of a known family do not wait (csrc/aten/underlying.cpp).
    out= forms keep the CPU kernel's own call (mse_loss.out's meta is not its final shape)."""
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
        meta_header, meta = (
            meta_function(f, torch_dir / "include", torch_dir / "lib")
            if v in ("functional", "inplace")
            else ("", "")
        )
        out.append(
            Registration(
                name,
                tiers,
                out_variant=out_variant,
                functional=functional,
                entry="(default)",
                meta=meta,
                meta_header=meta_header,
            )
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
    meta_fn = entry.get("meta", "")
    meta_inplace_fn = entry.get("meta_inplace", "")
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
    check_function_name("meta", meta_fn)
    check_function_name("meta_inplace", meta_inplace_fn)
    if (meta_fn or meta_inplace_fn) and tier != "underlying":
        raise EntryError("'meta' and 'meta_inplace' apply to underlying operators")
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
    if meta_inplace_fn and "inplace" not in variants:
        raise EntryError("'meta_inplace': the entry registers no in-place variant")
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
        own_meta = {"functional": meta_fn, "inplace": meta_inplace_fn}.get(v, "")
        if own_meta:
            if meta_body:
                key = "meta" if v == "functional" else "meta_inplace"
                raise EntryError(f"'{key}': the operator has a structured C++ meta function")
            meta_body = f"{own_meta}(stack);"
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
                meta_function=own_meta,
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
    regs += default_registrations(nf, set(seen), Path(args.torch_dir))
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
