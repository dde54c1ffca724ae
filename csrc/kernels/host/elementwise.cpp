#include "kernels/host/elementwise.h"

namespace accel::kernels::host {
namespace {

template <class T, class F>
void apply(T* out, const T* a, const T* b, T scalar, std::size_t n, F f) noexcept {
  if (b != nullptr) {
    for (std::size_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = f(a[i], scalar);
  }
}

}  // namespace

template <class T>
void binary(BinaryOp op, T* out, const T* a, const T* b, T scalar, std::size_t n) noexcept {
  switch (op) {
    case BinaryOp::Add: apply(out, a, b, scalar, n, [](T x, T y) { return x + y; }); break;
    case BinaryOp::Sub: apply(out, a, b, scalar, n, [](T x, T y) { return x - y; }); break;
    case BinaryOp::Mul: apply(out, a, b, scalar, n, [](T x, T y) { return x * y; }); break;
    case BinaryOp::Div: apply(out, a, b, scalar, n, [](T x, T y) { return x / y; }); break;
  }
}

template void binary<float>(BinaryOp, float*, const float*, const float*, float,
                            std::size_t) noexcept;
template void binary<double>(BinaryOp, double*, const double*, const double*, double,
                             std::size_t) noexcept;

}  // namespace accel::kernels::host
