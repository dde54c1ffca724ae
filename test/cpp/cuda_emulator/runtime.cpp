// The emulated CUDA runtime: devices, streams (a worker thread each), host functions, copies and
// memsets (memory.cpp has the memory itself, graphs.cpp events, capture and graphs).
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emulator.h"

namespace cuda_emulator {
namespace {

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -5;

struct State {
  State() {
    const char* n = std::getenv("CUDA_EMULATOR_DEVICES");
    devices = n != nullptr ? std::atoi(n) : 2;
    const char* mb = std::getenv("CUDA_EMULATOR_MEMORY_MB");
    memory = (mb != nullptr ? std::strtoull(mb, nullptr, 10) : 4096) << 20;
    legacy.resize(static_cast<std::size_t>(std::max(devices, 0)), nullptr);
    if (const char* f = std::getenv("CUDA_EMULATOR_LOSE_DEVICE")) lose_file = f;
    ::pthread_atfork(nullptr, nullptr, [] { state().forked = true; });
  }
  static State& state();
  std::mutex mu;
  int devices = 0;
  std::size_t memory = 0;
  std::vector<CUstream_st*> streams;  // live ones, legacy streams included
  std::vector<CUstream_st*> legacy;   // per device, made on first use
  bool forked = false;
  // A GPU fault (an illegal address in a kernel): once this file exists, the context is dead.
  std::string lose_file;
  std::atomic<bool> faulted{false};
};

// Never destroyed: stream workers may still run when the process exits.
State& State::state() {
  static State* s = new State();
  return *s;
}
State& st() {
  return State::state();
}

pthread_key_t thread_key() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    ::pthread_key_create(&k, [](void* p) { delete static_cast<ThreadState*>(p); });
    return k;
  }();
  return key;
}

void worker_loop(CUstream_st* s) {
  for (;;) {
    std::pair<uint64_t, std::function<void()>> op;
    {
      std::unique_lock<std::mutex> lock(s->m);
      s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (!context_faulted()) op.second();  // a dead context runs nothing more
    {
      std::lock_guard<std::mutex> lock(s->progress->m);
      s->progress->completed = op.first;
    }
    s->progress->cv.notify_all();
  }
}

CUstream_st* make_stream(int device, unsigned flags, int priority) {  // under the lock
  auto* s = new CUstream_st;
  s->device = device;
  s->flags = flags;
  s->priority = std::clamp(priority, kGreatestPriority, kLeastPriority);
  s->worker = std::thread(worker_loop, s);
  st().streams.push_back(s);
  return s;
}

uint64_t last_submitted(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->m);
  return s->submitted;
}

// Whether a stream may be queried or synchronized now: not while it captures (the capture is
// invalidated), nor when the capture modes forbid it.
cudaError_t may_wait_for(CUstream_st* s) {
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (s->capture != nullptr) {
      invalidate(s->capture);
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  return unsafe_call();
}

bool valid_device(int d) {
  return d >= 0 && d < st().devices;
}

}  // namespace

ThreadState& thread_state() {
  auto* t = static_cast<ThreadState*>(::pthread_getspecific(thread_key()));
  if (t == nullptr) {
    t = new ThreadState;
    ::pthread_setspecific(thread_key(), t);
  }
  return *t;
}

int device_count() {
  return st().devices;
}
std::size_t device_memory() {
  return st().memory;
}
int current_device() {
  return thread_state().device;
}

void Progress::wait(uint64_t seq, const char* call) {
  std::unique_lock<std::mutex> lock(m);
  if (cv.wait_for(lock, std::chrono::seconds(20), [&] { return completed >= seq; })) return;
  std::fprintf(stderr, "cuda emulator: %s has waited 20 s for a stream's work\n", call);
  cv.wait(lock, [&] { return completed >= seq; });
}
bool Progress::reached(uint64_t seq) {
  std::lock_guard<std::mutex> lock(m);
  return completed >= seq;
}

std::mutex& global_mutex() {
  return st().mu;
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) thread_state().last = e;
  return e;
}

