// Graph replay without ATen for the simplest operators.
//
// A captured operator normally replays as its ATen CPU kernel call (underlying_task.h): about
// 2 µs for a tiny tensor, most of it TensorIterator's set-up and the CPU views, which is what
// graphs of small operators are made of. Additions, subtractions (alpha 1), products and
// quotients of contiguous float32/float64 tensors of one shape, or of such a tensor and a
// scalar, are recorded instead as a task of csrc/kernels/host: the same IEEE operation per
// element, so replay gives the values eager execution gives, bit for bit.
#pragma once

#include <optional>

#include "aten/underlying_task.h"
#include "runtime/task.h"

namespace accel::aten {

// The task computing `work` directly, or nullopt when the call is not one of those above
// (other operators or dtypes, broadcasting, strided or partially overlapping tensors).
std::optional<rt::Task> replay_elementwise(const Work& work);

}  // namespace accel::aten
