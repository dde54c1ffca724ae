// The norm_rope kernels: the target's baseline build, and the dispatch to the AVX2 build where
// it exists (x86-64) and the CPU has AVX2, FMA and F16C.
#define ACCEL_KERNEL_ISA baseline
#include "kernels/host/norm_rope_impl.h"

namespace accel::kernels::host {

#if defined(ACCEL_KERNELS_AVX2)
namespace avx2 {
void norm_rope_forward(const NormRope&, const Rows&, const Rows&, const ParallelFor&);
void norm_rope_backward(const NormRope&, const Rows&, const Rows&, const Rows&, float*,
                        const ParallelFor&);
void qkv_norm_rope_forward(const QkvRows&, const ParallelFor&);
void copy_rows(const NormRope&, const Rows&, const Rows&, const ParallelFor&);
}  // namespace avx2
#endif

namespace {

bool empty(const NormRope& p) {
  return p.n * p.s * p.h * p.d == 0;
}

}  // namespace

void norm_rope_forward(const NormRope& p, const Rows& x, const Rows& out,
                       const ParallelFor& parallel) {
  if (empty(p)) return;
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2(p.isa)) return avx2::norm_rope_forward(p, x, out, parallel);
#endif
  baseline::forward_impl(p, x, out, parallel);
}

void norm_rope_backward(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
                        float* grad_weight, const ParallelFor& parallel) {
  if (empty(p)) {
    std::fill(grad_weight, grad_weight + p.d, 0.f);
    return;
  }
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2(p.isa)) return avx2::norm_rope_backward(p, x, grad, grad_x, grad_weight, parallel);
#endif
  baseline::backward_impl(p, x, grad, grad_x, grad_weight, parallel);
}

void qkv_norm_rope_forward(const QkvRows& a, const ParallelFor& parallel) {
  if (empty(a.q) || empty(a.k)) return;
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2(a.q.isa)) return avx2::qkv_norm_rope_forward(a, parallel);
#endif
  baseline::qkv_forward_impl(a, parallel);
}

void copy_rows(const NormRope& p, const Rows& src, const Rows& dst, const ParallelFor& parallel) {
  if (empty(p)) return;
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2(p.isa)) return avx2::copy_rows(p, src, dst, parallel);
#endif
  baseline::copy_impl(p, src, dst, parallel);
}

}  // namespace accel::kernels::host
