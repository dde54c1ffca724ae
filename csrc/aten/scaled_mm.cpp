// Float8 matrix products with scales: torch._scaled_mm, and _scaled_mm_v2 (what
// torch.nn.functional.scaled_mm calls), with the scalings CUDA's kernels take and the CPU's
// refuses. The CPU's kernel takes one scale per matrix (tensor-wise) only. CUDA's also takes a
// scale per row of the first matrix and per column of the second (row-wise: torchao's float8
// row-wise recipe and fbgemm make these), and the 128-element block scales of the DeepSeek
// recipe (1x128 and 128x128 blocks). accel computes those calls from its float32 operators: the
// float8 values widened (exactly), each scaled by its block's scale where the scales are per
// block of the shared dimension, multiplied, then scaled per row and column, the bias added,
// and rounded once to the output dtype. Tensor-wise calls run the CPU's kernel.
// _scaled_mm_v2 names each matrix's scaling (a recipe) instead of leaving it to the shapes. The
// CPU has no kernel for it: accel's checks the recipes against the scales and calls _scaled_mm.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/mm.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <utility>

#include "AccelNativeFunctions.h"
#include "aten/dispatch_util.h"

namespace accel::aten {
namespace {

enum class Scaling { TensorWise, RowWise, Block1x128, Block128x128 };

int64_t blocks(int64_t n) {
  return (n + 127) / 128;
}

// Whether `scale` scales the (outer x inner) matrix `outer`-major as `s` says: one float scale
// in all (tensor-wise), one per outer index (row-wise), per outer index and 128 inner ones
// (1x128), per 128x128 block (128x128). For the second matrix, outer is its column (N) and
// inner its row (K), and the scale is given transposed: (1, N), (K/128, N), (K/128, N/128).
bool scales_as(const at::Tensor& scale, int64_t outer, int64_t inner, Scaling s, bool second) {
  if (scale.scalar_type() != at::kFloat) return false;
  if (s == Scaling::TensorWise) return scale.numel() == 1;
  if (scale.dim() != 2) return false;
  const int64_t want_outer = s == Scaling::Block128x128 ? blocks(outer) : outer;
  const int64_t want_inner = s == Scaling::RowWise ? 1 : blocks(inner);
  const int64_t got_outer = scale.size(second ? 1 : 0);
  const int64_t got_inner = scale.size(second ? 0 : 1);
  return got_outer == want_outer && got_inner == want_inner;
}

// The (a, b) scalings CUDA's kernel takes, in its order of preference.
constexpr std::pair<Scaling, Scaling> kJoint[] = {
    {Scaling::TensorWise, Scaling::TensorWise},   {Scaling::RowWise, Scaling::RowWise},
    {Scaling::Block128x128, Scaling::Block1x128}, {Scaling::Block1x128, Scaling::Block128x128},
    {Scaling::Block1x128, Scaling::Block1x128},
};

std::optional<std::pair<Scaling, Scaling>> joint_scaling(const at::Tensor& a, const at::Tensor& b,
                                                         const at::Tensor& scale_a,
                                                         const at::Tensor& scale_b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  for (const auto& [sa, sb] : kJoint) {
    if (scales_as(scale_a, m, k, sa, false) && scales_as(scale_b, n, k, sb, true)) {
      return std::make_pair(sa, sb);
    }
  }
  return std::nullopt;
}

// `scale` (laid out as scales_as says for `s` and `second`) repeated to one per element of the
// matrix it scales, (outer x inner) for the first, its transpose for the second.
at::Tensor per_element(const at::Tensor& scale, Scaling s, bool second, int64_t outer,
                       int64_t inner) {
  at::Tensor t = second ? scale.t() : scale;  // (outer blocks, inner blocks)
  if (s == Scaling::Block128x128) t = t.repeat_interleave(128, 0).narrow(0, 0, outer);
  t = t.repeat_interleave(128, 1).narrow(1, 0, inner);
  return second ? t.t() : t;
}

void check_call(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                const std::optional<at::Tensor>& scale_result, c10::ScalarType out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "_scaled_mm: both inputs must be matrices, got ",
              a.dim(), "-d and ", b.dim(), "-d tensors");
  TORCH_CHECK(a.size(1) == b.size(0), "_scaled_mm: mat1 and mat2 shapes cannot be multiplied (",
              a.size(0), "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(c10::isFloat8Type(a.scalar_type()) && c10::isFloat8Type(b.scalar_type()),
              "_scaled_mm: expected float8 matrices, got ", a.scalar_type(), " and ",
              b.scalar_type());
  TORCH_CHECK_VALUE(
      a.scalar_type() != at::kFloat8_e5m2 || b.scalar_type() != at::kFloat8_e5m2,
      "_scaled_mm: multiplying two float8_e5m2 matrices is not supported (as on CUDA)");
  TORCH_CHECK(
      !scale_result || (scale_result->numel() == 1 && scale_result->scalar_type() == at::kFloat),
      "_scaled_mm: scale_result must be a float32 tensor of one element");
  const c10::Device device = a.device();
  auto same = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == device, "_scaled_mm: expected all tensors on ", device, ", but ",
                name, " is on ", t.device());
  };
  same(b, "mat2");
  same(scale_a, "scale_a");
  same(scale_b, "scale_b");
  if (bias) same(*bias, "bias");
  if (scale_result) same(*scale_result, "scale_result");
  TORCH_CHECK_VALUE(out == at::kBFloat16 || out == at::kHalf || out == at::kFloat,
                    "_scaled_mm: row-wise and block scaling give bfloat16, float16 or float32 "
                    "results (as on CUDA), not ",
                    out);
  if (bias) {
    TORCH_CHECK(bias->numel() == b.size(1), "_scaled_mm: bias must have ", b.size(1),
                " elements, got ", bias->numel());
    TORCH_CHECK(out != at::kFloat, "_scaled_mm: a bias is not supported for float32 results");
    TORCH_CHECK(bias->scalar_type() == (out == at::kHalf ? at::kHalf : at::kBFloat16),
                "_scaled_mm: the bias of ", out, " results must be ",
                out == at::kHalf ? at::kHalf : at::kBFloat16, ", got ", bias->scalar_type());
  }
}

