// The activation kernels for x86-64 CPUs with AVX2, FMA and F16C (compiled with those flags;
// activation.cpp calls them where the CPU has them).
#define ACCEL_KERNEL_ISA avx2
#include "kernels/host/activation_impl.h"

namespace accel::kernels::host::avx2 {

void bias_act(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& in,
              const float* bias, const Block& out, const Block& pre, const ParallelFor& parallel) {
  bias_act_impl(dtype, act, rows, cols, in, bias, out, pre, parallel);
}

void act_backward(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& grad,
                  const Block& saved, const Block& grad_in, const ParallelFor& parallel) {
  act_backward_impl(dtype, act, rows, cols, grad, saved, grad_in, parallel);
}

}  // namespace accel::kernels::host::avx2
