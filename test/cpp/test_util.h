// Helpers shared by the runtime's GoogleTest suites.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "runtime/runtime.h"

namespace accel::rt::testing {

// Lets a test hold a stream busy: a task waits on the gate until the test opens it.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A task on `consumer` placed after a wait on `ready` sees what a gated task on `producer`
// wrote before the event was recorded.
inline void expect_wait_orders(Stream producer, Stream consumer, Event ready) {
  Gate gate;
  std::atomic<int> value{0};
  int seen = -1;
  launch_host_func(producer, [&] {
    gate.wait();
    value = 42;
  });
  event_record(ready, producer);
  stream_wait_event(consumer, ready);
  launch_host_func(consumer, [&] { seen = value.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(event_query(ready));
  EXPECT_FALSE(stream_query(consumer));  // blocked behind the producer
  gate.open();
  stream_synchronize(consumer);
  EXPECT_EQ(seen, 42);
  EXPECT_TRUE(event_query(ready));
}

template <class E, class F>
void expect_throw(F&& f, const std::string& needle, const char* file, int line) {
  try {
    f();
    ADD_FAILURE_AT(file, line) << "expected " << typeid(E).name() << " containing '" << needle
                               << "', nothing was thrown";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "at " << file << ":" << line << ": message was: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE_AT(file, line) << "expected " << typeid(E).name() << ", got " << typeid(e).name()
                               << ": " << e.what();
  }
}

// Runs f() on a new thread: the message of the CaptureError it threw, or "" if none.
template <class F>
std::string capture_error_from_thread(F&& f) {
  std::string error;
  std::thread([&] {
    try {
      f();
    } catch (const CaptureError& e) {
      error = e.what();
    }
  }).join();
  return error;
}

// EXPECT_RT_ERROR(statement, ErrorType, "part of the message")
#define EXPECT_RT_ERROR(stmt, Type, needle) \
  ::accel::rt::testing::expect_throw<::accel::rt::Type>([&] { stmt; }, needle, __FILE__, __LINE__)

// Tests of what only the host driver allows (a host task calling back into the runtime, which
// CUDA forbids in host callbacks) skip on other drivers.
#define SKIP_UNLESS_HOST_DRIVER()                                                             \
  do {                                                                                        \
    if (std::string(::accel::rt::driver_name()) != "host") {                                  \
      GTEST_SKIP() << "host driver behaviour (CUDA forbids runtime calls in host callbacks)"; \
    }                                                                                         \
  } while (0)

// Tests that need streams to run asynchronously skip under ACCEL_LAUNCH_BLOCKING=1.
#define SKIP_IF_LAUNCH_BLOCKING()                                              \
  do {                                                                         \
    if (::accel::rt::launch_blocking()) GTEST_SKIP() << "needs async streams"; \
  } while (0)

// Whether the device's sensors can be read: false where a GPU driver lacks the vendor's
// library it reads them through (NVML: an emulated GPU); any other refusal is thrown.
inline bool sensors_available(int device) {
  try {
    (void)device_sensor(Sensor::MemoryUsed, device);
    return true;
  } catch (const NotSupportedError& e) {
    if (std::string(e.what()).find("NVML") == std::string::npos) throw;
    return false;
  }
}

// Pinned copies of device_kernel that graphs captured: freed by GraphFixture once its graph is.
inline std::vector<void*>& captured_staging() {
  static std::vector<void*> buffers;
  return buffers;
}

// Runs f(data, count) on `count` values of device memory at `ptr`, in stream order, as a kernel
// would: in place where the driver's device memory is host-accessible, else on a pinned copy
// (device to host, f, host to device; captured alike).
template <class T, class F>
void device_kernel(Stream s, T* ptr, std::size_t count, F f) {
  if (driver_capabilities().host_accessible_memory) {
    launch_host_func(s, [ptr, count, f] { f(ptr, count); });
    return;
  }
  auto* staging = static_cast<T*>(host_malloc(count * sizeof(T)));
  memcpy_async(staging, ptr, count * sizeof(T), CopyKind::DeviceToHost, s);
  launch_host_func(s, [staging, count, f] { f(staging, count); });
  memcpy_async(ptr, staging, count * sizeof(T), CopyKind::HostToDevice, s);
  if (stream_capture_status(s) == CaptureStatus::None) {
    host_record_stream(staging, s);  // back to the cache once the stream passed it
    host_free(staging);
  } else {
    captured_staging().push_back(staging);  // the graph's replays use it
  }
}

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Device memory freed at the end of the scope.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t size, Stream stream) : ptr_(rt::malloc(size, stream)) {}
  ~DeviceBuffer() { rt::free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_;
};

// A stream and a graph for each test of graph capture.
class GraphFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = stream_create(0);
    g_ = graph_create();
  }
  void TearDown() override {
    graph_destroy(g_);
    stream_destroy(s_);
    for (void* p : captured_staging()) host_free(p);
    captured_staging().clear();
  }
  Stream s_;
  Graph g_;
};

// Device <-> host helpers through the runtime's synchronous copies.
template <class T>
std::vector<T> download(const T* device_ptr, std::size_t n) {
  std::vector<T> out(n);
  rt::memcpy(out.data(), device_ptr, n * sizeof(T), CopyKind::DeviceToHost);
  return out;
}

template <class T>
T* upload(const std::vector<T>& values) {
  auto* p = static_cast<T*>(rt::malloc(values.size() * sizeof(T)));
  rt::memcpy(p, values.data(), values.size() * sizeof(T), CopyKind::HostToDevice);
  return p;
}

}  // namespace accel::rt::testing
