// The fused RMSNorm + rotary embedding kernels against a reference in double, on every
// instruction set built for this CPU, and the conversions to bfloat16 and float16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/host/activation.h"
#include "kernels/host/norm_rope.h"

namespace accel::kernels::host {
namespace {

std::vector<Isa> isas() {
  std::vector<Isa> out{Isa::Baseline};
  if (isa_available(Isa::Avx2)) out.push_back(Isa::Avx2);
  return out;
}

// A parallel loop that runs pieces of `grain` in reverse order: the kernels may not depend on
// the order or the number of pieces.
void reversed_pieces(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  for (int64_t end = n; end > 0; end -= grain) f(std::max<int64_t>(0, end - grain), end);
}

struct Case {
  int64_t n, s, h, d;
  bool interleaved;
};

// The reference: y = x * rsqrt(mean(x^2) + eps) * w, out = y*c + rotate(y)*s, in double.
std::vector<double> reference(const Case& c, const std::vector<float>& x,
                              const std::vector<float>& w, const std::vector<float>& cs,
                              const std::vector<float>& sn, float eps) {
  std::vector<double> out(x.size());
  const int64_t d = c.d, half = d / 2;
  for (int64_t r = 0; r < c.n * c.s * c.h; ++r) {
    const int64_t s = (r / c.h) % c.s;
    const float* xr = &x[r * d];
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    std::vector<double> y(d);
    for (int64_t i = 0; i < d; ++i) y[i] = xr[i] * inv * w[i];
    for (int64_t i = 0; i < d; ++i) {
      double rot;
      if (c.interleaved)
        rot = i % 2 == 0 ? -y[i + 1] : y[i - 1];
      else
        rot = i < half ? -y[i + half] : y[i - half];
      out[r * d + i] = y[i] * cs[s * d + i] + rot * sn[s * d + i];
    }
  }
  return out;
}

TEST(NormRope, ForwardMatchesAReferenceOnEveryInstructionSet) {
  std::mt19937 gen(0);
  std::normal_distribution<float> dist;
  for (const Case& c : {Case{2, 5, 3, 8, false}, Case{1, 7, 2, 6, true}, Case{3, 33, 4, 128, false},
                        Case{1, 3, 1, 2, true}, Case{2, 9, 5, 66, false}}) {
    const int64_t rows = c.n * c.s * c.h;
    std::vector<float> x(rows * c.d), w(c.d), cs(c.s * c.d), sn(c.s * c.d);
    for (auto* v : {&x, &w, &cs, &sn})
      for (float& e : *v) e = dist(gen);
    const std::vector<double> expected = reference(c, x, w, cs, sn, 1e-5f);
    for (Isa isa : isas()) {
      NormRope p;
      p.n = c.n, p.s = c.s, p.h = c.h, p.d = c.d;
      p.weight = w.data(), p.cos = cs.data(), p.sin = sn.data();
      p.cos_stride_s = c.d;  // cos_stride_n 0: broadcast over n
      p.eps = 1e-5f, p.interleaved = c.interleaved, p.isa = isa;
      std::vector<float> out(x.size());
      const Rows in{x.data(), c.s * c.h * c.d, c.h * c.d, c.d};
      norm_rope_forward(p, in, Rows{out.data(), c.s * c.h * c.d, c.h * c.d, c.d}, reversed_pieces);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], expected[i], 1e-5 * (1 + std::abs(expected[i])))
            << "isa " << int(isa) << " d " << c.d << " element " << i;
      // Heads-first output rows (n, h, s, d) hold the same values.
      std::vector<float> hf(x.size());
      norm_rope_forward(p, in, Rows{hf.data(), c.h * c.s * c.d, c.d, c.s * c.d}, reversed_pieces);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = r / (c.s * c.h), s = (r / c.h) % c.s, h = r % c.h;
        for (int64_t i = 0; i < c.d; ++i)
          ASSERT_EQ(hf[((n * c.h + h) * c.s + s) * c.d + i], out[r * c.d + i]);
      }
    }
  }
}

TEST(NormRope, BackwardMatchesFiniteDifferencesAndIsDeterministic) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  const Case c{2, 6, 3, 8, false};
  const int64_t rows = c.n * c.s * c.h;
  std::vector<float> x(rows * c.d), w(c.d), cs(c.s * c.d), sn(c.s * c.d), g(x.size());
  for (auto* v : {&x, &w, &cs, &sn, &g})
    for (float& e : *v) e = dist(gen);
  const Rows layout{nullptr, c.s * c.h * c.d, c.h * c.d, c.d};
  for (Isa isa : isas()) {
    for (bool interleaved : {false, true}) {
      Case ci = c;
      ci.interleaved = interleaved;
      auto loss_i = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
        const std::vector<double> out = reference(ci, xs, ws, cs, sn, 1e-6f);
        double l = 0;
        for (size_t i = 0; i < out.size(); ++i) l += out[i] * g[i];
        return l;
      };
      NormRope p;
      p.n = c.n, p.s = c.s, p.h = c.h, p.d = c.d;
      p.weight = w.data(), p.cos = cs.data(), p.sin = sn.data(), p.cos_stride_s = c.d;
      p.interleaved = interleaved, p.isa = isa;
      std::vector<float> gx(x.size()), gw(c.d), gw_serial(c.d);
      Rows xr = layout, gr = layout, gxr = layout;
      xr.data = x.data(), gr.data = g.data(), gxr.data = gx.data();
      norm_rope_backward(p, xr, gr, gxr, gw.data(), reversed_pieces);
      std::vector<float> gx_serial(x.size());
      gxr.data = gx_serial.data();
      norm_rope_backward(p, xr, gr, gxr, gw_serial.data());
      EXPECT_EQ(gw, gw_serial);  // the same sums, however the work was split
      EXPECT_EQ(gx, gx_serial);
      const double step = 1e-3;
      for (int64_t i = 0; i < 12; ++i) {
        std::vector<float> xp = x, xm = x;
        xp[i * 7] += step, xm[i * 7] -= step;
        const double fd = (loss_i(xp, w) - loss_i(xm, w)) / (2 * step);
        EXPECT_NEAR(gx[i * 7], fd, 2e-3 * (1 + std::abs(fd))) << "x element " << i * 7;
      }
      for (int64_t i = 0; i < c.d; ++i) {
        std::vector<float> wp = w, wm = w;
        wp[i] += step, wm[i] -= step;
        const double fd = (loss_i(x, wp) - loss_i(x, wm)) / (2 * step);
        EXPECT_NEAR(gw[i], fd, 2e-3 * (1 + std::abs(fd))) << "weight element " << i;
      }
    }
  }
}

