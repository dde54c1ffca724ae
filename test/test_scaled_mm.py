"""torch._scaled_mm with the scalings CUDA takes: tensor-wise (the CPU's kernel), row-wise and
the 128-element block scales (1x128, 128x128; csrc/aten/scaled_mm.cpp). Results against a
float64 reference of the same formula; errors as CUDA's checks give them. Matrices and scales
take the layouts CUDA's kernel wants (mat2 and some block scales column-major), so that on the
cuda driver, where CUDA's kernel runs, the values check it too; its errors are its own there."""

from __future__ import annotations

import pytest
import torch

import torch_accel

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 4).to(dtype)


def _scales(shape: tuple[int, ...], seed: int, column_major: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if column_major:  # CUDA's layout for 1x128 scales of mat1 and 128x128 scales of mat2
        return torch.rand(shape[::-1], generator=gen).t() + 0.25
    return torch.rand(shape, generator=gen) + 0.25


def _per_element(scale: torch.Tensor, rows: int, cols: int, block_rows: int, block_cols: int):
    """A (rows x cols) matrix of the scale of each element's block."""
    s = scale.double().repeat_interleave(block_rows, 0)[:rows]
    return s.repeat_interleave(block_cols, 1)[:, :cols]


def _reference(a, b, sa, sb, blocks_a, blocks_b, bias=None):  # noqa: ANN001, ANN202
    """float64: a and b scaled per element by their blocks' scales, then multiplied."""
    (m, k), n = a.shape, b.shape[1]
    a64 = a.double() * _per_element(sa, m, k, *blocks_a)
    b64 = b.double() * _per_element(sb.t(), n, k, *blocks_b).t()
    out = a64 @ b64
    return out if bias is None else out + bias.double()


M, K, N = 48, 384, 80  # K: three 128-element blocks; M, N not multiples of 128
RECIPES = {
    # name: (scale_a shape, scale_b shape, blocks of a (rows, cols), blocks of b (cols, rows),
    # which scales are column-major)
    "rowwise": ((M, 1), (1, N), (1, K), (1, K), ()),
    "1x128_128x128": ((M, 3), (3, 1), (1, 128), (128, 128), ("a", "b")),
    "128x128_1x128": ((1, 3), (3, N), (128, 128), (1, 128), ()),
    "1x128_1x128": ((M, 3), (3, N), (1, 128), (1, 128), ("a",)),
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scalings_cuda_takes_match_the_reference(recipe: str, out_dtype, no_fallback) -> None:
    shape_a, shape_b, blocks_a, blocks_b, column_major = RECIPES[recipe]
    a, b = _fp8((M, K), E4M3, 0), _fp8((N, K), E4M3, 1).t()  # b column-major, as CUDA wants
    sa, sb = _scales(shape_a, 2, "a" in column_major), _scales(shape_b, 3, "b" in column_major)
    got = torch._scaled_mm(
        a.to("accel"), b.to("accel"), sa.to("accel"), sb.to("accel"), out_dtype=out_dtype
    )
    assert got.device.type == "accel" and got.dtype == out_dtype and got.shape == (M, N)
    want = _reference(a, b, sa, sb, blocks_a, blocks_b)
    # one rounding to the output dtype, and float32 sums' error (small against the largest)
    rtol = torch.finfo(out_dtype).eps
    torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=1e-6 * want.abs().max())


def test_block_scales_apply_to_their_block_of_the_shared_dimension(no_fallback) -> None:
    a, b = _fp8((M, K), E4M3, 4), _fp8((N, K), E4M3, 5).t()
    sa = torch.ones(3, M)
    sa[1:] = 0  # only the first 128 columns of a count
    sa = sa.t()
    sb = _scales((3, N), 6)
    got = torch._scaled_mm(
        a.to("accel"), b.to("accel"), sa.to("accel"), sb.to("accel"), out_dtype=torch.float32
    ).cpu()
    want = a[:, :128].double() @ (b[:128].double() * sb[0].double())
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6 * want.abs().max())


