// How the c10d layer reads a collective's arguments: dtypes and reductions
// as the collectives know them, the checks every rank runs on tensors, lists,
// roots and split sizes (a clear error on every rank, never a hang), and the
// deadline of a timeout.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/clock.h"

namespace maestro {
namespace c10d_glue {

// When an operation given `timeout` must be over (a huge one never is).
Deadline deadlineAfter(std::chrono::milliseconds timeout);
std::string supportedDtypes();
collectives::DType toDType(at::ScalarType t);

// A reduction as the collectives run it. PREMUL_SUM is a SUM of every
// rank's tensor multiplied first by a factor (a number, or a one-element
// tensor read when the call is made): the c10d layer scales the buffer the
// collective reduces from, never a tensor the caller still owns.
struct Reduction {
  collectives::ReduceOp op = collectives::ReduceOp::kSum;
  std::optional<double> premul;

  // Scales `t` in place (a buffer of this operation's own, or the caller's
  // tensor where the result replaces it anyway).
  void prescale(const at::Tensor& t) const {
    if (premul) t.mul_(*premul);
  }
  // What to reduce from without touching `t`: `t` itself when contiguous and
  // nothing is to be scaled, else a contiguous (scaled) copy.
  at::Tensor source(const at::Tensor& t) const { return premul ? t.mul(*premul).contiguous() : t.contiguous(); }
};

Reduction toReduction(const ::c10d::ReduceOp& op, at::ScalarType dtype);

// Checks shared by every collective's inputs and outputs.
void checkTensor(const at::Tensor& t, const char* what);
void checkOne(const std::vector<at::Tensor>& tensors, const char* name);
void checkSameKind(const at::Tensor& a, const at::Tensor& b, const char* what, const char* a_what = "the input");
void checkRoot(int64_t root, int size, const char* name);
// A list of one tensor per rank, each like `like` (dtype; numel unless
// sizes may differ, as all-to-all's may), which the messages call `like_what`.
void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* name,
               const char* what, bool same_numel = true, const char* like_what = "the input");
// Gather's outputs and scatter's inputs: one list of a tensor per rank at
// the root (elsewhere torch passes none, and none is returned), staged by
// `stage` and checked against `like`, the tensor every rank has (`like_what`).
std::vector<at::Tensor> rootList(std::vector<std::vector<at::Tensor>>& lists, int64_t root, int rank, int size,
                                 const at::Tensor& like, const char* like_what, const char* name, const char* what,
                                 const std::function<std::vector<at::Tensor>(std::vector<at::Tensor>&)>& stage);
// An all-gather's output or a reduce-scatter's input (`larger`): world size
// x the elements of the other tensor.
void checkWorldTimes(const at::Tensor& larger, const char* larger_what, const at::Tensor& smaller,
                     const char* smaller_what, int size, const char* name);
void checkToItself(uint64_t sends, uint64_t receives, const char* name);
// Coalesced inputs: at least one, all of one dtype; with outputs: one
// each, of its input's dtype, with in_factor x input = out_factor x output
// elements.
void checkCoalesced(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs, int in_factor,
                    int out_factor, const char* name);
// all_to_all_single's split sizes (rows of dim 0) as element counts: equal
// parts when none are given.
std::vector<uint64_t> splitCounts(const std::vector<int64_t>& splits, const at::Tensor& t, int size,
                                  const char* which, const char* name);

}  // namespace c10d_glue
}  // namespace maestro
