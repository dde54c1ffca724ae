// Copies and fills between host and device memory, synchronous and asynchronous.
#include <numeric>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::download;
using testing::Gate;
using testing::upload;

std::vector<float> iota(std::size_t n, float start = 0.f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(Memcpy, SynchronousRoundTripInEveryDirection) {
  const auto host = iota(1000);
  float* a = static_cast<float*>(malloc(host.size() * sizeof(float)));
  float* b = static_cast<float*>(malloc(host.size() * sizeof(float)));
  memcpy(a, host.data(), host.size() * sizeof(float), CopyKind::HostToDevice);
  memcpy(b, a, host.size() * sizeof(float), CopyKind::DeviceToDevice);
  std::vector<float> back(host.size());
  memcpy(back.data(), b, back.size() * sizeof(float), CopyKind::DeviceToHost);
  EXPECT_EQ(back, host);
  // Default infers the direction.
  std::vector<float> again(host.size());
  memcpy(again.data(), b, again.size() * sizeof(float));
  EXPECT_EQ(again, host);
  std::vector<float> h2h(host.size());
  memcpy(h2h.data(), host.data(), h2h.size() * sizeof(float), CopyKind::HostToHost);
  EXPECT_EQ(h2h, host);
  free(a);
  free(b);
}

TEST(Memcpy, CopiesBetweenDevices) {
  const auto host = iota(4096, 3.f);
  set_device(0);
  float* on0 = upload(host);
  set_device(1);
  float* on1 = static_cast<float*>(malloc(host.size() * sizeof(float)));
  set_device(0);
  EXPECT_EQ(pointer_device(on1), 1);
  memcpy(on1, on0, host.size() * sizeof(float));
  Stream s1 = stream_create(1);
  memcpy_async(on0, on1, 16, CopyKind::DeviceToDevice, s1);  // stream of the other device
  stream_synchronize(s1);
  EXPECT_EQ(download(on1, host.size()), host);
  free(on0);
  free(on1);
  stream_destroy(s1);
}

TEST(Memcpy, PinnedAsyncCopiesAreOrderedOnTheStream) {
  SKIP_IF_LAUNCH_BLOCKING();
  constexpr std::size_t n = 1 << 16;
  auto* pinned_in = static_cast<float*>(host_malloc(n * sizeof(float)));
  auto* pinned_out = static_cast<float*>(host_malloc(n * sizeof(float)));
  for (std::size_t i = 0; i < n; ++i) pinned_in[i] = float(i);
  std::fill(pinned_out, pinned_out + n, -1.f);
  Stream s = stream_create();
  float* dev = static_cast<float*>(malloc(n * sizeof(float), s));
  Gate gate;
  launch_host_func(s, [&] { gate.wait(); });
  memcpy_async(dev, pinned_in, n * sizeof(float), CopyKind::HostToDevice, s);
  memcpy_async(pinned_out, dev, n * sizeof(float), CopyKind::DeviceToHost, s);
  // Both copies are queued behind the gate: nothing has moved yet.
  EXPECT_EQ(pinned_out[0], -1.f);
  EXPECT_EQ(pinned_out[n - 1], -1.f);
  gate.open();
  stream_synchronize(s);
  for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(pinned_out[i], float(i));
  EXPECT_EQ(pinned_out[n - 1], float(n - 1));
  free(dev);
  host_free(pinned_in);
  host_free(pinned_out);
  stream_destroy(s);
}

TEST(Memcpy, PageableSourceIsStagedSoTheCallerMayReuseIt) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  std::vector<float> src = iota(1000);
  float* dev = static_cast<float*>(malloc(src.size() * sizeof(float), s));
  Gate gate;
  launch_host_func(s, [&] { gate.wait(); });
  memcpy_async(dev, src.data(), src.size() * sizeof(float), CopyKind::HostToDevice, s);
  std::fill(src.begin(), src.end(), 99.f);  // the copy has not run, but the data was staged
  gate.open();
  stream_synchronize(s);
  EXPECT_EQ(download(dev, 1000), iota(1000));
  free(dev);
  stream_destroy(s);
}

TEST(Memcpy, PageableDestinationIsCompleteWhenTheCallReturns) {
  Stream s = stream_create();
  const auto host = iota(512);
  float* dev = upload(host);
  std::vector<float> out(512, 0.f);
  memcpy_async(out.data(), dev, 512 * sizeof(float), CopyKind::DeviceToHost, s);
  EXPECT_EQ(out, host);  // no synchronize needed for pageable memory
  free(dev);
  stream_destroy(s);
}

TEST(Memcpy, WrongKindIsRejectedWithTheReason) {
  std::vector<float> host(16, 1.f);
  float* dev = upload(host);
  EXPECT_RT_ERROR(memcpy(dev, host.data(), 64, CopyKind::DeviceToHost), InvalidValueError,
                  "the source");
  EXPECT_RT_ERROR(memcpy(dev, host.data(), 64, CopyKind::DeviceToHost), InvalidValueError,
                  "is host memory, not device memory");
  EXPECT_RT_ERROR(memcpy(host.data(), dev, 64, CopyKind::HostToDevice), InvalidValueError,
                  "memcpy(kind=HostToDevice): the source");
  EXPECT_RT_ERROR(memcpy(host.data(), dev, 64, CopyKind::DeviceToDevice), InvalidValueError,
                  "the destination");
  EXPECT_RT_ERROR(memcpy(dev, dev, 64, CopyKind::HostToHost), InvalidValueError,
                  "is device memory, not host memory");
  free(dev);
}

TEST(Memcpy, OutOfBoundsNullAndFreedPointersAreRejected) {
  std::vector<float> host(64, 1.f);
  float* dev = upload(std::vector<float>(16, 0.f));
  EXPECT_RT_ERROR(memcpy(dev, host.data(), 65, CopyKind::HostToDevice), InvalidValueError,
                  "run past the end of its device allocation (64 bytes left of 64)");
  EXPECT_RT_ERROR(memcpy(dev + 8, host.data(), 33), InvalidValueError, "32 bytes left of 64");
  EXPECT_RT_ERROR(memcpy(nullptr, host.data(), 4), InvalidPointerError,
                  "the destination pointer is null");
  EXPECT_RT_ERROR(memcpy_async(dev, nullptr, 4, CopyKind::Default, default_stream(0)),
                  InvalidPointerError, "source pointer is null");
  memcpy(dev + 8, host.data(), 32);  // exactly to the end is fine
  free(dev);
  EXPECT_RT_ERROR(memcpy(host.data(), dev, 4), InvalidPointerError, "that is not allocated");
  memcpy(nullptr, nullptr, 0);  // size 0 is a no-op
}

TEST(Memset, SynchronousAndAsynchronous) {
  unsigned char* dev = static_cast<unsigned char*>(malloc(1000));
  memset(dev, 0xAB, 1000);
  std::vector<unsigned char> out(1000);
  memcpy(out.data(), dev, 1000);
  for (unsigned char c : out) ASSERT_EQ(c, 0xAB);
  Stream s = stream_create();
  memset_async(dev + 10, 0, 20, s);
  stream_synchronize(s);
  memcpy(out.data(), dev, 1000);
  EXPECT_EQ(out[9], 0xAB);
  EXPECT_EQ(out[10], 0);
  EXPECT_EQ(out[29], 0);
  EXPECT_EQ(out[30], 0xAB);
  std::vector<char> host(10);
  EXPECT_RT_ERROR(memset(host.data(), 0, 10), InvalidValueError, "is host memory");
  EXPECT_RT_ERROR(memset(dev, 0, 1001), InvalidValueError, "run past the end");
  free(dev);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
