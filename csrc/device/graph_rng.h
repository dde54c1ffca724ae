// Random operators inside captured graphs: every replay draws fresh numbers.
//
// Eager random operators each get a CPU generator made from their accel generator's (seed,
// offset), and the offset advances by one (generator.h). A captured operator cannot: its task
// is recorded once and replayed many times. As CUDA's graphs do with Philox (seed, offset), a
// graph keeps, per accel generator it draws from, the (seed, base offset) of the replay, set by
// a task that runs on the replay stream right before the graph; the graph's k-th draw from that
// generator is recorded as a task that rebuilds its operator's CPU generator from (seed, base +
// k) just before the operator runs. Replaying reads the accel generator's seed and offset at the
// call and advances the offset by the graph's number of draws: manual_seed(s) before a replay
// reproduces it, and consecutive replays draw as consecutive eager calls would (not the same
// numbers as eager ones, which number their draws differently). Capture itself leaves the
// generators' offsets as they were. On the cuda driver the graph's CUDA kernels draw instead
// (captured_cuda_generator below).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "runtime/runtime.h"

namespace accel::device {

// Captures through the Python API register the graph they record into (the capture id is the
// runtime's stream_capture_id of the capturing stream); ends and resets forget it.
void graph_rng_capture_begin(rt::Graph graph, uint64_t capture_id);
void graph_rng_capture_end(rt::Graph graph);
void graph_rng_forget(rt::Graph graph);

// The CPU generator for a random operator about to be recorded on `stream`, which captures
// capture `capture_id`: records, before the operator, the task that sets its state for each
// replay. Throws torch_accel.CaptureError (invalidating the capture) if the capture was not
// begun through graph_rng_capture_begin (a C++ capture straight on the runtime).
at::Generator captured_cpu_generator(const at::Generator& accel_gen, rt::Stream stream,
                                     uint64_t capture_id, const char* op);

// The cuda executor's graph-safe draws (aten/executor.cpp, through libaccel_aten_cuda.so): a
// CUDA generator in capture mode whose kernels read the Philox seed and base offset from
// `seed_offset` (two int64 of pinned host memory, set by a task on the replay stream before
// each replay) and number the captured draws after the base, as torch.cuda's graphs do. So on
// cuda, replaying from a seed gives the numbers eager calls give from that seed.
class CapturedCudaRng {
 public:
  virtual ~CapturedCudaRng() = default;
  virtual at::Generator generator() const = 0;
  // The Philox offsets the captured draws took in all (what a replay advances by).
  virtual uint64_t increment() const = 0;
};
using CapturedCudaRngFactory = std::unique_ptr<CapturedCudaRng> (*)(c10::DeviceIndex device,
                                                                    int64_t* seed_offset);

// The CUDA generator for a random operator the cuda executor is about to capture on `stream`:
// the graph's one for `accel_gen` (made by `make` at its first draw). Throws CaptureError as
// captured_cpu_generator does.
at::Generator captured_cuda_generator(const at::Generator& accel_gen, rt::Stream stream,
                                      uint64_t capture_id, const char* op,
                                      CapturedCudaRngFactory make);

// Before replaying `graph` on `stream`: records the generators' (seed, offset) for this replay
// and advances their offsets by the graph's draws.
void graph_rng_before_replay(rt::Graph graph, rt::Stream stream);

}  // namespace accel::device
