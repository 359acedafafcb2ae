#include "c10d/tensor_args.hpp"

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace c10d_glue {

using collectives::DType;
using collectives::ReduceOp;

Deadline deadlineAfter(std::chrono::milliseconds timeout) {
  auto now = Clock::now();
  // A huge timeout (timedelta.max) must not overflow the clock.
  if (timeout > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return now + timeout;
}

std::string supportedDtypes() {
  return "float32, float64, float16, bfloat16, int8, int16, int32, int64, uint8, bool";
}

DType toDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    case at::kShort: return DType::kInt16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    case at::kBool: return DType::kBool;
    default: fail("dtype ", c10::toString(t), " is not supported by maestro (supported: ", supportedDtypes(), ")");
  }
}


Reduction toReduction(const ::c10d::ReduceOp& op, at::ScalarType dtype) {
  Reduction r;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: r.op = ReduceOp::kSum; break;
    case ::c10d::ReduceOp::AVG: r.op = ReduceOp::kAvg; break;
    case ::c10d::ReduceOp::PRODUCT: r.op = ReduceOp::kProduct; break;
    case ::c10d::ReduceOp::MIN: r.op = ReduceOp::kMin; break;
    case ::c10d::ReduceOp::MAX: r.op = ReduceOp::kMax; break;
    case ::c10d::ReduceOp::BAND: r.op = ReduceOp::kBand; break;
    case ::c10d::ReduceOp::BOR: r.op = ReduceOp::kBor; break;
    case ::c10d::ReduceOp::BXOR: r.op = ReduceOp::kBxor; break;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      MAESTRO_CHECK(at::isFloatingType(dtype), "ReduceOp.PREMUL_SUM is defined for floating-point tensors only, not ",
                    c10::toString(dtype));
      auto* factor = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      MAESTRO_CHECK(factor != nullptr, "ReduceOp.PREMUL_SUM without its factor (make it with "
                                       "torch.distributed._make_nccl_premul_sum(factor))");
      if (factor->tensor_factor.defined()) {
        MAESTRO_CHECK(factor->tensor_factor.numel() == 1, "ReduceOp.PREMUL_SUM: the factor tensor has ",
                      factor->tensor_factor.numel(), " elements, not 1");
        r.premul = factor->tensor_factor.item<double>();
      } else {
        r.premul = factor->double_factor;
      }
      r.op = ReduceOp::kSum;
      break;
    }
    default:
      fail("reduce op ", std::to_string(op.op_),
           " is not supported by maestro (supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM)");
  }
  collectives::checkDefined(r.op, toDType(dtype));
  return r;
}

// Checks shared by every collective's inputs and outputs.
void checkTensor(const at::Tensor& t, const char* what) {
  MAESTRO_CHECK(t.defined(), what, " is undefined");
  // CUDA tensors were replaced by their host stand-ins (OpStaging) by now.
  MAESTRO_CHECK(t.device().is_cpu(), what, " is on device ", t.device().str(), "; maestro supports CPU and CUDA tensors");
  MAESTRO_CHECK(t.layout() == at::kStrided, what, " is ", c10::str(t.layout()),
                "; maestro supports dense (strided) tensors only");
  toDType(t.scalar_type());
}

void checkOne(const std::vector<at::Tensor>& tensors, const char* name) {
  MAESTRO_CHECK(tensors.size() == 1, name, " takes exactly one tensor per process (got ", tensors.size(), ")");
  checkTensor(tensors[0], "the tensor");
}

void checkSameKind(const at::Tensor& a, const at::Tensor& b, const char* what, const char* a_what) {
  MAESTRO_CHECK(a.scalar_type() == b.scalar_type(), what, " has dtype ", c10::toString(b.scalar_type()),
                " but ", a_what, " has ", c10::toString(a.scalar_type()));
}

void checkRoot(int64_t root, int size, const char* name) {
  MAESTRO_CHECK(root >= 0 && root < size, name, ": root rank ", root, " is not a rank of this group of ", size);
}

