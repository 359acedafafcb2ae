#include "c10d/work.hpp"

#include <ATen/core/jit_type.h>

#include <c10/core/StreamGuard.h>

#include <optional>

#include "common/error.h"

namespace maestro {
namespace c10d_glue {

MaestroWork::MaestroWork(int rank, ::c10d::OpType type, uint64_t seq, const char* profiling_title,
                         std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs,
                         std::vector<c10::Device> devices)
    : Work(rank, type, profiling_title, std::optional<std::vector<at::Tensor>>(inputs)),
      seq_(seq),
      outputs_(std::move(outputs)),
      inputs_(std::move(inputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::move(devices))),
      future_result_(c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get())) {}

bool MaestroWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool MaestroWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr MaestroWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool MaestroWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    throw Error(strcat("maestro: Work.wait() timed out after ", timeout.count(),
                       " ms; the collective is still running (it fails on its own at the group timeout)"));
  }
  if (exception_) std::rethrow_exception(exception_);
  lock.unlock();
  if (copies_) copies_->streamWait();
  return true;
}

void MaestroWork::synchronize() {
  wait();
  if (copies_) copies_->hostWait();
}

int MaestroWork::sourceRank() const {
  const int source = source_.load();
  if (source < 0) return ::c10d::Work::sourceRank();  // torch's error: not a completed recv
  return source;
}

c10::intrusive_ptr<c10::ivalue::Future> MaestroWork::getFuture() { return future_; }

c10::intrusive_ptr<c10::ivalue::Future> MaestroWork::getFutureResult() { return future_result_; }

namespace {

::c10d::WorkResult resultOf(const std::exception_ptr& error) {
  if (!error) return ::c10d::WorkResult::SUCCESS;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return ::c10d::WorkResult::TIMEOUT;
  } catch (...) {
    return ::c10d::WorkResult::COMM_ERROR;
  }
}

}  // namespace

std::vector<at::Tensor> MaestroWork::result() { return outputs_; }

float MaestroWork::getDuration() const {
  // The end is stamped first thing in complete(), before either future is
  // completed: a caller woken by one of them sees it (completed_ comes later).
  const auto ended = ended_.load();
  if (ended == std::chrono::steady_clock::time_point{})
    throw Error("maestro: Work._get_duration() is known once the operation has completed (wait() for it first)");
  return std::chrono::duration<float, std::milli>(ended - started_.load()).count();
}

void MaestroWork::complete(std::exception_ptr error) {
  ended_.store(std::chrono::steady_clock::now());
  // The future first: a caller woken by finish() may read it at once. On a
  // device, it records its events on the stream of the copies back, so its
  // users wait for them (and no longer).
  std::optional<c10::StreamGuard> guard;
  if (copies_ && copies_->stream()) guard.emplace(*copies_->stream());
  if (error) future_->setError(error);
  else future_->markCompleted(c10::IValue(outputs_));
  guard.reset();
  inputs_.clear();
  future_result_->markCompleted(c10::IValue(static_cast<int64_t>(resultOf(error))));
  finish(error);
}

}  // namespace c10d_glue
}  // namespace maestro
