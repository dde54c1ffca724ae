// Torch-free host kernels, alone and run on a stream over device memory.
#include <cmath>

#include "kernels/host/blas1.h"
#include "kernels/host/elementwise.h"
#include "test_util.h"

namespace accel::rt {
namespace {

namespace k = accel::kernels::host;

TEST(Kernels, Blas1MatchesAReference) {
  std::vector<float> x(1001), y(1001), expected(1001);
  for (int i = 0; i < 1001; ++i) {
    x[i] = 0.5f * float(i);
    y[i] = float(i % 7);
    expected[i] = 2.f * x[i] + y[i];
  }
  k::axpy(2.f, x.data(), y.data(), y.size());
  EXPECT_EQ(y, expected);
  k::fill(y.data(), -1.5f, 10);
  EXPECT_EQ(y[9], -1.5f);
  EXPECT_EQ(y[10], expected[10]);
  EXPECT_DOUBLE_EQ(k::sum(x.data(), x.size()), 0.5 * 1000.0 * 1001.0 / 2.0);
}

TEST(Kernels, ElementwiseArithmeticMatchesAReference) {
  std::vector<double> a(257), b(257);
  for (int i = 0; i < 257; ++i) {
    a[i] = 0.1 * i - 3.0;
    b[i] = 1.0 + 0.01 * i;
  }
  std::vector<double> out(257);
  k::binary<double>(k::BinaryOp::Div, out.data(), a.data(), b.data(), 0.0, a.size());
  for (int i = 0; i < 257; ++i) EXPECT_EQ(out[i], a[i] / b[i]);
  k::binary<double>(k::BinaryOp::Sub, out.data(), a.data(), nullptr, 0.75, a.size());
  for (int i = 0; i < 257; ++i) EXPECT_EQ(out[i], a[i] - 0.75);
  std::vector<float> f(33, 1.5f), g(33, 2.0f);
  k::binary<float>(k::BinaryOp::Mul, f.data(), f.data(), g.data(), 0.f, f.size());  // in place
  EXPECT_EQ(f, std::vector<float>(33, 3.0f));
  k::binary<float>(k::BinaryOp::Add, f.data(), f.data(), nullptr, 0.5f, 32);
  EXPECT_EQ(f[31], 3.5f);
  EXPECT_EQ(f[32], 3.0f);  // n elements only
}

TEST(Kernels, AxpyOnDeviceMemoryInStreamOrder) {
  if (!driver_capabilities().host_accessible_memory) {
    GTEST_SKIP() << "host kernels run on host-accessible device memory (the host driver's)";
  }
  const std::size_t n = 1 << 16;
  std::vector<float> x(n, 1.f), y(n, 2.f);
  Stream s = stream_create();
  float* dx = static_cast<float*>(malloc(n * sizeof(float), s));
  float* dy = static_cast<float*>(malloc(n * sizeof(float), s));
  memcpy_async(dx, x.data(), n * sizeof(float), CopyKind::HostToDevice, s);
  memcpy_async(dy, y.data(), n * sizeof(float), CopyKind::HostToDevice, s);
  for (int r = 0; r < 3; ++r) launch_host_func(s, [=] { k::axpy(0.5f, dx, dy, n); });
  std::vector<float> out(n);
  memcpy_async(out.data(), dy, n * sizeof(float), CopyKind::DeviceToHost, s);
  EXPECT_EQ(out, std::vector<float>(n, 3.5f));
  free(dx);
  free(dy);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
