// Random number generators of accel devices.
//
// An accel generator holds CUDA-like state: a seed and an offset. Random operators run on the
// CPU kernels (through the fallback now, on device memory later), so each random operator gets
// a fresh CPU generator whose whole Mersenne Twister state is derived from (seed, offset), and
// the offset advances by one. The same seed thus gives the same sequence of random operators,
// offsets and states round-trip exactly, and distinct (seed, offset) pairs give independent
// streams (the state is filled from a 128-bit key, not a 32-bit seed).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

namespace accel::device {

// The default generator of a device (index -1: the current device).
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// True for generators of accel devices.
bool is_accel_generator(const at::Generator& gen);
// A CPU generator for the next random operator drawing from `gen` (which advances).
at::Generator next_cpu_generator(const at::Generator& gen);
// For a random operator that CUDA's kernel runs (the cuda executor): while alive, holds accel
// generator `gen` and a CUDA generator of `cuda_device` whose Philox seed and offset are gen's
// (its offset rounded up to Philox's multiple of 4); on destruction gen takes the offset the
// kernel advanced to. So on the cuda driver accel generators follow CUDA's Philox semantics: a
// seed gives torch.cuda's numbers.
class CudaDraw {
 public:
  CudaDraw(const at::Generator& gen, c10::DeviceIndex cuda_device);
  ~CudaDraw();
  CudaDraw(const CudaDraw&) = delete;
  CudaDraw& operator=(const CudaDraw&) = delete;
  const at::Generator& cuda_generator() const { return cuda_; }

 private:
  at::Generator accel_;
  at::Generator cuda_;
};

// The (seed, offset) of accel generator `gen`, whose offset then advances by n (graph replays).
std::pair<uint64_t, uint64_t> take_offsets(const at::Generator& gen, uint64_t n);
// The same for Philox (the cuda driver's graphs): the offset first rounded up to Philox's
// multiple of 4, as CudaDraw rounds it.
std::pair<uint64_t, uint64_t> take_philox_offsets(const at::Generator& gen, uint64_t n);
// Gives CPU generator `cpu` the state of draw `offset` of `seed` (what next_cpu_generator makes).
void set_cpu_generator_state(const at::Generator& cpu, uint64_t seed, uint64_t offset);

}  // namespace accel::device