def test_rowwise_with_bias_mixed_float8_and_out_form(no_fallback) -> None:
    a, b = _fp8((16, 64), E5M2, 7), _fp8((32, 64), E4M3, 8).t()
    sa, sb = _scales((16, 1), 9), _scales((1, 32), 10)
    for out_dtype in (torch.bfloat16, torch.float16):
        bias = torch.randn(32).to(out_dtype)
        want = _reference(a, b, sa, sb, (1, 64), (1, 64), bias).to(out_dtype)
        args = [t.to("accel") for t in (a, b, sa, sb)]
        got = torch._scaled_mm(*args, bias=bias.to("accel"), out_dtype=out_dtype)
        torch.testing.assert_close(got.cpu(), want)
        out = torch.empty(0, dtype=out_dtype, device="accel")
        returned = torch._scaled_mm(*args, bias=bias.to("accel"), out_dtype=out_dtype, out=out)
        assert returned is out
        torch.testing.assert_close(out.cpu(), want)


def test_tensorwise_runs_the_cpu_kernel() -> None:
    a, b = _fp8((16, 32), E4M3, 11), _fp8((8, 32), E4M3, 12).t()
    sa, sb = torch.tensor(0.5), torch.tensor(3.0)
    cpu = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    got = torch._scaled_mm(*(t.to("accel") for t in (a, b, sa, sb)), out_dtype=torch.bfloat16)
    assert torch.equal(got.cpu(), cpu)


def test_empty_shared_dimension_gives_zeros(no_fallback) -> None:
    a, b = torch.empty(4, 0, dtype=E4M3), torch.empty(0, 8, dtype=E4M3)
    got = torch._scaled_mm(
        a.to("accel"),
        b.to("accel"),
        torch.ones(4, 1, device="accel"),
        torch.ones(1, 8, device="accel"),
        out_dtype=torch.bfloat16,
    )
    assert torch.equal(got.cpu(), torch.zeros(4, 8, dtype=torch.bfloat16))


HOST_ONLY = pytest.mark.skipif(
    torch_accel.driver() != "host", reason="CUDA's kernel runs there, with its own checks"
)


@HOST_ONLY
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"sa": torch.ones(M, 2)}, RuntimeError, r"invalid scaling.*\(48, 1\) and \(1, 80\)"),
        ({"sa": torch.ones(M, 1, dtype=torch.float16)}, RuntimeError, "invalid scaling"),
        ({"sb": torch.ones(1, N)}, RuntimeError, "invalid scaling"),  # sa 1x128, sb row-wise
        ({"out_dtype": E4M3}, ValueError, "bfloat16, float16 or float32"),
        (
            {"a": torch.zeros(M, K, dtype=E5M2), "b": torch.zeros(K, N, dtype=E5M2)},
            ValueError,
            "two float8_e5m2",
        ),
        ({"a": torch.zeros(M, K)}, RuntimeError, "expected float8 matrices"),
        ({"b": torch.zeros(K + 1, N, dtype=E4M3)}, RuntimeError, "cannot be multiplied"),
        (
            {"bias": torch.zeros(N, dtype=torch.bfloat16), "out_dtype": torch.float32},
            RuntimeError,
            "bias is not supported for float32",
        ),
        ({"bias": torch.zeros(N, dtype=torch.float16)}, RuntimeError, "must be BFloat16"),
        ({"bias": torch.zeros(N + 1, dtype=torch.bfloat16)}, RuntimeError, "must have 80"),
        ({"scale_result": torch.ones(2)}, RuntimeError, "scale_result must be a float32"),
        ({"cpu": "sb"}, RuntimeError, "sb|scale_b is on cpu"),
    ],
)
def test_bad_calls_raise_and_the_device_stays_usable(change: dict, error: type, match: str):
    call = {
        "a": torch.zeros(M, K, dtype=E4M3), "b": torch.zeros(K, N, dtype=E4M3),
        "sa": torch.ones(M, 3), "sb": torch.ones(3, N), "out_dtype": torch.bfloat16,
    }  # fmt: skip
    call.update({k: v for k, v in change.items() if k != "cpu"})
    on_device = {
        k: v.to("accel") if isinstance(v, torch.Tensor) and k != change.get("cpu") else v
        for k, v in call.items()
    }
    args = [on_device.pop(k) for k in ("a", "b", "sa", "sb")]
    with pytest.raises(error, match=match):
        torch._scaled_mm(*args, **on_device)
    torch.accel.synchronize()
    x = torch.arange(4.0, device="accel")
    assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


