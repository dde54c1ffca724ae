#include "aten/underlying_task.h"

#include "aten/parallel.h"

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <future>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "aten/dispatch_util.h"
#include "aten/executor.h"
#include "aten/meta_cache.h"

namespace accel::aten {
namespace {

using device::kAccel;

// ATen's grain size: its kernels run serially below it.
constexpr int64_t kGrainSize = 32768;

// Kernels but matrix products (pointwise, reductions, copies, convolutions) follow ATen's own
// rule: serial below its grain size, on the worker's threads above it, so that they split their
// work (and round their sums) as the CPU does. For memory-bound kernels the limit was 512K elements
// while the process held two OpenMP teams (the caller's and the worker's: libgomp then cut its
// threads' spinning to ~100 iterations, and every region waited for sleeping threads). With one
// team (rt::give_back_openmp_team) a region costs what it costs on the CPU, and the 512K limit kept
// medium tensors on one core (2-core Xeon, measured on the worker with the caller issuing back to
// back, 512K limit against this one: add_ of 256K floats 81 against 16 us, gelu of 128K 76 against
// 34 us; training steps of ConvNeXt-Atto 0.76x -> 0.89x the CPU's, ViT-Tiny 0.85x -> 0.93x, a
// 4-layer GPT-2 with dropout 0.87x -> 1.0x). Below 64K elements a busy caller still makes serial
// cheaper for the lightest kernels (add_ of 32K floats 3.6 against 7.0 us); the models above did
// not show it.
constexpr int64_t kSerialNumel = kGrainSize;

// Matrix products run serially on the stream worker below both limits: MKL's threads for a
// product of a few rows cost more to start than they save, and the calling thread, busy issuing
// the next operators, competes with them for the cores. Measured on the worker (2-core
// VM, float32 mm, serial against parallel): [2, 256] by [256, 768] 14 against 68 us (GPT-2's
// decoder step), 64x256x256 61 against 87 us; above either limit the threads win where the
// product reads more memory than one core's caches hold (2x1024x1024 182 against 123 us) or
// computes long enough to repay the wake-up (16x1024x1024 324 against 213 us).
constexpr int64_t kSerialMacs = int64_t{1} << 22;         // multiply-adds, at most
constexpr int64_t kSerialMatrixNumel = int64_t{1} << 20;  // elements of either operand

// Keeps the warnings of a kernel call, to be passed on after it.
class CollectWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { list.push_back(w); }
  std::vector<c10::Warning> list;
};

int64_t numel_of(const Layout& l) {
  return c10::multiply_integers(l.sizes);
}

void copy_result(const Layout& into, const at::Tensor& result, KernelStorages& storages) {
  if (into.dtype != c10::ScalarType::Undefined && result.defined()) {
    // copy_ broadcasts: a result smaller than predicted would fill the allocation silently.
    TORCH_CHECK(result.sizes() == c10::IntArrayRef(into.sizes), "the kernel returned a result of ",
                result.sizes(), " where ", c10::IntArrayRef(into.sizes),
                " was predicted (a bug of accel: please report it)");
    into.view(storages).copy_(result);
  }
}

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

}  // namespace

static bool is_zero_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor()._is_zerotensor();
}

bool has_zero_tensors(const torch::jit::Stack& stack, size_t n) {
  return std::any_of(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end(), is_zero_tensor);
}

void materialize_zero_tensors(torch::jit::Stack& stack, size_t n) {
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    c10::IValue& v = stack[i];
    if (is_zero_tensor(v)) {
      const at::Tensor& zero = v.toTensor();
      v = at::zeros(zero.sizes(), zero.options());
    }
  }
}

