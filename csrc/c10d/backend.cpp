// ProcessGroupMaestro, the group: set-up, split, shrink, abort and shutdown,
// and the worker that runs the queued operations one at a time (each one's
// steps: the op pipeline, op_pipeline.cpp).
#include "c10d/backend.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>

#include "c10d/store_rendezvous.hpp"
#include "c10d/tensor_args.hpp"
#include "collectives/tuner.h"
#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/metrics.h"

namespace maestro {
namespace c10d_glue {
namespace {

// The engine of this process's default maestro group: the one whose paths
// its other groups send on.
std::mutex default_mu;
std::weak_ptr<multipath::Engine> default_engine;

// Every group of this process still alive, for abortAllAtExit().
std::mutex live_groups_mu;
std::vector<ProcessGroupMaestro*> live_groups;

multipath::Engine::Parent defaultGroupOf(const std::vector<int64_t>& global_ranks) {
  if (global_ranks.empty()) return {};  // the default group itself
  std::lock_guard<std::mutex> lock(default_mu);
  multipath::Engine::Parent parent{default_engine.lock(), {}};
  for (int64_t r : global_ranks) parent.ranks.push_back(static_cast<int>(r));
  return parent;
}

}  // namespace

ProcessGroupMaestro::ProcessGroupMaestro(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout,
                                         const std::map<std::string, std::string>& options,
                                         const std::vector<int64_t>& global_ranks)
    : ProcessGroupMaestro(store, rank, size, timeout, options, defaultGroupOf(global_ranks)) {
  if (global_ranks.empty()) {
    std::lock_guard<std::mutex> lock(default_mu);
    default_engine = engine_;
  }
}

ProcessGroupMaestro::ProcessGroupMaestro(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout,
                                         const std::map<std::string, std::string>& options,
                                         multipath::Engine::Parent parent)
    : Backend(rank, size), knobs_(options), timeout_(timeout), store_(store) {
  // The engine keeps the store: pairs connect through it on first use.
  auto rendezvous = std::make_shared<StoreRendezvous>(store);
  const char* master = std::getenv("MASTER_ADDR");
  engine_ = std::make_shared<multipath::Engine>(options, std::shared_ptr<Rendezvous>(rendezvous), rank, size,
                                                deadlineAfter(timeout), master ? master : "", std::move(parent));
  transport::Memory* memory = &engine_->transport();  // all the group registers with
  cache_ = std::make_unique<multipath::RegistrationCache>(memory, engine_->config().reg_cache_size,
                                                          engine_->config().reg_cache_bytes);
  p2p_ = std::make_unique<collectives::PointToPoint>(*engine_);
  staging_mode_ = stagingMode(engine_->config().staging);
  staging_piece_ = engine_->config().staging_piece;
  staging_pool_ = std::make_shared<StagingPool>(
      [memory](void* addr, size_t length) { return memory->registerMemory(addr, length); },
      [memory](const Region& r) { memory->deregisterMemory(r); });
  MAESTRO_INFO(collectives::describeTuner(*engine_));
  worker_ = std::thread([this] { workerLoop(); });
  std::lock_guard<std::mutex> lock(live_groups_mu);
  live_groups.push_back(this);
}

std::string ProcessGroupMaestro::describe() const {
  auto engine = live("describe");
  return engine->describeSetup() + "\n" + collectives::describeTuner(*engine);
}

ProcessGroupMaestro::~ProcessGroupMaestro() {
  {
    // Waits for an abortAllAtExit() that holds this group (its members are
    // intact until the body ends).
    std::lock_guard<std::mutex> lock(live_groups_mu);
    live_groups.erase(std::remove(live_groups.begin(), live_groups.end(), this), live_groups.end());
  }
  stopWorker(true);
}

int ProcessGroupMaestro::abortAllAtExit() {
  std::lock_guard<std::mutex> lock(live_groups_mu);
  int n = 0;
  // Newest first: subgroups before the default group whose paths they share.
  for (auto it = live_groups.rbegin(); it != live_groups.rend(); ++it) {
    bool running;
    {
      std::lock_guard<std::mutex> worker((*it)->stop_mu_);
      running = (*it)->worker_.joinable();
    }
    if (!running) continue;  // destroyed or shut down already
    MAESTRO_INFO("the process is exiting without destroy_process_group: group ", (*it)->getRank(), "/",
                 (*it)->getSize(), " says goodbye to its peers");
    (*it)->abort();
    ++n;
  }
  live_groups.clear();
  return n;
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupMaestro::split(const c10::intrusive_ptr<::c10d::Store>& store,
                                                               const std::vector<int>& ranks,
                                                               const c10::intrusive_ptr<::c10d::Backend::Options>& opts) {
  for (int r : ranks)
    MAESTRO_CHECK(r >= 0 && r < getSize(), "split: rank ", r, " is not a rank of this group of ", getSize());
  auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_.load();
  return c10::make_intrusive<ProcessGroupMaestro>(store, static_cast<int>(me - ranks.begin()),
                                                  static_cast<int>(ranks.size()), timeout, knobs_,
                                                  multipath::Engine::Parent{live("split"), ranks});
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupMaestro::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                                int shrink_flags,
                                                                const c10::intrusive_ptr<::c10d::Backend::Options>& opts) {
  constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT
  std::vector<int> survivors;
  std::string excluded;
  for (int64_t r : ranks_to_exclude)
    MAESTRO_CHECK(r >= 0 && r < getSize(), "shrink: rank ", r, " is not a rank of this group of ", getSize());
  for (int r = 0; r < getSize(); ++r) {
    if (std::find(ranks_to_exclude.begin(), ranks_to_exclude.end(), r) == ranks_to_exclude.end())
      survivors.push_back(r);
    else
      excluded += strcat(excluded.empty() ? "" : ",", r);
  }
  MAESTRO_CHECK(std::find(survivors.begin(), survivors.end(), getRank()) != survivors.end(),
                "shrink: rank ", getRank(), " is excluded, so it takes no part");
  MAESTRO_CHECK(!survivors.empty() && !excluded.empty(), "shrink: nothing to exclude");
  std::shared_ptr<multipath::Engine> paths = live("shrink");  // kept through an abort of this group
  if (shrink_flags & kShrinkAbort) abort();
  // The survivors of the same shrink meet under the same key; another
  // exclusion list (ranks that disagree) never matches it.
  auto store = c10::make_intrusive<::c10d::PrefixStore>(strcat("maestro/shrink/", ++shrinks_, "/", excluded), store_);
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_.load();
  const int rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), getRank()) - survivors.begin());
  MAESTRO_INFO("shrink: without rank(s) ", excluded, ", this rank is ", rank, " of ", survivors.size());
  return c10::make_intrusive<ProcessGroupMaestro>(store, rank, static_cast<int>(survivors.size()), timeout, knobs_,
                                                  multipath::Engine::Parent{std::move(paths), survivors});
}

