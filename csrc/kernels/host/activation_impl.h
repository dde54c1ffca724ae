// The bodies of the activation kernels, compiled once per instruction set: activation.cpp (the
// target's baseline) and activation_avx2.cpp (AVX2, FMA and F16C), each inside its own
// namespace ACCEL_KERNEL_ISA. Include only from those files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/host/activation.h"

#ifndef ACCEL_KERNEL_ISA
#error "define ACCEL_KERNEL_ISA (the namespace of this instruction set) before including"
#endif

namespace accel::kernels::host::ACCEL_KERNEL_ISA {
namespace {

// exp(x) = 2^k * exp(r), r = x - k*ln2 in [-ln2/2, ln2/2], exp(r) by a degree-6 polynomial;
// branch-free so that loops over it vectorize.
// Results below 2^-126 (x < -87.3) flush to zero.
inline float exp_impl(float x) {
  const float clamped = x != x ? 0.f : std::min(std::max(x, -87.3f), 88.72f);
  // Round to nearest by adding and removing 1.5 * 2^23 (vectorizes without SSE4.1's round).
  const float k = std::min((clamped * 1.44269504088896341f + 12582912.f) - 12582912.f, 127.f);
  const float r = (clamped - k * 0.693359375f) + k * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(k) << 23;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  v = x < -87.3f ? 0.f : v;
  return x > 88.72f ? std::numeric_limits<float>::infinity() : (x != x ? x : v);
}

// erf by Abramowitz and Stegun 7.1.26: |error| < 1.5e-7, under 5e-7 in float.
inline float erf_impl(float x) {
  const float a = std::fabs(x);
  const float t = 1.f / (1.f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.f - p * t * exp_impl(-a * a);
  return std::copysign(y, x);
}

inline float act_value(Activation act, float v) {
  switch (act) {
    case Activation::None: return v;
    case Activation::Relu: return v > 0.f ? v : (v != v ? v : 0.f);
    case Activation::Gelu: return 0.5f * v * (1.f + erf_impl(v * 0.70710678118654752f));
    case Activation::GeluTanh: {
      const float u = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      const float th = 1.f - 2.f / (exp_impl(2.f * u) + 1.f);
      return 0.5f * v * (1.f + th);
    }
    case Activation::Silu: return v / (1.f + exp_impl(-v));
  }
  return v;
}

// The derivative of the activation at the pre-activation v (relu: v is the output).
inline float act_derivative(Activation act, float v) {
  switch (act) {
    case Activation::None: return 1.f;
    case Activation::Relu: return v > 0.f ? 1.f : 0.f;
    case Activation::Gelu: {
      const float cdf = 0.5f * (1.f + erf_impl(v * 0.70710678118654752f));
      const float pdf = 0.39894228040143268f * exp_impl(-0.5f * v * v);
      return cdf + v * pdf;
    }
    case Activation::GeluTanh: {
      const float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      const float th = 1.f - 2.f / (exp_impl(2.f * inner) + 1.f);
      const float d_inner = 0.79788456080286536f * (1.f + 3.f * 0.044715f * v * v);
      return 0.5f * (1.f + th) + 0.5f * v * (1.f - th * th) * d_inner;
    }
    case Activation::Silu: {
      const float s = 1.f / (1.f + exp_impl(-v));
      return s * (1.f + v * (1.f - s));
    }
  }
  return 1.f;
}

template <class T>
T* at_row(const Block& b, int64_t r) {
  return static_cast<T*>(b.data) + r * b.ld;
}

// One activation per instantiation, so that each loop is one straight-line body.
template <class T, Activation A>
void bias_act_rows(int64_t begin, int64_t end, int64_t cols, const Block& in, const float* bias,
                   const Block& out, const Block& pre, float* v) {
  for (int64_t r = begin; r < end; ++r) {
    const T* src = at_row<const T>(in, r);
    for (int64_t j = 0; j < cols; ++j) v[j] = to_float(src[j]);
    if (bias != nullptr)
      for (int64_t j = 0; j < cols; ++j) v[j] += bias[j];
    if (pre.data != nullptr) {
      T* p = at_row<T>(pre, r);
      for (int64_t j = 0; j < cols; ++j) p[j] = from_float<T>(v[j]);
    }
    T* dst = at_row<T>(out, r);
    for (int64_t j = 0; j < cols; ++j) dst[j] = from_float<T>(act_value(A, v[j]));
  }
}

template <class T, Activation A>
void backward_rows(int64_t begin, int64_t end, int64_t cols, const Block& grad, const Block& saved,
                   const Block& grad_in) {
  for (int64_t r = begin; r < end; ++r) {
    const T* g = at_row<const T>(grad, r);
    const T* s = A == Activation::None ? nullptr : at_row<const T>(saved, r);
    T* gi = at_row<T>(grad_in, r);
    if constexpr (A == Activation::None) {
      if (gi != g) std::memcpy(static_cast<void*>(gi), g, sizeof(T) * cols);
    } else {
      for (int64_t j = 0; j < cols; ++j)
        gi[j] = from_float<T>(to_float(g[j]) * act_derivative(A, to_float(s[j])));
    }
  }
}

template <class F>
void dispatch_act(Activation act, F&& f) {
  switch (act) {
    case Activation::None: f(std::integral_constant<Activation, Activation::None>{}); break;
    case Activation::Relu: f(std::integral_constant<Activation, Activation::Relu>{}); break;
    case Activation::Gelu: f(std::integral_constant<Activation, Activation::Gelu>{}); break;
    case Activation::GeluTanh: f(std::integral_constant<Activation, Activation::GeluTanh>{}); break;
    case Activation::Silu: f(std::integral_constant<Activation, Activation::Silu>{}); break;
  }
}

int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

}  // namespace

inline void bias_act_impl(Dtype dtype, Activation act, int64_t rows, int64_t cols, const Block& in,
                          const float* bias, const Block& out, const Block& pre,
                          const ParallelFor& parallel) {
  dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_act(act, [&](auto a) {
      parallel(rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
        std::vector<float> v(cols);
        bias_act_rows<T, decltype(a)::value>(begin, end, cols, in, bias, out, pre, v.data());
      });
    });
  });
}

inline void act_backward_impl(Dtype dtype, Activation act, int64_t rows, int64_t cols,
                              const Block& grad, const Block& saved, const Block& grad_in,
                              const ParallelFor& parallel) {
  dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_act(act, [&](auto a) {
      parallel(rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
        backward_rows<T, decltype(a)::value>(begin, end, cols, grad, saved, grad_in);
      });
    });
  });
}

inline float exp_value(float x) {
  return exp_impl(x);
}
inline float erf_value(float x) {
  return erf_impl(x);
}

}  // namespace accel::kernels::host::ACCEL_KERNEL_ISA
