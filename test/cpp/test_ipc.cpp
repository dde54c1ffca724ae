// Interprocess memory (runtime/ipc.cpp) within one process: the reference counting and the
// keeping of freed allocations, with the runtime importing its own exports (as its own memory;
// CUDA does not open a process's own handles). test_multiprocessing.py crosses processes. Skips
// on drivers that cannot share memory.
#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::download;

class Ipc : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!driver_capabilities().ipc_memory) {
      GTEST_SKIP() << "the " << driver_name() << " driver cannot share memory";
    }
  }
};

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST_F(Ipc, AnOwnExportImportsAsTheSameAddress) {
  constexpr std::size_t n = 1024;
  auto* x = static_cast<float*>(malloc(n * sizeof(float)));
  memcpy(x, iota(n, 0.0f).data(), n * sizeof(float), CopyKind::HostToDevice);
  // A pointer inside the allocation: the import is its counterpart.
  const IpcExport e = ipc_export(x + 16);
  EXPECT_EQ(e.device, 0);
  EXPECT_GE(e.segment_size, e.offset + 4 * sizeof(float));
  auto* y = static_cast<float*>(ipc_import(e));
  EXPECT_EQ(y, x + 16);
  EXPECT_EQ(pointer_attributes(y).type, MemoryType::Device);
  EXPECT_EQ(download(y, 4), (std::vector<float>{16, 17, 18, 19}));
  ipc_release(y);
  free(x);
  EXPECT_EQ(ipc_pending(0), 0u);
}

TEST_F(Ipc, AnAllocationFreedWhileImportedWaitsForTheRelease) {
  constexpr std::size_t bytes = 4096;
  void* x = malloc(bytes);
  memcpy(x, iota(bytes / 4, 1.0f).data(), bytes, CopyKind::HostToDevice);
  void* y = ipc_import(ipc_export(x));
  free(x);  // the importer still holds it: kept out of reuse
  EXPECT_EQ(ipc_pending(0), 1u);
  EXPECT_RT_ERROR(free(x), InvalidPointerError, "double free");
  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) {
    others.push_back(malloc(bytes));
    EXPECT_NE(others.back(), x);
    memset(others.back(), 0, bytes);
  }
  EXPECT_EQ(download(static_cast<float*>(y), 3), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ipc_collect(), 0u);  // not released yet
  ipc_release(y);
  EXPECT_EQ(ipc_collect(), 1u);
  EXPECT_EQ(ipc_pending(0), 0u);
  for (void* p : others) free(p);
}

TEST_F(Ipc, EachExportIsOneReference) {
  void* x = malloc(512);
  const IpcExport e = ipc_export(x);
  const IpcExport again = ipc_export(x);
  EXPECT_EQ(again.ref_slot, e.ref_slot);
  void* a = ipc_import(e);
  void* b = ipc_import(again);
  EXPECT_EQ(a, b);  // one mapping of the segment
  ipc_release(a);
  free(x);
  EXPECT_EQ(ipc_pending(0), 1u);  // the second import still holds it
  ipc_release(b);
  EXPECT_RT_ERROR(ipc_release(b), InvalidPointerError, "was not returned by ipc_import");
  EXPECT_EQ(ipc_collect(0), 1u);
}

TEST_F(Ipc, AReleasedAllocationIsFreedAtOnce) {
  void* x = malloc(512);
  ipc_release(ipc_import(ipc_export(x)));
  free(x);
  EXPECT_EQ(ipc_pending(0), 0u);
  EXPECT_RT_ERROR(free(x), InvalidPointerError, "double free");
}

TEST_F(Ipc, OtherDevicesShareTheirs) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const Stream s = current_stream(1);  // the export waits for its work
  auto* x = static_cast<float*>(malloc(64 * sizeof(float), s));
  memcpy_async(x, iota(64, 5.0f).data(), 64 * sizeof(float), CopyKind::HostToDevice, s);
  const IpcExport e = ipc_export(x);
  EXPECT_EQ(e.device, 1);
  auto* y = static_cast<float*>(ipc_import(e));
  EXPECT_EQ(pointer_attributes(y).device, 1);
  EXPECT_EQ(download(y, 2), (std::vector<float>{5, 6}));
  ipc_release(y);
  free(x);
}

// An expandable segment's memory is shared where the driver can (the host driver: the
// reservation's memory file), and refused with a reason where it cannot (cuda: cuMem* memory).
TEST_F(Ipc, ExpandableSegmentsShareOrSayWhy) {
  if (!driver_capabilities().virtual_memory) GTEST_SKIP() << "no virtual memory";
  const AllocatorSettings saved = allocator_settings();
  AllocatorSettings settings = saved;
  settings.expandable_segments = true;
  set_allocator_settings(settings);
  const Stream s = stream_create(0);  // a stream of its own: a new expandable segment
  auto* x = static_cast<float*>(malloc(std::size_t{3} << 20, s));
  memcpy_async(x, iota(4, 7.0f).data(), 4 * sizeof(float), CopyKind::HostToDevice, s);
  stream_synchronize(s);
  if (std::string(driver_name()) == "cuda") {
    EXPECT_RT_ERROR(ipc_export(x), NotSupportedError, "expandable segments");
  } else {
    const IpcExport e = ipc_export(x + 1);
    EXPECT_EQ(ipc_import(e), x + 1);
    EXPECT_GE(e.segment_size, e.offset + 3 * sizeof(float));
    ipc_release(x + 1);
  }
  free(x);
  stream_destroy(s);
  set_allocator_settings(saved);
}

