// Element types of the torch-free host kernels and their conversions to and from float (the
// type the kernels compute in). bfloat16 rounds to nearest even and keeps NaN a NaN, as
// c10::BFloat16 does; float16 is the compiler's _Float16 (IEEE binary16).
#pragma once

#include <cstdint>
#include <cstring>

namespace accel::kernels::host {

enum class Dtype { Float32, BFloat16, Float16 };

struct BFloat16 {
  uint16_t bits;
};

inline float to_float(float v) {
  return v;
}
inline float to_float(_Float16 v) {
  return static_cast<float>(v);
}
inline float to_float(BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <class T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline _Float16 from_float<_Float16>(float v) {
  return static_cast<_Float16>(v);
}
template <>
inline BFloat16 from_float<BFloat16>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  // Branch-free (vectorizable): a NaN stays a quiet NaN, the rest rounds to nearest even.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return BFloat16{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}

// Calls f(T{}) with T the storage type of `dtype`.
template <class F>
void dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::Float32: f(float{}); break;
    case Dtype::BFloat16: f(BFloat16{}); break;
    case Dtype::Float16: f(_Float16{}); break;
  }
}

}  // namespace accel::kernels::host