TEST(NormRope, NullGradientsGiveZerosAndCopyRowsCopies) {
  const int64_t d = 4;
  std::vector<float> x(2 * d, 1.f), gx(2 * d, 7.f), gw(d, 7.f), w(d, 1.f), cs(d, 1.f), sn(d, 0.f);
  NormRope p;
  p.n = 1, p.s = 1, p.h = 2, p.d = d, p.weight = w.data(), p.cos = cs.data(), p.sin = sn.data();
  norm_rope_backward(p, Rows{x.data(), 0, 0, d}, Rows{}, Rows{gx.data(), 0, 0, d}, gw.data());
  EXPECT_EQ(gx, std::vector<float>(2 * d, 0.f));
  EXPECT_EQ(gw, std::vector<float>(d, 0.f));
  std::vector<float> src{1, 2, 3, 4, 5, 6, 7, 8}, dst(8);
  copy_rows(p, Rows{src.data(), 0, 0, d}, Rows{dst.data(), 0, 0, d});
  EXPECT_EQ(dst, src);
}

TEST(Numeric, BFloat16RoundsToNearestEvenAndKeepsNaN) {
  auto bits = [](float v) { return from_float<BFloat16>(v).bits; };
  EXPECT_EQ(bits(1.0f), 0x3f80);
  EXPECT_EQ(bits(1.00390625f), 0x3f80);  // halfway, even below: stays
  EXPECT_EQ(bits(1.01171875f), 0x3f82);  // halfway, odd below: rounds up to even
  EXPECT_EQ(bits(-0.0f), 0x8000);
  EXPECT_EQ(bits(std::numeric_limits<float>::infinity()), 0x7f80);
  const BFloat16 nan = from_float<BFloat16>(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(to_float(nan)));
  EXPECT_TRUE(std::isnan(to_float(from_float<BFloat16>(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(to_float(from_float<_Float16>(65504.f)), 65504.f);
  EXPECT_TRUE(std::isinf(to_float(from_float<_Float16>(65520.f))));  // rounds past the largest
}

TEST(Activation, ApproximationsAreWithinAFewUlp) {
  for (float x = -90.f; x <= 90.f; x += 0.013f) {
    const double e = std::exp(double(x));
    if (x < -87.3f) {
      EXPECT_EQ(approx_exp(x), 0.f) << x;  // flushed to zero (below about 2^-126)
    } else if (e > std::numeric_limits<float>::max()) {
      EXPECT_TRUE(std::isinf(approx_exp(x))) << x;
    } else {
      EXPECT_NEAR(approx_exp(x), e, 3e-7 * e) << x;
    }
  }
  EXPECT_EQ(approx_exp(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_TRUE(std::isinf(approx_exp(100.f)));
  EXPECT_TRUE(std::isnan(approx_exp(std::nanf(""))));
  for (float x = -6.f; x <= 6.f; x += 0.001f) EXPECT_NEAR(approx_erf(x), std::erf(x), 5e-7) << x;
  EXPECT_TRUE(std::isnan(approx_erf(std::nanf(""))));
}

TEST(Activation, EpilogueAndDerivativeMatchTheirDefinitions) {
  const int64_t rows = 3, cols = 37;
  std::vector<float> in(rows * cols), bias(cols);
  for (int64_t i = 0; i < rows * cols; ++i) in[i] = 0.37f * float(i % 23) - 4.f;
  for (int64_t j = 0; j < cols; ++j) bias[j] = 0.01f * float(j);
  in[5] = std::nanf("");
  auto gelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  for (auto [act, f] : {std::pair<Activation, double (*)(double)>{Activation::Gelu, +gelu},
                        {Activation::Silu, +silu}}) {
    std::vector<float> out(in.size()), pre(in.size()), grad(in.size(), 1.f), gin(in.size());
    bias_act(Dtype::Float32, act, rows, cols, Block{in.data(), cols}, bias.data(),
             Block{out.data(), cols}, Block{pre.data(), cols}, reversed_pieces);
    act_backward(Dtype::Float32, act, rows, cols, Block{grad.data(), cols}, Block{pre.data(), cols},
                 Block{gin.data(), cols});
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double v = double(in[i]) + bias[i % cols];
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(out[i]) && std::isnan(gin[i]));
        continue;
      }
      EXPECT_EQ(pre[i], float(v));
      EXPECT_NEAR(out[i], f(v), 2e-6 * (1 + std::abs(f(v)))) << i;
      const double h = 1e-3, fd = (f(v + h) - f(v - h)) / (2 * h);
      EXPECT_NEAR(gin[i], fd, 1e-4) << i;
    }
  }
}

}  // namespace
}  // namespace accel::kernels::host
