// The activation kernels: the target's baseline build, and the dispatch to the AVX2 build where
// it exists (x86-64) and the CPU has it (isa.h).
#define ACCEL_KERNEL_ISA baseline
#include "kernels/host/activation_impl.h"
#include "kernels/host/isa.h"

namespace accel::kernels::host {

#if defined(ACCEL_KERNELS_AVX2)
namespace avx2 {
void bias_act(Dtype, Activation, int64_t, int64_t, const Block&, const float*, const Block&,
              const Block&, const ParallelFor&);
void act_backward(Dtype, Activation, int64_t, int64_t, const Block&, const Block&, const Block&,
                  const ParallelFor&);
}  // namespace avx2
#endif

float approx_exp(float x) {
  return baseline::exp_value(x);
}
float approx_erf(float x) {
  return baseline::erf_value(x);
}

void bias_act(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& in,
              const float* bias, const Block& out, const Block& pre, const ParallelFor& parallel) {
  if (rows <= 0 || cols <= 0) return;
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2()) return avx2::bias_act(dtype, act, rows, cols, in, bias, out, pre, parallel);
#endif
  baseline::bias_act_impl(dtype, act, rows, cols, in, bias, out, pre, parallel);
}

void act_backward(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& grad,
                  const Block& saved, const Block& grad_in, const ParallelFor& parallel) {
  if (rows <= 0 || cols <= 0) return;
#if defined(ACCEL_KERNELS_AVX2)
  if (use_avx2()) return avx2::act_backward(dtype, act, rows, cols, grad, saved, grad_in, parallel);
#endif
  baseline::act_backward_impl(dtype, act, rows, cols, grad, saved, grad_in, parallel);
}

}  // namespace accel::kernels::host
