// The Work a maestro collective returns: a future of its output tensors
// (DDP's comm hooks use getFuture()), completed by the group's worker thread
// with the result or the error.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <vector>

#include "c10d/staging.hpp"

namespace maestro {
namespace c10d_glue {

class MaestroWork : public ::c10d::Work {
 public:
  // `devices`: where the tensors are, when not on the CPU (the future then
  // follows their streams).
  MaestroWork(int rank, ::c10d::OpType type, uint64_t seq, const char* profiling_title,
              std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs,
              std::vector<c10::Device> devices = {});

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Blocks until the operation finished (it has its own deadline, the group
  // timeout), or until `timeout` if one is given; rethrows the operation's
  // error on this rank. Staged device tensors: the data is in host memory
  // then, and the caller's current stream waits for its copy back (the host
  // does not).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // wait(), and the host waits for the copy back too.
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A future of the outcome, never of an error: a ::c10d::WorkResult as an
  // int -- SUCCESS, TIMEOUT (the operation's deadline ran out) or COMM_ERROR
  // (any other failure) -- as ProcessGroupNCCL's.
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override { return seq_; }
  // Milliseconds from the moment the operation started moving (the worker
  // took it up; a send/recv: posted) to its completion, measured on this
  // rank's host clock; raises before completion.
  float getDuration() const override;
  // recv / recv from any source: the rank the message came from.
  int sourceRank() const override;

  // Before complete(): the rank a received message came from.
  void setSource(int rank) { source_.store(rank); }

  // Staged device tensors: the copies back into them (before complete()).
  void setCopies(std::shared_ptr<CopyEngine> copies) { copies_ = std::move(copies); }

  // The operation starts now (for getDuration); else its creation counts.
  void markStarted() { started_.store(std::chrono::steady_clock::now()); }
  // Called once by the worker.
  void complete(std::exception_ptr error);

 private:
  const uint64_t seq_;
  std::atomic<std::chrono::steady_clock::time_point> started_{std::chrono::steady_clock::now()};
  std::atomic<std::chrono::steady_clock::time_point> ended_{};
  std::atomic<int> source_{-1};
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> inputs_;  // kept alive until the operation is done
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10::ivalue::Future> future_result_;
  std::shared_ptr<CopyEngine> copies_;
};

}  // namespace c10d_glue
}  // namespace maestro
