#include "aten/underlying.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "aten/device_kernel.h"
#include "aten/dispatch_util.h"
#include "aten/fallback.h"
#include "device/allocator.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

std::atomic<bool> g_force_fallback{false};

// The tier of an operator for the driver this process runs on.
Tier driver_tier(const OpConfig& c) {
  static const int driver = [] {
    const std::string name = device::call([] { return std::string(rt::driver_name()); });
    return name == "cuda" ? 1 : name == "level_zero" ? 2 : 0;
  }();
  return driver == 1 ? c.cuda : driver == 2 ? c.level_zero : c.host;
}

bool is_accel(const at::Tensor& t) { return t.defined() && t.device().type() == kAccel; }

// One argument of the CPU call, captured by value for the task.
struct Arg {
  enum class Kind : uint8_t { Value, Tensor, TensorList, OptionalTensorList };
  Kind kind = Kind::Value;
  c10::IValue value;
  Layout tensor;
  std::vector<Layout> list;
  std::vector<std::optional<Layout>> optional_list;

  // Back to an empty slot, keeping the lists' capacity (slots are reused by later calls).
  void reset() {
    kind = Kind::Value;
    value = c10::IValue();
    list.clear();
    optional_list.clear();
  }

  c10::IValue materialize() const {
    switch (kind) {
      case Kind::Tensor:
        return tensor.cpu_view();
      case Kind::TensorList: {
        std::vector<at::Tensor> views;
        views.reserve(list.size());
        for (const Layout& l : list) views.push_back(l.cpu_view());
        return views;
      }
      case Kind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> views;
        for (const auto& l : optional_list) {
          views.push_back(l ? std::optional<at::Tensor>(l->cpu_view()) : std::nullopt);
        }
        return views;
      }
      case Kind::Value:
        break;
    }
    return value;
  }
};

bool is_optional_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  const c10::TypePtr elem = v.toList().elementType();
  return elem->kind() == c10::TypeKind::OptionalType &&
         elem->containedType(0)->kind() == c10::TypeKind::TensorType;
}

// CPU tensors given to an accel operator are copied at enqueue time, like CUDA reads them at
// launch: the caller may change them as soon as the call returns.
at::Tensor snapshot(const at::Tensor& cpu) { return cpu.clone(); }

// Fills `a` (a cleared, possibly reused slot) with the task's copy of `v`.
void capture(const c10::IValue& v, Arg& a) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (is_accel(t)) {
      a.kind = Arg::Kind::Tensor;
      a.tensor = Layout::of(t);
    } else {
      a.value = t.defined() ? c10::IValue(snapshot(t)) : v;
    }
  } else if (v.isTensorList()) {
    const c10::List<at::Tensor> ts = v.toTensorList();
    bool all_accel = true;
    for (const at::Tensor& t : ts) all_accel = all_accel && is_accel(t);
    if (all_accel) {
      a.kind = Arg::Kind::TensorList;
      for (const at::Tensor& t : ts) a.list.push_back(Layout::of(t));
    } else {
      std::vector<at::Tensor> copies;
      for (const at::Tensor& t : ts) copies.push_back(is_accel(t) ? t : snapshot(t));
      a.value = copies;  // mixed lists take the synchronous path before reaching here
    }
  } else if (is_optional_tensor_list(v)) {
    a.kind = Arg::Kind::OptionalTensorList;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isNone()) {
        a.optional_list.emplace_back(std::nullopt);
      } else {
        a.optional_list.emplace_back(Layout::of(e.toTensor()));
      }
    }
  } else if (v.isDevice() && v.toDevice().type() == kAccel) {
    a.value = c10::Device(c10::kCPU);  // factory operators build their result on the CPU
  } else {
    a.value = v;
  }
}

// A meta tensor with the layout and dtype of `t` (built directly: no dispatcher round trip).
at::Tensor meta_like(const at::Tensor& t) {
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(),
                                                std::nullopt, std::nullopt, std::nullopt);
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