[[noreturn]] void invalid_scaling(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& scale_a, const at::Tensor& scale_b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(false,
              "_scaled_mm: invalid scaling: float32 scales, with scale_a and scale_b of "
              "shapes (1) and (1) (tensor-wise), (",
              m, ", 1) and (1, ", n, ") (row-wise), (", blocks(m), ", ", blocks(k), ") and (",
              blocks(k), ", ", n, ") (128x128 blocks and 1x128 blocks), (", m, ", ", blocks(k),
              ") and (", blocks(k), ", ", blocks(n), ") (1x128 and 128x128), or (", m, ", ",
              blocks(k), ") and (", blocks(k), ", ", n, ") (1x128 and 1x128); got ",
              scale_a.scalar_type(), " ", scale_a.sizes(), " and ", scale_b.scalar_type(), " ",
              scale_b.sizes());
}

at::Tensor scaled_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, Scaling sa, Scaling sb,
                          const std::optional<at::Tensor>& bias, c10::ScalarType out) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  at::Tensor a32 = a.to(at::kFloat);
  at::Tensor b32 = b.to(at::kFloat);
  at::Tensor product;
  if (sa == Scaling::RowWise) {  // (and sb): scales per output row and column
    product = at::mm(a32, b32).mul_(scale_a).mul_(scale_b);
  } else {  // per block of the shared dimension: scaled before the sums
    a32.mul_(per_element(scale_a, sa, false, m, k));
    b32.mul_(per_element(scale_b, sb, true, n, k));
    product = at::mm(a32, b32);
  }
  if (bias) product.add_(*bias);
  return product.to(out);
}

}  // namespace

// _scaled_mm and _scaled_mm.out (self, mat2, scale_a, scale_b, bias, scale_result, out_dtype,
// use_fast_accum[, out]) with other than tensor-wise scales. use_fast_accum changes nothing
// (the sums are float32's); scale_result scales float8 results only, which these scalings do
// not give (as CUDA's).
bool scaled_mm_scales_when(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t begin = stack.size() - op.schema().arguments().size();
  const c10::IValue& scale_a = stack[begin + 2];
  const c10::IValue& scale_b = stack[begin + 3];
  return scale_a.isTensor() && scale_b.isTensor() &&
         !(scale_a.toTensor().numel() == 1 && scale_b.toTensor().numel() == 1);
}

