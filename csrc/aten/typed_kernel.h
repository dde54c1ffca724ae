// The typed entry of an underlying operator: its kernel registered with the operator's C++
// signature, in front of the boxed kernel (underlying.cpp).
//
// A boxed kernel gets its arguments from the dispatcher as IValues, copies of the caller's
// tensors. Since torch 2.11 a tensor held by Python (a parameter, an activation) holds its
// PyObject alive while C++ holds another reference to it (pytorch/pytorch#166342): the copy
// that makes the second reference increfs the PyObject and the copy's destruction decrefs it,
// each under the GIL, which the Python bindings released for the call. For a tiny add of two
// such tensors that was four GIL round trips, 2,460 of its 13,300 instructions on the calling
// thread, and 0.8 us of its 2.5 to 3 us.
//
// The typed entry boxes the tensors borrowed instead (the IValue holds the caller's
// TensorImpl without a reference of its own, as c10::MaybeOwned borrows) and tries the kernel's
// asynchronous path, which reads the arguments and keeps no tensor (AsyncPath). Every other call
// (the first of a signature, one that falls back, ...) goes to the boxed kernel through c10's
// own boxing, as it would without this entry.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "aten/underlying.h"

namespace accel::aten {
namespace typed {

// What the typed entries of one operator share.
struct Entry {
  explicit Entry(const OpConfig& c) : config(&c) { std::tie(boxed, async) = make_underlying(c); }
  const OpConfig* config;
  c10::BoxedKernel boxed;
  AsyncPath* async = nullptr;  // owned by `boxed`

  // The operator, found at the first call (registration runs before it can be found).
  const c10::OperatorHandle& op() {
    std::call_once(found_, [this] { op_ = find(config->name); });
    return *op_;
  }

 private:
  static c10::OperatorHandle find(const char* name);  // "aten::add.Tensor"
  std::once_flag found_;
  std::optional<c10::OperatorHandle> op_;
};

// A stack of the call's arguments, its tensors borrowed; they are released, not dereferenced,
// when it goes.
class BorrowedStack {
 public:
  explicit BorrowedStack(size_t n) { stack_.reserve(n); }
  BorrowedStack(const BorrowedStack&) = delete;
  BorrowedStack& operator=(const BorrowedStack&) = delete;
  ~BorrowedStack() {
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (!((borrowed_ >> i) & 1u)) continue;
      at::Tensor t = std::move(stack_[i]).toTensor();
      c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    }
  }

  // As c10's boxArgs boxes `arg`, tensors borrowed.
  template <class T>
  void push(T& arg) {
    using V = std::decay_t<T>;
    if constexpr (std::is_same_v<V, at::Tensor>) {
      borrow(arg);
    } else if constexpr (std::is_same_v<V, std::optional<at::Tensor>>) {
      if (arg.has_value()) {
        borrow(*arg);
      } else {
        stack_.emplace_back();
      }
    } else {
      stack_.emplace_back(arg);
    }
  }

  const torch::jit::Stack& stack() const { return stack_; }

 private:
  void borrow(const at::Tensor& t) {
    static_assert(sizeof(borrowed_) * 8 >= 64);
    TORCH_INTERNAL_ASSERT(stack_.size() < 64, "accel: a typed entry with over 64 arguments");
    borrowed_ |= uint64_t{1} << stack_.size();
    stack_.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }

  torch::jit::Stack stack_;
  uint64_t borrowed_ = 0;  // bit i: stack_[i] is a borrowed tensor
};

template <class T>
struct is_tuple : std::false_type {};
template <class... Ts>
struct is_tuple<std::tuple<Ts...>> : std::true_type {};

template <class Ret, size_t... I>
Ret new_results(c10::SmallVectorImpl<c10::IValue>& results, std::index_sequence<I...>) {
  return Ret(std::move(results[I]).template to<std::tuple_element_t<I, Ret>>()...);
}

// The typed result of a call AsyncPath ran: c10's BoxedKernelWrapper's rules for the results
// that are arguments (an in-place operator returns its first argument, an out= operator its
// last one or ones), the new tensors from `results`.
template <class Ret, class... Args>
Ret typed_results(c10::SmallVectorImpl<c10::IValue>& results, Args&... args) {
  if constexpr (std::is_void_v<Ret>) {
    return;
  } else if constexpr (std::is_same_v<Ret, const at::Tensor&>) {
    return std::get<0>(std::tie(args...));
  } else if constexpr (std::is_same_v<Ret, at::Tensor&>) {
    using First = std::tuple_element_t<0, std::tuple<Args...>>;
    if constexpr (std::is_same_v<First, at::Tensor&>) {
      return std::get<0>(std::tie(args...));
    } else {
      return std::get<sizeof...(Args) - 1>(std::tie(args...));
    }
  } else if constexpr (c10::impl::is_tuple_of_mutable_tensor_refs<Ret>::value) {
    return c10::guts::tuple_take<std::tuple<Args...>, -static_cast<int>(std::tuple_size_v<Ret>)>(
        std::tuple<Args...>{args...});
  } else if constexpr (is_tuple<Ret>::value) {
    return new_results<Ret>(results, std::make_index_sequence<std::tuple_size_v<Ret>>{});
  } else {
    return std::move(results[0]).template to<Ret>();
  }
}

template <class FuncType>
struct Kernel;

template <class Ret, class... Args>
struct Kernel<Ret(Args...)> {
  static torch::CppFunction make(const OpConfig& config) {
    return torch::CppFunction(
        [e = std::make_shared<Entry>(config)](c10::DispatchKeySet keys, Args... args) -> Ret {
          const c10::OperatorHandle& op = e->op();
          {
            BorrowedStack stack(sizeof...(Args));
            (stack.push(args), ...);
            c10::SmallVector<c10::IValue, 3> results;
            if (e->async->call_async(op, stack.stack(), results)) {
              ++typed_calls().borrowed;
              return typed_results<Ret, Args...>(results, args...);
            }
          }
          ++typed_calls().boxed;
          return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(e->boxed, op, keys, args...);
        });
  }
};

}  // namespace typed

// The registration of an underlying operator whose kernel has the C++ signature `FuncType`.
template <class FuncType>
torch::CppFunction make_typed_kernel(const OpConfig& config) {
  return typed::Kernel<FuncType>::make(config);
}

}  // namespace accel::aten
