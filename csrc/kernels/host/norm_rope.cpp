#include "kernels/host/norm_rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace accel::kernels::host {
namespace {

// Rows of (n, s) pairs handed to one call of a parallel body: enough elements to pay for a
// thread's start, at least one pair.
int64_t grain_of(const NormRope& p) {
  return std::max<int64_t>(1, 32768 / (p.h * p.d));
}

template <class T>
T* row(const Rows& r, int64_t n, int64_t s, int64_t h) {
  return static_cast<T*>(r.data) + n * r.stride_n + s * r.stride_s + h * r.stride_h;
}

// The sum of v[0..d) squared, with eight partial sums (vectorizable, and closer to a pairwise
// sum than one running sum).
float sum_squares(const float* v, int64_t d) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += v[i + k] * v[i + k];
  float total = 0.f;
  for (; i < d; ++i) total += v[i] * v[i];
  for (float a : acc) total += a;
  return total;
}

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

template <class T>
void forward(const NormRope& p, const Rows& x, const Rows& out, const ParallelFor& parallel) {
  const int64_t d = p.d;
  parallel(p.n * p.s, grain_of(p), [&](int64_t begin, int64_t end) {
    std::vector<float> y(d);
    for (int64_t ns = begin; ns < end; ++ns) {
      const int64_t n = ns / p.s, s = ns % p.s;
      const float* c = p.cos + n * p.cos_stride_n + s * p.cos_stride_s;
      const float* sn = p.sin + n * p.cos_stride_n + s * p.cos_stride_s;
      for (int64_t h = 0; h < p.h; ++h) {
        load(row<const T>(x, n, s, h), y.data(), d);
        const float r = 1.f / std::sqrt(sum_squares(y.data(), d) / float(d) + p.eps);
        for (int64_t i = 0; i < d; ++i) y[i] *= r * p.weight[i];
        rotate_store(y.data(), c, sn, row<T>(out, n, s, h), d, p.interleaved);
      }
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
  const float r = 1.f / std::sqrt(sum_squares(nrm, d) / float(d) + p.eps);
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
    copy_rows(p, grad, grad_x, parallel);
    return;
  }
  // Fixed blocks of pairs, each with its own grad_weight sum, added up in block order: the
  // result does not depend on how many threads ran the blocks.
  const int64_t blocks = std::min<int64_t>(pairs, 64);
  const int64_t per_block = (pairs + blocks - 1) / blocks;
  std::vector<float> partial(blocks * d, 0.f);
  parallel(blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(3 * d);
    for (int64_t b = begin; b < end; ++b) {
      float* dw = partial.data() + b * d;
      for (int64_t ns = b * per_block; ns < std::min(pairs, (b + 1) * per_block); ++ns) {
        const int64_t n = ns / p.s, s = ns % p.s;
        const int64_t off = n * p.cos_stride_n + s * p.cos_stride_s;
        for (int64_t h = 0; h < p.h; ++h)
          backward_row(p, row<const T>(x, n, s, h), row<const T>(grad, n, s, h),
                       row<T>(grad_x, n, s, h), p.cos + off, p.sin + off, dw, scratch.data(),
                       scratch.data() + d, scratch.data() + 2 * d);
      }
    }
  });
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < d; ++i) grad_weight[i] += partial[b * d + i];
}

}  // namespace

void norm_rope_forward(const NormRope& p, const Rows& x, const Rows& out,
                       const ParallelFor& parallel) {
  if (p.n * p.s * p.h * p.d == 0) return;
  dispatch(p.dtype, [&](auto t) { forward<decltype(t)>(p, x, out, parallel); });
}

void norm_rope_backward(const NormRope& p, const Rows& x, const Rows& grad, const Rows& grad_x,
                        float* grad_weight, const ParallelFor& parallel) {
  if (p.n * p.s * p.h * p.d == 0) {
    std::fill(grad_weight, grad_weight + p.d, 0.f);
    return;
  }
  dispatch(p.dtype,
           [&](auto t) { backward<decltype(t)>(p, x, grad, grad_x, grad_weight, parallel); });
}

void copy_rows(const NormRope& p, const Rows& src, const Rows& dst, const ParallelFor& parallel) {
  if (p.n * p.s * p.h * p.d == 0) return;
  dispatch(p.dtype, [&](auto t) {
    using T = decltype(t);
    parallel(p.n * p.s, grain_of(p), [&](int64_t begin, int64_t end) {
      for (int64_t ns = begin; ns < end; ++ns) {
        const int64_t n = ns / p.s, s = ns % p.s;
        for (int64_t h = 0; h < p.h; ++h) {
          T* to = row<T>(dst, n, s, h);
          if (src.data == nullptr)
            std::memset(static_cast<void*>(to), 0, sizeof(T) * p.d);
          else
            std::memcpy(static_cast<void*>(to), row<const T>(src, n, s, h), sizeof(T) * p.d);
        }
      }
    });
  });
}

}  // namespace accel::kernels::host