// The argument for the meta pass; false if it cannot be represented (a CPU tensor with
// elements, or a CPU tensor inside a list): such calls take the synchronous path.
bool to_meta(const c10::IValue& v, c10::IValue* out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      *out = v;
    } else if (is_accel(t)) {
      *out = meta_like(t);
    } else if (t.device().is_cpu() && t.dim() == 0) {
      *out = v;  // CPU scalars combine with any device
    } else {
      return false;
    }
    return true;
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> metas;
    for (const at::Tensor& t : v.toTensorVector()) {
      if (!is_accel(t)) return false;
      metas.push_back(meta_like(t));
    }
    *out = metas;
    return true;
  }
  if (is_optional_tensor_list(v)) {
    c10::List<std::optional<at::Tensor>> metas;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isNone()) {
        metas.push_back(std::nullopt);
      } else if (is_accel(e.toTensor())) {
        metas.push_back(meta_like(e.toTensor()));
      } else {
        return false;
      }
    }
    *out = metas;
    return true;
  }
  if (v.isDevice() && v.toDevice().type() == kAccel) {
    *out = c10::Device(c10::kMeta);
    return true;
  }
  *out = v;
  return true;
}

// CPU indices (the Tensor?[] of index, index_put_) go to the device first, as CUDA's indexing
// moves them: the call then runs in stream order like any other.
void upload_cpu_indices(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::DeviceIndex device) {
  const auto on_cpu = [](const c10::IValue& e) {
    return e.isTensor() && e.toTensor().defined() && e.toTensor().device().is_cpu();
  };
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!is_optional_tensor_list(v)) continue;
    const c10::ArrayRef<c10::IValue> elems = v.toListRef();
    if (std::none_of(elems.begin(), elems.end(), on_cpu)) continue;
    c10::List<std::optional<at::Tensor>> uploaded;
    for (const c10::IValue& e : elems) {
      if (on_cpu(e)) {
        uploaded.push_back(e.toTensor().to(c10::Device(kAccel, device)));
      } else {
        uploaded.push_back(e.isNone() ? std::nullopt : std::optional<at::Tensor>(e.toTensor()));
      }
    }
    v = std::move(uploaded);
  }
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const auto kind = r.type()->kind();
    if (kind == c10::TypeKind::TensorType) continue;
    if (kind == c10::TypeKind::ListType &&
        r.type()->containedType(0)->kind() == c10::TypeKind::TensorType) {
      continue;
    }
    return false;
  }
  return true;
}

// The argument a write-aliasing result refers to.
std::optional<size_t> aliased_argument(const c10::FunctionSchema& schema,
                                       const c10::Argument& result) {
  const c10::AliasInfo* alias = result.alias_info();
  if (alias == nullptr || !alias->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a == nullptr) continue;
    for (const auto& set : alias->beforeSets()) {
      if (a->beforeSets().count(set) != 0) return i;
    }
  }
  return std::nullopt;
}

// Result metadata of an operator call, cached by the metadata (and non-tensor values) of its
// arguments: a repeated call allocates its results without running any meta kernel (PyTorch
// implements many in Python, tens of microseconds each). Shapes that depend on tensor data never
// come here (those operators are marked `sync`).
struct TensorMeta {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype;
  bool conj;
  bool neg;

  // Undefined results (backward operators whose output_mask leaves a gradient out) have dtype
  // Undefined and allocate as undefined tensors.
  static TensorMeta of(const at::Tensor& t) {
    if (!t.defined()) return {{}, {}, c10::ScalarType::Undefined, false, false};
    return {c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
            c10::SmallVector<int64_t, 5>(t.strides().begin(), t.strides().end()),
            t.scalar_type(), t.is_conj(), t.is_neg()};
  }
};

// A new accel tensor on the current device (the caller's guard selects it).
at::Tensor allocate(const TensorMeta& m) {
  if (m.dtype == c10::ScalarType::Undefined) return at::Tensor();
  at::Tensor t = at::detail::empty_strided_generic(
      m.sizes, m.strides, device::device_allocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), m.dtype);
  if (m.conj) t._set_conj(true);
  if (m.neg) t._set_neg(true);
  return t;
}

at::Tensor allocate(const at::Tensor& like) { return allocate(TensorMeta::of(like)); }

struct CachedResult {
  // Per result: one TensorMeta (tensor result) or several (tensor list result).
  std::vector<std::vector<TensorMeta>> results;
  std::vector<bool> result_is_list;
  // Per argument: the metadata after the call (write arguments may be resized).
  std::vector<std::optional<TensorMeta>> written;
};

