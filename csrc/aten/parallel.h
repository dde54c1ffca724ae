// Threads for accel's own host kernels: ATen's intra-op threads.
//
// ATen's CPU kernels parallelize with OpenMP, through the runtime PyTorch ships (already loaded,
// and global). at::parallel_for is inline and needs this file compiled with OpenMP, which would
// bring a second OpenMP runtime; instead the kernels' ParallelFor (csrc/kernels/host/parallel.h)
// starts a team of torch's runtime through its entry points, looked up at run time: the same
// threads, the same count (torch.set_num_threads), nested regions serial. Without OpenMP in the
// process the kernels run serially.
#pragma once

#include "kernels/host/parallel.h"

namespace accel::aten {

// A ParallelFor over ATen's intra-op threads.
kernels::host::ParallelFor intra_op_parallel();

// The OpenMP runtime's omp_set_num_threads and omp_get_max_threads (null without one), and
// MKL's thread-local count (null without MKL): torch.set_num_threads sets MKL's global count,
// which takes precedence over OpenMP's for MKL's calls, so a serial call must set both.
struct OmpThreads {
  void (*set)(int);
  int (*get)();
  int (*mkl_set_local)(int);  // returns the previous thread-local count (0: the global one)
};
const OmpThreads& omp_threads();

}  // namespace accel::aten
