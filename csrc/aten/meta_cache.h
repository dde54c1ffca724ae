// Result metadata of underlying operator calls, and the cache that keeps it per call signature.
//
// An underlying call allocates its results before its kernel runs, so it needs their sizes,
// strides and dtypes up front. They come from PyTorch's meta functions, and are verified by the
// first call of each signature, which runs synchronously (see underlying.cpp). The cache key is
// the metadata of the arguments (and their non-floating-point values, the default dtype, and
// which written tensors alias which arguments): a repeated call with the same key allocates
// its results without running any meta kernel (PyTorch implements many in Python, tens of
// microseconds each). Shapes that depend on tensor data never come here.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace accel::aten {

struct TensorMeta {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool conj = false;
  bool neg = false;

  // Undefined results (backward operators whose output_mask leaves a gradient out) have dtype
  // Undefined and allocate as undefined tensors.
  static TensorMeta of(const at::Tensor& t);
  bool describes(const at::Tensor& t) const;
};

struct CachedResult {
  // Per result: one TensorMeta (tensor result) or several (tensor list result).
  std::vector<std::vector<TensorMeta>> results;
  std::vector<bool> result_is_list;
  // Per argument: the metadata after the call (write arguments may be resized).
  std::vector<std::optional<TensorMeta>> written;
  // The kernel did not do what the meta functions said (it resized an out= tensor they did not
  // resize, say): calls with this key run synchronously, where the actual results are known.
  bool run_on_caller = false;
  // False while no call with this key has run the way later calls run: its first call ran the
  // CPU's own kernel on the caller (underlying_caller.h), later calls run their task (an out=
  // variant, a kernel into the results), whose checks can differ by dtype. The first such call
  // waits for its task (see underlying.cpp).
  mutable std::atomic<bool> launch_checked{true};
};

// How a call is described in its cache key.
struct KeyOptions {
  // Numbers inside generic lists are described by their type only when false (the scalar lists
  // of _foreach_ operators change every step).
  bool list_values = true;
  // Floating-point numbers are described by their value when true, else by their type only.
  // Values decide result shapes only in arange, but argument checks of many kernels read them
  // (bernoulli_'s p, uniform_'s range): a call with a new value runs first on the caller, where
  // such a check raises. Operators whose values change every call (learning rates) turn this
  // off (FloatVariation).
  bool float_values = true;
  // Which tensors share storage, and where (operators that write: overlap is an error there).
  bool aliasing = false;
  // Tensors are described by their sizes and strides when true, else by their number of
  // dimensions and the kind of their layout only (contiguous, channels-last, dense, empty): the
  // key of a family of calls that differ in shapes alone (Families).
  bool layouts = true;
};

// The cache key of the call whose arguments are stack[begin:]; false if some argument cannot be
// described (the call is not cached then).
bool encode_call(const torch::jit::Stack& stack, size_t begin, const KeyOptions& options,
                 std::string& key, bool* has_floats = nullptr);

// Per operator: whether the floating-point values of its calls vary so much that keying on them
// would make most calls cache misses (a learning rate that changes every step). Fed with the
// keys of cache misses with and without float values; once more than kMaxValues values are
// seen for one type-only key, it answers true for good.
class FloatVariation {
 public:
  bool varies() const { return varies_.load(std::memory_order_relaxed); }
  bool varies(const std::string& type_key, const std::string& value_key);

 private:
  static constexpr size_t kMaxValues = 8;
  static constexpr size_t kMaxKeys = 256;
  std::atomic<bool> varies_{false};
  std::mutex mutex_;
  std::unordered_map<std::string, std::vector<std::string>> seen_;
};

// Per operator: the families of calls (keys without layouts, KeyOptions::layouts) of which a
// call ran at the call without an error or a warning: a first call of a new shape in such a
// family need not wait for its kernel (its argument checks are the meta function's, which runs
// at every first call; what the kernel checks depends on the data, as a CUDA kernel's does).
class Families {
 public:
  bool contains(const std::string& family);
  void insert(const std::string& family);

 private:
  static constexpr size_t kMaxFamilies = 1024;
  std::mutex mutex_;
  std::unordered_set<std::string> families_;
};

class MetaCache {
 public:
  std::shared_ptr<const CachedResult> find(const std::string& key);
  void insert(const std::string& key, std::shared_ptr<const CachedResult> value);

 private:
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CachedResult>> entries_;
};

// The call's results and its arguments afterwards, computed on meta tensors: by `meta` (a C++
// meta function on a boxed stack) where given, else by the operator's Meta kernel. Null if the
// call cannot be represented on meta tensors (a CPU tensor with elements) or the meta
// computation fails (no meta kernel, a shape that depends on the data, an invalid call).
std::shared_ptr<CachedResult> meta_results(const c10::OperatorHandle& op,
                                           void (*meta)(torch::jit::Stack*),
                                           const torch::jit::Stack& stack, size_t begin);

// Gives every result in `r` contiguous strides (OpConfig::contiguous_results).
void make_contiguous(CachedResult& r);

// Whether `v` is a Tensor?[] (indices).
bool is_optional_tensor_list(const c10::IValue& v);

// Called inside the handler of a meta computation that failed and was dropped (the call then
// runs its CPU kernel on the caller instead). A meta function written in Python that raised (a
// data-dependent one, such as nonzero's, reached through the Python dispatcher) leaves its error
// set in the interpreter, unfetched by torch's python_error: returning normally with it set makes
// the next Python call fail ("returned a result with an exception set"). The Python module
// installs the handler that takes it; without one (no Python) nothing is called.
void set_dropped_error_handler(void (*handler)());

}  // namespace accel::aten