// Appends a binary description of `v` to `key` (fixed-size fields, lengths before lists and
// strings, so distinct argument lists never describe alike); false if `v` cannot be described.
// Floating-point numbers are described by their type only unless `float_values` (they decide
// result shapes only in arange; learning rates and the like change every step and would miss
// the cache every time). Numbers inside generic lists are described by their type only when
// `list_values` is false (the scalar lists of _foreach_ operators).
bool describe(const c10::IValue& v, std::string& key, bool list_values = true,
              bool float_values = false) {
  const auto put = [&](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  const auto put_int = [&](int64_t x) { put(&x, sizeof(x)); };
  const auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      key.push_back('U');
      return;
    }
    key.push_back(t.device().type() == kAccel ? 'A' : 'C');
    const int64_t dim = t.dim();
    put_int(dim);
    put(t.sizes().data(), sizeof(int64_t) * dim);
    put(t.strides().data(), sizeof(int64_t) * dim);
    key.push_back(static_cast<char>(t.scalar_type()));
    // Wrapped Python numbers take part in type promotion differently from 0-dim tensors.
    key.push_back(static_cast<char>(t.is_conj() | (t.is_neg() << 1) |
                                    (t.unsafeGetTensorImpl()->is_wrapped_number() << 2)));
  };
  if (v.isTensor()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    key.push_back('L');
    const c10::List<at::Tensor> ts = v.toTensorList();
    put_int(static_cast<int64_t>(ts.size()));
    for (const at::Tensor& t : ts) tensor(t);
  } else if (v.isNone()) {
    key.push_back('N');
  } else if (v.isInt()) {
    key.push_back('i');
    put_int(v.toInt());
  } else if (v.isDouble()) {
    key.push_back('d');
    if (float_values) {
      const double x = v.toDouble();
      put(&x, sizeof(x));
    }
  } else if (v.isBool()) {
    key.push_back(v.toBool() ? 'T' : 'F');
  } else if (v.isComplexDouble()) {
    key.push_back('c');
    if (float_values) {
      const c10::complex<double> x = v.toComplexDouble();
      put(&x, sizeof(x));
    }
  } else if (v.isIntList()) {
    key.push_back('I');
    const auto xs = v.toIntVector();
    put_int(static_cast<int64_t>(xs.size()));
    for (int64_t x : xs) put_int(x);
  } else if (v.isString()) {
    key.push_back('s');
    put_int(static_cast<int64_t>(v.toStringRef().size()));
    key.append(v.toStringRef());
  } else if (v.isDevice()) {
    key.push_back('D');
    const c10::Device d = v.toDevice();
    key.push_back(static_cast<char>(d.type()));
    key.push_back(static_cast<char>(d.index()));
  } else if (v.isGenerator()) {
    key.push_back('G');  // draws do not change result shapes
  } else if (v.isList()) {
    key.push_back('l');
    const auto& xs = v.toListRef();
    put_int(static_cast<int64_t>(xs.size()));
    for (const c10::IValue& e : xs) {
      if (!list_values && (e.isDouble() || e.isInt() || e.isBool() || e.isComplexDouble())) {
        key.push_back(e.isDouble() ? 'd' : e.isInt() ? 'i' : e.isBool() ? 'b' : 'c');
      } else if (!describe(e, key, list_values, float_values)) {
        return false;
      }
    }
  } else {
    return false;
  }
  return true;
}

class MetaCache {
 public:
  static constexpr size_t kMaxEntries = 4096;
  static constexpr size_t kRecentSlots = 64;

  struct Recent {
    const MetaCache* owner = nullptr;
    std::string key;
    std::shared_ptr<const CachedResult> value;
  };
  static std::array<Recent, kRecentSlots>& recent() {
    thread_local std::array<Recent, kRecentSlots> slots;
    return slots;
  }

  std::shared_ptr<const CachedResult> find(const std::string& key) {
    // A few recent hits per thread, checked without the lock (a training step calls each
    // operator with a handful of signatures). Entries stay valid: cached results never change.
    Recent& slot = recent()[(reinterpret_cast<uintptr_t>(this) >> 4) % kRecentSlots];
    if (slot.owner == this && slot.key == key) return slot.value;
    std::shared_ptr<const CachedResult> hit;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = entries_.find(key);
      if (it == entries_.end()) return nullptr;
      hit = it->second;
    }
    slot.owner = this;
    slot.key = key;
    slot.value = hit;
    return hit;
  }
  void insert(const std::string& key, std::shared_ptr<const CachedResult> value) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    entries_.emplace(key, std::move(value));
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CachedResult>> entries_;
};

// Below this many elements in every tensor of a call, its kernel runs without intra-op
// parallelism (ATen's own grain size).
constexpr int64_t kSerialNumel = 32768;

