#include "distributed/agreement.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <sstream>

namespace accel::distributed {
namespace {

constexpr int64_t kMagic = 0x6163636c;  // "accl"
constexpr int64_t kHeader = 8;          // then one send count per rank

enum Field : int64_t { kTag, kOp, kReduceOp, kRoot, kDtype, kElements, kPairwise, kUnused };

const char* reduce_op_name(int64_t op) {
  static const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
  return op >= 0 && op < 9 ? names[op] : "?";
}

std::string describe(const int64_t* row) {
  std::ostringstream out;
  if (row[kTag] != kMagic) return "a call that is not an accl collective";
  out << c10d::opTypeToString(static_cast<c10d::OpType>(row[kOp]));
  if (row[kReduceOp] >= 0) out << " (" << reduce_op_name(row[kReduceOp]) << ")";
  if (row[kRoot] >= 0) out << " root " << row[kRoot];
  if (row[kDtype] >= 0) {
    out << " of " << c10::toString(static_cast<c10::ScalarType>(row[kDtype]));
    if (!row[kPairwise]) out << ", " << row[kElements] << " elements";
  }
  return out.str();
}

}  // namespace

void agree(c10d::Backend& inner, c10d::OpType op, const Signature& sig, const std::string& name) {
  const int size = inner.getSize();
  const int rank = inner.getRank();
  const int64_t width = kHeader + size;
  const bool pairwise = !sig.send.empty();
  at::Tensor mine = at::empty({width}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  std::fill(m, m + width, 0);
  m[kTag] = kMagic;
  m[kOp] = static_cast<int64_t>(op);
  m[kReduceOp] = sig.reduce_op;
  m[kRoot] = sig.root;
  m[kDtype] = sig.dtype;
  m[kElements] = sig.elements;
  m[kPairwise] = pairwise ? 1 : 0;
  for (size_t j = 0; j < sig.send.size() && j < static_cast<size_t>(size); ++j) {
    m[kHeader + j] = sig.send[j];
  }

  std::vector<at::Tensor> in{mine};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size; ++r) out[0].push_back(at::empty({width}, at::kLong));
  inner.allgather(out, in)->wait();

  bool same = true;
  for (int r = 0; r < size && same; ++r) {
    const int64_t* o = out[0][r].data_ptr<int64_t>();
    for (int64_t f : {kTag, kOp, kReduceOp, kRoot, kDtype, kPairwise}) same = same && o[f] == m[f];
    if (!pairwise) {
      same = same && o[kElements] == m[kElements];
    } else if (same) {
      same = o[kHeader + rank] == sig.recv.at(r);  // what rank r sends me is what I expect
    }
  }
  if (same) return;
  std::ostringstream msg;
  msg << "accl: " << name << ": the ranks called different collectives or passed tensors that "
      << "do not match (dtype, number of elements";
  if (pairwise) msg << ", split sizes";
  msg << "):";
  for (int r = 0; r < size; ++r) {
    const int64_t* o = out[0][r].data_ptr<int64_t>();
    msg << "\n  rank " << r << ": " << describe(o);
    if (pairwise && o[kTag] == kMagic) {
      msg << ", sends";
      for (int j = 0; j < size; ++j) msg << (j ? "," : " [") << o[kHeader + j];
      msg << "] elements to ranks 0.." << size - 1;
    }
  }
  msg << "\nEvery rank must call the same collectives in the same order, with tensors of the "
         "same dtype and size. (ACCEL_DIST_CHECK=0 skips this check; Gloo then aborts the "
         "process on a size mismatch.)";
  TORCH_CHECK_VALUE(false, msg.str());
}

}  // namespace accel::distributed
