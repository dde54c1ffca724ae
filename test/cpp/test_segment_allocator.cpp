// Segments from functions the user gives (torch.cuda's pluggable allocator): a MemPool's own
// allocator, and the device's current allocator (set_device_allocator, DeviceAllocator.*: run in
// a process of its own, before any device memory exists).
//
// The test allocator hands out host memory where the driver's device memory is host memory, and
// the emulated CUDA runtime's cudaMalloc and cudaFree on the cuda driver built on it (as a
// pluggable allocator on a GPU would call CUDA's); the tests skip elsewhere.
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include "test_util.h"

namespace accel::rt {
namespace {

// What the allocator functions saw.
struct Heap {
  std::mutex m;
  std::map<void*, std::size_t> live;  // pointer -> size given
  std::vector<std::size_t> sizes;     // of every alloc call
  std::vector<void*> alloc_streams;   // the stream handle of every alloc call
  int allocs = 0;
  int frees = 0;
  int bad_frees = 0;  // a pointer or size the heap did not give
  int wrong_device = 0;
  std::size_t refuse_above = SIZE_MAX;  // alloc returns nullptr for larger sizes
  bool repeat = false;                  // alloc returns the last live pointer again
  void* last = nullptr;
};

Heap& heap() {
  static auto* h = new Heap();
  return *h;
}

int expected_device = 0;

// Where the test allocator's memory comes from (null: nowhere usable with this driver).
struct Source {
  void* (*alloc)(std::size_t) = nullptr;
  void (*free)(void*) = nullptr;
};
void* host_memory(std::size_t size) {
  return std::aligned_alloc(512, (size + 511) / 512 * 512);
}
void host_free(void* p) {
  std::free(p);
}

const Source& source() {
  static const Source s = [] {
    if (driver_capabilities().host_accessible_memory) return Source{host_memory, host_free};
    // The cuda driver on the emulated CUDA runtime: its cudaMalloc, under the emulator's name.
    const char* dir = std::getenv("ACCEL_DRIVER_PATH");
    if (std::string(driver_name()) != "cuda" || dir == nullptr) return Source{};
    const std::string path = std::string(dir) + "/libaccel_driver_cuda.so";
    void* driver = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) return Source{};
    Source found;
    found.alloc = reinterpret_cast<void* (*)(std::size_t)>(::dlsym(driver, "cuda_emulator_malloc"));
    found.free = reinterpret_cast<void (*)(void*)>(::dlsym(driver, "cuda_emulator_free"));
    return found.alloc != nullptr && found.free != nullptr ? found : Source{};
  }();
  return s;
}

void* heap_alloc(std::size_t size, int device, void* stream) {
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.m);
  ++h.allocs;
  h.sizes.push_back(size);
  h.alloc_streams.push_back(stream);
  if (device != expected_device) ++h.wrong_device;
  if (size > h.refuse_above) return nullptr;
  if (h.repeat && h.last != nullptr) return h.last;
  void* p = source().alloc(size);
  if (p == nullptr) return nullptr;
  h.live[p] = size;
  h.last = p;
  return p;
}

void heap_free(void* ptr, std::size_t size, int device, void* stream) {
  (void)stream;
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.m);
  ++h.frees;
  if (device != expected_device) ++h.wrong_device;
  auto it = h.live.find(ptr);
  if (it == h.live.end() || it->second != size) {
    ++h.bad_frees;
    return;
  }
  h.live.erase(it);
  if (h.last == ptr) h.last = nullptr;
  source().free(ptr);
}

constexpr SegmentAllocator kHeap{heap_alloc, heap_free};

class SegmentAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (source().alloc == nullptr) {
      GTEST_SKIP() << "the test's allocator has no device memory to give on the " << driver_name()
                   << " driver (host memory, or the emulated CUDA runtime's)";
    }
    Heap& h = heap();
    std::lock_guard<std::mutex> lock(h.m);
    h.sizes.clear();
    h.alloc_streams.clear();
    h.allocs = h.frees = h.bad_frees = h.wrong_device = 0;
    h.refuse_above = SIZE_MAX;
    h.repeat = false;
    expected_device = 0;
  }
  void TearDown() override {
    Heap& h = heap();
    EXPECT_EQ(h.bad_frees, 0);
    EXPECT_EQ(h.wrong_device, 0);
  }
};