// ATen's CPU kernels parallelize with OpenMP (the copy PyTorch ships, already loaded and
// global), and OpenMP's thread count is per thread: one on the stream's worker for the length
// of a small task. Without OpenMP in the process this does nothing.
class SerialScope {
 public:
  SerialScope() {
    const Omp& o = omp();
    if (o.set == nullptr || o.get == nullptr) return;
    (void)at::get_num_threads();  // ATen's per-thread set-up first (torch.set_num_threads)
    saved_ = o.get();
    if (saved_ > 1) o.set(1);
  }
  ~SerialScope() {
    if (saved_ > 1) omp().set(saved_);
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  struct Omp {
    void (*set)(int);
    int (*get)();
  };
  static const Omp& omp() {
    static const Omp o{reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")),
                       reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"))};
    return o;
  }
  int saved_ = 0;
};

int64_t numel_of(const Layout& l) {
  int64_t n = 1;
  for (int64_t d : l.sizes) n *= d;
  return n;
}

int64_t largest_numel(c10::ArrayRef<Arg> args, const std::vector<Layout>& more) {
  int64_t most = 0;
  for (const Arg& a : args) {
    switch (a.kind) {
      case Arg::Kind::Tensor:
        most = std::max(most, numel_of(a.tensor));
        break;
      case Arg::Kind::TensorList:
        for (const Layout& l : a.list) most = std::max(most, numel_of(l));
        break;
      case Arg::Kind::OptionalTensorList:
        for (const auto& l : a.optional_list) {
          if (l) most = std::max(most, numel_of(*l));
        }
        break;
      case Arg::Kind::Value:
        if (a.value.isTensor() && a.value.toTensor().defined()) {
          most = std::max(most, a.value.toTensor().numel());
        }
        break;
    }
  }
  for (const Layout& l : more) most = std::max(most, numel_of(l));
  return most;
}

void copy_result(const Layout& into, const at::Tensor& result) {
  if (into.dtype != c10::ScalarType::Undefined && result.defined()) into.cpu_view().copy_(result);
}

// The arguments of one call, filled on the calling thread and read by the task.
struct WorkBuffers {
  std::vector<Arg> slots;  // the first `count` are this call's arguments; the rest are spare
  size_t count = 0;
  std::vector<Layout> copy_into;  // functional results without an out= variant

  Arg& add() {
    if (count == slots.size()) slots.emplace_back();
    return slots[count++];
  }
  c10::ArrayRef<Arg> args() const { return {slots.data(), count}; }
  void clear() {
    for (size_t i = 0; i < count; ++i) slots[i].reset();
    count = 0;
    copy_into.clear();
  }
};

// Buffers go back to a pool when their task is destroyed (on the stream's worker) and are
// reused by later calls: freeing on the worker what the caller allocated would make the two
// threads contend for the caller's malloc arena on every call.
class BufferPool {
 public:
  std::unique_ptr<WorkBuffers> take() {
    // A calling thread keeps a stash, refilled with everything returned so far in one go: one
    // lock per batch of calls rather than per call.
    thread_local std::vector<std::unique_ptr<WorkBuffers>> stash;
    if (stash.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      stash.swap(free_);
    }
    if (stash.empty()) return std::make_unique<WorkBuffers>();
    std::unique_ptr<WorkBuffers> b = std::move(stash.back());
    stash.pop_back();
    return b;
  }
  void give(WorkBuffers* b) {
    std::unique_ptr<WorkBuffers> owned(b);
    // Slots are kept, not destroyed: their heap parts were allocated by the calling thread,
    // and freeing them here, on the stream's worker, would contend for its malloc arena.
    owned->clear();
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kMaxPooled) free_.push_back(std::move(owned));
  }
  // Buffers left in a thread's stash when it exits are freed with it.

 private:
  static constexpr size_t kMaxPooled = 256;
  std::mutex mutex_;
  std::vector<std::unique_ptr<WorkBuffers>> free_;
};

BufferPool& buffer_pool() {
  static BufferPool* pool = new BufferPool;  // never destroyed: workers may run at exit
  return *pool;
}

struct Recycle {
  void operator()(WorkBuffers* b) const noexcept { buffer_pool().give(b); }
};

// The work of one operator call on the stream (small enough for the Task's inline storage).
struct Work {
  c10::OperatorHandle op;
  std::unique_ptr<WorkBuffers, Recycle> buf;
  // Computes into the results (copy_into) instead of running `op` (OpConfig::into).
  void (*into)(torch::jit::Stack& args, const std::vector<at::Tensor>& results) = nullptr;
  // Small work runs on the worker alone: an OpenMP team started for a few elements costs more
  // than the work, and its threads spin afterwards, taking a core from the calling thread.
  bool serial = false;