bool run_on_stream(c10::DeviceIndex device, const char* what, const std::function<void()>& kernel) {
  std::exception_ptr failure;
  CollectWarnings warnings;
  // The task refers to this frame: it has run once the synchronize below returns (a stream
  // synchronize waits for every task before it reports a failure), and it throws nothing.
  // A synchronize that a capture elsewhere forbids (global mode) is refused without waiting:
  // the frame then outlives the task by waiting for its own signal (the stream is not
  // capturing, the callers refused that, so the task runs).
  auto ran = std::make_shared<std::promise<void>>();
  std::future<void> task_ran = ran->get_future();
  launch(device, what, [&, ran] {
    {
      c10::WarningUtils::WarningHandlerGuard guard(&warnings);
      try {
        kernel();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    ran->set_value();
  });
  device::call(
      [&] {
        try {
          rt::stream_synchronize(rt::current_stream(device));
        } catch (const rt::CaptureError&) {
          task_ran.wait();
          throw;
        }
      },
      what);
  for (const c10::Warning& w : warnings.list) c10::WarningUtils::get_warning_handler()->process(w);
  if (failure) std::rethrow_exception(failure);
  return !warnings.list.empty();
}

NotAnOperator::NotAnOperator() {
  if (at::hasCallbacks()) off_.emplace();
}

SerialScope::SerialScope() {
  const OmpThreads& o = omp_threads();
  if (o.set == nullptr || o.get == nullptr) return;
  (void)at::get_num_threads();  // ATen's per-thread set-up first (torch.set_num_threads)
  saved_ = o.get();
  if (saved_ > 1) o.set(1);
  if (o.mkl_set_local != nullptr) saved_mkl_ = o.mkl_set_local(1);
}

SerialScope::~SerialScope() {
  const OmpThreads& o = omp_threads();
  if (saved_ > 1) o.set(saved_);
  if (saved_mkl_ >= 0) o.mkl_set_local(saved_mkl_);
}

void Arg::stash(const c10::IValue& v, bool write) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (is_accel(t)) {
      kind = Kind::Tensor;
      tensor = Layout::of(t, write);
    } else {
      // A CPU tensor here is a 0-dim scalar; the task gets its own copy (the caller may change
      // the original before the task runs). A Python number stays one: a wrapped number takes
      // part in type promotion more weakly than a 0-dim tensor (0-dim float + 0.37 computes in
      // float, 0-dim float + 0-dim double in double).
      if (t.defined()) {
        at::Tensor copy = t.clone();
        if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
          copy.unsafeGetTensorImpl()->set_wrapped_number(true);
        }
        value = std::move(copy);
      } else {
        value = v;
      }
    }
  } else if (v.isTensorList()) {
    // Lists with CPU tensors never get here: the meta pass refuses them.
    kind = Kind::TensorList;
    for (const at::Tensor& t : v.toTensorList()) list.push_back(Layout::of(t, write));
  } else if (is_optional_tensor_list(v)) {
    kind = Kind::OptionalTensorList;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isNone()) {
        optional_list.emplace_back(std::nullopt);
      } else {
        optional_list.emplace_back(Layout::of(e.toTensor(), write));
      }
    }
  } else if (v.isDevice() && v.toDevice().type() == kAccel) {
    value = kernel_device(v.toDevice().index());
  } else {
    value = v;
  }
}

void Arg::reset() {
  kind = Kind::Value;
  result = false;
  value = c10::IValue();
  list.clear();
  optional_list.clear();
}

c10::IValue Arg::materialize(KernelStorages& storages) const {
  switch (kind) {
    case Kind::Tensor: return tensor.view(storages);
    case Kind::TensorList: {
      std::vector<at::Tensor> views;
      views.reserve(list.size());
      for (const Layout& l : list) views.push_back(l.view(storages));
      return views;
    }
    case Kind::OptionalTensorList: {
      c10::List<std::optional<at::Tensor>> views;
      for (const auto& l : optional_list) {
        views.push_back(l ? std::optional<at::Tensor>(l->view(storages)) : std::nullopt);
      }
      return views;
    }
    case Kind::Value: break;
  }
  return value;
}

void WorkBuffers::clear() {
  for (size_t i = 0; i < count; ++i) slots[i].reset();
  count = 0;
  copy_into.clear();
}

std::unique_ptr<WorkBuffers> take_buffers() {
  return buffer_pool().take();
}