bool context_faulted() {
  if (st().faulted.load(std::memory_order_acquire)) return true;
  if (st().lose_file.empty() || ::access(st().lose_file.c_str(), F_OK) != 0) return false;
  st().faulted.store(true, std::memory_order_release);
  return true;
}

cudaError_t enter_without_context() {
  if (thread_state().in_callback)
    return cudaErrorNotPermitted;  // CUDA forbids CUDA calls in host functions
  if (st().forked) return cudaErrorInitializationError;
  return cudaSuccess;
}

cudaError_t enter() {
  const cudaError_t e = enter_without_context();
  if (e != cudaSuccess) return e;
  // After a fault every call that needs the context fails with it, frees included (sticky).
  return context_faulted() ? cudaErrorIllegalAddress : cudaSuccess;
}

CUstream_st* resolve(cudaStream_t stream) {
  const auto raw = reinterpret_cast<uintptr_t>(stream);
  if (raw > 2) return stream;
  std::lock_guard<std::mutex> lock(st().mu);  // 0, cudaStreamLegacy, cudaStreamPerThread
  CUstream_st*& legacy = st().legacy[static_cast<std::size_t>(thread_state().device)];
  if (legacy == nullptr) legacy = make_stream(thread_state().device, 0, 0);
  return legacy;
}

cudaError_t submit(CUstream_st* s, std::function<void()> op, const char* label, uint64_t* seq) {
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (s->capture != nullptr) return capture_node(s, std::move(op), label);
  }
  const uint64_t n = enqueue(s, std::move(op));
  if (seq != nullptr) *seq = n;
  return cudaSuccess;
}

uint64_t enqueue(CUstream_st* s, std::function<void()> op) {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(s->m);
    n = ++s->submitted;
    s->queue.emplace_back(n, std::move(op));
  }
  s->cv.notify_one();
  return n;
}

}  // namespace cuda_emulator

using namespace cuda_emulator;