  void operator()() const {
    try {
      run();
    } catch (const c10::Error& e) {
      // A failure found by the kernel (an index out of range, say) surfaces at the next
      // synchronizing call, as on CUDA: name the operator, and leave out the C++ backtrace.
      throw std::runtime_error(std::string(op.schema().name()) + ": " + e.what_without_backtrace());
    }
  }

  void run() const {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::optional<SerialScope> no_parallel;
    if (serial) no_parallel.emplace();
    torch::jit::Stack stack;
    stack.reserve(buf->count);
    for (const Arg& a : buf->args()) stack.push_back(a.materialize());
    if (into != nullptr) {
      std::vector<at::Tensor> results;
      results.reserve(buf->copy_into.size());
      for (const Layout& l : buf->copy_into) results.push_back(l.cpu_view());
      into(stack, results);
      return;
    }
    op.callBoxed(&stack);
    // The results in order, tensor lists flattened, as copy_into lists them.
    const std::vector<Layout>& copy_into = buf->copy_into;
    size_t k = 0;
    for (const c10::IValue& r : stack) {
      if (k == copy_into.size()) break;
      if (r.isTensorList()) {
        for (const at::Tensor& t : r.toTensorVector()) copy_result(copy_into[k++], t);
      } else {
        copy_result(copy_into[k++], r.toTensor());
      }
    }
  }
};
static_assert(sizeof(Work) <= rt::Task::kInlineSize && std::is_nothrow_move_constructible_v<Work>,
              "Work must fit a Task's inline storage (no allocation per call)");

class UnderlyingKernel final : public c10::OperatorKernel {
 public:
  explicit UnderlyingKernel(const OpConfig* config)
      : config_(config),
        foreach_(std::string(config->name).rfind("aten::_foreach_", 0) == 0),
        float_shapes_(std::string(config->name).rfind("aten::arange", 0) == 0) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpConfig& c = *config_;
    resolve_ops(op);
    // The CPU fallback runs the cpu_op where there is one (the CPU has no kernel for
    // convolution_overrideable, for one).
    const c10::OperatorHandle& fallback_op = cpu_op_ ? *cpu_op_ : op;
    switch (driver_tier(c)) {
      case Tier::Error:
        TORCH_CHECK_NOT_IMPLEMENTED(false, c.name, " is not supported on accel: ", c.reason);
      case Tier::CpuFallback:
      case Tier::Native:  // a native operator has its own kernel; never registered here
        cpu_fallback(fallback_op, stack);
        return;
      case Tier::Underlying:
        break;
    }
    if (g_force_fallback.load(std::memory_order_relaxed) || !host_accessible() ||
        !dtype_allowed(c, op, *stack)) {
      cpu_fallback(fallback_op, stack);
      return;
    }
    const c10::DeviceIndex device = call_device(op, *stack, c.name);
    c10::DeviceGuard guard(c10::Device(kAccel, device));
    if (info_.has_index_list) upload_cpu_indices(op, stack, device);
    if (info_.has_generator) substitute_generators(op, stack, device);
    if (c.metadata_only) {
      run_on_caller(op, stack, device, /*synchronize=*/false);
    } else if (c.sync || !info_.tensor_returns_only || !enqueue(op, stack, device)) {
      run_on_caller(op, stack, device, /*synchronize=*/true);
    }
  }

 private:
  static bool dtype_allowed(const OpConfig& c, const c10::OperatorHandle& op,
                            const torch::jit::Stack& stack) {
    if (c.dtypes == 0) return true;
    const size_t n = op.schema().arguments().size();
    for (size_t i = stack.size() - n; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      c10::ScalarType st = c10::ScalarType::Undefined;
      if (v.isTensor() && v.toTensor().defined()) {
        st = v.toTensor().scalar_type();
      } else if (v.isTensorList() && !v.toTensorList().empty()) {
        st = v.toTensorList().get(0).scalar_type();
      } else {
        continue;
      }
      return (c.dtypes >> static_cast<int>(st)) & 1u;
    }
    return true;
  }

  // What the kernel needs to know about the operator's schema, computed once.
  struct SchemaInfo {
    std::vector<std::optional<size_t>> return_alias;  // per result: the argument it writes
    std::vector<bool> write_argument;                  // per argument: written (out=, in-place)
    bool tensor_returns_only = true;                   // results are tensors or tensor lists
    bool has_write_arguments = false;
    bool has_generator = false;
    bool has_index_list = false;  // a Tensor?[] argument (indices)
  };

