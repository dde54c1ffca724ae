#include "aten/replay_kernels.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string_view>

#include "kernels/host/elementwise.h"

namespace accel::aten {
namespace {

using kernels::host::BinaryOp;

std::optional<BinaryOp> binary_op(std::string_view name) {
  if (name == "add") return BinaryOp::Add;
  if (name == "sub") return BinaryOp::Sub;
  if (name == "mul") return BinaryOp::Mul;
  if (name == "div") return BinaryOp::Div;
  return std::nullopt;
}

int64_t numel(const Layout& l) {
  int64_t n = 1;
  for (int64_t s : l.sizes) n *= s;
  return n;
}

bool contiguous(const Layout& l) {
  int64_t expected = 1;
  for (size_t i = l.sizes.size(); i-- > 0;) {
    if (l.sizes[i] == 1) continue;
    if (l.strides[i] != expected) return false;
    expected *= l.sizes[i];
  }
  return true;
}

// A number the operation may use as its scalar operand: a Python scalar, or a 0-dim CPU tensor
// of a real type (ATen converts both to the tensor's dtype first, as done here).
std::optional<double> scalar_value(const c10::IValue& v) {
  // Integers beyond 2^53 would be rounded twice (to double, then to float): left to ATen.
  constexpr int64_t kExact = int64_t{1} << 53;
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) {
    if (v.toInt() > kExact || v.toInt() < -kExact) return std::nullopt;
    return static_cast<double>(v.toInt());
  }
  if (!v.isTensor()) return std::nullopt;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || t.dim() != 0 || t.is_complex() || t.scalar_type() == c10::kBool ||
      !(c10::isFloatingType(t.scalar_type()) || c10::isIntegralType(t.scalar_type(), false))) {
    return std::nullopt;
  }
  if (c10::isIntegralType(t.scalar_type(), false)) {
    const auto i = t.item<int64_t>();
    if (i > kExact || i < -kExact) return std::nullopt;
  }
  return t.item<double>();
}

bool is_one(const c10::IValue& v) {
  return (v.isDouble() && v.toDouble() == 1.0) || (v.isInt() && v.toInt() == 1);
}

char* data(const Layout& l) {
  return static_cast<char*>(l.base) + l.offset * static_cast<int64_t>(c10::elementSize(l.dtype));
}

// Either the same elements (in place) or no common byte.
bool same_or_disjoint(const char* a, const char* b, size_t bytes) {
  return a == b || a + bytes <= b || b + bytes <= a;
}

}  // namespace

std::optional<rt::Task> replay_elementwise(const Work& work) {
  if (work.into != nullptr || !work.buf->copy_into.empty()) return std::nullopt;
  const c10::FunctionSchema& schema = work.op.schema();
  std::string_view name = schema.name();
  if (name.substr(0, 6) != "aten::") return std::nullopt;
  name.remove_prefix(6);
  const bool in_place = !name.empty() && name.back() == '_';
  if (in_place) name.remove_suffix(1);
  const std::optional<BinaryOp> op = binary_op(name);
  if (!op) return std::nullopt;

  const std::vector<c10::Argument>& params = schema.arguments();
  const c10::ArrayRef<Arg> args = work.buf->args();
  if (params.size() != args.size()) return std::nullopt;
  const Layout* self = nullptr;
  const Layout* other = nullptr;
  const Layout* out = nullptr;
  std::optional<double> scalar;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& param = params[i].name();
    const Arg& a = args[i];
    if (param == "self" && a.kind == Arg::Kind::Tensor) {
      self = &a.tensor;
    } else if (param == "other" && a.kind == Arg::Kind::Tensor) {
      other = &a.tensor;
    } else if (param == "other" && a.kind == Arg::Kind::Value) {
      scalar = scalar_value(a.value);
      if (!scalar) return std::nullopt;
    } else if (param == "alpha" && a.kind == Arg::Kind::Value && is_one(a.value)) {
      continue;
    } else if (param == "out" && a.kind == Arg::Kind::Tensor) {
      out = &a.tensor;
    } else {
      return std::nullopt;  // rounding_mode, an alpha other than 1, ...
    }
  }
  if (in_place) out = self;
  if (self == nullptr || out == nullptr || (other == nullptr) == !scalar.has_value()) {
    return std::nullopt;
  }
  const c10::ScalarType dtype = self->dtype;
  if (dtype != c10::kFloat && dtype != c10::kDouble) return std::nullopt;
  for (const Layout* l : {self, other, out}) {
    if (l == nullptr) continue;
    if (l->dtype != dtype || l->conj || l->neg || !contiguous(*l) || l->sizes != self->sizes) {
      return std::nullopt;
    }
  }
  const int64_t n = numel(*self);
  const size_t bytes = static_cast<size_t>(n) * c10::elementSize(dtype);
  char* o = data(*out);
  const char* a = data(*self);
  const char* b = other != nullptr ? data(*other) : nullptr;
  if (!same_or_disjoint(o, a, bytes) || (b != nullptr && !same_or_disjoint(o, b, bytes))) {
    return std::nullopt;
  }
  const double value = scalar.value_or(0.0);
  const BinaryOp kind = *op;
  const auto count = static_cast<size_t>(n);
  if (dtype == c10::kFloat) {
    return rt::Task([=] {
      kernels::host::binary<float>(
          kind, reinterpret_cast<float*>(o), reinterpret_cast<const float*>(a),
          reinterpret_cast<const float*>(b), static_cast<float>(value), count);
    });
  }
  return rt::Task([=] {
    kernels::host::binary<double>(kind, reinterpret_cast<double*>(o),
                                  reinterpret_cast<const double*>(a),
                                  reinterpret_cast<const double*>(b), value, count);
  });
}

}  // namespace accel::aten