c10::intrusive_ptr<::c10d::Backend::Options> ProcessGroupMaestro::getBackendOptions() {
  return c10::make_intrusive<::c10d::Backend::Options>(getBackendName(), timeout_.load());
}

void ProcessGroupMaestro::shutdown() { stopWorker(true); }

void ProcessGroupMaestro::abort() {
  runAbortHooks("abort()");
  stopWorker(false);
}

std::string ProcessGroupMaestro::dumpJson() const {
  std::shared_ptr<multipath::Engine> engine = live("dump");
  return recorder_.json(getRank(), getSize(), engine->channel(), engine->pathStats());
}

void ProcessGroupMaestro::writeDump() {
  std::shared_ptr<multipath::Engine> engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    engine = engine_;
  }
  if (!engine || engine->config().dump.empty()) return;
  const std::string file = multipath::expandFileName(engine->config().dump, getRank(), engine->channel());
  try {
    const std::string text = recorder_.json(getRank(), getSize(), engine->channel(), engine->pathStats());
    FILE* f = std::fopen(file.c_str(), "w");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
      if (f) std::fclose(f);
      MAESTRO_WARN("MAESTRO_DUMP: cannot write ", file);
      return;
    }
    MAESTRO_WARN("wrote this group's flight record (last operations, path counters) to ", file);
  } catch (const std::exception& e) {
    MAESTRO_WARN("MAESTRO_DUMP: ", e.what());
  }
}

#if MAESTRO_ABORT_HOOKS
void ProcessGroupMaestro::registerAbortHook(int64_t hook_id, ::c10d::AbortHook hook) {
  MAESTRO_CHECK(hook != nullptr, "register_abort_hook: the hook is None");
  std::lock_guard<std::mutex> lock(hooks_mu_);
  abort_hooks_[hook_id] = std::move(hook);
}

void ProcessGroupMaestro::unregisterAbortHook(int64_t hook_id) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  abort_hooks_.erase(hook_id);
}
#endif

void ProcessGroupMaestro::runAbortHooks(const std::string& why) {
#if MAESTRO_ABORT_HOOKS
  std::map<int64_t, ::c10d::AbortHook> hooks;
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    if (hooks_ran_) return;
    hooks_ran_ = true;
    hooks = abort_hooks_;  // run unlocked: a hook may (un)register hooks
  }
  if (!hooks.empty()) MAESTRO_INFO("running ", hooks.size(), " abort hook(s): ", why);
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      MAESTRO_WARN("abort hook ", id, " raised: ", e.what());
    }
  }
