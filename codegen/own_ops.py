"""accel's own operators in yaml/accel_functions.yaml (``op: accel::<name>``): their entries,
the C++ that defines them in the ``accel`` namespace (torch.ops.accel) with their kernels, and
their section of docs/ops.md. Used by gen_accel.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Entries of accel's own operators.
OWN_KEYS = {"op", "schema", "tier", "kernel", "cpu", "doc"}


class EntryError(Exception):
    pass


def cpp_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class OwnOperator:
    """One of accel's own operators (torch.ops.accel.<name>)."""

    name: str  # "rms_norm_rope"
    schema: str  # its schema, without the namespace
    kernel: str
    signature: str  # the C++ declaration of the kernel
    cpu: bool  # the kernel is registered for CPU tensors too
    doc: str


def expand_own(entry: dict[str, Any]) -> OwnOperator:
    from torchgen.api.types import DispatcherSignature
    from torchgen.model import FunctionSchema

    unknown = set(entry) - OWN_KEYS
    if unknown:
        raise EntryError(f"unknown key(s) {sorted(unknown)} for an accel:: operator; known keys: "
                         f"{sorted(OWN_KEYS)}")  # fmt: skip
    name = entry["op"].removeprefix("accel::")
    if entry.get("tier") != "native":
        raise EntryError("accel's own operators are native (tier: native, with their kernel)")
    kernel = entry.get("kernel", "")
    if not isinstance(kernel, str) or not re.fullmatch(r"[A-Za-z_]\w*", kernel):
        raise EntryError("'kernel' must name the C++ function in accel::aten implementing it")
    schema = entry.get("schema", "")
    if not isinstance(schema, str) or not schema:
        raise EntryError("an accel:: operator needs its 'schema'")
    try:
        parsed = FunctionSchema.parse(schema)
    except Exception as e:  # torchgen raises AssertionError and others on bad schemas
        raise EntryError(f"bad schema {schema!r}: {e}") from e
    if str(parsed.name) != name:
        raise EntryError(f"the schema defines '{parsed.name}', not '{name}'")
    signature = DispatcherSignature.from_schema(parsed, symint=False).decl(name=kernel)
    doc = str(entry.get("doc", ""))
    return OwnOperator(name, schema, kernel, signature, bool(entry.get("cpu", False)), doc)


def render_own(own: list[OwnOperator]) -> list[str]:
    """The definitions of accel's own operators and their kernels' registrations."""
    if not own:
        return []
    cpp = ["", "TORCH_LIBRARY(accel, m) {"]
    cpp += [f"  m.def({cpp_string(o.schema)}, {{at::Tag::pt2_compliant_tag}});" for o in own]
    cpp += ["}", "", "TORCH_LIBRARY_IMPL(accel, PrivateUse1, m) {"]
    cpp += [f"  m.impl({cpp_string(o.name)}, TORCH_FN(accel::aten::{o.kernel}));" for o in own]
    cpp += ["}"]
    if any(o.cpu for o in own):
        cpp += ["", "TORCH_LIBRARY_IMPL(accel, CPU, m) {"]
        cpp += [
            f"  m.impl({cpp_string(o.name)}, TORCH_FN(accel::aten::{o.kernel}));"
            for o in own
            if o.cpu
        ]
        cpp += ["}"]
    return cpp


def render_own_docs(own: list[OwnOperator]) -> list[str]:
    if not own:
        return []
    lines = [
        "## accel's own operators",
        "",
        "Defined by accel in the `accel` namespace (`torch.ops.accel.<name>`, Python wrappers in",
        "`torch_accel.ops`), with native kernels of their own.",
        "",
        "| operator | schema | CPU tensors | what it does |",
        "|---|---|---|---|",
    ]
    for o in own:
        cpu = "yes" if o.cpu else "no"
        lines.append(f"| `accel::{o.name}` | `{o.schema}` | {cpu} | {o.doc} |")
    return lines + [""]
