// The op pipeline's steps (op_pipeline.hpp): the one path every collective
// and point-to-point call of ProcessGroupMaestro takes.
#include <memory>
#include <utility>

#include "c10d/backend.hpp"
#include "c10d/tensor_args.hpp"
#include "common/error.h"

namespace maestro {
namespace c10d_glue {

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::collective(const OpInfo& op, std::chrono::milliseconds timeout,
                                                                 const Declare& declare) {
  // 1. stage, 2. checks.
  auto staging = std::make_shared<OpStaging>(*staging_pool_, staging_mode_, getBoundDeviceId(), op.name);
  Call call;
  try {
    call = declare(*staging, op.name);
  } catch (const Error& e) {
    reject(op, e.what());
  }
  if (!staging->active()) staging = nullptr;
  // 3. enqueue.
  std::lock_guard<std::mutex> lock(mu_);
  MAESTRO_CHECK(!stopping_, "maestro ", op.name, ": the process group was shut down");
  if (broken_) fail("maestro ", op.name, ": this process group is unusable after an earlier failure (", broken_what_,
                    "); create a new process group");
  const uint64_t seq = ++seq_;
  uint64_t bytes = 0;
  for (const auto& t : call.inputs) bytes += t.defined() ? t.numel() * t.element_size() : 0;
  recorder_.queued(seq, op.title, bytes);
  auto work = workOf(op, seq, std::move(call.outputs), std::move(call.inputs), staging.get());
  queue_.push_back(Pending{seq, work, std::move(call.run), timeout, std::move(staging)});
  cv_.notify_all();
  return work;
}

c10::intrusive_ptr<MaestroWork> ProcessGroupMaestro::workOf(const OpInfo& op, uint64_t seq,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> inputs, OpStaging* staging) {
  auto work = c10::make_intrusive<MaestroWork>(getRank(), op.type, seq, op.title, std::move(outputs), std::move(inputs),
                                               staging ? staging->devices() : std::vector<c10::Device>{});
  if (staging && staging->active()) {
    work->setCopies(staging->copies());
    staging->called();  // the caller's stream, as it is now, is what the copies wait for
  }
  return work;
}

void ProcessGroupMaestro::reject(const OpInfo& op, const std::string& why) {
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t seq = ++seq_;  // the operation the peers are about to run
    msg = strcat("maestro ", op.name, " #", seq, " rejected on rank ", getRank(), ": ", why);
    // Nothing moved here: the group stays usable on this rank. A peer that
    // did start the operation fails it on the abort (and is then unusable,
    // as after any failure); if every rank refused it (an unsupported op or
    // dtype), nobody started it and every rank goes on.
    if (engine_) engine_->broadcastAbort(seq, msg);  // null: shut down, nobody to tell
  }
  throw Error(msg);
}

void ProcessGroupMaestro::runQueued(Pending& p) {
  // 4. run: the staging's copies in first.
  if (p.staging) {
    try {
      p.staging->copyIn();
    } catch (const std::exception& e) {  // the peers must not wait for this rank
      engine_->broadcastAbort(p.seq, strcat("maestro: rank ", getRank(), " could not stage its tensors: ", e.what()));
      throw;
    }
  }
  {
    OpMemory memory(memorySource());
    // The call's own timeout (opts.timeout) where it set one, else the group's.
    p.run(OpRun{p.seq, deadlineAfter(p.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : p.timeout), memory});
    // 5. copy back (success only: an error leaves the caller's tensors as they are).
    memory.copyBack();
  }  // unpinned
  if (p.staging) p.staging->copyOut();
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::pointToPoint(const OpInfo& op, bool send,
                                                                   std::vector<at::Tensor>& tensors, int peer,
                                                                   int tag) {
  // 1. stage, 2. checks. Only this rank and its peer are involved: a bad
  // argument raises here and leaves the group as it was (the peer's matching
  // call times out).
  auto st = std::make_shared<OpStaging>(*staging_pool_, staging_mode_, getBoundDeviceId(), op.name);
  std::vector<at::Tensor> host = send ? st->in(tensors) : st->out(tensors);
  checkOne(host, op.name);
  MAESTRO_CHECK(static_cast<uint32_t>(tag) - kReservedTagBase >= kReservedTags, op.name, ": tag ", tag,
                " is reserved by maestro (tags from ", static_cast<int32_t>(kReservedTagBase), " to ",
                static_cast<int32_t>(kReservedTagBase + kReservedTags - 1), ")");
  MemorySource source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro ", op.name, ": the process group was shut down");
    source = memorySource();
  }
  // 3. post, beside the collectives: no sequence number.
  auto work = workOf(op, 0, send ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{tensors[0]}, {tensors[0]},
                     st.get());
  // A send's bytes are in its stand-in before it is posted (this call waits for that copy).
  if (st->active()) st->copyIn();
  // 4. run: pinned, zero copy where the layout allows (the peer writes
  // straight into a contiguous recv tensor, a send is read straight from a
  // contiguous one).
  const at::Tensor tensor = host[0];
  auto memory = std::make_shared<OpMemory>(source);
  const collectives::Window window = memory->pinned({tensor}, send ? OpMemory::kRead : OpMemory::kWrite)[0];
  const uint64_t bytes = tensor.numel() * tensor.element_size();
  collectives::PointToPoint::Done done = [work, memory, send, st](std::exception_ptr error, int source) mutable {
    if (!error && !send) {
      try {
        // 5. copy back.
        memory->copyBack();
        st->copyOut();
      } catch (const std::exception&) {
        error = std::current_exception();
      }
    }
    memory.reset();  // unpinned before the Work completes: the caller may free the tensor then
    if (!send) work->setSource(source);
    work->complete(error);
    st->finish();
  };
  const Deadline deadline = deadlineAfter(timeout_.load());
  if (send) p2p_->send(peer, static_cast<uint32_t>(tag), window, bytes, deadline, std::move(done));
  else p2p_->recv(peer, static_cast<uint32_t>(tag), window, bytes, deadline, std::move(done));
  return work;
}

}  // namespace c10d_glue
}  // namespace maestro
