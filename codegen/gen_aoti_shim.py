"""Generates accel's C shim for Inductor's C++ wrapper and AOTInductor (``c_shim_accel``).

Inductor's C++ wrapper calls each extern kernel it knows (torchgen's ``inductor_fallback_ops``:
mm, convolution, sort, ...) through a C function named for the device, ``aoti_torch_<device>_
<op>``; libtorch carries them for cpu, cuda, xpu and mps. accel's are generated here with
torchgen, from the same list and the same signatures, each calling the operator through the
dispatcher (``at::<op>``), so the call reaches accel's registration and runs in stream order as
an eager call does. Their header is what the generated code includes; the definitions are
compiled into libtorch_accel.

    python codegen/gen_aoti_shim.py --out-dir build/generated/aoti
"""

from __future__ import annotations

import argparse
from pathlib import Path

PREFIX = "aoti_torch_accel_"


def generate() -> tuple[str, str]:
    """(header, source) of accel's C shim."""
    import torchgen
    from torchgen.aoti.fallback_ops import inductor_fallback_ops
    from torchgen.gen import get_grouped_native_functions, parse_native_yaml
    from torchgen.gen_aoti_c_shim import gen_aoti_c_shim, get_fallback_op_name
    from torchgen.model import NativeFunctionsGroup

    root = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native"
    parsed = parse_native_yaml(str(root / "native_functions.yaml"), str(root / "tags.yaml"))
    delegates = {}
    for group in get_grouped_native_functions(parsed.native_functions):
        if isinstance(group, NativeFunctionsGroup):
            for f in group.functions():
                if f.structured_delegate is not None:
                    delegates[f.structured_delegate] = group
                    break
    chosen = {}
    for f in parsed.native_functions:
        name = get_fallback_op_name(f)
        if name in inductor_fallback_ops:
            chosen[name] = f
    functions = tuple(f for _, f in sorted(chosen.items()))
    missing = sorted(set(inductor_fallback_ops) - set(chosen))
    if missing:
        raise SystemExit(f"gen_aoti_shim: no native function for {', '.join(missing)}")

    # Per-operator headers (torchgen writes them only for a dispatch key's shim).
    includes = "\n".join(sorted({f"#include <ATen/ops/{f.root_name}.h>" for f in functions}))

    def render(header: bool) -> str:
        # dispatch_key None: torchgen's device-generic shim ("aten"), each op called as at::<op>.
        text = gen_aoti_c_shim(
            functions,
            inductor_fallback_ops,
            delegates,
            None,
            parsed.backend_indices,
            header=header,
            extend_aoti_c_shim=False,
            includes=includes,
        )
        text = text.replace(_ATEN_LIST_NOTE, _NOTE).replace("aoti_torch_aten_", PREFIX)
        if not header:
            text = _call_methods_through_ops(text, functions)
        text = text.replace("#ifndef AT_PER_OPERATOR_HEADERS", "#if 0", 1)
        return text.replace(
            "<torch/csrc/inductor/aoti_torch/generated/c_shim_aten.h>", '"c_shim_accel.h"'
        )

    return render(True), render(False)


def _call_methods_through_ops(text: str, functions: tuple) -> str:  # type: ignore[type-arg]
    """Operators with only a method variant (``bernoulli_``, ``set_``, ``to_sparse``) have no
    ``at::<op>`` function: their shims call ``at::_ops::<op>::call`` (the same arguments)."""
    from torchgen.api.types import CppSignatureGroup
    from torchgen.gen_aoti_c_shim import get_fallback_op_name
    from torchgen.model import Variant

    for f in functions:
        if Variant.function in f.variants:
            continue
        name = CppSignatureGroup.from_native_function(f, method=False).signature.name()
        start = text.index(f"AOTITorchError {PREFIX}{shim_name(get_fallback_op_name(f))}(")
        end = text.index("\n}\n", start)
        if "at::symint::" in text[start:end]:  # torchgen's own call for symint methods
            continue
        body = text[start:end].replace(
            f"at::{name}(", f"at::_ops::{f.func.name.unambiguous_name()}::call(", 1
        )
        if body == text[start:end]:
            raise SystemExit(f"gen_aoti_shim: no call of at::{name} in its shim")
        text = text[:start] + body + text[end:]
    return text


def shim_name(op: str) -> str:
    """aten.bernoulli_.float -> bernoulli__float; aten.mm.default -> mm."""
    base, _, overload = op.removeprefix("aten.").partition(".")
    return base if overload == "default" else f"{base}_{overload}"


_ATEN_LIST_NOTE = (
    "// This file corresponds to the aten_shimified_ops list in torchgen/aoti/fallback_ops.py"
)
_NOTE = (
    "// accel's C shim (codegen/gen_aoti_shim.py): torchgen's inductor_fallback_ops, each op\n"
    "// called through the dispatcher."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args()
    header, source = generate()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("c_shim_accel.h", header), ("c_shim_accel.cpp", source)):
        path = args.out_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


if __name__ == "__main__":
    main()
