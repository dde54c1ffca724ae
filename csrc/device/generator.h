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
// The (seed, offset) of accel generator `gen`, whose offset then advances by n (graph replays).
std::pair<uint64_t, uint64_t> take_offsets(const at::Generator& gen, uint64_t n);
// Gives CPU generator `cpu` the state of draw `offset` of `seed` (what next_cpu_generator makes).
void set_cpu_generator_state(const at::Generator& cpu, uint64_t seed, uint64_t offset);

}  // namespace accel::device
