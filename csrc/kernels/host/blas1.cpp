#include "kernels/host/blas1.h"

namespace accel::kernels::host {

void axpy(float a, const float* __restrict x, float* __restrict y, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
}

void fill(float* y, float value, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] = value;
}

double sum(const float* x, std::size_t n) noexcept {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace accel::kernels::host
