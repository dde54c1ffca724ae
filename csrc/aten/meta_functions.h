// Result metadata of accel's own computing, beside the yaml `meta:` functions (which the
// generated registrations name): see meta_functions.cpp.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace accel::aten {

// The length of arange(start, end, step) filled as `dtype`, computed as the CPU kernel computes
// it, with its checks and their messages (the dtypes it fills; a zero step; bounds against the
// step's sign; a non-finite range; an overflowing length), and one check PyTorch's kernels lack:
// an int64 arange whose step truncates to zero (arange(0, 1, 0.5, dtype=torch.long)) divides by
// zero in the CPU's kernel and CUDA's, killing the process with SIGFPE.
int64_t arange_length(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                      c10::ScalarType dtype);

// arange_length of the call of aten::arange.start_step or aten::arange.start_out whose
// arguments are stack[begin:] (`out`: the out= form), with the dtype the call fills.
int64_t arange_call_length(const torch::jit::Stack& stack, size_t begin, bool out);

}  // namespace accel::aten