  void resolve_ops(const c10::OperatorHandle& op) {
    std::call_once(resolved_, [&] {
      const c10::FunctionSchema& schema = op.schema();
      for (const c10::Argument& r : schema.returns()) {
        info_.return_alias.push_back(aliased_argument(schema, r));
      }
      for (const c10::Argument& a : schema.arguments()) {
        info_.write_argument.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
        info_.has_write_arguments = info_.has_write_arguments || info_.write_argument.back();
        const c10::TypePtr& t = a.type();
        info_.has_generator = info_.has_generator || is_generator_argument(a);
        info_.has_index_list =
            info_.has_index_list ||
            (t->kind() == c10::TypeKind::ListType &&
             t->containedType(0)->kind() == c10::TypeKind::OptionalType &&
             t->containedType(0)->containedType(0)->kind() == c10::TypeKind::TensorType);
      }
      info_.tensor_returns_only = returns_only_tensors(schema);
      const auto find = [](const char* full) -> std::optional<c10::OperatorHandle> {
        if (full == nullptr || *full == '\0') return std::nullopt;
        std::string name(full);
        std::string overload;
        if (name.rfind("aten::", 0) == 0) name = name.substr(6);
        if (const auto dot = name.find('.'); dot != std::string::npos) {
          overload = name.substr(dot + 1);
          name = name.substr(0, dot);
        }
        return c10::Dispatcher::singleton().findSchemaOrThrow(("aten::" + name).c_str(),
                                                              overload.c_str());
      };
      cpu_op_ = find(config_->cpu_op);
      out_op_ = find(config_->out_variant);
      functional_op_ = find(config_->functional);
    });
  }

  // The meta pass, the allocation of results and the task. False if the call cannot be
  // enqueued (no meta kernel, CPU tensors with elements among the arguments).
  bool enqueue(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
    const c10::FunctionSchema& schema = op.schema();
    const size_t n = schema.arguments().size();
    const size_t begin = stack->size() - n;
    const c10::OperatorHandle& shape_op = cpu_op_ ? *cpu_op_ : op;

    thread_local std::string miss_key;
    const std::shared_ptr<const CachedResult> shapes =
        result_metadata(shape_op, *stack, begin, &miss_key);
    if (!shapes) return false;
    if (!miss_key.empty()) {
      // First call with this signature. PyTorch's meta functions do not always describe what
      // the CPU kernel returns (batch norm's statistics in eval mode, layer norm's in bfloat16,
      // strides): a call without written arguments runs once on the caller and its actual
      // results are what later calls allocate. The meta pass above still had to succeed, which
      // tells that the result shapes do not depend on the data.
      std::string key = std::move(miss_key);
      if (!info_.has_write_arguments && !capturing(device)) {
        run_on_caller(op, stack, device, /*synchronize=*/true);
        cache_.insert(key, observed(*stack, info_.return_alias.size(), n));
        return true;
      }
      cache_.insert(key, shapes);
    }

    // Results: arguments written in place (out=, in-place) or new tensors.
    const size_t n_returns = info_.return_alias.size();
    c10::SmallVector<c10::IValue, 3> results(n_returns);
    c10::SmallVector<Layout, 3> fresh;  // new results, in order
    for (size_t j = 0; j < n_returns; ++j) {
      if (const auto arg = info_.return_alias[j]) {
        results[j] = (*stack)[begin + *arg];
        continue;
      }
      if (!shapes->result_is_list[j]) {
        at::Tensor t = allocate(shapes->results[j].front());
        fresh.push_back(Layout::of(t));
        results[j] = std::move(t);
      } else {
        std::vector<at::Tensor> ts;
        for (const TensorMeta& m : shapes->results[j]) {
          ts.push_back(allocate(m));
          fresh.push_back(Layout::of(ts.back()));
        }
        results[j] = std::move(ts);
      }
    }
    // out= arguments the meta pass resized get the same shape on accel.
    for (size_t i = 0; i < n; ++i) {
      if (!info_.write_argument[i] || !shapes->written[i]) continue;
      const TensorMeta& m = *shapes->written[i];
      const at::Tensor& t = (*stack)[begin + i].toTensor();
      if (c10::IntArrayRef(m.sizes) != t.sizes() || c10::IntArrayRef(m.strides) != t.strides()) {
        t.resize_(m.sizes);
        t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides);
      }
    }

