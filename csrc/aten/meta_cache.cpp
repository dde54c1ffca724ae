#include "aten/meta_cache.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstdint>

#include "aten/dispatch_util.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

// Appends a binary description of `v` to `key` (fixed-size fields, lengths before lists and
// strings, so distinct argument lists never describe alike); false if `v` cannot be described.
class KeyWriter {
 public:
  KeyWriter(std::string& key, const KeyOptions& options) : key_(key), options_(options) {}

  bool value(const c10::IValue& v, bool in_list = false) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTensorList()) {
      key_.push_back('L');
      const c10::List<at::Tensor> ts = v.toTensorList();
      put_int(static_cast<int64_t>(ts.size()));
      for (const at::Tensor& t : ts) tensor(t);
    } else if (v.isNone()) {
      key_.push_back('N');
    } else if (in_list && !options_.list_values &&
               (v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble())) {
      key_.push_back(v.isDouble() ? 'd' : v.isInt() ? 'i' : v.isBool() ? 'b' : 'c');
    } else if (v.isInt()) {
      key_.push_back('i');
      put_int(v.toInt());
    } else if (v.isDouble()) {
      floats_ = true;
      key_.push_back(options_.float_values ? 'e' : 'd');  // distinct tags: no ambiguity
      if (options_.float_values) put_value(v.toDouble());
    } else if (v.isBool()) {
      key_.push_back(v.toBool() ? 'T' : 'F');
    } else if (v.isComplexDouble()) {
      floats_ = true;
      key_.push_back(options_.float_values ? 'x' : 'c');
      if (options_.float_values) put_value(v.toComplexDouble());
    } else if (v.isIntList()) {
      key_.push_back('I');
      const auto xs = v.toIntVector();
      put_int(static_cast<int64_t>(xs.size()));
      for (int64_t x : xs) put_int(x);
    } else if (v.isString()) {
      key_.push_back('s');
      put_int(static_cast<int64_t>(v.toStringRef().size()));
      key_.append(v.toStringRef());
    } else if (v.isDevice()) {
      key_.push_back('D');
      const c10::Device d = v.toDevice();
      key_.push_back(static_cast<char>(d.type()));
      key_.push_back(static_cast<char>(d.index()));
    } else if (v.isGenerator()) {
      key_.push_back('G');  // draws do not change result shapes
    } else if (v.isList()) {
      key_.push_back('l');
      const auto& xs = v.toListRef();
      put_int(static_cast<int64_t>(xs.size()));
      for (const c10::IValue& e : xs) {
        if (!value(e, /*in_list=*/true)) return false;
      }
    } else {
      return false;
    }
    return true;
  }

  // Whether a floating-point number was described (by value or by type).
  bool floats() const { return floats_; }

  // Which tensors share a storage with an earlier one, and at which offsets: written tensors
  // that overlap an input are an error only some kernels detect, so such calls differ in key.
  void aliasing() {
    for (size_t i = 1; i < storages_.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (storages_[i].first != storages_[j].first) continue;
        key_.push_back('a');
        put_int(static_cast<int64_t>(i));
        put_int(static_cast<int64_t>(j));
        put_int(storages_[i].second);
        put_int(storages_[j].second);
        break;
      }
    }
  }

 private:
  void put(const void* p, size_t n) { key_.append(static_cast<const char*>(p), n); }
  void put_int(int64_t x) { put(&x, sizeof(x)); }
  template <class T>
  void put_value(const T& x) {
    put(&x, sizeof(x));
  }

  void tensor(const at::Tensor& t) {
    if (!t.defined()) {
      key_.push_back('U');
      return;
    }
    key_.push_back(t.device().type() == kAccel ? 'A' : 'C');
    const int64_t dim = t.dim();
    put_int(dim);
    if (options_.layouts) {
      put(t.sizes().data(), sizeof(int64_t) * dim);
      put(t.strides().data(), sizeof(int64_t) * dim);
    } else {
      key_.push_back(static_cast<char>(
          t.is_contiguous() | (t.is_contiguous(c10::MemoryFormat::ChannelsLast) << 1) |
          (t.is_contiguous(c10::MemoryFormat::ChannelsLast3d) << 2) |
          (t.is_non_overlapping_and_dense() << 3) | ((t.numel() == 0) << 4)));
    }
    key_.push_back(static_cast<char>(t.scalar_type()));
    // Wrapped Python numbers take part in type promotion differently from 0-dim tensors.
    key_.push_back(static_cast<char>(t.is_conj() | (t.is_neg() << 1) |
                                     (t.unsafeGetTensorImpl()->is_wrapped_number() << 2)));
    if (options_.aliasing) {
      storages_.emplace_back(t.storage().unsafeGetStorageImpl(), t.storage_offset());
    }
  }

  std::string& key_;
  const KeyOptions& options_;
  bool floats_ = false;
  c10::SmallVector<std::pair<const void*, int64_t>, 8> storages_;
};

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

}  // namespace

