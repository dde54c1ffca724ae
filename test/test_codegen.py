"""codegen/gen_accel.py: registrations and docs from yaml/accel_functions.yaml, and clear errors
for malformed entries (the build runs the same script and stops on its exit status).

The generator runs in this process (its main(), PyTorch's operators parsed once: 3.5 s per run
otherwise), except where its exit status as a script is the subject."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# The generator's output does not depend on the runtime's debug modes (conftest.py).
pytestmark = pytest.mark.config_independent

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "codegen" / "gen_accel.py"
TORCH_DIR = Path(torch.__file__).parent
TYPED_PARTS = 8  # the generator's default, as CMakeLists.txt asks for it


@dataclass
class Generated:
    returncode: int
    stderr: str


def _arguments(tmp_path: Path, text: str) -> list[str]:
    spec = tmp_path / "ops.yaml"
    spec.write_text(text)
    out, docs = tmp_path / "out", tmp_path / "ops.md"
    return ["--yaml", str(spec), "--out-dir", str(out), "--docs", str(docs), "--torch-dir",
            str(TORCH_DIR)]  # fmt: skip


def generate(tmp_path: Path, text: str) -> Generated:
    """The generator's main() on `text` as its yaml."""
    sys.path.insert(0, str(GENERATOR.parent))
    try:
        import gen_accel  # codegen/gen_accel.py
    finally:
        sys.path.remove(str(GENERATOR.parent))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = gen_accel.main(_arguments(tmp_path, text))
    return Generated(code, err.getvalue())


def typed_parts(tmp_path: Path) -> list[str]:
    """The generated files of typed entries, in order."""
    out = tmp_path / "out"
    return [(out / f"RegisterAccelTyped{k}.cpp").read_text() for k in range(TYPED_PARTS)]


