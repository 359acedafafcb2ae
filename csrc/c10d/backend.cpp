#include "c10d/backend.hpp"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/metrics.h"

namespace maestro {
namespace c10d_glue {
namespace {

using collectives::DType;
using collectives::ReduceOp;

// The Work types of the coalesced tensor collectives: their own since torch
// 2.14 (the release pinned in requirements/torch.txt); torch 2.11 has only
// COALESCED for both.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
constexpr auto kAllgatherIntoTensorCoalesced = ::c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
constexpr auto kReduceScatterTensorCoalesced = ::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr auto kAllgatherIntoTensorCoalesced = ::c10d::OpType::COALESCED;
constexpr auto kReduceScatterTensorCoalesced = ::c10d::OpType::COALESCED;
#endif

// The rendezvous through the c10d store (already prefixed per group).
class StoreRendezvous : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const c10::DistNetworkError& e) {
      lost(key, e.what());
    }
  }
  std::string get(const std::string& key, Deadline deadline) override {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) fail("timed out waiting for '", key, "' in the store (did every rank start?)");
      try {
        store_->wait({key}, std::min(left, std::chrono::milliseconds(5000)));
        auto v = store_->get(key);
        return std::string(v.begin(), v.end());
      } catch (const c10::DistNetworkError& e) {
        lost(key, e.what());
      } catch (const c10::DistStoreError&) {
        // The store's own timeout slice passed; loop to our deadline.
      }
    }
  }
  void erase(const std::string& key) override {
    try {
      store_->deleteKey(key);
    } catch (const c10::Error&) {  // a store that cannot delete: blank the value
      Rendezvous::erase(key);
    }
  }
  bool tryGet(const std::string& key, std::string* value) override {
    try {
      if (!store_->check({key})) return false;
      auto v = store_->get(key);
      value->assign(v.begin(), v.end());
      return true;
    } catch (const c10::DistNetworkError& e) {
      lost(key, e.what());
    }
  }

 private:
  [[noreturn]] static void lost(const std::string& key, const std::string& what) {
    fail("lost the rendezvous store at '", key, "' (the rank hosting it, usually rank 0, exited -- look for its "
         "error): ", what.substr(0, what.find('\n')));
  }

 public:

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

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

// A reduction as the collectives run it. PREMUL_SUM is a SUM of every
// rank's tensor multiplied first by a factor (a number, or a one-element
// tensor read when the call is made): the c10d layer scales the buffer the
// collective reduces from, never a tensor the caller still owns.
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
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

void checkSameKind(const at::Tensor& a, const at::Tensor& b, const char* what, const char* a_what = "the input") {
  MAESTRO_CHECK(a.scalar_type() == b.scalar_type(), what, " has dtype ", c10::toString(b.scalar_type()),
                " but ", a_what, " has ", c10::toString(a.scalar_type()));
}

void checkRoot(int64_t root, int size, const char* name) {
  MAESTRO_CHECK(root >= 0 && root < size, name, ": root rank ", root, " is not a rank of this group of ", size);
}

// A list of one tensor per rank, each like `like` (dtype; numel unless
// sizes may differ, as all-to-all's may), which the messages call `like_what`.
void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* name,
               const char* what, bool same_numel = true, const char* like_what = "the input") {
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
                                  const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = t.dim() == 0 ? 1 : (rows ? t.numel() / rows : 0);
  std::vector<uint64_t> out;
  if (splits.empty()) {
    MAESTRO_CHECK(rows % size == 0, "all_to_all_single: the ", which, " has ", rows,
                  " rows (dim 0), not divisible by the world size ", size, "; pass split sizes");
    out.assign(size, static_cast<uint64_t>(rows / size * row));
    return out;
  }
  MAESTRO_CHECK(static_cast<int>(splits.size()) == size, "all_to_all_single: ", splits.size(), " ", which,
                " split sizes for a group of ", size, " ranks");
  int64_t sum = 0;
  for (int64_t s : splits) {
    MAESTRO_CHECK(s >= 0, "all_to_all_single: negative ", which, " split size ", s);
    sum += s;
    out.push_back(static_cast<uint64_t>(s * row));
  }
  MAESTRO_CHECK(sum == rows, "all_to_all_single: the ", which, " split sizes add up to ", sum, " but the ", which,
                " has ", rows, " rows (dim 0)");
  return out;
}

}  // namespace

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
  rlimit memlock{};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) != 0) memlock.rlim_cur = RLIM_INFINITY;
  cache_ = std::make_unique<multipath::RegistrationCache>(
      &engine_->transport(), engine_->config().reg_cache_size,
      regCacheBytes(engine_->config(), static_cast<uint64_t>(memlock.rlim_cur)));
  p2p_ = std::make_unique<collectives::PointToPoint>(*engine_);
  staging_mode_ = stagingMode(engine_->config().staging);
  staging_piece_ = engine_->config().staging_piece;
  transport::Transport* transport = &engine_->transport();
  staging_pool_ = std::make_shared<StagingPool>(
      [transport](void* addr, size_t length) { return transport->registerMemory(addr, length); },
      [transport](const Region& r) { transport->deregisterMemory(r); });
  worker_ = std::thread([this] { workerLoop(); });
  std::lock_guard<std::mutex> lock(live_groups_mu);
  live_groups.push_back(this);
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

