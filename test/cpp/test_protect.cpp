// ACCEL_PROTECT_DEVICE_MEMORY=1: device memory is inaccessible to the host outside runtime
// control. Run by the runtime_protect test entry; skipped elsewhere.
#include <setjmp.h>
#include <signal.h>
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

TEST(Protect, TasksOpenOnlyTheMappingsTheyTouch) {
  SKIP_UNLESS_PROTECTING();
  constexpr std::size_t kBytes = 16 << 20;  // large blocks: a mapping each
  char* touched = static_cast<char*>(malloc(kBytes));
  char* untouched = static_cast<char*>(malloc(kBytes));
  Stream s = stream_create();
  bool before = true, after_own_touch = false, other_meanwhile = true;
  launch_host_func(s, [&] {
    before = host_readable(touched);  // the kernel sees what a task has not touched yet
    touched[0] = 7;                   // the first touch opens the mapping
    after_own_touch = host_readable(touched);
    other_meanwhile = host_readable(untouched);
  });
  stream_synchronize(s);
  EXPECT_FALSE(before);
  EXPECT_TRUE(after_own_touch);
  EXPECT_FALSE(other_meanwhile);
  EXPECT_FALSE(host_readable(touched));  // closed again when the task ended
  EXPECT_FALSE(host_readable(untouched));
  EXPECT_EQ(testing::download(touched, 1), std::vector<char>{7});
  free(touched);
  free(untouched);
  stream_destroy(s);
}

sigjmp_buf g_jump;
volatile sig_atomic_t g_foreign_faults = 0;
void foreign_handler(int, siginfo_t*, void*) {
  g_foreign_faults = g_foreign_faults + 1;
  siglongjmp(g_jump, 1);
}

TEST(Protect, AHandlerInstalledLaterStillGetsTheFaultsThatAreNotTheRuntimes) {
  SKIP_UNLESS_PROTECTING();
  int* dev = testing::upload(std::vector<int>{1, 2, 3});
  // What faulthandler.enable() does after the runtime started: a handler over the runtime's.
  struct sigaction mine {}, before {};
  mine.sa_sigaction = foreign_handler;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(::sigaction(SIGSEGV, &mine, &before), 0);
  Stream s = stream_create();
  launch_host_func(s, [dev] { dev[1] *= 10; });  // the runtime's handler comes first again
  stream_synchronize(s);
  EXPECT_EQ(testing::download(dev, 3), (std::vector<int>{1, 20, 3}));
  EXPECT_EQ(g_foreign_faults, 0);
  if (sigsetjmp(g_jump, 1) == 0) {
    volatile int* stray = dev;
    (void)stray[0];  // outside any task: not the runtime's to resolve
  }
  EXPECT_EQ(g_foreign_faults, 1);
  ::sigaction(SIGSEGV, &before, nullptr);
  free(dev);
  stream_destroy(s);
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
