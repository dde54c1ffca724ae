// Torch-free host kernels of the fused per-head RMSNorm and rotary embedding (accel's
// rms_norm_rope and qkv_rms_norm_rope operators, csrc/aten/fused_rope.cpp).
//
// A row is one head's vector of `d` elements; rows are indexed by (n, s, h): batch, sequence
// position, head. Per row, in float:
//   y   = x * rsqrt(mean(x^2) + eps) * weight
//   out = y * cos[n, s] + rotate(y) * sin[n, s]
// where rotate is HF's rotate_half (rotate(y)[i] = -y[i + d/2] for i < d/2, y[i - d/2] after)
// or, interleaved, GPT-J's pairs (rotate(y)[2j] = -y[2j + 1], rotate(y)[2j + 1] = y[2j]).
// Each row is read once and written once; the result is rounded once, to the row's dtype.
#pragma once

#include <cstdint>

#include "kernels/host/isa.h"
#include "kernels/host/numeric.h"
#include "kernels/host/parallel.h"

namespace accel::kernels::host {

// Rows of `d` contiguous elements: row (n, s, h) starts at data + n*stride_n + s*stride_s +
// h*stride_h (strides in elements). A null `data` reads as zeros where a kernel allows it.
struct Rows {
  void* data = nullptr;
  int64_t stride_n = 0, stride_s = 0, stride_h = 0;
};

struct NormRope {
  int64_t n = 1, s = 1, h = 1, d = 0;  // batch, sequence, heads, head dim (even)
  Dtype dtype = Dtype::Float32;        // of the rows: inputs, outputs and gradients
  const float* weight = nullptr;       // d values
  // cos and sin of row (n, s, .): d floats at cos + n*cos_stride_n + s*cos_stride_s (same
  // strides for sin); a stride of 0 broadcasts.
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t cos_stride_n = 0, cos_stride_s = 0;
  float eps = 1e-6f;
  bool interleaved = false;
  Isa isa = Isa::Best;
};

// out = rotary(rmsnorm(x)); out may not overlap x unless it is x itself.
void norm_rope_forward(const NormRope& p, const Rows& x, const Rows& out,
                       const ParallelFor& parallel = serial_for);

// The gradients of norm_rope_forward given `grad` (the gradient of out; null data: zeros):
// grad_x rows, and grad_weight (d floats, overwritten with the sum over all rows, in an order
// that does not depend on the number of threads).
void norm_rope_backward(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
                        float* grad_weight, const ParallelFor& parallel = serial_for);

// q, k and v of a fused QKV projection: q and k rows normalized and rotated (q's and k's
// parameters; same n, s, d and dtype), v's rows (k's shape) copied, in one pass over the input.
struct QkvRows {
  NormRope q, k;
  Rows q_in, k_in, v_in, q_out, k_out, v_out;
};
void qkv_norm_rope_forward(const QkvRows& a, const ParallelFor& parallel = serial_for);

// Copies rows of p's shape and dtype from src to dst (null src data: writes zeros).
void copy_rows(const NormRope& p, const Rows& src, const Rows& dst,
               const ParallelFor& parallel = serial_for);

}  // namespace accel::kernels::host
