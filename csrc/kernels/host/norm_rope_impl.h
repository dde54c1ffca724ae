// The bodies of the norm_rope kernels, compiled once per instruction set: norm_rope.cpp (the
// target's baseline) and norm_rope_avx2.cpp (AVX2, FMA and F16C), each inside its own namespace
// ACCEL_KERNEL_ISA. Include only from those files. The loops are written for the compiler to
// vectorize: float rows, eight partial sums, branch-free conversions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/host/norm_rope.h"

#ifndef ACCEL_KERNEL_ISA
#error "define ACCEL_KERNEL_ISA (the namespace of this instruction set) before including"
#endif

namespace accel::kernels::host::ACCEL_KERNEL_ISA {
namespace {

template <class T>
T* row(const Rows& r, int64_t n, int64_t s, int64_t h) {
  return static_cast<T*>(r.data) + n * r.stride_n + s * r.stride_s + h * r.stride_h;
}

// Tiles of rows: a tile is a few consecutive positions (for one n) with all their heads, so
// that rows of one position that lie a whole sequence apart (heads-first layouts (..., heads,
// seq, d), often a power of two apart, which maps them all to one cache set) are visited head by
// head, consecutively. Parallel work is split by tiles.
struct Tiles {
  int64_t block = 1, per_n = 1, count = 0, grain = 1;
  explicit Tiles(const NormRope& p) {
    block = std::clamp<int64_t>(16384 / (p.h * p.d), 1, std::max<int64_t>(p.s, 1));
    per_n = (p.s + block - 1) / block;
    count = p.n * per_n;
    grain = std::max<int64_t>(1, 65536 / (block * p.h * p.d));  // pays for a thread's start
  }
};

// Calls f(n, s, h) for the rows of tile t, in the memory order of `order` (the rows written).
template <class F>
void tile_rows(const NormRope& p, const Tiles& tiles, int64_t t, const Rows& order, F f) {
  const int64_t n = t / tiles.per_n, first = (t % tiles.per_n) * tiles.block;
  const int64_t last = std::min(p.s, first + tiles.block);
  if (order.stride_h > order.stride_s) {
    for (int64_t h = 0; h < p.h; ++h)
      for (int64_t s = first; s < last; ++s) f(n, s, h);
  } else {
    for (int64_t s = first; s < last; ++s)
      for (int64_t h = 0; h < p.h; ++h) f(n, s, h);
  }
}

const float* trig_row(const NormRope& p, const float* table, int64_t n, int64_t s) {
  return table + n * p.cos_stride_n + s * p.cos_stride_s;
}

// The sum of a[i]*b[i], with eight partial sums (vectorizable, and closer to a pairwise sum
// than one running sum).
float dot(const float* a, const float* b, int64_t d) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float total = 0.f;
  for (; i < d; ++i) total += a[i] * b[i];
  for (float v : acc) total += v;
  return total;
}

template <class T>
void load(const T* src, float* dst, int64_t d) {
  for (int64_t i = 0; i < d; ++i) dst[i] = to_float(src[i]);
}

// out = y*c + rotate(y)*s, rounded to T.
template <class T>
void rotate_store(const float* y, const float* c, const float* s, T* out, int64_t d,
                  bool interleaved) {
  if (interleaved) {
    for (int64_t j = 0; j < d; j += 2) {
      out[j] = from_float<T>(y[j] * c[j] - y[j + 1] * s[j]);
      out[j + 1] = from_float<T>(y[j + 1] * c[j + 1] + y[j] * s[j + 1]);
    }
    return;
  }
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = from_float<T>(y[i] * c[i] - y[i + half] * s[i]);
  for (int64_t i = half; i < d; ++i) out[i] = from_float<T>(y[i] * c[i] + y[i - half] * s[i]);
}

// The forward of tile t; y: d floats of scratch.
template <class T>
void forward_tile(const NormRope& p, const Tiles& tiles, int64_t t, const Rows& x, const Rows& out,
                  float* y) {
  const int64_t d = p.d;
  tile_rows(p, tiles, t, out, [&](int64_t n, int64_t s, int64_t h) {
    load(row<const T>(x, n, s, h), y, d);
    const float r = 1.f / std::sqrt(dot(y, y, d) / float(d) + p.eps);
    for (int64_t i = 0; i < d; ++i) y[i] *= r * p.weight[i];
    rotate_store(y, trig_row(p, p.cos, n, s), trig_row(p, p.sin, n, s), row<T>(out, n, s, h), d,
                 p.interleaved);
  });
}

// Copies the rows of tile t (null src data: zeros).
template <class T>
void copy_tile(const NormRope& p, const Tiles& tiles, int64_t t, const Rows& src, const Rows& dst) {
  tile_rows(p, tiles, t, dst, [&](int64_t n, int64_t s, int64_t h) {
    T* to = row<T>(dst, n, s, h);
    if (src.data == nullptr)
      std::memset(static_cast<void*>(to), 0, sizeof(T) * p.d);
    else
      std::memcpy(static_cast<void*>(to), row<const T>(src, n, s, h), sizeof(T) * p.d);
  });
}

template <class T>
void forward(const NormRope& p, const Rows& x, const Rows& out, const ParallelFor& parallel) {
  const Tiles tiles(p);
  parallel(tiles.count, tiles.grain, [&](int64_t begin, int64_t end) {
    std::vector<float> y(p.d);
    for (int64_t t = begin; t < end; ++t) forward_tile<T>(p, tiles, t, x, out, y.data());
  });
}

template <class T>
void copy(const NormRope& p, const Rows& src, const Rows& dst, const ParallelFor& parallel) {
  const Tiles tiles(p);
  parallel(tiles.count, tiles.grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) copy_tile<T>(p, tiles, t, src, dst);
  });
}