int64_t serial_numel() {
  return kSerialNumel;
}

void RecycleBuffers::operator()(WorkBuffers* b) const noexcept {
  buffer_pool().give(b);
}

int matmul_left_operand(std::string_view name) {
  if (name.starts_with("aten::")) name.remove_prefix(6);
  name = name.substr(0, name.find('.'));
  if (name.ends_with('_')) name.remove_suffix(1);  // in place: the same arguments
  static constexpr std::pair<std::string_view, int> kProducts[] = {
      {"mm", 0},      {"bmm", 0},    {"mv", 0},    {"addmm", 1},
      {"baddbmm", 1}, {"addbmm", 1}, {"addmv", 1}, {"_addmm_activation", 1}};
  for (const auto& [product, left] : kProducts) {
    if (name == product) return left;
  }
  return -1;
}

namespace {

// Multiply-adds of a product of `left` ([..., M, K] or [M, K]) by `right` ([..., K, N] or [K]).
int64_t multiply_adds(c10::IntArrayRef left, c10::IntArrayRef right) {
  return c10::multiply_integers(left) * (right.size() >= 2 ? right.back() : 1);
}

bool small_product(c10::IntArrayRef left, c10::IntArrayRef right) {
  return multiply_adds(left, right) <= kSerialMacs &&
         c10::multiply_integers(left) < kSerialMatrixNumel &&
         c10::multiply_integers(right) < kSerialMatrixNumel;
}

}  // namespace

bool small_work(const WorkBuffers& buf, const SerialRule& rule) {
  const c10::ArrayRef<Arg> args = buf.args();
  if (rule.left >= 0 && args.size() > static_cast<size_t>(rule.left) + 1 &&
      args[rule.left].kind == Arg::Kind::Tensor && args[rule.left + 1].kind == Arg::Kind::Tensor) {
    return small_product(args[rule.left].tensor.sizes, args[rule.left + 1].tensor.sizes);
  }
  int64_t most = 0;
  for (const Arg& a : args) {
    switch (a.kind) {
      case Arg::Kind::Tensor: most = std::max(most, numel_of(a.tensor)); break;
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
  for (const Layout& l : buf.copy_into) most = std::max(most, numel_of(l));
  return most < kSerialNumel;
}

bool unconvertible_scalar(const torch::jit::Stack& stack, size_t begin) {
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  const auto imaginary = [](const c10::IValue& v) {
    return v.isComplexDouble() && v.toComplexDouble().imag() != 0;
  };
  // Numbers first (tensor lists unread): most calls have neither kind.
  bool complex_number = false;
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isDouble() && std::isfinite(v.toDouble()) && std::abs(v.toDouble()) > kFloatMax) {
      return true;
    }
    complex_number = complex_number || imaginary(v);
    if (v.isList() && !v.isTensorList()) {  // a list of numbers (_foreach_lerp.ScalarList)
      for (const c10::IValue& e : v.toListRef()) complex_number = complex_number || imaginary(e);
    }
  }
  if (!complex_number) return false;
  for (size_t i = begin; i < stack.size(); ++i) {  // complex tensors take complex numbers
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_complex()) return false;
    if (v.isList()) {  // tensor lists, optional ones too
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().is_complex()) return false;
      }
    }
  }
  return true;
}

bool small_call(const torch::jit::Stack& stack, size_t begin, const CachedResult* results,
                const SerialRule& rule) {
  const size_t left = begin + static_cast<size_t>(rule.left);
  if (rule.left >= 0 && left + 1 < stack.size() && stack[left].isTensor() &&
      stack[left + 1].isTensor()) {
    return small_product(stack[left].toTensor().sizes(), stack[left + 1].toTensor().sizes());
  }
  int64_t most = 0;
  const auto count = [&](const at::Tensor& t) {
    if (t.defined()) most = std::max(most, t.numel());
  };
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      count(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) count(t);
    } else if (is_optional_tensor_list(v)) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) count(e.toTensor());
      }
    }
  }
  if (results != nullptr) {
    for (const auto& list : results->results) {
      for (const TensorMeta& m : list) {
        if (m.dtype == c10::ScalarType::Undefined) continue;
        most = std::max(most, c10::multiply_integers(m.sizes));
      }
    }
  }
  return most < kSerialNumel;
}

