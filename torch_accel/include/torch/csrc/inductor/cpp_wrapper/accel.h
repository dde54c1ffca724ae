// The device header of Inductor's C++ wrapper for accel (Inductor includes and precompiles
// torch/csrc/inductor/cpp_wrapper/<device>.h; torch_accel/_inductor/cpp_wrapper.py puts this
// directory on the compiler's include path): the CPU's, and accel's launcher and C shim.
#pragma once

#include <torch/csrc/inductor/cpp_wrapper/cpu.h>
#include <torch_accel_aoti.h>