TensorMeta TensorMeta::of(const at::Tensor& t) {
  if (!t.defined()) return {};
  return {c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
          c10::SmallVector<int64_t, 5>(t.strides().begin(), t.strides().end()), t.scalar_type(),
          t.is_conj(), t.is_neg()};
}

bool TensorMeta::describes(const at::Tensor& t) const {
  if (!t.defined()) return dtype == c10::ScalarType::Undefined;
  return dtype == t.scalar_type() && c10::IntArrayRef(sizes) == t.sizes() &&
         c10::IntArrayRef(strides) == t.strides() && conj == t.is_conj() && neg == t.is_neg();
}

bool encode_call(const torch::jit::Stack& stack, size_t begin, const KeyOptions& options,
                 std::string& key, bool* has_floats) {
  // Type promotion of Python numbers and integer division depend on the default dtype; kernels
  // read the deterministic-algorithms settings (an alert, filling new memory).
  key.push_back(static_cast<char>(c10::get_default_dtype_as_scalartype()));
  const at::Context& ctx = at::globalContext();
  key.push_back(static_cast<char>(ctx.deterministicAlgorithms() |
                                  (ctx.deterministicAlgorithmsWarnOnly() << 1) |
                                  (ctx.deterministicFillUninitializedMemory() << 2)));
  KeyWriter writer(key, options);
  for (size_t i = begin; i < stack.size(); ++i) {
    if (!writer.value(stack[i])) return false;
  }
  if (options.aliasing) writer.aliasing();
  if (has_floats != nullptr) *has_floats = writer.floats();
  return true;
}

bool FloatVariation::varies(const std::string& type_key, const std::string& value_key) {
  if (varies_.load(std::memory_order_relaxed)) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (seen_.size() >= kMaxKeys) seen_.clear();  // bounded, like the cache
  std::vector<std::string>& values = seen_[type_key];
  if (std::find(values.begin(), values.end(), value_key) == values.end()) {
    values.push_back(value_key);
  }
  if (values.size() > kMaxValues) {
    varies_.store(true, std::memory_order_relaxed);
    seen_.clear();
  }
  return varies_.load(std::memory_order_relaxed);
}

namespace {

struct Recent {
  const MetaCache* owner = nullptr;
  std::string key;
  std::shared_ptr<const CachedResult> value;
};
constexpr size_t kRecentSlots = 64;

std::array<Recent, kRecentSlots>& recent() {
  thread_local std::array<Recent, kRecentSlots> slots;
  return slots;
}

}  // namespace

bool Families::contains(const std::string& family) {
  std::lock_guard<std::mutex> lock(mutex_);
  return families_.count(family) != 0;
}

void Families::insert(const std::string& family) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (families_.size() >= kMaxFamilies) families_.clear();  // bounded, like the cache
  families_.insert(family);
}

std::shared_ptr<const CachedResult> MetaCache::find(const std::string& key) {
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

void MetaCache::insert(const std::string& key, std::shared_ptr<const CachedResult> value) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.size() >= kMaxEntries) entries_.clear();
  entries_.insert_or_assign(key, std::move(value));
}

void make_contiguous(CachedResult& r) {
  for (auto& metas : r.results) {
    for (TensorMeta& m : metas) {
      const c10::DimVector strides = c10::contiguous_strides(m.sizes);
      m.strides.assign(strides.begin(), strides.end());
    }
  }
}

