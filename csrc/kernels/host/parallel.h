// How torch-free host kernels spread work over threads. The kernels do not own a thread pool:
// the caller passes one (the operator layer passes ATen's intra-op pool, so torch.set_num_threads
// applies), and a kernel called without one runs serially.
#pragma once

#include <cstdint>
#include <functional>

namespace accel::kernels::host {

// Calls body(begin, end) over pieces of [0, n) of at least `grain` items (the last may be
// shorter), possibly on several threads at once; returns when every piece is done.
using ParallelFor = std::function<void(int64_t n, int64_t grain,
                                       const std::function<void(int64_t, int64_t)>& body)>;

inline void serial_for(int64_t n, int64_t /*grain*/,
                       const std::function<void(int64_t, int64_t)>& body) {
  if (n > 0) body(0, n);
}

}  // namespace accel::kernels::host
