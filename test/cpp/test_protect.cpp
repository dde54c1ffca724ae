// ACCEL_PROTECT_DEVICE_MEMORY=1: device memory is inaccessible to the host outside runtime
// control. Run by the runtime_protect test entry; skipped elsewhere.
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

#define SKIP_UNLESS_PROTECTING()                                                         \
  do {                                                                                   \
    if (!testing::env_flag("ACCEL_PROTECT_DEVICE_MEMORY"))                               \
      GTEST_SKIP() << "runs with ACCEL_PROTECT_DEVICE_MEMORY=1 (ctest runtime_protect)"; \
  } while (0)

// Can the host read the byte at p? Asks the kernel, which answers EFAULT instead of crashing.
bool host_readable(const void* p) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const ssize_t n = ::write(fds[1], p, 1);
  ::close(fds[0]);
  ::close(fds[1]);
  return n == 1;
}

TEST(Protect, DeviceMemoryIsInaccessibleOutsideRuntimeAccess) {
  SKIP_UNLESS_PROTECTING();
  char* p = static_cast<char*>(malloc(4096));
  EXPECT_FALSE(host_readable(p));
  {
    HostAccessGuard outer(p, 4096);
    EXPECT_TRUE(host_readable(p));
    p[0] = 'x';
    {
      HostAccessGuard inner(p, 16);  // nested: reference counted
      EXPECT_TRUE(host_readable(p));
    }
    EXPECT_TRUE(host_readable(p));  // the outer access still holds
    EXPECT_EQ(p[0], 'x');
  }
  EXPECT_FALSE(host_readable(p));
  // Host memory is never affected.
  int local = 1;
  HostAccessGuard host_side(&local, sizeof(local));
  EXPECT_TRUE(host_readable(&local));
  free(p);
}

TEST(Protect, ConcurrentAccessorsKeepMemoryAccessibleUntilTheLastLeaves) {
  SKIP_UNLESS_PROTECTING();
  char* p = static_cast<char*>(malloc(4096));
  testing::Gate entered, leave;
  std::thread other([&] {
    HostAccessGuard access(p, 4096);
    entered.open();
    leave.wait();
  });
  entered.wait();
  { HostAccessGuard mine(p, 4096); }
  EXPECT_TRUE(host_readable(p));  // the other thread still holds access
  leave.open();
  other.join();
  EXPECT_FALSE(host_readable(p));
  free(p);
}

TEST(Protect, RuntimeCopiesFillsAndTasksStillWork) {
  SKIP_UNLESS_PROTECTING();
  std::vector<int> host(256);
  for (int i = 0; i < 256; ++i) host[i] = i;
  int* dev = testing::upload(host);
  EXPECT_FALSE(host_readable(dev));
  Stream s = stream_create();
  launch_host_func(s, [dev] {
    for (int i = 0; i < 256; ++i) dev[i] *= 3;  // tasks run with device access
  });
  stream_synchronize(s);
  auto back = testing::download(dev, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(back[i], 3 * i);
  memset(dev, 0, 256 * sizeof(int));
  EXPECT_EQ(testing::download(dev, 256), std::vector<int>(256, 0));
  EXPECT_FALSE(host_readable(dev));
  free(dev);
  stream_destroy(s);
}

TEST(Protect, TasksMayTouchEveryDevicesMemory) {
  SKIP_UNLESS_PROTECTING();
  int* on0 = testing::upload(std::vector<int>{1, 2, 3});
  set_device(1);
  int* on1 = static_cast<int*>(malloc(3 * sizeof(int)));
  set_device(0);
  Stream s1 = stream_create(1);
  // A copy between devices runs on one device's stream and reads the other's memory.
  launch_host_func(s1, [on0, on1] {
    for (int i = 0; i < 3; ++i) on1[i] = on0[i] * 10;
  });
  stream_synchronize(s1);
  EXPECT_EQ(testing::download(on1, 3), (std::vector<int>{10, 20, 30}));
  EXPECT_FALSE(host_readable(on0));
  EXPECT_FALSE(host_readable(on1));
  free(on0);
  free(on1);
  stream_destroy(s1);
}

TEST(Protect, HostDereferenceOfDevicePointerCrashesAtOnce) {
  SKIP_UNLESS_PROTECTING();
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "death tests fork, which ThreadSanitizer does not support with threads";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        volatile char* p = static_cast<volatile char*>(malloc(4096));
        p[0] = 1;
      },
      "");
#endif
}

}  // namespace
}  // namespace accel::rt