void Work::operator()(KernelStorages& storages) const {
  if (!storages.device().is_cpu()) {  // on the caller: errors raise at the call
    run(storages);
    return;
  }
  try {
    run(storages);
  } catch (const c10::Error& e) {
    // A failure found by the kernel (an index out of range, say) surfaces at the next
    // synchronizing call, as on CUDA: name the operator, and leave out the C++ backtrace.
    throw std::runtime_error(std::string(op.schema().name()) + ": " + e.what_without_backtrace());
  }
}

void Work::run(KernelStorages& storages) const {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::optional<SerialScope> no_parallel;
  if (serial && storages.device().is_cpu()) no_parallel.emplace();
  torch::jit::Stack stack;
  stack.reserve(buf->count);
  for (const Arg& a : buf->args()) stack.push_back(a.materialize(storages));
  if (into != nullptr) {
    std::vector<at::Tensor> results;
    results.reserve(buf->copy_into.size());
    for (const Layout& l : buf->copy_into) results.push_back(l.view(storages));
    into(stack, results);
    return;
  }
  // The accel tensors of the call and their CPU views: a kernel may move an out= tensor to new
  // memory (resizing it past its storage and back: smooth_l1_loss's mean), whose contents
  // then go back into the accel memory.
  c10::SmallVector<std::pair<const Arg*, at::Tensor>, 4> views;
  for (size_t i = 0; i < buf->count; ++i) {
    if (buf->slots[i].kind == Arg::Kind::Tensor) {
      views.emplace_back(&buf->slots[i], stack[i].toTensor());
    }
  }
  CollectWarnings warnings;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    NotAnOperator not_an_operator;
    op.callBoxed(&stack);
  }
  // The caller allocated the out= tensors (the user called the functional form): resizing
  // them is not the user's concern (isin of a Scalar: its out= form resizes [] to [0] and back;
  // smooth_l1_loss's mean moves its result).
  bool ours = false;
  for (const auto& [slot, view] : views) {
    const Layout* layout = &slot->tensor;
    ours = ours || slot->result;
    if (!view.defined()) continue;
    // A kernel may also flip a written tensor's conjugate or negative bit (linalg_lu_solve with
    // left=False conjugates its result lazily): the accel tensor keeps its bits, so the values
    // are resolved into its memory.
    const bool resized = layout->changed_in(view);
    if (!resized && view.is_conj() == layout->conj && view.is_neg() == layout->neg) continue;
    TORCH_CHECK(view.sizes() == c10::IntArrayRef(layout->sizes), "the kernel resized an output to ",
                view.sizes(), " where ", c10::IntArrayRef(layout->sizes),
                " was predicted (a bug of accel: please report it)");
    layout->view_on(storages.device()).copy_(view);
  }
  // The kernel's warnings, less the one about resizing a result the caller allocated (the user
  // called the functional form, where the CPU passes no out= tensor).
  for (const c10::Warning& w : warnings.list) {
    if (ours && w.msg().find("was resized since it had shape") != std::string::npos) continue;
    c10::WarningUtils::get_warning_handler()->process(w);
  }
  // The results in order, tensor lists flattened, as copy_into lists them.
  const std::vector<Layout>& copy_into = buf->copy_into;
  size_t k = 0;
  for (const c10::IValue& r : stack) {
    if (k == copy_into.size()) break;
    if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector()) copy_result(copy_into[k++], t, storages);
    } else {
      copy_result(copy_into[k++], r.toTensor(), storages);
    }
  }
}

static_assert(sizeof(Work) <= rt::Task::kInlineSize && std::is_nothrow_move_constructible_v<Work>,
              "Work must fit a Task's inline storage (no allocation per call)");

}  // namespace accel::aten
