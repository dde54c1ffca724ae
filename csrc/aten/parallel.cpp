#include "aten/parallel.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <exception>
#include <mutex>

namespace accel::aten {
namespace {

// libgomp's entry point for `#pragma omp parallel`: runs fn(data) on a team of `threads`.
using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

struct Runtime {
  GompParallel parallel = nullptr;
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;
};

const Runtime& runtime() {
  static const Runtime r{reinterpret_cast<GompParallel>(dlsym(RTLD_DEFAULT, "GOMP_parallel")),
                         reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_thread_num")),
                         reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_num_threads"))};
  return r;
}

struct Team {
  int64_t n;
  const std::function<void(int64_t, int64_t)>* body;
  std::exception_ptr error;
  std::mutex mutex;
};

// One member's share of [0, n): equal contiguous pieces, as ATen's OpenMP parallel_for splits.
void member(void* data) {
  Team& team = *static_cast<Team*>(data);
  const Runtime& r = runtime();
  const int64_t members = r.num_threads(), id = r.thread_num();
  const int64_t piece = (team.n + members - 1) / members;
  const int64_t begin = id * piece, end = std::min(team.n, begin + piece);
  if (begin >= end) return;
  try {
    (*team.body)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(team.mutex);
    if (!team.error) team.error = std::current_exception();
  }
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const Runtime& r = runtime();
  // at::get_num_threads applies torch.set_num_threads to this thread first (per-thread in
  // OpenMP; stream workers are threads of their own).
  const int64_t pieces = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pieces);
  if (r.parallel == nullptr || r.thread_num == nullptr || r.num_threads == nullptr ||
      threads <= 1 || at::in_parallel_region()) {
    body(0, n);
    return;
  }
  Team team{n, &body, nullptr, {}};
  r.parallel(&member, &team, static_cast<unsigned>(threads), 0);
  if (team.error) std::rethrow_exception(team.error);
}

}  // namespace

kernels::host::ParallelFor intra_op_parallel() {
  return &parallel_for;
}

const OmpThreads& omp_threads() {
  static const OmpThreads o{
      reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")),
      reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads")),
      // The C interface (mkl_set_num_threads_local is the Fortran one, by pointer).
      reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"))};
  return o;
}

}  // namespace accel::aten
