/* The C interface of libaccel_aten_cuda.so: what torch_accel needs from PyTorch's CUDA side to
 * run ATen CUDA kernels on accel memory (csrc/aten/executor.h). Loaded with dlopen only when
 * the cuda driver runs, so the package never needs CUDA otherwise. */
#ifndef ACCEL_ATEN_CUDA_BRIDGE_H_
#define ACCEL_ATEN_CUDA_BRIDGE_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ACCEL_CUDA_BRIDGE_VERSION 2

/* ACCEL_CUDA_BRIDGE_VERSION of the library. */
typedef int (*accel_cuda_bridge_version_fn)(void);
/* Makes CUDA device `device` current and the cudaStream_t `stream` its current stream for
 * PyTorch on the calling thread. Returns what accel_cuda_exit restores, or NULL after writing why
 * into `error`. */
typedef void* (*accel_cuda_enter_fn)(int device, void* stream, char* error, size_t error_len);
typedef void (*accel_cuda_exit_fn)(void* state);
/* PyTorch's current CUDA stream of `device` into *stream. Returns 0, or nonzero after writing
 * why into `error`. */
typedef int (*accel_cuda_current_stream_fn)(int device, void** stream, char* error,
                                            size_t error_len);
/* Work submitted to the cudaStream_t `waiting` from now on waits for the work queued so far on
 * `waited_for` (both streams of CUDA device `device`). Returns 0, or nonzero with `error`. */
typedef int (*accel_cuda_wait_fn)(int device, void* waiting, void* waited_for, char* error,
                                  size_t error_len);

/* From now until accel_cuda_pool_end, PyTorch's CUDA allocations for work on streams that take
 * part in the capture `stream` of CUDA device `device` is recording go to a new private pool of
 * PyTorch's CUDA allocator (what torch.cuda.graph does for its own captures), whose id is
 * written into pool[2]. Returns 0, or nonzero with `error`. */
typedef int (*accel_cuda_pool_begin_fn)(int device, void* stream, unsigned long long pool[2],
                                        char* error, size_t error_len);
/* Ends the pool's allocation (the capture ended). */
typedef int (*accel_cuda_pool_end_fn)(int device, const unsigned long long pool[2], char* error,
                                      size_t error_len);
/* The pool's memory may go once its blocks are free (the graph was reset or destroyed). */
typedef int (*accel_cuda_pool_release_fn)(int device, const unsigned long long pool[2], char* error,
                                          size_t error_len);

/* Gives PyTorch's CUDA allocator's cached, unused memory back to CUDA; returns 1 if the memory
 * it reserves on `device` went down, 0 if not, -1 on failure (then `error`). */
typedef int (*accel_cuda_empty_cache_fn)(int device, char* error, size_t error_len);

/* Random operators captured into an accel graph (device/graph_rng.h): a CUDA generator of
 * device `device` in capture mode whose kernels read their Philox seed and base offset, when
 * they run, from seed_offset[0] and seed_offset[1] (pinned host memory, which the caller sets
 * before each replay; kernels reach it through unified addressing); the captured draws take
 * consecutive offsets after the base, as in torch.cuda's graphs. Returns the handle, or NULL
 * after writing why into `error`. Only for captures: a draw outside one is an error. */
typedef void* (*accel_cuda_graph_rng_create_fn)(int device, long long* seed_offset, char* error,
                                                size_t error_len);
/* The handle's generator, a c10::GeneratorImpl* the handle keeps alive. */
typedef void* (*accel_cuda_graph_rng_generator_fn)(void* rng);
/* The Philox offsets the captured draws took in all: what a replay advances the generator by. */
typedef unsigned long long (*accel_cuda_graph_rng_increment_fn)(void* rng);
typedef void (*accel_cuda_graph_rng_destroy_fn)(void* rng);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_ATEN_CUDA_BRIDGE_H_ */