extern "C" {

cudaError_t cudaGetLastError() {
  if (context_faulted()) return cudaErrorIllegalAddress;  // sticky: not reset
  const cudaError_t e = thread_state().last;
  thread_state().last = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define EMU_NAME(x) \
  case x: return #x;
    EMU_NAME(cudaSuccess)
    EMU_NAME(cudaErrorInvalidValue)
    EMU_NAME(cudaErrorMemoryAllocation)
    EMU_NAME(cudaErrorInitializationError)
    EMU_NAME(cudaErrorInvalidDevice)
    EMU_NAME(cudaErrorInvalidResourceHandle)
    EMU_NAME(cudaErrorNotReady)
    EMU_NAME(cudaErrorIllegalState)
    EMU_NAME(cudaErrorNotPermitted)
    EMU_NAME(cudaErrorNotSupported)
    EMU_NAME(cudaErrorOperatingSystem)
    EMU_NAME(cudaErrorStreamCaptureUnsupported)
    EMU_NAME(cudaErrorStreamCaptureInvalidated)
    EMU_NAME(cudaErrorStreamCaptureMerge)
    EMU_NAME(cudaErrorStreamCaptureUnmatched)
    EMU_NAME(cudaErrorStreamCaptureUnjoined)
    EMU_NAME(cudaErrorStreamCaptureIsolation)
    EMU_NAME(cudaErrorStreamCaptureImplicit)
    EMU_NAME(cudaErrorCapturedEvent)
    EMU_NAME(cudaErrorStreamCaptureWrongThread)
    EMU_NAME(cudaErrorIllegalAddress)
#undef EMU_NAME
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined:
      return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "emulated CUDA error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  const cudaError_t entered = enter_without_context();  // works after a fault, as CUDA's
  if (entered != cudaSuccess) return fail(entered);
  *count = st().devices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  EMU_ENTER();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  thread_state().device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  EMU_ENTER();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulator device %d", device);
  prop->totalGlobalMem = st().memory;
  prop->multiProcessorCount = 4;
  prop->major = 9;
  prop->minor = 0;
  prop->maxThreadsPerMultiProcessor = 2048;
  // A UUID of its own per device, as a GPU has.
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = static_cast<char>(0xe0 + i);
  prop->uuid.bytes[15] = static_cast<char>(device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
  EMU_ENTER();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::snprintf(bus, static_cast<std::size_t>(len), "00000000:%02X:00.0", 0x10 + device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  EMU_ENTER();
  if (least != nullptr) *least = kLeastPriority;
  if (greatest != nullptr) *greatest = kGreatestPriority;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  EMU_ENTER();
  if (const cudaError_t e = unsafe_call(); e != cudaSuccess) return fail(e);
  std::vector<std::pair<std::shared_ptr<Progress>, uint64_t>> waits;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    for (CUstream_st* s : st().streams) {
      if (s->device == thread_state().device) waits.emplace_back(s->progress, last_submitted(s));
    }
  }
  for (auto& [p, seq] : waits) p->wait(seq, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  EMU_ENTER();
  std::lock_guard<std::mutex> lock(st().mu);
  *stream = make_stream(thread_state().device, flags, priority);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EMU_ENTER();
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
    auto& all = st().streams;
    all.erase(std::remove(all.begin(), all.end(), stream), all.end());
  }
  {
    std::lock_guard<std::mutex> lock(stream->m);
    stream->stop = true;  // its queued work still runs, as on a GPU
  }
  stream->cv.notify_one();
  stream->worker.join();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  EMU_ENTER();
  *priority = resolve(stream)->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  EMU_ENTER();
  *device = resolve(stream)->device;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EMU_ENTER();
  CUstream_st* s = resolve(stream);
  if (const cudaError_t e = may_wait_for(s); e != cudaSuccess) return fail(e);
  s->progress->wait(last_submitted(s), "cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  EMU_ENTER();
  CUstream_st* s = resolve(stream);
  if (const cudaError_t e = may_wait_for(s); e != cudaSuccess) return fail(e);
  return s->progress->reached(last_submitted(s)) ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  EMU_ENTER();
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return fail(submit(
      resolve(stream),
      [fn, data] {
        thread_state().in_callback = true;
        fn(data);
        thread_state().in_callback = false;
      },
      "host function"));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  EMU_ENTER();
  if (n == 0) return cudaSuccess;
  CUstream_st* s = resolve(stream);
  Access to, from;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    to = classify(dst, n);
    from = classify(src, n);
    if (to.kind == Kind::Bad || from.kind == Kind::Bad) return fail(cudaErrorInvalidValue);
    const bool dst_dev = to.kind == Kind::Device;
    const bool src_dev = from.kind == Kind::Device;
    const bool ok = kind == cudaMemcpyDefault ||
                    (kind == cudaMemcpyHostToHost && !src_dev && !dst_dev) ||
                    (kind == cudaMemcpyHostToDevice && !src_dev && dst_dev) ||
                    (kind == cudaMemcpyDeviceToHost && src_dev && !dst_dev) ||
                    (kind == cudaMemcpyDeviceToDevice && src_dev && dst_dev);
    if (!ok) return fail(cudaErrorInvalidValue);
    const bool pageable = to.kind == Kind::Pageable || from.kind == Kind::Pageable;
    if (pageable && s->capture != nullptr) {  // a pageable copy is synchronous: not capturable
      invalidate(s->capture);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  char* d = to.host;
  const char* f = from.host;
  uint64_t seq = 0;
  if (const cudaError_t e = submit(
          s, [d, f, n] { std::memmove(d, f, n); }, "memcpy", &seq);
      e != cudaSuccess) {
    return fail(e);
  }
  // Pageable host memory: the call returns once the copy has been made (after the stream's
  // earlier work), as CUDA's staged copies do.
  if (to.kind == Kind::Pageable || from.kind == Kind::Pageable) {
    s->progress->wait(seq, "cudaMemcpyAsync (pageable memory)");
  }
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t n, cudaStream_t stream) {
  EMU_ENTER();
  if (n == 0) return cudaSuccess;
  Access to;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    to = classify(dst, n);
  }
  if (to.kind != Kind::Device) return fail(cudaErrorInvalidValue);
  char* d = to.host;
  return fail(submit(
      resolve(stream), [d, value, n] { std::memset(d, value, n); }, "memset"));
}

}  // extern "C"