V2_RECIPES = {  # torch.nn.functional.scaled_mm's names for RECIPES' scalings
    "rowwise": ("RowWise", "RowWise"),
    "1x128_128x128": ("BlockWise1x128", "BlockWise128x128"),
    "128x128_1x128": ("BlockWise128x128", "BlockWise1x128"),
    "1x128_1x128": ("BlockWise1x128", "BlockWise1x128"),
}


@pytest.mark.parametrize("recipe", V2_RECIPES)
def test_functional_scaled_mm_names_the_scalings(recipe: str, no_fallback) -> None:
    from torch.nn.functional import ScalingType

    shape_a, shape_b, blocks_a, blocks_b, column_major = RECIPES[recipe]
    name_a, name_b = V2_RECIPES[recipe]
    a, b = _fp8((M, K), E4M3, 13), _fp8((N, K), E4M3, 14).t()
    sa, sb = _scales(shape_a, 15, "a" in column_major), _scales(shape_b, 16, "b" in column_major)
    args = [t.to("accel") for t in (a, b, sa, sb)]
    got = torch.nn.functional.scaled_mm(
        args[0], args[1], args[2], getattr(ScalingType, name_a), args[3],
        getattr(ScalingType, name_b),
    )  # fmt: skip
    assert got.dtype == torch.bfloat16  # its default
    assert torch.equal(got.cpu(), torch._scaled_mm(*args, out_dtype=torch.bfloat16).cpu())
    want = _reference(a, b, sa, sb, blocks_a, blocks_b)
    torch.testing.assert_close(got.cpu().double(), want, rtol=2**-8, atol=1e-6 * want.abs().max())
    out = torch.empty(0, dtype=torch.float32, device="accel")
    recipes = [[int(getattr(ScalingType, n).value)] for n in (name_a, name_b)]
    torch._scaled_mm_v2(args[0], args[1], [args[2]], recipes[0], [], [args[3]], recipes[1], [],
                        None, torch.float32, [], False, out=out)  # fmt: skip
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-6, atol=1e-6 * want.abs().max())


@HOST_ONLY
def test_functional_scaled_mm_tensorwise_and_errors() -> None:
    from torch.nn.functional import ScalingType, SwizzleType, scaled_mm

    a, b = _fp8((16, 32), E4M3, 17), _fp8((8, 32), E4M3, 18).t()
    one = torch.tensor(0.5, device="accel")
    got = scaled_mm(a.to("accel"), b.to("accel"), one, ScalingType.TensorWise, one,
                    ScalingType.TensorWise, output_dtype=torch.float32)  # fmt: skip
    assert torch.equal(
        got.cpu(), torch._scaled_mm(a, b, one.cpu(), one.cpu(), out_dtype=torch.float32)
    )
    rows, cols = torch.ones(16, 1, device="accel"), torch.ones(1, 8, device="accel")
    calls = [
        (dict(recipe_a=ScalingType.TensorWise), ValueError, "fit their recipes: TensorWise and"),
        (dict(recipe_a=ScalingType.BlockWise1x32), NotImplementedError, "1x16 and 1x32 block"),
        (dict(swizzle_a=SwizzleType.SWIZZLE_32_4_4), ValueError, "not swizzled"),
        (dict(contraction_dim=[0, 1]), NotImplementedError, "contraction_dim"),
    ]  # fmt: skip
    for change, error, match in calls:
        kwargs = {"recipe_a": ScalingType.RowWise, **change}
        recipe_a = kwargs.pop("recipe_a")
        with pytest.raises(error, match=match):
            scaled_mm(a.to("accel"), b.to("accel"), rows, recipe_a, cols, ScalingType.RowWise,
                      **kwargs)  # fmt: skip
    torch.accel.synchronize()