// Values written to `n` floats at p and read back through the runtime's copies.
void expect_round_trip(float* p, std::size_t n, Stream s) {
  std::vector<float> in(n);
  std::iota(in.begin(), in.end(), 1.0f);
  memcpy_async(p, in.data(), n * sizeof(float), CopyKind::HostToDevice, s);
  testing::device_kernel<float>(s, p, n, [](float* v, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) v[i] *= 2.0f;
  });
  std::vector<float> out(n);
  memcpy_async(out.data(), p, n * sizeof(float), CopyKind::DeviceToHost, s);
  stream_synchronize(s);
  for (std::size_t i = 0; i < n; i += n / 7 + 1) EXPECT_EQ(out[i], 2.0f * in[i]) << i;
}

TEST_F(SegmentAllocatorTest, APoolsSegmentsComeFromItsAllocatorAndGoBackToIt) {
  const Stream s = stream_create(0);
  const PoolId pool = mem_pool_create(0, MemPoolOptions{.allocator = kHeap});
  mem_pool_begin_allocate(0, pool);
  auto* small = static_cast<float*>(rt::malloc(1000 * sizeof(float), s));
  auto* large = static_cast<float*>(rt::malloc(3 << 20, s));
  auto* small2 = static_cast<float*>(rt::malloc(1000 * sizeof(float), s));  // cached, same segment
  mem_pool_end_allocate(0, pool);
  void* outside = rt::malloc(4096, s);  // the default pool: the driver's

  {
    Heap& h = heap();
    std::lock_guard<std::mutex> lock(h.m);
    EXPECT_EQ(h.allocs, 2);
    EXPECT_EQ(h.sizes, (std::vector<std::size_t>{std::size_t{2} << 20, std::size_t{20} << 20}));
    EXPECT_EQ(h.alloc_streams,
              (std::vector<void*>{stream_native_handle(s), stream_native_handle(s)}));
    const auto inside = [&](const void* p) {
      for (const auto& [base, size] : h.live) {
        const auto* b = static_cast<const char*>(base);
        if (p >= b && p < b + size) return true;
      }
      return false;
    };
    EXPECT_TRUE(inside(small));
    EXPECT_TRUE(inside(large));
    EXPECT_TRUE(inside(small2));
    EXPECT_FALSE(inside(outside));
  }
  EXPECT_EQ(pointer_device(large + 100), 0);
  // The user's memory is the user's: not shared with other processes by the runtime.
  if (driver_capabilities().ipc_memory) {
    EXPECT_RT_ERROR(ipc_export(large), NotSupportedError, "pluggable allocator");
  }
  uint64_t in_pool = 0;
  for (const SegmentInfo& seg : memory_snapshot().segments) {
    if (seg.pool == pool) in_pool += seg.total_size;
  }
  EXPECT_EQ(in_pool, uint64_t{22} << 20);
  expect_round_trip(small, 1000, s);
  expect_round_trip(large, (3 << 20) / sizeof(float), s);

  rt::free(small);
  rt::free(large);
  stream_synchronize(s);
  empty_cache(0);  // a held pool keeps its segments
  EXPECT_EQ(heap().frees, 0);
  mem_pool_release(0, pool);
  EXPECT_EQ(heap().frees, 1);  // the large segment was free: back at once
  rt::free(small2);            // the last block of the small one: cached until empty_cache
  EXPECT_EQ(heap().frees, 1);
  empty_cache(0);
  EXPECT_EQ(heap().frees, 2);
  EXPECT_TRUE(heap().live.empty());
  rt::free(outside);
  stream_destroy(s);
}

TEST_F(SegmentAllocatorTest, AnAllocatorWithoutMemoryIsOutOfMemoryAndTheDeviceStaysUsable) {
  heap().refuse_above = std::size_t{4} << 20;
  const PoolId pool = mem_pool_create(0, MemPoolOptions{.allocator = kHeap});
  mem_pool_begin_allocate(0, pool);
  void* fits = rt::malloc(1 << 16);
  EXPECT_RT_ERROR(rt::malloc(std::size_t{64} << 20), OutOfMemoryError, "out of memory");
  mem_pool_end_allocate(0, pool);
  void* elsewhere = rt::malloc(std::size_t{64} << 20);  // the driver's memory is still there
  EXPECT_NE(elsewhere, nullptr);
  rt::free(elsewhere);
  rt::free(fits);
  mem_pool_release(0, pool);
  EXPECT_TRUE(heap().live.empty());
}

