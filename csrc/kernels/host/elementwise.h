// Torch-free elementwise arithmetic of the host driver: what graph replay runs for small
// contiguous float additions, subtractions, products and quotients (aten/replay_kernels.cpp).
// One IEEE operation per element, as ATen's CPU kernels compute them for these dtypes.
#pragma once

#include <cstddef>

namespace accel::kernels::host {

enum class BinaryOp { Add, Sub, Mul, Div };

// out[i] = a[i] op b[i], or a[i] op scalar when b is null. out may be a or b (in place).
template <class T>
void binary(BinaryOp op, T* out, const T* a, const T* b, T scalar, std::size_t n) noexcept;

extern template void binary<float>(BinaryOp, float*, const float*, const float*, float,
                                   std::size_t) noexcept;
extern template void binary<double>(BinaryOp, double*, const double*, const double*, double,
                                    std::size_t) noexcept;

}  // namespace accel::kernels::host