// ---------------------------------------------------------------- plumbing

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::enqueue(::c10d::OpType type, const char* name,
                                                              std::chrono::milliseconds timeout,
                                                              std::vector<at::Tensor> outputs,
                                                              std::vector<at::Tensor> inputs,
                                                              std::shared_ptr<OpStaging> staging, Job job) {
  if (staging && !staging->active()) staging = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  MAESTRO_CHECK(!stopping_, "maestro ", name, ": the process group was shut down");
  if (broken_) fail("maestro ", name, ": this process group is unusable after an earlier failure (", broken_what_,
                    "); create a new process group");
  uint64_t seq = ++seq_;
  uint64_t bytes = 0;
  for (const auto& t : inputs) bytes += t.defined() ? t.numel() * t.element_size() : 0;
  recorder_.queued(seq, name, bytes);
  auto work = c10::make_intrusive<MaestroWork>(getRank(), type, seq, name, std::move(outputs), std::move(inputs),
                                               staging ? staging->devices() : std::vector<c10::Device>{});
  if (staging) {
    work->setCopies(staging->copies());
    staging->called();  // the caller's stream, as it is now, is what the copies wait for
  }
  queue_.push_back(Pending{seq, work, std::move(job), timeout, std::move(staging)});
  cv_.notify_all();
  return work;
}

std::shared_ptr<OpStaging> ProcessGroupMaestro::staging(const char* name) {
  return std::make_shared<OpStaging>(*staging_pool_, staging_mode_, getBoundDeviceId(), name);
}

void ProcessGroupMaestro::reject(const char* name, const std::string& why) {
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t seq = ++seq_;  // the operation the peers are about to run
    msg = strcat("maestro ", name, " #", seq, " rejected on rank ", getRank(), ": ", why);
    // Nothing moved here: the group stays usable on this rank. A peer that
    // did start the operation fails it on the abort (and is then unusable,
    // as after any failure); if every rank refused it (an unsupported op or
    // dtype), nobody started it and every rank goes on.
    if (engine_) engine_->broadcastAbort(seq, msg);  // null: shut down, nobody to tell
  }
  throw Error(msg);
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
        if (p.staging) {
          try {
            p.staging->copyIn();
          } catch (const std::exception& e) {  // the peers must not wait for this rank
            engine_->broadcastAbort(p.seq, strcat("maestro: rank ", getRank(), " could not stage its tensors: ", e.what()));
            throw;
          }
        }
        // The call's own timeout (opts.timeout) where it set one, else the group's.
        p.job(p.seq, deadlineAfter(p.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : p.timeout));
        if (p.staging) p.staging->copyOut();
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

ProcessGroupMaestro::Pinned::Pinned(ProcessGroupMaestro* pg, const at::Tensor& t) : pg_(pg), tensor_(t) {
  window = pg_->window(t);
}

ProcessGroupMaestro::Pinned::~Pinned() { pg_->release(tensor_); }

collectives::Window ProcessGroupMaestro::window(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  void* base = storage.mutable_data();
  size_t nbytes = storage.nbytes();
  if (nbytes == 0 || base == nullptr) return collectives::Window{};
  // A staging slab (a CUDA tensor's host stand-in) is registered already.
  if (auto slab = staging_pool_->regionOf(base))
    return collectives::Window{*slab, static_cast<uint64_t>(static_cast<const uint8_t*>(t.data_ptr()) -
                                                            static_cast<const uint8_t*>(base))};
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(storage.getWeakStorageImpl());
  Region r = cache_->acquire(storage.unsafeGetStorageImpl(), base, nbytes, [weak] { return !weak.expired(); });
  uint64_t offset = static_cast<uint64_t>(static_cast<const uint8_t*>(t.data_ptr()) - static_cast<const uint8_t*>(base));
  return collectives::Window{r, offset};
}

ProcessGroupMaestro::Staged ProcessGroupMaestro::stage(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  Region r = engine_->buffer(collectives::kStagingBuffer, std::max<size_t>(bytes, 1));
  return Staged{at::from_blob(r.addr, {numel}, options.device(at::kCPU).requires_grad(false)),
                collectives::Window{r, 0}};
}

void ProcessGroupMaestro::inPlace(const at::Tensor& tensor, const std::function<void(const collectives::Window&)>& run) {
  if (tensor.is_contiguous()) {
    Pinned pin(this, tensor);
    run(pin.window);
    return;
  }
  Staged work = stage(tensor.numel(), tensor.options());
  work.tensor.view(tensor.sizes()).copy_(tensor);
  run(work.window);
  tensor.copy_(work.tensor.view(tensor.sizes()));
}

