// Torch-free host kernels of a linear layer's epilogue (accel's linear_act operator,
// csrc/aten/fused_linear.cpp): bias and activation applied to a block of the matrix product
// while it is in cache, and the activation's derivative for the backward. Rows of `cols`
// elements, `ld` elements apart; computed in float, rounded once to the block's dtype.
#pragma once

#include <cstdint>

#include "kernels/host/numeric.h"
#include "kernels/host/parallel.h"

namespace accel::kernels::host {

// gelu: x * Phi(x) (erf); gelu_tanh: PyTorch's approximate="tanh"; silu: x * sigmoid(x).
enum class Activation { None, Relu, Gelu, GeluTanh, Silu };

struct Block {
  void* data = nullptr;
  int64_t ld = 0;  // elements between rows
};

// out = act(in + bias) for rows x cols (bias: cols floats, or null). `pre`, when its data is
// not null, receives in + bias (the pre-activation the backward needs). out may be in.
void bias_act(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& in,
              const float* bias, const Block& out, const Block& pre,
              const ParallelFor& parallel = serial_for);

// grad_in = grad * act'(saved): saved is the pre-activation (gelu, gelu_tanh, silu) or the
// output (relu: where it is positive); none copies grad. grad_in may be grad.
void act_backward(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& grad,
                  const Block& saved, const Block& grad_in,
                  const ParallelFor& parallel = serial_for);

// Vectorizable float approximations (a few ulp; exp over the whole float range, with
// exp(-inf) = 0 and exp(x > 88.7) = inf), exposed for the tests.
float approx_exp(float x);
float approx_erf(float x);

}  // namespace accel::kernels::host