#else
  (void)why;
#endif
}

void ProcessGroupMaestro::stopWorker(bool drain) {
  std::lock_guard<std::mutex> stop(stop_mu_);
  std::deque<Pending> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!worker_.joinable()) return;
    if (!drain) dropped.swap(queue_);
    stopping_ = true;
  }
  cv_.notify_all();
  auto error = std::make_exception_ptr(Error("maestro: the process group was aborted before this operation ran"));
  for (auto& p : dropped) p.work->complete(error);
  std::shared_ptr<multipath::Engine> running;
  {
    std::unique_lock<std::mutex> lock(mu_);
    running = engine_;
    // shutdown(): the operations already queued still run, for a while; a
    // peer that stopped (frozen, gone) must not hold the caller for the
    // group timeout. abort(): the one running fails now.
    if (drain && !idle_cv_.wait_for(lock, kShutdownGrace, [&] { return queue_.empty() && !running_; }))
      MAESTRO_WARN("shutdown: operations still running after ", kShutdownGrace.count(), " s; they fail now");
    else if (drain)
      running = nullptr;  // idle: nothing to interrupt
  }
  if (running) running->interrupt(drain ? "the process group was shut down while this operation was running"
                                        : "the process group was aborted");
  running = nullptr;
  worker_.join();
  // Messages still in flight fail; their buffers are unpinned while the
  // cache is still here.
  if (p2p_) p2p_->stop(drain ? "the process group was shut down" : "the process group was aborted");
  std::shared_ptr<multipath::RegistrationCache> cache;
  std::shared_ptr<multipath::Engine> engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cache.swap(cache_);
    engine.swap(engine_);
  }
  cache.reset();  // its registrations go before the engine's transport
  staging_pool_->clear();  // so do the slabs'

  // engine: stopped here, or by whoever still holds a copy from live().
}

std::shared_ptr<multipath::Engine> ProcessGroupMaestro::live(const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!engine_) fail("maestro ", what, ": the process group was shut down");
  return engine_;
}

std::map<std::string, double> ProcessGroupMaestro::cacheStats() const {
  std::shared_ptr<multipath::RegistrationCache> cache;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cache_) fail("maestro registration_cache_stats: the process group was shut down");
    cache = cache_;
  }
  return {{"entries", static_cast<double>(cache->size())},
          {"hits", static_cast<double>(cache->hits())},
          {"misses", static_cast<double>(cache->misses())},
          {"evictions", static_cast<double>(cache->evictions())},
          {"bytes", static_cast<double>(cache->bytes())}};
}

void ProcessGroupMaestro::workerLoop() {
  setLogRank(getRank());
  nameThisThread("maestro-work");
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle, the worker drops the registrations of tensors that died since
      // (every kSweepInterval): their memory must not stay registered --
      // pinned, on verbs -- until the group's next operation, which may
      // never come.
      while (!stopping_ && queue_.empty()) {
        if (cv_.wait_for(lock, kSweepInterval) == std::cv_status::timeout && !stopping_ && queue_.empty()) {
          lock.unlock();
          cache_->sweep();
          lock.lock();
        }
      }
      if (queue_.empty()) return;
      p = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;  // with the pop: shutdown() never sees it in neither place
    }
    p.work->markStarted();
    recorder_.started(p.seq);
    std::exception_ptr error;
    std::optional<std::string> gave_up;  // the group's first failure, when it is this operation's and no stop caused it
    {
      std::lock_guard<std::mutex> lock(mu_);
      error = broken_;
    }
    if (error) {
      error = std::make_exception_ptr(Error(strcat("maestro: this process group is unusable after an earlier failure (",
                                                   broken_what_, "); create a new process group")));
    } else {
      try {
        runQueued(p);
      } catch (const std::exception& e) {
        error = std::current_exception();
        std::lock_guard<std::mutex> lock(mu_);
        if (!broken_) {
          broken_ = error;
          broken_what_ = e.what();
          engine_->noteFailure(p.seq, broken_what_);
          // abort() ran the hooks already; shutdown() is not an abort.
          if (!stopping_) gave_up = e.what();
        }
      }
    }
    recorder_.finished(p.seq, error);  // before the dump, which shows it
    if (gave_up) {
      writeDump();
      runAbortHooks(*gave_up);
    }
    p.work->complete(error);
    if (p.staging) p.staging->finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
}

}  // namespace c10d_glue
}  // namespace maestro