TEST_F(SegmentAllocatorTest, MemoryGivenTwiceIsRefusedAndReturned) {
  const PoolId pool = mem_pool_create(0, MemPoolOptions{.allocator = kHeap});
  mem_pool_begin_allocate(0, pool);
  void* first = rt::malloc(std::size_t{12} << 20);  // a segment of its own
  heap().repeat = true;
  EXPECT_RT_ERROR(rt::malloc(std::size_t{12} << 20), InvalidValueError,
                  "overlaps memory it already gave the device");
  heap().repeat = false;
  void* second = rt::malloc(std::size_t{12} << 20);
  mem_pool_end_allocate(0, pool);
  EXPECT_NE(first, second);
  // The refused memory is not given back (it is the first segment's): nothing was freed.
  EXPECT_EQ(heap().frees, 0);
  EXPECT_EQ(heap().live.size(), 2u);
  rt::free(first);
  rt::free(second);
  mem_pool_release(0, pool);
  EXPECT_TRUE(heap().live.empty());
}

TEST_F(SegmentAllocatorTest, TheDeviceAllocatorCannotChangeOnceMemoryWasAllocated) {
  void* p = rt::malloc(4096);  // this process has device memory now
  EXPECT_RT_ERROR(set_device_allocator(kHeap), InvalidValueError, "cannot change");
  EXPECT_RT_ERROR(set_device_allocator(SegmentAllocator{heap_alloc, nullptr}), InvalidValueError,
                  "give both an alloc and a free function");
  EXPECT_TRUE(device_allocator().is_driver());
  rt::free(p);
  EXPECT_EQ(heap().allocs, 0);
}

// In a process of its own (ctest runtime_device_allocator), before any device memory exists.
TEST(DeviceAllocator, EveryAllocationGoesToTheDevicesAllocatorUncached) {
  if (source().alloc == nullptr) {
    GTEST_SKIP() << "the test's allocator has no device memory to give on this driver";
  }
  ASSERT_EQ(memory_stats(0).num_device_alloc, 0) << "run this suite in a fresh process";
  set_device_allocator(kHeap);
  EXPECT_EQ(device_allocator(), kHeap);
  EXPECT_FALSE(memory_caching(0));
  const Stream s = stream_create(0);
  auto* a = static_cast<float*>(rt::malloc(1000 * sizeof(float), s));
  auto* b = static_cast<float*>(rt::malloc(1000 * sizeof(float), s));
  EXPECT_EQ(heap().allocs, 2);  // no caching: each allocation calls the allocator
  EXPECT_EQ(heap().sizes, (std::vector<std::size_t>{4096, 4096}));  // rounded to 512 bytes
  expect_round_trip(a, 1000, s);
  rt::free(a);
  EXPECT_EQ(heap().frees, 1);  // its stream had passed the free: back at once
  testing::Gate gate;
  launch_host_func(s, [&] { gate.wait(); });
  rt::free(b);  // still in use by the stream's queued work: returned once it ran
  gate.open();
  stream_synchronize(s);
  void* c = rt::malloc(64, s);  // the completed free is processed on the next allocation
  EXPECT_EQ(heap().frees, 2);
  // Pools created now take their segments from it too, and cache them.
  const PoolId pool = mem_pool_create(0);
  mem_pool_begin_allocate(0, pool);
  void* in_pool = rt::malloc(1 << 16, s);
  void* in_pool2 = rt::malloc(1 << 16, s);
  mem_pool_end_allocate(0, pool);
  EXPECT_EQ(heap().allocs, 4);  // c, and one 2 MiB segment for both
  EXPECT_EQ(heap().sizes.back(), std::size_t{2} << 20);
  rt::free(in_pool);
  rt::free(in_pool2);
  rt::free(c);
  mem_pool_release(0, pool);
  stream_synchronize(s);
  empty_cache(0);
  EXPECT_TRUE(heap().live.empty());
  EXPECT_EQ(heap().bad_frees, 0);
  EXPECT_EQ(heap().wrong_device, 0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, 0);
  EXPECT_RT_ERROR(set_device_allocator(SegmentAllocator{}), InvalidValueError, "cannot change");
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