def generate_as_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """The generator as the build runs it."""
    return subprocess.run(
        [sys.executable, str(GENERATOR), *_arguments(tmp_path, text)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def generated(tmp_path: Path, text: str) -> tuple[str, str]:
    """AccelNativeFunctions.h and RegisterAccel.cpp generated from the yaml `text`."""
    result = generate(tmp_path, text)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    return (out / "AccelNativeFunctions.h").read_text(), (out / "RegisterAccel.cpp").read_text()


MALFORMED = [
    ("{op: not_an_op, tier: underlying}", "unknown operator 'not_an_op'"),
    ("{op: add.Tensor, tier: fast}", "unknown tier 'fast'"),
    ("{op: empty_strided, tier: native}", "a native operator needs 'kernel'"),
    ("{op: add.Tensor, tier: underlying, speed: 3}", "unknown key(s) ['speed']"),
    ("{op: add.Tensor, tier: underlying, drivers: {tpu: error}}", "unknown driver 'tpu'"),
    ("{op: add.Tensor, tier: underlying, dtypes: [float8]}", "unknown dtype 'float8'"),
    ("{op: add.Tensor, tier: error}", "an error entry needs a 'reason'"),
    ("{op: sub.Tensor, tier: cpu_fallback}", "a cpu_fallback entry needs a 'reason'"),
    ("{op: transpose.int, tier: underlying}", "view operators must be native"),
    ("{op: add.Tensor, tier: underlying, variants: [sideways]}", "unknown variant 'sideways'"),
    ("{op: relu, tier: cpu_fallback, sync: true, reason: x}", "apply to underlying operators"),
    (
        "{op: relu, tier: cpu_fallback, contiguous_results: true, reason: x}",
        "'contiguous_results' applies to underlying operators",
    ),
    ("{op: mm, tier: underlying, cpu_op: add.Tensor}", "takes other arguments"),
    ("{op: nonzero, tier: underlying, sync: true, metadata_only: true}", "exclude each other"),
    ("{op: add.Tensor, tier: underlying, out_equivalent: true}", "'out_equivalent' is implied"),
    ("{op: abs, tier: underlying, cuda_like_when: f}", "says when the 'cuda_like' function acts"),
    ("{op: atan2, tier: underlying, meta: f}", "has a structured C++ meta function"),
    ("{op: abs, tier: cpu_fallback, meta: f, reason: x}", "'meta' and 'meta_inplace' apply"),
    ("{op: atan2_, tier: underlying, meta_inplace: f}", "'meta_inplace': the operator has a"),
    ("{op: where.self, tier: underlying, meta_inplace: f}", "registers no in-place variant"),
    ("{op: masked_fill_.Scalar, tier: underlying, meta_inplace: 'a b'}", "'meta_inplace'"),
    ("add.Tensor", "each entry must be a mapping"),
    ("{op: accel::f, tier: underlying, schema: 'f(Tensor x) -> Tensor'}", "are native"),
    ("{op: accel::g, tier: native, kernel: g}", "needs its 'schema'"),
    ("{op: accel::h, tier: native, kernel: h, schema: 'k(Tensor x) -> Tensor'}", "defines 'k'"),
    ("{op: accel::m, tier: native, kernel: m, schema: 'm(Tensor x) ->'}", "bad schema"),
    ("{op: accel::n, tier: native, kernel: 'a b', schema: 'n(Tensor x) -> Tensor'}", "'kernel'"),
]


def test_malformed_entries_fail_naming_each_entry(tmp_path: Path) -> None:
    # One run reports every malformed entry (the generator checks them all before failing).
    text = "- {op: mul.Tensor, tier: underlying}\n" + "".join(f"- {e}\n" for e, _ in MALFORMED)
    result = generate_as_script(tmp_path, text)  # the status that stops the build
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == len(MALFORMED), result.stderr
    for number, ((_, message), line) in enumerate(zip(MALFORMED, lines, strict=True), 2):
        assert f"entry {number} " in line and message in line, line
    assert not (tmp_path / "out" / "RegisterAccel.cpp").exists()  # nothing half-generated


def test_an_operator_registered_twice_is_an_error(tmp_path: Path) -> None:
    result = generate(
        tmp_path,
        "- {op: add.Tensor, tier: underlying}\n"
        "- {op: add_.Tensor, tier: cpu_fallback, reason: x}\n",
    )
    assert result.returncode == 1
    # An entry covers the operator's whole group: add_.Tensor's includes add.Tensor.
    assert "entry 2 (op: add_.Tensor): 'add.Tensor' is already registered" in result.stderr


def test_one_entry_registers_functional_inplace_and_out(tmp_path: Path) -> None:
    result = generate(
        tmp_path,
        "- {op: add.Tensor, tier: underlying}\n"
        "- {op: relu, tier: underlying, drivers: {cuda: cpu_fallback}}\n"
        "- {op: sum.dim_IntList, tier: error, reason: not yet}\n"
        "- {op: empty_strided, tier: native, kernel: empty_strided}\n",
    )
    assert result.returncode == 0, result.stderr
    cpp = (tmp_path / "out" / "RegisterAccel.cpp").read_text()
    typed_cpp = typed_parts(tmp_path)
    # Underlying operators get a typed entry (csrc/aten/typed_kernel.h) with their dispatcher
    # signature, in front of the boxed kernel; the error tier only the boxed kernel.
    typed = {
        "add.Tensor": "at::Tensor (const at::Tensor &, const at::Tensor &, const at::Scalar &)",
        "add_.Tensor": "at::Tensor & (at::Tensor &, const at::Tensor &, const at::Scalar &)",
        "add.out": "at::Tensor & (const at::Tensor &, const at::Tensor &, const at::Scalar &, "
        "at::Tensor &)",
        "relu": "at::Tensor (const at::Tensor &)",
        "relu_": "at::Tensor & (at::Tensor &)",
    }
    for name, signature in typed.items():
        assert f'm.impl("{name}", make_typed_kernel<{signature}>(' in "".join(typed_cpp), name
        assert f'm.impl("{name}",' not in cpp, name
    assert 'm.impl("sum.dim_IntList", make_kernel(' in cpp
    assert 'm.impl("empty_strided", TORCH_FN(accel::aten::empty_strided));' in cpp
    # The functional add runs its structured out= form straight into the new result.
    assert '"aten::add.Tensor", Tier::Underlying, Tier::Underlying, Tier::Underlying, "", ' in cpp
    assert '"aten::add.out"' in cpp
    header = (tmp_path / "out" / "AccelNativeFunctions.h").read_text()
    assert "empty_strided(" in header
    docs = (tmp_path / "ops.md").read_text()
    assert "| `relu` | underlying | cpu_fallback | underlying |" in docs
    assert "| `sum.dim_IntList` | error | error | error | not yet |" in docs
    assert "| `empty_strided` | native | native | native | kernel `empty_strided` |" in docs


def test_an_entrys_meta_function_is_declared_and_called(tmp_path: Path) -> None:
    # A functional form without a structured meta function may name accel's own (yaml `meta`);
    # operators the yaml does not list get their structured one (functional and in-place).
    header, cpp = generated(
        tmp_path,
        "- {op: _scaled_dot_product_flash_attention_for_cpu, tier: underlying, meta: my_meta}\n"
        "- {op: masked_fill_.Scalar, tier: underlying, meta: fm, meta_inplace: fm_}\n",
    )
    assert "void my_meta(torch::jit::Stack* stack);" in header
    assert "  my_meta(stack);" in cpp
    # The in-place form's own (yaml `meta_inplace`), the functional form's, none for out=.
    for name, function in (
        ("masked_fill_.Scalar", "fm_"),
        ("masked_fill.Scalar", "fm"),
    ):
        assert f"void {function}(torch::jit::Stack* stack);" in header
        meta = cpp.index(f"// {name}\nvoid meta_")
        assert f"  {function}(stack);" in cpp[meta : cpp.index("\n}\n", meta)], name
    assert "// masked_fill.Scalar_out\nvoid meta_" not in cpp
    for name in ("isin.Tensor_Tensor", "upsample_nearest2d", "atan2_"):
        meta = cpp.index(f"// {name}\nvoid meta_")
        assert "at::meta::" in cpp[meta : cpp.index("\n}\n", meta)], name
    assert "// isin.Tensor_Tensor_out\nvoid meta_" not in cpp  # out= forms keep the CPU's call
    assert "result shapes from `my_meta`" in (tmp_path / "ops.md").read_text()


def test_a_native_operator_may_take_another_tier_on_another_driver(tmp_path: Path) -> None:
    # The fused LSTM cell: accel's own kernel on the host, CUDA's kernel underlying on cuda.
    result = generate(
        tmp_path,
        "- {op: _thnn_fused_lstm_cell, tier: native, kernel: _thnn_fused_lstm_cell, "
        "drivers: {cuda: underlying}}\n",
    )
    assert result.returncode == 0, result.stderr
    cpp = (tmp_path / "out" / "RegisterAccel.cpp").read_text()
    assert (
        'm.impl("_thnn_fused_lstm_cell", make_kernel(kOperatorConfigs[0], c10::KernelFunction::'
        "makeFromUnboxedFunction(TORCH_FN(accel::aten::_thnn_fused_lstm_cell))));" in cpp
    )
    assert '"aten::_thnn_fused_lstm_cell", Tier::Native, Tier::Underlying, Tier::Native,' in cpp
    assert "TORCH_FN(accel::aten::_thnn_fused_lstm_cell));" not in cpp  # not registered twice
    docs = (tmp_path / "ops.md").read_text()
    assert "| `_thnn_fused_lstm_cell` | native | underlying | native |" in docs
    bad = generate(
        tmp_path,
        "- {op: empty_strided, tier: native, kernel: empty_strided, drivers: {cuda: native}}\n",
    )
    assert bad.returncode == 1
    assert "driver 'cuda': tier must be underlying, cpu_fallback or error" in bad.stderr


def test_an_own_operator_is_defined_with_its_schema(tmp_path: Path) -> None:
    header, cpp = generated(
        tmp_path,
        "- {op: accel::scale, tier: native, kernel: scale_kernel, cpu: true,\n"
        "   schema: 'scale(Tensor x, float by=2.0) -> Tensor', doc: multiplies}\n",
    )
    assert "at::Tensor scale_kernel(const at::Tensor & x, double by);" in header
    assert 'm.def("scale(Tensor x, float by=2.0) -> Tensor", {at::Tag::pt2_compliant_tag});' in cpp
    for key in ("PrivateUse1", "CPU"):
        assert f'TORCH_LIBRARY_IMPL(accel, {key}, m) {{\n  m.impl("scale"' in cpp
    assert "| `accel::scale` |" in (tmp_path / "ops.md").read_text()


def test_the_project_yaml_generates_and_documents_every_tier(tmp_path: Path) -> None:
    result = generate(tmp_path, (ROOT / "yaml" / "accel_functions.yaml").read_text())
    assert result.returncode == 0, result.stderr
    docs = (tmp_path / "ops.md").read_text()
    assert "| `add.out` | underlying |" in docs
    assert "| `copy_` | native |" in docs
    assert "| `nonzero` | underlying |" in docs and "data-dependent result shape" in docs
    # The typed entries are split into files compiled side by side: each registration in one
    # of them, never in RegisterAccel.cpp, the registrations of one signature (its template
    # instances) in one file, the files balanced.
    cpp = (tmp_path / "out" / "RegisterAccel.cpp").read_text()
    assert "make_typed_kernel" not in cpp
    registration = re.compile(r'm\.impl\("([^"]+)", make_typed_kernel<(.*)>\(kOperatorConfigs')
    names: list[str] = []
    part_of: dict[str, int] = {}
    signatures = []
    for k, part in enumerate(typed_parts(tmp_path)):
        found = registration.findall(part)
        names += [name for name, _ in found]
        for _, signature in found:
            assert part_of.setdefault(signature, k) == k, signature
        signatures.append(len({signature for _, signature in found}))
    assert len(names) == len(set(names)) > 1000
    assert "add.Tensor" in names and "cat" in names
    assert max(signatures) - min(signatures) <= 8, signatures
    # The registrations compiled into this build come from the same file.
    torch.accel.reset_fallback_stats()
    a = torch.ones(2, device="accel")
    torch.add(a, a, out=torch.empty(2, device="accel"))
    assert torch.accel.fallback_stats() == {}


def test_aoti_shim_has_a_function_for_every_operator_inductor_calls_through_one() -> None:
    # codegen/gen_aoti_shim.py: Inductor's C++ wrapper calls aoti_torch_<device>_<op> for each
    # operator of torchgen's list; libtorch_accel must define all of accel's (a missing one
    # fails only when a generated library loads).
    import ctypes

    from torchgen.aoti.fallback_ops import inductor_fallback_ops

    sys.path.insert(0, str(ROOT / "codegen"))
    try:
        from gen_aoti_shim import PREFIX, shim_name
    finally:
        sys.path.pop(0)
    lib = ctypes.CDLL(str(ROOT / "torch_accel" / "lib" / "libtorch_accel.so"))
    names = [PREFIX + shim_name(op) for op in inductor_fallback_ops]
    assert len(names) > 150
    assert [n for n in names if not hasattr(lib, n)] == []
    header = (ROOT / "torch_accel" / "include" / "c_shim_accel.h").read_text()
    assert [n for n in names if not re.search(rf"\b{n}\(", header)] == []
