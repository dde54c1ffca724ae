// Torch-free level-1 kernels of the host driver (used by the runtime demo and tests).
#pragma once

#include <cstddef>

namespace accel::kernels::host {

// y[i] = a * x[i] + y[i]
void axpy(float a, const float* x, float* y, std::size_t n) noexcept;
// y[i] = value
void fill(float* y, float value, std::size_t n) noexcept;
// sum of x[i], accumulated in double
double sum(const float* x, std::size_t n) noexcept;

}  // namespace accel::kernels::host