TEST_F(Ipc, BadInputIsRefused) {
  EXPECT_RT_ERROR(ipc_export(nullptr), InvalidPointerError, "null");
  std::vector<char> host(64);
  EXPECT_RT_ERROR(ipc_export(host.data()), InvalidPointerError, "not in a live device allocation");
  void* x = malloc(512);
  IpcExport e = ipc_export(x);
  IpcExport wrong_device = e;
  wrong_device.device = 99;
  EXPECT_RT_ERROR(ipc_import(wrong_device), InvalidDeviceError, "on device 99");
  IpcExport gone = e;
  gone.ref_pid = 0x7ffffff0;  // no such process
  EXPECT_RT_ERROR(ipc_import(gone), InvalidValueError, "has exited");
  IpcExport bad = e;
  bad.handle = IpcMemHandle{};
  EXPECT_ANY_THROW(ipc_import(bad));
  EXPECT_RT_ERROR(ipc_release(host.data()), InvalidPointerError, "was not returned by ipc_import");
  // The export's reference is still out (nothing imported it): the free waits for it.
  free(x);
  EXPECT_EQ(ipc_pending(0), 1u);
  ipc_release(ipc_import(e));
  EXPECT_EQ(ipc_collect(), 1u);
  // The device stays usable.
  void* y = malloc(512);
  memset(y, 1, 512);
  EXPECT_EQ(download(static_cast<unsigned char*>(y), 1)[0], 1);
  free(y);
}

// Interprocess events within one process (test_multiprocessing.py crosses processes): they
// order streams as events do, their handles are refused here as CUDA refuses them, and they
// cannot time or be recorded inside a capture.
class IpcEvent : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!driver_capabilities().ipc_events) {
      GTEST_SKIP() << "the " << driver_name() << " driver has no interprocess events";
    }
  }
};

TEST_F(IpcEvent, OrdersStreamsAsAnEvent) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream producer = stream_create(), consumer = stream_create();
  Event ready = event_create_interprocess(0);
  EXPECT_TRUE(event_query(ready));  // never recorded
  testing::expect_wait_orders(producer, consumer, ready);
  event_destroy(ready);
  stream_destroy(producer);
  stream_destroy(consumer);
}

TEST_F(IpcEvent, HandlesAndTheirErrors) {
  Event e = event_create_interprocess(1 % device_count());
  const IpcEventHandle h = event_ipc_handle(e);
  EXPECT_EQ(std::memcmp(h.bytes, event_ipc_handle(e).bytes, sizeof(h.bytes)), 0);
  EXPECT_RT_ERROR(event_open_ipc_handle(event_device(e), h), InvalidValueError,
                  "names an event of this process");
  EXPECT_RT_ERROR(event_open_ipc_handle(99, h), InvalidDeviceError, "on device 99");
  EXPECT_ANY_THROW(event_open_ipc_handle(0, IpcEventHandle{}));
  Event plain = event_create();
  EXPECT_RT_ERROR(event_ipc_handle(plain), InvalidValueError, "not an interprocess event");
  event_record(e, default_stream(event_device(e)));
  event_record(plain, default_stream(0));
  event_synchronize(e);
  event_synchronize(plain);
  EXPECT_RT_ERROR(event_elapsed_time(e, e), InvalidValueError, "without timing");
  event_destroy(e);
  EXPECT_RT_ERROR(event_ipc_handle(e), InvalidHandleError, "was destroyed");
  // A recycled runtime event is an ordinary one again.
  Event again = event_create();
  EXPECT_RT_ERROR(event_ipc_handle(again), InvalidValueError, "not an interprocess event");
  event_destroy(again);
  event_destroy(plain);
}

TEST_F(IpcEvent, ARecordInsideACaptureIsRefused) {
  if (!driver_capabilities().graphs) GTEST_SKIP() << "no graphs";
  Stream s = stream_create();
  Event e = event_create_interprocess(0);
  Graph g = graph_create();
  graph_capture_begin(g, s);
  EXPECT_RT_ERROR(event_record(e, s), CaptureError, "interprocess event");
  EXPECT_RT_ERROR(graph_capture_end(g), CaptureError, "invalidated");
  graph_destroy(g);
  event_record(e, s);  // eagerly, afterwards
  event_synchronize(e);
  event_destroy(e);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
