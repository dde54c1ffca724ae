// The norm_rope kernels for x86-64 CPUs with AVX2, FMA and F16C (compiled with those flags;
// norm_rope.cpp calls them where the CPU has them).
#define ACCEL_KERNEL_ISA avx2
#include "kernels/host/norm_rope_impl.h"

namespace accel::kernels::host::avx2 {

void norm_rope_forward(const NormRope& p, const Rows& x, const Rows& out,
                       const ParallelFor& parallel) {
  forward_impl(p, x, out, parallel);
}

void norm_rope_backward(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
                        float* grad_weight, const ParallelFor& parallel) {
  backward_impl(p, x, grad, grad_x, grad_weight, parallel);
}

void qkv_norm_rope_forward(const QkvRows& a, const ParallelFor& parallel) {
  qkv_forward_impl(a, parallel);
}

void copy_rows(const NormRope& p, const Rows& src, const Rows& dst, const ParallelFor& parallel) {
  copy_impl(p, src, dst, parallel);
}

}  // namespace accel::kernels::host::avx2