// q, k and v of one fused projection, tile by tile (q's tiles: q, k and v have the same
// positions, so each tile of the input is read once for all three).
template <class T>
void qkv_forward(const QkvRows& a, const ParallelFor& parallel) {
  const Tiles tiles(a.q);
  Tiles kv_tiles(a.k);
  kv_tiles.block = tiles.block;
  kv_tiles.per_n = tiles.per_n;
  parallel(tiles.count, std::max<int64_t>(1, tiles.grain / 2), [&](int64_t begin, int64_t end) {
    std::vector<float> y(a.q.d);
    for (int64_t t = begin; t < end; ++t) {
      forward_tile<T>(a.q, tiles, t, a.q_in, a.q_out, y.data());
      forward_tile<T>(a.k, kv_tiles, t, a.k_in, a.k_out, y.data());
      copy_tile<T>(a.k, kv_tiles, t, a.v_in, a.v_out);
    }
  });
}

// One row's backward: grad_x, and grad_weight accumulated into dw.
//   dy = g*c - rotate(g*s)    (rotate is antisymmetric: its transpose is -rotate)
//   dn = dy * weight, with n = x * r the normalized row; dw += dy * n
//   dx = r * (dn - n * mean(dn * n))
template <class T>
void backward_row(const NormRope& p, const T* x, const T* g, T* dx, const float* c, const float* s,
                  float* dw, float* nrm, float* gs, float* dy) {
  const int64_t d = p.d;
  load(x, nrm, d);
  const float r = 1.f / std::sqrt(dot(nrm, nrm, d) / float(d) + p.eps);
  for (int64_t i = 0; i < d; ++i) nrm[i] *= r;
  for (int64_t i = 0; i < d; ++i) {
    dy[i] = to_float(g[i]);
    gs[i] = dy[i] * s[i];
    dy[i] *= c[i];
  }
  if (p.interleaved) {
    for (int64_t j = 0; j < d; j += 2) {
      dy[j] += gs[j + 1];
      dy[j + 1] -= gs[j];
    }
  } else {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) dy[i] += gs[i + half];
    for (int64_t i = half; i < d; ++i) dy[i] -= gs[i - half];
  }
  for (int64_t i = 0; i < d; ++i) {
    dw[i] += dy[i] * nrm[i];
    dy[i] *= p.weight[i];  // dn
  }
  const float mean = dot(dy, nrm, d) / float(d);
  for (int64_t i = 0; i < d; ++i) dx[i] = from_float<T>(r * (dy[i] - nrm[i] * mean));
}

template <class T>
void backward(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
              float* grad_weight, const ParallelFor& parallel) {
  const int64_t d = p.d, pairs = p.n * p.s;
  std::fill(grad_weight, grad_weight + d, 0.f);
  if (grad.data == nullptr) {
    copy<T>(p, grad, grad_x, parallel);
    return;
  }
  // Fixed blocks of (n, s) pairs, each with its own grad_weight sum, added up in block order:
  // the result does not depend on how many threads ran the blocks.
  const int64_t blocks = std::min<int64_t>(pairs, 64);
  const int64_t per_block = (pairs + blocks - 1) / blocks;
  std::vector<float> partial(blocks * d, 0.f);
  parallel(blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(3 * d);
    for (int64_t b = begin; b < end; ++b) {
      float* dw = partial.data() + b * d;
      for (int64_t ns = b * per_block; ns < std::min(pairs, (b + 1) * per_block); ++ns) {
        const int64_t n = ns / p.s, s = ns % p.s;
        for (int64_t h = 0; h < p.h; ++h)
          backward_row(p, row<const T>(x, n, s, h), row<const T>(grad, n, s, h),
                       row<T>(grad_x, n, s, h), trig_row(p, p.cos, n, s), trig_row(p, p.sin, n, s),
                       dw, scratch.data(), scratch.data() + d, scratch.data() + 2 * d);
      }
    }
  });
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < d; ++i) grad_weight[i] += partial[b * d + i];
}

}  // namespace

inline void forward_impl(const NormRope& p, const Rows& x, const Rows& out,
                         const ParallelFor& parallel) {
  dispatch(p.dtype, [&](auto t) { forward<decltype(t)>(p, x, out, parallel); });
}

inline void backward_impl(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
                          float* grad_weight, const ParallelFor& parallel) {
  dispatch(p.dtype,
           [&](auto t) { backward<decltype(t)>(p, x, grad, grad_x, grad_weight, parallel); });
}

inline void qkv_forward_impl(const QkvRows& a, const ParallelFor& parallel) {
  dispatch(a.q.dtype, [&](auto t) { qkv_forward<decltype(t)>(a, parallel); });
}

inline void copy_impl(const NormRope& p, const Rows& src, const Rows& dst,
                      const ParallelFor& parallel) {
  dispatch(p.dtype, [&](auto t) { copy<decltype(t)>(p, src, dst, parallel); });
}

}  // namespace accel::kernels::host::ACCEL_KERNEL_ISA