bool scaled_mm_scales(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!scaled_mm_scales_when(op, *stack)) return false;
  if (out_through_functional(op, stack)) return true;
  const size_t begin = stack->size() - op.schema().arguments().size();
  auto optional_tensor = [&](size_t i) {
    const c10::IValue& v = (*stack)[begin + i];
    return v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor());
  };
  const at::Tensor a = (*stack)[begin].toTensor();
  const at::Tensor b = (*stack)[begin + 1].toTensor();
  const at::Tensor scale_a = (*stack)[begin + 2].toTensor();
  const at::Tensor scale_b = (*stack)[begin + 3].toTensor();
  const std::optional<at::Tensor> bias = optional_tensor(4);
  const std::optional<at::Tensor> scale_result = optional_tensor(5);
  const c10::IValue& dtype = (*stack)[begin + 6];
  const c10::ScalarType out = dtype.isNone() ? a.scalar_type() : dtype.toScalarType();
  check_call(a, b, scale_a, scale_b, bias, scale_result, out);
  const auto joint = joint_scaling(a, b, scale_a, scale_b);
  if (!joint) invalid_scaling(a, b, scale_a, scale_b);
  at::Tensor result =
      scaled_product(a, b, scale_a, scale_b, joint->first, joint->second, bias, out);
  torch::jit::drop(*stack, op.schema().arguments().size());
  stack->emplace_back(std::move(result));
  return true;
}

namespace {

// torch.nn.functional.ScalingType and SwizzleType, as _scaled_mm_v2 takes them.
constexpr int64_t kTensorWise = 0, kRowWise = 1, kBlock1x16 = 2, kBlock1x32 = 3, kBlock1x128 = 4,
                  kBlock128x128 = 5;
constexpr int64_t kNoSwizzle = 0;
constexpr const char* kRecipeNames[] = {"TensorWise",    "RowWise",        "BlockWise1x16",
                                        "BlockWise1x32", "BlockWise1x128", "BlockWise128x128"};

std::string recipe_name(int64_t recipe) {
  return recipe >= 0 && recipe < 6 ? kRecipeNames[recipe] : std::to_string(recipe);
}

Scaling recipe_of(at::IntArrayRef recipe, const char* name) {
  TORCH_CHECK_VALUE(recipe.size() == 1, "_scaled_mm_v2: ", name,
                    " must hold one scaling type for float8 matrices, got ", recipe.size());
  switch (recipe[0]) {
    case kTensorWise: return Scaling::TensorWise;
    case kRowWise: return Scaling::RowWise;
    case kBlock1x128: return Scaling::Block1x128;
    case kBlock128x128: return Scaling::Block128x128;
    case kBlock1x16:
    case kBlock1x32:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "_scaled_mm_v2: ", name,
                                  ": the 1x16 and 1x32 block "
                                  "scalings (MX and NV formats, swizzled scales) are not "
                                  "supported on accel; tensor-wise, row-wise, 1x128 and 128x128 "
                                  "block scalings are");
    default: break;
  }
  TORCH_CHECK_VALUE(false, "_scaled_mm_v2: ", name, ": unknown scaling type ", recipe[0]);
}