ProcessGroupMaestro::PinnedList::PinnedList(ProcessGroupMaestro* pg, const std::vector<at::Tensor>& tensors, bool read)
    : tensors_(tensors) {
  for (const auto& t : tensors) {
    buffers_.push_back(t.is_contiguous() ? t : (read ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous)));
    pins_.push_back(std::make_unique<Pinned>(pg, buffers_.back()));
    windows.push_back(pins_.back()->window);
  }
}

void ProcessGroupMaestro::PinnedList::copyBack() {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (!buffers_[i].is_same(tensors_[i])) tensors_[i].copy_(buffers_[i]);
}

void ProcessGroupMaestro::release(const at::Tensor& t) {
  if (t.storage().nbytes() > 0) cache_->unpin(t.storage().unsafeGetStorageImpl());
}

// ---------------------------------------------------------------- collectives

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::AllreduceOptions& opts) {
  auto st = staging("allreduce");
  std::vector<at::Tensor> host;
  Reduction op;
  try {
    MAESTRO_CHECK(tensors.size() == 1, "allreduce takes exactly one tensor per process (got ", tensors.size(), ")");
    // A staged tensor the ring reduces in place is copied in and out in
    // pieces that overlap its transfer (unless it must be scaled first).
    // Only a tensor of two pieces or more: below that, a piece's launch and
    // event would cost more than the overlap gains.
    const at::Tensor& t = tensors[0];
    const uint64_t piece = staging_piece_;
    if (opts.reduceOp.op_ != ::c10d::ReduceOp::PREMUL_SUM && t.defined() && piece > 0 &&
        static_cast<uint64_t>(t.numel()) * t.element_size() >= 2 * piece)
      host = {st->inoutPipelined(t, collectives::allreduceStagingOrder(static_cast<uint64_t>(t.numel()),
                                                                       t.element_size(), getRank(), getSize(), piece))};
    else
      host = st->inout(tensors);
    checkOne(host, "allreduce");
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  } catch (const Error& e) {
    reject("allreduce", e.what());
  }
  at::Tensor tensor = host[0];
  collectives::StagedBuffer* pipeline = st->pipeline();  // lives as long as st, which outlives the job
  return enqueue(::c10d::OpType::ALLREDUCE, "maestro:all_reduce", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, op, pipeline](uint64_t seq, Deadline deadline) {
                   op.prescale(tensor);
                   inPlace(tensor, [&](const collectives::Window& w) {
                     collectives::allreduce(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), op.op,
                                            deadline, pipeline);
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  auto st = staging("allreduce_coalesced");
  std::vector<at::Tensor> host;
  Reduction op;
  try {
    host = st->inout(tensors);
    MAESTRO_CHECK(!host.empty(), "allreduce_coalesced needs at least one tensor");
    for (const auto& t : host) {
      checkTensor(t, "a tensor");
      checkSameKind(host[0], t, "a tensor");
    }
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  } catch (const Error& e) {
    reject("allreduce_coalesced", e.what());
  }
  return enqueue(::c10d::OpType::ALLREDUCE_COALESCED, "maestro:all_reduce_coalesced", opts.timeout, tensors, tensors, st,
                 [this, tensors = host, op](uint64_t seq, Deadline deadline) {
                   int64_t total = 0;
                   for (const auto& t : tensors) total += t.numel();
                   Staged packed = stage(total, tensors[0].options());
                   int64_t at = 0;
                   for (const auto& t : tensors) {
                     packed.tensor.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
                     at += t.numel();
                   }
                   op.prescale(packed.tensor);
                   collectives::allreduce(*engine_, seq, packed.window, total, toDType(tensors[0].scalar_type()), op.op,
                                          deadline);
                   at = 0;
                   for (const auto& t : tensors) {
                     t.copy_(packed.tensor.narrow(0, at, t.numel()).view(t.sizes()));
                     at += t.numel();
                   }
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::broadcast(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::BroadcastOptions& opts) {
  auto st = staging("broadcast");
  std::vector<at::Tensor> host;
  try {
    host = getRank() == opts.rootRank ? st->inout(tensors) : st->out(tensors);
    checkOne(host, "broadcast");
    MAESTRO_CHECK(opts.rootTensor == 0, "broadcast: rootTensor must be 0 (one tensor per process)");
    MAESTRO_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "broadcast: root rank ", opts.rootRank,
                  " is not a rank of this group of ", getSize());
  } catch (const Error& e) {
    reject("broadcast", e.what());
  }
  at::Tensor tensor = host[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(::c10d::OpType::BROADCAST, "maestro:broadcast", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, root](uint64_t seq, Deadline deadline) {
                   inPlace(tensor, [&](const collectives::Window& w) {
                     collectives::broadcast(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), root,
                                            deadline);
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                        const ::c10d::AllgatherOptions& opts) {
  auto st = staging("all_gather_into_tensor");
  at::Tensor in, out;
  try {
    in = st->in(input);
    out = st->out(output);
    checkTensor(in, "the input");
    checkTensor(out, "the output");
    checkSameKind(in, out, "the output");
    MAESTRO_CHECK(output.numel() == input.numel() * getSize(), "all_gather_into_tensor: the output has ",
                  output.numel(), " elements but must have world size (", getSize(), ") x input (", input.numel(),
                  ") = ", input.numel() * getSize());
  } catch (const Error& e) {
    reject("all_gather_into_tensor", e.what());
  }
  return enqueue(::c10d::OpType::_ALLGATHER_BASE, "maestro:all_gather_into_tensor", opts.timeout, {output}, {input}, st,
                 [this, out, in](uint64_t seq, Deadline deadline) {
                   at::Tensor src = in.contiguous();  // read locally, never registered
                   if (out.is_contiguous()) {
                     Pinned pin(this, out);
                     collectives::allgather(*engine_, seq, src.data_ptr(), pin.window, src.numel(),
                                            toDType(src.scalar_type()), deadline);
                     return;
                   }
                   Staged work = stage(out.numel(), out.options());
                   collectives::allgather(*engine_, seq, src.data_ptr(), work.window, src.numel(),
                                          toDType(src.scalar_type()), deadline);
                   out.copy_(work.tensor.view(out.sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const ::c10d::AllgatherOptions& opts) {
  auto st = staging("allgather");
  std::vector<at::Tensor> ins, outs;
  try {
    ins = st->in(inputs);
    checkOne(ins, "allgather");
    MAESTRO_CHECK(outputs.size() == 1, "allgather takes one output list per process (got ", outputs.size(), ")");
    outs = st->out(outputs[0]);
    checkList(outs, ins[0], getSize(), "allgather", "output");
  } catch (const Error& e) {
    reject("allgather", e.what());
  }
  at::Tensor in = ins[0];
  return enqueue(::c10d::OpType::ALLGATHER, "maestro:all_gather", opts.timeout, outputs[0], {inputs[0]}, st,
                 [this, outs, in](uint64_t seq, Deadline deadline) {
                   // Gather into one flat tensor (written in place by the
                   // peers), then copy into the caller's list.
                   Staged flat = stage(static_cast<int64_t>(outs.size()) * in.numel(), in.options());
                   at::Tensor src = in.contiguous();
                   collectives::allgather(*engine_, seq, src.data_ptr(), flat.window, src.numel(),
                                          toDType(src.scalar_type()), deadline);
                   for (size_t i = 0; i < outs.size(); ++i)
                     outs[i].copy_(
                         flat.tensor.narrow(0, static_cast<int64_t>(i) * in.numel(), in.numel()).view(outs[i].sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                            const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter_tensor");
  at::Tensor in, out;
  Reduction op;
  try {
    in = st->in(input);
    out = st->out(output);
    checkTensor(in, "the input");
    checkTensor(out, "the output");
    checkSameKind(in, out, "the output");
    MAESTRO_CHECK(input.numel() == output.numel() * getSize(), "reduce_scatter_tensor: the input has ", input.numel(),
                  " elements but must have world size (", getSize(), ") x output (", output.numel(),
                  ") = ", output.numel() * getSize());
    op = toReduction(opts.reduceOp, input.scalar_type());
  } catch (const Error& e) {
    reject("reduce_scatter_tensor", e.what());
  }
  return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, "maestro:reduce_scatter_tensor", opts.timeout, {output}, {input}, st,
                 [this, out, in, op](uint64_t seq, Deadline deadline) {
                   at::Tensor src = op.source(in);
                   at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                              toDType(src.scalar_type()), op.op, deadline);
                   if (!dst.is_same(out)) out.copy_(dst);
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                                     const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter");
  std::vector<at::Tensor> houts, ins;
  Reduction op;
  try {
    houts = st->out(outputs);
    checkOne(houts, "reduce_scatter");
    MAESTRO_CHECK(inputs.size() == 1, "reduce_scatter takes one input list per process (got ", inputs.size(), ")");
    ins = st->in(inputs[0]);
    checkList(ins, houts[0], getSize(), "reduce_scatter", "input", true, "the output");
    op = toReduction(opts.reduceOp, houts[0].scalar_type());
  } catch (const Error& e) {
    reject("reduce_scatter", e.what());
  }
  at::Tensor out = houts[0];
  return enqueue(::c10d::OpType::REDUCE_SCATTER, "maestro:reduce_scatter", opts.timeout, {outputs[0]}, inputs[0], st,
                 [this, out, ins, op](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> flat;
                   for (const auto& t : ins) flat.push_back(t.reshape({-1}));
                   at::Tensor src = at::cat(flat);
                   op.prescale(src);
                   at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                              toDType(src.scalar_type()), op.op, deadline);
                   if (!dst.is_same(out)) out.copy_(dst);
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue(::c10d::OpType::BARRIER, "maestro:barrier", opts.timeout, {}, {}, nullptr,
                 [this](uint64_t seq, Deadline deadline) { collectives::barrier(*engine_, seq, deadline); });
}

// ---------------------------------------------------------------- coalesced

void ProcessGroupMaestro::allgatherPacked(uint64_t seq, Deadline deadline, const std::vector<at::Tensor>& inputs,
                                          const std::function<void(size_t, int, const at::Tensor&)>& place) {
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs) flat.push_back(t.reshape({-1}));
  at::Tensor src = at::cat(flat);  // read locally, never registered
  const int64_t total = src.numel();
  Staged all = stage(total * getSize(), src.options());
  collectives::allgather(*engine_, seq, src.data_ptr(), all.window, total, toDType(src.scalar_type()), deadline);
  for (int r = 0; r < getSize(); ++r) {
    int64_t at = r * total;
    for (size_t i = 0; i < inputs.size(); ++i) {
      place(i, r, all.tensor.narrow(0, at, inputs[i].numel()));
      at += inputs[i].numel();
    }
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  auto st = staging("allgather_coalesced");
  std::vector<std::vector<at::Tensor>> outs;
  std::vector<at::Tensor> ins;
  try {
    ins = st->in(inputs);
    for (const auto& l : outputLists) outs.push_back(st->out(l));
    // torch's layout (as gloo's): outputLists[r][i] receives rank r's input i.
    checkCoalesced(ins, nullptr, 1, 1, "allgather_coalesced");
    MAESTRO_CHECK(static_cast<int>(outputLists.size()) == getSize(), "allgather_coalesced: ", outputLists.size(),
                  " output lists but the group has ", getSize(), " ranks (one list per rank)");
    for (size_t r = 0; r < outputLists.size(); ++r) {
      MAESTRO_CHECK(outputLists[r].size() == inputs.size(), "allgather_coalesced: output list ", r, " has ",
                    outputLists[r].size(), " tensors but there are ", inputs.size(), " inputs");
      for (size_t i = 0; i < inputs.size(); ++i) {
        checkTensor(outs[r][i], "an output tensor");
        checkSameKind(ins[i], outs[r][i], "an output tensor");
        MAESTRO_CHECK(outputLists[r][i].numel() == inputs[i].numel(), "allgather_coalesced: output ", r, "/", i,
                      " has ", outputLists[r][i].numel(), " elements but input ", i, " has ", inputs[i].numel());
      }
    }
  } catch (const Error& e) {
    reject("allgather_coalesced", e.what());
  }
  std::vector<at::Tensor> all_outs;
  for (const auto& l : outputLists) all_outs.insert(all_outs.end(), l.begin(), l.end());
  return enqueue(::c10d::OpType::ALLGATHER_COALESCED, "maestro:all_gather_coalesced", opts.timeout, all_outs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   allgatherPacked(seq, deadline, ins, [&](size_t i, int r, const at::Tensor& block) {
                     outs[r][i].copy_(block.view(outs[r][i].sizes()));
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const ::c10d::AllgatherOptions& opts) {
  auto st = staging("all_gather_into_tensor_coalesced");
  std::vector<at::Tensor> outs, ins;
  try {
    ins = st->in(inputs);
    outs = st->out(outputs);
    checkCoalesced(ins, &outs, getSize(), 1, "all_gather_into_tensor_coalesced");
  } catch (const Error& e) {
    reject("all_gather_into_tensor_coalesced", e.what());
  }
  return enqueue(kAllgatherIntoTensorCoalesced, "maestro:all_gather_into_tensor_coalesced", opts.timeout, outputs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> flat;  // contiguous, viewed flat
                   for (const auto& o : outs)
                     flat.push_back(o.is_contiguous() ? o.view({-1}) : at::empty({o.numel()}, o.options()));
                   allgatherPacked(seq, deadline, ins, [&](size_t i, int r, const at::Tensor& block) {
                     const int64_t m = ins[i].numel();
                     flat[i].narrow(0, r * m, m).copy_(block);  // rank r's block of output i
                   });
                   for (size_t i = 0; i < outs.size(); ++i)
                     if (!outs[i].is_contiguous()) outs[i].copy_(flat[i].view(outs[i].sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter_tensor_coalesced");
  std::vector<at::Tensor> outs, ins;
  Reduction op;
  try {
    ins = st->in(inputs);
    outs = st->out(outputs);
    checkCoalesced(ins, &outs, 1, getSize(), "reduce_scatter_tensor_coalesced");
    op = toReduction(opts.reduceOp, ins[0].scalar_type());
  } catch (const Error& e) {
    reject("reduce_scatter_tensor_coalesced", e.what());
  }
  return enqueue(kReduceScatterTensorCoalesced, "maestro:reduce_scatter_tensor_coalesced", opts.timeout, outputs, inputs, st,
                 [this, outs, ins, op](uint64_t seq, Deadline deadline) {
                   // Rank r's block: block r of every input, one after another.
                   std::vector<at::Tensor> parts;
                   int64_t total = 0;
                   for (const auto& o : outs) total += o.numel();
                   for (int r = 0; r < getSize(); ++r)
                     for (size_t i = 0; i < ins.size(); ++i) {
                       const int64_t m = outs[i].numel();
                       parts.push_back(ins[i].reshape({-1}).narrow(0, r * m, m));
                     }
                   at::Tensor src = at::cat(parts);
                   op.prescale(src);
                   at::Tensor dst = at::empty({total}, src.options());
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), total,
                                              toDType(src.scalar_type()), op.op, deadline);
                   int64_t at = 0;
                   for (const auto& o : outs) {
                     o.copy_(dst.narrow(0, at, o.numel()).view(o.sizes()));
                     at += o.numel();
                   }
                 });
}

// Reduce, gather, scatter, all-to-all: the root (or every rank) learns the
// peers' buffers in the operation's handshake (collectives/op.h), and the
// data is written one-sided straight between the callers' tensors.

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::ReduceOptions& opts) {
  auto st = staging("reduce");
  std::vector<at::Tensor> host;
  Reduction op;
  try {
    // Only the root's tensor takes the result.
    host = getRank() == opts.rootRank ? st->inout(tensors) : st->in(tensors);
    checkOne(host, "reduce");
    MAESTRO_CHECK(opts.rootTensor == 0, "reduce: rootTensor must be 0 (one tensor per process)");
    checkRoot(opts.rootRank, getSize(), "reduce");
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  } catch (const Error& e) {
    reject("reduce", e.what());
  }
  at::Tensor tensor = host[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(::c10d::OpType::REDUCE, "maestro:reduce", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, op, root](uint64_t seq, Deadline deadline) {
                   auto run = [&](const collectives::Window& w) {
                     collectives::reduce(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), op.op, root,
                                         deadline);
                   };
                   if (!op.premul) return inPlace(tensor, run);
                   // PREMUL_SUM: a scaled copy is reduced, so the other ranks'
                   // tensors stay as they were; the root takes the result.
                   Staged work = stage(tensor.numel(), tensor.options());
                   work.tensor.view(tensor.sizes()).copy_(tensor);
                   op.prescale(work.tensor);
                   run(work.window);
                   if (getRank() == root) tensor.copy_(work.tensor.view(tensor.sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const ::c10d::GatherOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  auto st = staging("gather");
  std::vector<at::Tensor> ins, outs;  // only the root has outputs; elsewhere torch passes none
  try {
    ins = st->in(inputs);
    checkOne(ins, "gather");
    outs = rootList(outputs, opts.rootRank, getRank(), getSize(), ins[0], "the input", "gather", "output",
                    [&](std::vector<at::Tensor>& list) { return st->out(list); });
  } catch (const Error& e) {
    reject("gather", e.what());
  }
  at::Tensor in = ins[0];
  return enqueue(::c10d::OpType::GATHER, "maestro:gather", opts.timeout,
                 getRank() == root ? outputs[0] : std::vector<at::Tensor>{}, {inputs[0]}, st,
                 [this, outs, in, root](uint64_t seq, Deadline deadline) {
                   PinnedList src(this, {in}, true), dst(this, outs, false);
                   collectives::gather(*engine_, seq, src.windows[0], dst.windows, in.numel(),
                                       toDType(in.scalar_type()), root, deadline);
                   dst.copyBack();
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const ::c10d::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  auto st = staging("scatter");
  std::vector<at::Tensor> houts, ins;  // only the root has inputs
  try {
    houts = st->out(outputs);
    checkOne(houts, "scatter");
    ins = rootList(inputs, opts.rootRank, getRank(), getSize(), houts[0], "the output", "scatter", "input",
                   [&](std::vector<at::Tensor>& list) { return st->in(list); });
  } catch (const Error& e) {
    reject("scatter", e.what());
  }
  at::Tensor out = houts[0];
  return enqueue(::c10d::OpType::SCATTER, "maestro:scatter", opts.timeout, {outputs[0]},
                 getRank() == root ? inputs[0] : std::vector<at::Tensor>{}, st,
                 [this, out, ins, root](uint64_t seq, Deadline deadline) {
                   PinnedList src(this, ins, true), dst(this, {out}, false);
                   collectives::scatter(*engine_, seq, src.windows, dst.windows[0], out.numel(),
                                        toDType(out.scalar_type()), root, deadline);
                   dst.copyBack();
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const ::c10d::AllToAllOptions& opts) {
  auto st = staging("all_to_all");
  std::vector<at::Tensor> outs, ins;
  try {
    ins = st->in(inputs);
    outs = st->out(outputs);
    MAESTRO_CHECK(!ins.empty(), "all_to_all: the input list is empty");
    checkList(ins, ins[0], getSize(), "all_to_all", "input", false);
    checkList(outs, ins[0], getSize(), "all_to_all", "output", false);
    checkToItself(ins[getRank()].numel(), outs[getRank()].numel(), "all_to_all");
  } catch (const Error& e) {
    reject("all_to_all", e.what());
  }
  return enqueue(::c10d::OpType::ALLTOALL, "maestro:all_to_all", opts.timeout, outputs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> sources;
                   for (const auto& t : ins) {
                     // An input that shares memory with an output is read
                     // from a copy: the peers' writes must not overwrite it.
                     bool aliased = false;
                     for (const auto& o : outs) aliased = aliased || (t.numel() && o.numel() && t.is_alias_of(o));
                     sources.push_back(aliased ? t.clone() : t);
                   }
                   PinnedList src(this, sources, true), dst(this, outs, false);
                   std::vector<uint64_t> sends, recvs;
                   for (const auto& t : ins) sends.push_back(t.numel());
                   for (const auto& t : outs) recvs.push_back(t.numel());
                   collectives::alltoall(*engine_, seq, src.windows, sends, dst.windows, recvs,
                                         toDType(ins[0].scalar_type()), deadline);
                   dst.copyBack();
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                        std::vector<int64_t>& outputSplitSizes,
                                                                        std::vector<int64_t>& inputSplitSizes,
                                                                        const ::c10d::AllToAllOptions& opts) {
  auto st = staging("all_to_all_single");
  std::vector<uint64_t> sends, recvs;
  at::Tensor in, out;
  try {
    in = st->in(input);
    out = st->out(output);
    checkTensor(in, "the input");
    checkTensor(out, "the output");
    checkSameKind(in, out, "the output");
    sends = splitCounts(inputSplitSizes, input, getSize(), "input");
    recvs = splitCounts(outputSplitSizes, output, getSize(), "output");
    checkToItself(sends[getRank()], recvs[getRank()], "all_to_all_single");
  } catch (const Error& e) {
    reject("all_to_all_single", e.what());
  }
  return enqueue(::c10d::OpType::ALLTOALL_BASE, "maestro:all_to_all_single", opts.timeout, {output}, {input}, st,
                 [this, out, in, sends, recvs](uint64_t seq, Deadline deadline) {
                   at::Tensor source = in.numel() && out.numel() && in.is_alias_of(out) ? in.clone() : in;
                   PinnedList src(this, {source}, true), dst(this, {out}, false);
                   // Every rank's block is a window at its offset in the one
                   // tensor: read and written in place.
                   const uint64_t elem = in.element_size();
                   std::vector<collectives::Window> ins, outs;
                   uint64_t at_in = 0, at_out = 0;
                   for (int p = 0; p < getSize(); ++p) {
                     ins.push_back(collectives::Window{src.windows[0].region, src.windows[0].base + at_in * elem});
                     outs.push_back(collectives::Window{dst.windows[0].region, dst.windows[0].base + at_out * elem});
                     at_in += sends[p];
                     at_out += recvs[p];
                   }
                   collectives::alltoall(*engine_, seq, ins, sends, outs, recvs, toDType(in.scalar_type()), deadline);
                   dst.copyBack();
                 });
}

// ---------------------------------------------------------------- point to point

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return pointToPoint(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  MAESTRO_CHECK(srcRank >= 0, "recv: source rank ", srcRank, " is not a rank of this group of ", getSize());
  return pointToPoint(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return pointToPoint(false, tensors, -1, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::pointToPoint(bool send, std::vector<at::Tensor>& tensors,
                                                                   int peer, int tag) {
  const char* name = send ? "send" : "recv";
  // Only this rank and its peer are involved: a bad argument raises here and
  // leaves the group as it was (the peer's matching call times out).
  auto st = staging(name);
  std::vector<at::Tensor> host = send ? st->in(tensors) : st->out(tensors);
  checkOne(host, name);
  MAESTRO_CHECK(static_cast<uint32_t>(tag) - kReservedTagBase >= kReservedTags, name, ": tag ", tag,
                " is reserved by maestro (tags from ", static_cast<int32_t>(kReservedTagBase), " to ",
                static_cast<int32_t>(kReservedTagBase + kReservedTags - 1), ")");
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro ", name, ": the process group was shut down");
  }
  at::Tensor tensor = host[0];
  // Zero copy where the layout allows: the peer writes straight into a
  // contiguous recv tensor, a send is read straight from a contiguous one.
  at::Tensor buffer = tensor.is_contiguous() ? tensor : (send ? tensor.contiguous() : at::empty_like(tensor, at::MemoryFormat::Contiguous));
  auto work = c10::make_intrusive<MaestroWork>(getRank(), send ? ::c10d::OpType::SEND : (peer < 0 ? ::c10d::OpType::RECVANYSOURCE : ::c10d::OpType::RECV),
                                               0, send ? "maestro:send" : (peer < 0 ? "maestro:recvAnySource" : "maestro:recv"),
                                               send ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{tensors[0]},
                                               std::vector<at::Tensor>{tensors[0]}, st->devices());
  if (st->active()) {
    work->setCopies(st->copies());
    st->called();
    st->copyIn();  // a send's bytes are in its stand-in before it is posted (this call waits for that copy)
  }
  auto pin = std::make_shared<Pinned>(this, buffer);
  const uint64_t bytes = buffer.numel() * buffer.element_size();
  collectives::PointToPoint::Done done = [work, pin, tensor, buffer, send, st](std::exception_ptr error,
                                                                                 int source) mutable {
    if (!error && !send) {
      try {
        if (!buffer.is_same(tensor)) tensor.copy_(buffer);
        st->copyOut();
      } catch (const std::exception&) {
        error = std::current_exception();
      }
    }
    pin.reset();  // unpinned before the Work completes: the caller may free the tensor then
    if (!send) work->setSource(source);
    work->complete(error);
    st->finish();
  };
  const Deadline deadline = deadlineAfter(timeout_.load());
  if (send) p2p_->send(peer, static_cast<uint32_t>(tag), pin->window, bytes, deadline, std::move(done));
  else p2p_->recv(peer, static_cast<uint32_t>(tag), pin->window, bytes, deadline, std::move(done));
  return work;
}

// ---------------------------------------------------------------- monitored barrier

void ProcessGroupMaestro::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  const int n = getSize(), me = getRank();
  const auto timeout = opts.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
  const Deadline deadline = deadlineAfter(timeout);
  // Every rank calls it the same number of times: the count names the
  // barrier, so a late token of an earlier one never matches a later one.
  const uint32_t tag = kReservedTagBase + monitored_barriers_.fetch_add(1) % kReservedTags;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro monitored_barrier: the process group was shut down");
  }
  if (n == 1) return;
  // rank 0's answer: which ranks did not arrive (all zero: pass).
  at::Tensor missing = at::zeros({n}, at::kInt);
  struct Token {
    std::promise<std::exception_ptr> done;
    std::shared_ptr<Pinned> pin;
  };
  // Rank 0 answers once it heard from everyone or gave up on someone: up to
  // one timeout after it came, so the others wait for its answer longer.
  const Deadline answer_deadline = deadlineAfter(2 * timeout);
  auto post = [&](bool send, int peer, const at::Tensor& t, Deadline deadline) {
    auto token = std::make_shared<Token>();
    token->pin = std::make_shared<Pinned>(this, t);
    auto done = [token](std::exception_ptr error, int) {
      token->pin.reset();
      token->done.set_value(error);
    };
    const uint64_t bytes = t.numel() * t.element_size();
    if (send) p2p_->send(peer, tag, token->pin->window, bytes, deadline, done);
    else p2p_->recv(peer, tag, token->pin->window, bytes, deadline, done);
    return token->done.get_future();
  };
  const std::string ms = strcat(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms");
  at::Tensor empty = at::empty({0}, at::kInt);
  if (me != 0) {
    auto sent = post(true, 0, empty, deadline);
    auto answer = post(false, 0, missing, answer_deadline);
    std::exception_ptr error = sent.get();
    std::exception_ptr answered = answer.get();
    if (error || answered)
      fail("maestro monitored_barrier: rank ", me, " did not hear from rank 0 within ", ms,
           " (rank 0 did not reach the barrier, or failed it: see its error)");
    std::string who;
    for (int r = 0; r < n; ++r)
      if (missing.data_ptr<int32_t>()[r]) who += strcat(who.empty() ? "" : ", ", r);
    if (!who.empty())
      fail("Rank(s) ", who, " failed to pass monitoredBarrier in ", ms, " (maestro monitored_barrier, reported by rank 0)");
    return;
  }
  std::vector<std::future<std::exception_ptr>> arrivals;
  for (int r = 1; r < n; ++r) arrivals.push_back(post(false, r, empty, deadline));
  std::vector<int> late;
  for (int r = 1; r < n; ++r)
    if (arrivals[r - 1].get()) {
      late.push_back(r);
      missing.data_ptr<int32_t>()[r] = 1;
    }
  std::vector<std::future<std::exception_ptr>> answers;
  for (int r = 1; r < n; ++r)
    if (!missing.data_ptr<int32_t>()[r]) answers.push_back(post(true, r, missing, answer_deadline));
  for (auto& a : answers) a.get();  // a rank that left after arriving is not this barrier's failure
  if (late.empty()) return;
  // gloo's wording, which torch's tests and users' log scrapers look for.
  if (timeout.count() <= 0)
    fail("Rank 0 timed out in monitoredBarrier after ", ms, " (maestro monitored_barrier: no time to wait for rank",
         late.size() > 1 ? "s" : "", " ", late[0], late.size() > 1 ? " and others" : "", ")");
  std::string who;
  for (size_t i = 0; i < (waitAllRanks ? late.size() : 1); ++i) who += strcat(i ? ", " : "", late[i]);
  fail(waitAllRanks && late.size() > 1 ? "Ranks " : "Rank ", who, " failed to pass monitoredBarrier in ", ms,
       " (maestro monitored_barrier", waitAllRanks ? "" : "; the first such rank, wait_all_ranks=True names all", ")");
}

}  // namespace c10d_glue
}  // namespace maestro