namespace {
std::atomic<void (*)()> dropped_error_handler{nullptr};

// An operator that returns nothing and writes only its in-place arguments (no out=), with no
// Meta kernel: PyTorch's fused SGD and Adagrad optimizer steps (and fused Adam's tensor_lr
// overloads). In-place arguments keep their shapes, so its results are known without one: it
// runs asynchronously and can be captured, as the fused Adam step with a Meta kernel does. Its
// argument checks depend only on what the call's cache key holds, and the first call of each
// key runs before the call returns, raising them there.
bool in_place_without_meta(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (!schema.returns().empty() || !schema.is_mutable()) return false;
  for (const c10::Argument& a : schema.arguments()) {
    if (a.is_out()) return false;
  }
  return !op.hasKernelForDispatchKey(c10::DispatchKey::Meta);
}
}  // namespace

std::shared_ptr<CachedResult> meta_results(const c10::OperatorHandle& op,
                                           void (*meta)(torch::jit::Stack*),
                                           const torch::jit::Stack& stack, size_t begin) {
  torch::jit::Stack args;
  args.reserve(stack.size() - begin);
  // An out= tensor with elements goes to the meta function empty, so that resizing it warns
  // nowhere: a meta function written in Python (linalg's, in torch/_meta_registrations.py)
  // warns through Python's warnings, which the handler below cannot drop, and the CPU kernel
  // warns again when it runs. Resizing an empty tensor gives the same shape and strides as
  // resizing one of another shape; where the shape already fits, nothing is resized and the
  // out= tensor keeps its own (kept[i]).
  const auto& schema_args = op.schema().arguments();
  std::vector<std::optional<TensorMeta>> kept(stack.size() - begin);
  for (size_t i = begin; i < stack.size(); ++i) {
    const size_t k = i - begin;
    // Generators go to the meta function as None: it draws nothing, and the Python references
    // that are the meta functions of exponential_, cauchy_, geometric_ and log_normal_ refuse a
    // generator ("generator is not supported in refs"), which made those calls synchronous.
    if (k < schema_args.size() && is_generator_argument(schema_args[k])) {
      args.emplace_back();
      continue;
    }
    c10::IValue m;
    if (!to_meta(stack[i], &m)) return nullptr;
    if (k < schema_args.size() && schema_args[k].is_out() && m.isTensor()) {
      const at::Tensor& t = m.toTensor();
      if (t.defined() && t.is_meta() && t.numel() > 0 && !t.is_conj() && !t.is_neg()) {
        kept[k] = TensorMeta::of(t);
        m = at::detail::empty_meta({0}, t.scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt);
      }
    }
    args.push_back(std::move(m));
  }
  torch::jit::Stack results = args;  // the call consumes its stack; `args` keeps the inputs
  // The meta functions' warnings are dropped: the CPU kernel gives its own when it runs.
  struct Drop final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } drop;
  c10::WarningUtils::WarningHandlerGuard quiet(&drop);
  try {
    if (meta != nullptr) {
      meta(&results);
    } else if (in_place_without_meta(op)) {
      results.clear();  // nothing returned; the arguments keep their shapes
    } else {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &results);
    }
  } catch (...) {
    // No meta kernel, a data-dependent shape, or an error in the call: the synchronous path
    // runs the CPU kernel, which raises a genuine error exactly as on the CPU.
    if (auto* handler = dropped_error_handler.load(std::memory_order_acquire)) handler();
    return nullptr;
  }
  // The meta of an argument after the call: an out= tensor whose shape fit stays as it was.
  auto after = [&](const at::Tensor& t) {
    for (size_t k = 0; k < args.size(); ++k) {
      if (kept[k] && args[k].isTensor() &&
          args[k].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        if (c10::IntArrayRef(kept[k]->sizes) == t.sizes()) return *kept[k];
        break;
      }
    }
    return TensorMeta::of(t);
  };
  auto r = std::make_shared<CachedResult>();
  for (const c10::IValue& v : results) {
    if (v.isTensor()) {
      r->results.push_back({after(v.toTensor())});
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
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined()) {
      r->written.emplace_back(after(v.toTensor()));
    } else {
      r->written.emplace_back(std::nullopt);
    }
  }
  return r;
}

bool is_optional_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  const c10::TypePtr elem = v.toList().elementType();
  return elem->kind() == c10::TypeKind::OptionalType &&
         elem->containedType(0)->kind() == c10::TypeKind::TensorType;
}

void set_dropped_error_handler(void (*handler)()) {
  dropped_error_handler.store(handler, std::memory_order_release);
}

}  // namespace accel::aten