    Work work{cpu_op_ ? *cpu_op_ : op,
              std::unique_ptr<WorkBuffers, Recycle>(buffer_pool().take().release())};
    WorkBuffers& buf = *work.buf;
    if (functional_op_) {
      // An out= form with several outputs: run the functional form and copy into the outputs
      // (see codegen/gen_accel.py for why it is not called boxed).
      work.op = *functional_op_;
      for (size_t i = 0; i < n; ++i) {
        if (!info_.write_argument[i]) capture((*stack)[begin + i], buf.add());
      }
      for (const std::optional<size_t>& arg : info_.return_alias) {
        buf.copy_into.push_back(Layout::of((*stack)[begin + *arg].toTensor()));
      }
    } else {
      for (size_t i = begin; i < stack->size(); ++i) capture((*stack)[i], buf.add());
    }
    if (!fresh.empty()) {
      if (config_->into != nullptr) {
        work.into = config_->into;  // computes straight into the new tensors
        work.buf->copy_into.assign(fresh.begin(), fresh.end());
      } else if (out_op_ && !cpu_op_) {
        work.op = *out_op_;  // results are written straight into the new tensors
        for (const Layout& l : fresh) {
          Arg& a = buf.add();
          a.kind = Arg::Kind::Tensor;
          a.tensor = l;
        }
      } else {
        work.buf->copy_into.assign(fresh.begin(), fresh.end());
      }
    }
    work.serial = largest_numel(buf.args(), buf.copy_into) < kSerialNumel;
    launch(device, config_->name, std::move(work));