// Checks a _scaled_mm_v2 call's recipes against its scales: the _scaled_mm call it makes then
// takes the same scaling.
void check_recipes(const at::Tensor& self, const at::Tensor& mat2, at::TensorList scale_a,
                   at::IntArrayRef recipe_a, at::IntArrayRef swizzle_a, at::TensorList scale_b,
                   at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                   at::IntArrayRef contraction_dim) {
  TORCH_CHECK(self.dim() == 2 && mat2.dim() == 2,
              "_scaled_mm_v2: both inputs must be matrices, got ", self.dim(), "-d and ",
              mat2.dim(), "-d tensors");
  TORCH_CHECK_NOT_IMPLEMENTED(
      self.scalar_type() != at::kFloat4_e2m1fn_x2 && mat2.scalar_type() != at::kFloat4_e2m1fn_x2,
      "_scaled_mm_v2: float4 matrices are not supported on accel");
  TORCH_CHECK_VALUE(scale_a.size() == 1 && scale_b.size() == 1,
                    "_scaled_mm_v2: float8 matrices take one scale tensor each, got ",
                    scale_a.size(), " and ", scale_b.size());
  const Scaling sa = recipe_of(recipe_a, "recipe_a");
  const Scaling sb = recipe_of(recipe_b, "recipe_b");
  for (at::IntArrayRef swizzle : {swizzle_a, swizzle_b}) {
    for (int64_t z : swizzle) {
      TORCH_CHECK_VALUE(z == kNoSwizzle,
                        "_scaled_mm_v2: float32 scales are not swizzled "
                        "(SwizzleType.NO_SWIZZLE), got swizzle type ",
                        z);
    }
  }
  const bool standard =
      contraction_dim.empty() ||
      (contraction_dim.size() == 2 && contraction_dim[0] == 1 && contraction_dim[1] == 0);
  TORCH_CHECK_NOT_IMPLEMENTED(standard, "_scaled_mm_v2: contraction_dim ", contraction_dim,
                              " is not supported on accel: only [] or [1, 0] (the columns of "
                              "mat_a with the rows of mat_b)");
  const at::Tensor& a_scale = scale_a[0];
  const at::Tensor& b_scale = scale_b[0];
  if (self.size(1) == mat2.size(0)) {  // (else _scaled_mm names the shapes)
    const int64_t m = self.size(0), k = self.size(1), n = mat2.size(1);
    bool listed = false;
    for (const auto& [ja, jb] : kJoint) listed = listed || (ja == sa && jb == sb);
    TORCH_CHECK_VALUE(
        listed && scales_as(a_scale, m, k, sa, false) && scales_as(b_scale, n, k, sb, true),
        "_scaled_mm_v2: the scales do not fit their recipes: ", recipe_name(recipe_a[0]), " and ",
        recipe_name(recipe_b[0]),
        " (the pairs CUDA takes: each TensorWise, each RowWise, BlockWise1x128 "
        "with BlockWise128x128 or BlockWise1x128, BlockWise128x128 with "
        "BlockWise1x128) with float32 scales of shapes ",
        a_scale.sizes(), " and ", b_scale.sizes(), " for (", m, " x ", k, ") and (", k, " x ", n,
        ") matrices");
  }
}

}  // namespace

at::Tensor _scaled_mm_v2(const at::Tensor& self, const at::Tensor& mat2, at::TensorList scale_a,
                         at::IntArrayRef recipe_a, at::IntArrayRef swizzle_a,
                         at::TensorList scale_b, at::IntArrayRef recipe_b,
                         at::IntArrayRef swizzle_b, const std::optional<at::Tensor>& bias,
                         std::optional<at::ScalarType> out_dtype, at::IntArrayRef contraction_dim,
                         bool use_fast_accum) {
  check_recipes(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b,
                contraction_dim);
  return at::_scaled_mm(self, mat2, scale_a[0], scale_b[0], bias, std::nullopt, out_dtype,
                        use_fast_accum);
}

at::Tensor& _scaled_mm_v2_out(const at::Tensor& self, const at::Tensor& mat2,
                              at::TensorList scale_a, at::IntArrayRef recipe_a,
                              at::IntArrayRef swizzle_a, at::TensorList scale_b,
                              at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                              const std::optional<at::Tensor>& bias,
                              std::optional<at::ScalarType> out_dtype,
                              at::IntArrayRef contraction_dim, bool use_fast_accum,
                              at::Tensor& out) {
  check_recipes(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b,
                contraction_dim);
  TORCH_CHECK(!out_dtype || *out_dtype == out.scalar_type(), "_scaled_mm_v2: out_dtype ",
              *out_dtype, " does not match out's dtype ", out.scalar_type());
  return at::_scaled_mm_out(out, self, mat2, scale_a[0], scale_b[0], bias, std::nullopt,
                            out.scalar_type(), use_fast_accum);
}

}  // namespace accel::aten