// A list of one tensor per rank, each like `like` (dtype; numel unless
// sizes may differ, as all-to-all's may), which the messages call `like_what`.
void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* name,
               const char* what, bool same_numel, const char* like_what) {
  MAESTRO_CHECK(static_cast<int>(list.size()) == size, name, ": the ", what, " list has ", list.size(),
                " tensors but the group has ", size, " ranks");
  const std::string each = strcat("an ", what, " tensor");
  for (const auto& t : list) {
    checkTensor(t, each.c_str());
    checkSameKind(like, t, each.c_str(), like_what);
    MAESTRO_CHECK(!same_numel || t.numel() == like.numel(), name, ": ", each, " has ", t.numel(),
                  " elements but ", like_what, " has ", like.numel());
  }
}

// Gather's outputs and scatter's inputs: one list of a tensor per rank at
// the root (elsewhere torch passes none, and none is returned), staged by
// `stage` and checked against `like`, the tensor every rank has (`like_what`).
std::vector<at::Tensor> rootList(std::vector<std::vector<at::Tensor>>& lists, int64_t root, int rank, int size,
                                 const at::Tensor& like, const char* like_what, const char* name, const char* what,
                                 const std::function<std::vector<at::Tensor>(std::vector<at::Tensor>&)>& stage) {
  checkRoot(root, size, name);
  if (rank != root) return {};
  MAESTRO_CHECK(lists.size() == 1, name, ": the root takes one ", what, " list (got ", lists.size(), ")");
  std::vector<at::Tensor> list = stage(lists[0]);
  checkList(list, like, size, name, what, true, like_what);
  return list;
}

void checkWorldTimes(const at::Tensor& larger, const char* larger_what, const at::Tensor& smaller,
                     const char* smaller_what, int size, const char* name) {
  MAESTRO_CHECK(larger.numel() == smaller.numel() * size, name, ": the ", larger_what, " has ", larger.numel(),
                " elements but must have world size (", size, ") x ", smaller_what, " (", smaller.numel(), ") = ",
                smaller.numel() * size);
}

void checkToItself(uint64_t sends, uint64_t receives, const char* name) {
  MAESTRO_CHECK(sends == receives, name, ": this rank sends ", sends, " elements to itself but expects ", receives);
}

// Coalesced inputs: at least one, all of one dtype; with outputs: one
// each, of its input's dtype, with in_factor x input = out_factor x output
// elements.
void checkCoalesced(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs, int in_factor,
                    int out_factor, const char* name) {
  MAESTRO_CHECK(!inputs.empty(), name, " needs at least one tensor");
  for (const auto& t : inputs) {
    checkTensor(t, "an input tensor");
    checkSameKind(inputs[0], t, "an input tensor");
  }
  if (!outputs) return;
  MAESTRO_CHECK(outputs->size() == inputs.size(), name, ": ", inputs.size(), " inputs but ", outputs->size(),
                " outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& out = (*outputs)[i];
    checkTensor(out, "an output tensor");
    checkSameKind(inputs[i], out, "an output tensor");
    MAESTRO_CHECK(inputs[i].numel() * in_factor == out.numel() * out_factor, name, ": input ", i, " has ",
                  inputs[i].numel(), " elements and output ", i, " has ", out.numel(),
                  "; the larger must be world size (", std::max(in_factor, out_factor), ") x the smaller");
  }
}

// all_to_all_single's split sizes (rows of dim 0) as element counts: equal
// parts when none are given.
std::vector<uint64_t> splitCounts(const std::vector<int64_t>& splits, const at::Tensor& t, int size,
                                  const char* which, const char* name) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = t.dim() == 0 ? 1 : (rows ? t.numel() / rows : 0);
  std::vector<uint64_t> out;
  if (splits.empty()) {
    MAESTRO_CHECK(rows % size == 0, name, ": the ", which, " has ", rows,
                  " rows (dim 0), not divisible by the world size ", size, "; pass split sizes");
    out.assign(size, static_cast<uint64_t>(rows / size * row));
    return out;
  }
  MAESTRO_CHECK(static_cast<int>(splits.size()) == size, name, ": ", splits.size(), " ", which,
                " split sizes for a group of ", size, " ranks");
  int64_t sum = 0;
  for (int64_t s : splits) {
    MAESTRO_CHECK(s >= 0, name, ": negative ", which, " split size ", s);
    sum += s;
    out.push_back(static_cast<uint64_t>(s * row));
  }
  MAESTRO_CHECK(sum == rows, name, ": the ", which, " split sizes add up to ", sum, " but the ", which,
                " has ", rows, " rows (dim 0)");
  return out;
}

}  // namespace c10d_glue
}  // namespace maestro