    torch::jit::drop(*stack, n);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return true;
  }

  static bool capturing(c10::DeviceIndex device) {
    return device::call([&] { return rt::device_is_capturing(device); });
  }

  // The metadata of the `n_results` results on top of the stack (for a call of `n_args`
  // arguments, none of them written).
  static std::shared_ptr<const CachedResult> observed(const torch::jit::Stack& stack,
                                                      size_t n_results, size_t n_args) {
    auto r = std::make_shared<CachedResult>();
    for (size_t i = stack.size() - n_results; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensorList()) {
        std::vector<TensorMeta> ms;
        for (const at::Tensor& t : v.toTensorVector()) ms.push_back(TensorMeta::of(t));
        r->results.push_back(std::move(ms));
        r->result_is_list.push_back(true);
      } else {
        r->results.push_back({TensorMeta::of(v.toTensor())});
        r->result_is_list.push_back(false);
      }
    }
    r->written.assign(n_args, std::nullopt);
    return r;
  }

  // Runs the CPU kernel on the calling thread, after the stream has drained: for results
  // whose shapes depend on the data, non-tensor results, and calls the meta pass cannot
  // represent. Operators that read no tensor data (metadata_only) do not wait.
  void run_on_caller(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     c10::DeviceIndex device, bool synchronize) {
    const c10::FunctionSchema& schema = op.schema();
    if (info_.has_write_arguments) {
      copying_path(cpu_op_ ? *cpu_op_ : op, stack);  // CPU results of in-place/out= calls must be copied back
      return;
    }
    const size_t n = schema.arguments().size();
    const size_t begin = stack->size() - n;
    if (synchronize) {
      device::call([&] { rt::stream_synchronize(rt::current_stream(device)); }, config_->name);
    }
    std::vector<std::unique_ptr<rt::HostAccessGuard>> access;
    torch::jit::Stack cpu;
    cpu.reserve(n);
    const auto view = [&](const at::Tensor& t) {
      access.push_back(std::make_unique<rt::HostAccessGuard>(t.storage().data(), t.storage().nbytes()));
      at::Tensor v = Layout::of(t).cpu_view();
      // Operators that only inspect their arguments may look at requires_grad too (the
      // attention backend choice does).
      if (config_->metadata_only && t.requires_grad()) v.set_requires_grad(true);
      return v;
    };
    for (size_t i = begin; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor() && is_accel(v.toTensor())) {
        cpu.emplace_back(view(v.toTensor()));
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> ts;
        for (const at::Tensor& t : v.toTensorVector()) ts.push_back(is_accel(t) ? view(t) : t);
        cpu.emplace_back(std::move(ts));
      } else if (is_optional_tensor_list(v)) {
        c10::List<std::optional<at::Tensor>> ts;
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isNone()) {
            ts.push_back(std::nullopt);
          } else {
            const at::Tensor& t = e.toTensor();
            ts.push_back(is_accel(t) ? view(t) : t);
          }
        }
        cpu.emplace_back(std::move(ts));
      } else if (v.isDevice() && v.toDevice().type() == kAccel) {
        cpu.emplace_back(c10::Device(c10::kCPU));
      } else {
        cpu.push_back(v);
      }
    }
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      (cpu_op_ ? *cpu_op_ : op).callBoxed(&cpu);
    }
    access.clear();
    torch::jit::drop(*stack, n);
    const auto to_accel = [&](const at::Tensor& r) {
      if (!r.defined()) return r;
      // The CPU result's layout where it is dense (channels-last stays channels-last).
      at::Tensor dense = r.is_non_overlapping_and_dense() ? r : r.contiguous();
      at::Tensor out = allocate(dense);
      const size_t bytes = static_cast<size_t>(dense.numel()) * dense.itemsize();
      if (bytes > 0) {
        device::call(
            [&] { rt::memcpy(out.data_ptr(), dense.data_ptr(), bytes, rt::CopyKind::HostToDevice); },
            config_->name);
      }
      return out;
    };
    for (c10::IValue& r : cpu) {
      if (r.isTensor()) {
        stack->emplace_back(to_accel(r.toTensor()));
      } else if (r.isTensorList()) {
        std::vector<at::Tensor> ts;
        for (const at::Tensor& t : r.toTensorVector()) ts.push_back(to_accel(t));
        stack->emplace_back(std::move(ts));
      } else {
        stack->push_back(std::move(r));
      }
    }
  }

  // The metadata of the call's results, and of its arguments after the call (out= arguments may
  // be resized): from the cache, else computed on meta tensors (the C++ meta function where
  // there is one, else the dispatcher's Meta kernel), and then `miss_key` is the key to cache
  // it under (empty on a hit, or if the call cannot be cached). Null if the call cannot be
  // represented on meta tensors or the meta computation fails (no meta kernel, or a result
  // shape that depends on the data).
  std::shared_ptr<const CachedResult> result_metadata(const c10::OperatorHandle& shape_op,
                                                      const torch::jit::Stack& stack,
                                                      size_t begin, std::string* miss_key) {
    const size_t n = stack.size() - begin;
    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    bool cacheable = true;
    for (size_t i = begin; i < stack.size() && cacheable; ++i) {
      cacheable = describe(stack[i], key, /*list_values=*/!foreach_, float_shapes_);
    }
    miss_key->clear();
    if (cacheable) {
      if (auto hit = cache_.find(key)) return hit;
      *miss_key = key;  // copied: the meta pass below may run operators on this thread
    }
    torch::jit::Stack meta;
    meta.reserve(n);
    for (size_t i = begin; i < stack.size(); ++i) {
      c10::IValue m;
      if (!to_meta(stack[i], &m)) return nullptr;
      meta.push_back(std::move(m));
    }
    const std::vector<c10::IValue> meta_args(meta.begin(), meta.end());
    try {
      if (config_->meta != nullptr) {
        config_->meta(&meta);
      } else {
        shape_op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
      }
    } catch (...) {
      // No meta kernel, a data-dependent shape, or an error in the call: the synchronous path
      // runs the CPU kernel, which raises a genuine error exactly as on the CPU.
      return nullptr;
    }
    auto r = std::make_shared<CachedResult>();
    for (const c10::IValue& v : meta) {
      if (v.isTensor()) {
        r->results.push_back({TensorMeta::of(v.toTensor())});
        r->result_is_list.push_back(false);
      } else if (v.isTensorList()) {
        std::vector<TensorMeta> ms;
        for (const at::Tensor& t : v.toTensorVector()) ms.push_back(TensorMeta::of(t));
        r->results.push_back(std::move(ms));
        r->result_is_list.push_back(true);
      } else {
        return nullptr;  // results other than tensors: run synchronously
      }
    }
    for (const c10::IValue& v : meta_args) {
      if (v.isTensor() && v.toTensor().defined()) {
        r->written.emplace_back(TensorMeta::of(v.toTensor()));
      } else {
        r->written.emplace_back(std::nullopt);
      }
    }
    return r;
  }

  const OpConfig* config_;
  const bool foreach_;
  const bool float_shapes_;  // floating-point arguments decide result shapes (arange)
  SchemaInfo info_;  // set by resolve_ops
  MetaCache cache_;
  std::once_flag resolved_;
  std::optional<c10::OperatorHandle> cpu_op_;
  std::optional<c10::OperatorHandle> out_op_;
  std::optional<c10::OperatorHandle> functional_op_;
};

}  // namespace

torch::CppFunction make_kernel(const OpConfig& config) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<UnderlyingKernel>(&config));
}

void set_force_fallback(bool force) { g_force_fallback.store(force); }
bool force_fallback() { return g_force_fallback.load(); }

}  // namespace accel::aten
