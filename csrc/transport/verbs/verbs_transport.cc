// Memory, the data path, shutdown and the factory of the verbs transport
// (see verbs_transport_impl.h for the thread model).
#include "transport/verbs/verbs_transport.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/nic_counters.h"
#include "transport/verbs/gid_table.h"
#include "transport/verbs/memory_region.h"
#include "transport/verbs/verbs_transport_impl.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

// Control sends (hellos of the layer above, credits, ...) beside the writes
// that max_inflight_per_path allows, so a full window of writes does not
// delay them.
constexpr int kControlSendSlots = 8;

}  // namespace

VerbsTransport::VerbsTransport(const TransportOptions& options)
    : options_(options),
      sink_(options.sink),
      send_depth_(std::max(1, options.max_inflight_per_path) + kControlSendSlots),
      // Twice the peer's send window: a peer can have one full window of writes
      // and control sends in flight while the previous window's receive
      // completions are still being handled.
      recv_depth_(2 * (std::max(1, options.max_inflight_per_path) + kControlSendSlots)) {
  MAESTRO_CHECK(sink_ != nullptr, "verbs: TransportOptions.sink is required");
  MAESTRO_CHECK(options.max_inflight_per_path >= 1, "verbs: max_inflight_per_path must be >= 1, not ",
                options.max_inflight_per_path);
  device_list_ = rdma_get_devices(&num_devices_);
  if (device_list_ == nullptr || num_devices_ == 0) {
    if (device_list_ != nullptr) rdma_free_devices(device_list_);
    fail("verbs: no RDMA device found: load the NIC's RDMA driver, or for Soft-RoCE "
         "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <nic>`; "
         "MAESTRO_TRANSPORT=tcp works without one");
  }
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_ == nullptr) {
    const int err = errno;
    rdma_free_devices(device_list_);
    fail("verbs: cannot open the rdma_cm event channel (/dev/infiniband/rdma_cm): ", std::strerror(err),
         "; is the rdma_ucm module loaded?");
  }
  // Non-blocking, so the cm thread can poll() it beside its wake-up fd and
  // drain it without blocking.
  const int flags = fcntl(cm_channel_->fd, F_GETFL);
  fcntl(cm_channel_->fd, F_SETFL, flags | O_NONBLOCK);
  cm_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  progress_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (cm_wake_fd_ < 0 || progress_wake_fd_ < 0) {
    const int err = errno;
    if (cm_wake_fd_ >= 0) close(cm_wake_fd_);
    if (progress_wake_fd_ >= 0) close(progress_wake_fd_);
    rdma_destroy_event_channel(cm_channel_);
    rdma_free_devices(device_list_);
    fail("verbs: eventfd failed: ", std::strerror(err));
  }
  cm_thread_ = std::thread([this] { cmLoop(); });
}

VerbsTransport::~VerbsTransport() { shutdown(); }

Device* VerbsTransport::deviceFor(ibv_context* context) {
  MAESTRO_CHECK(context != nullptr, "verbs: the address is not on an RDMA device");
  if (!device_) {
    device_ = std::make_unique<Device>(context, !options_.busy_poll);
    progress_thread_ = std::thread([this] { progressLoop(); });
  } else {
    MAESTRO_CHECK(device_->context() == context, "verbs: this rank's vNIC addresses are on two RDMA devices (",
                  device_->name(), " and ", ibv_get_device_name(context->device),
                  "); the transport shares one protection domain and completion queue, so put all "
                  "vNIC aliases on one NIC");
  }
  return device_.get();
}

std::unique_ptr<Path> VerbsTransport::newPath(int peer, int index, Device* device) const {
  return std::make_unique<Path>(peer, index, device, send_depth_, recv_depth_);
}

Path* VerbsTransport::livePath(int peer, int path) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find({peer, path});
  return it == live_.end() ? nullptr : it->second->path.get();
}

ibv_qp* VerbsTransport::pathQp(int peer, int path) const {
  Path* p = livePath(peer, path);
  return p == nullptr ? nullptr : p->qp();
}

// ---- memory -----------------------------------------------------------------

Region VerbsTransport::registerMemory(void* addr, size_t length) {
  MAESTRO_CHECK(!stopping_, "verbs: registerMemory after shutdown");
  MAESTRO_CHECK(addr != nullptr || length == 0, "verbs: registerMemory(nullptr, ", length, ")");
  Device* device = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_) {
      device = device_.get();
    } else {
      // The device is normally chosen by the vNIC address of the first
      // listen()/connect(); with a single device there is nothing to choose.
      MAESTRO_CHECK(num_devices_ == 1, "verbs: this host has ", num_devices_,
                    " RDMA devices; call listen() or connect() before registerMemory() so the "
                    "transport knows which one the vNICs are on");
      device = deviceFor(device_list_[0]);
    }
  }
  // ibv_reg_mr rejects zero-length regions; an empty tensor still needs a
  // valid region (zero-length writes carry no SGE and are not key-checked).
  static char empty_byte;
  void* reg_addr = length == 0 ? &empty_byte : addr;
  bool windows = false;
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    windows = binder() != nullptr;
  }
  // With memory windows the MR itself grants no remote access: only a
  // window bound over it while the region is exposed does.
  const int access = IBV_ACCESS_LOCAL_WRITE | (windows ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* mr = registerOrExplain(device->pd(), reg_addr, std::max<size_t>(length, 1), access, "a user buffer");
  std::lock_guard<std::mutex> lock(regions_mu_);
  const uint32_t id = next_region_id_++;
  regions_[id].mr = mr;
  Region region;
  region.id = id;
  region.key = mr->rkey;
  region.lkey = mr->lkey;
  region.addr = addr;
  region.length = length;
  MAESTRO_TRACE("verbs: registered region ", id, " (", length, " bytes, rkey 0x", std::hex, mr->rkey, ")");
  return region;
}

WindowBinder* VerbsTransport::binder() {
  if (windows_checked_) return binder_.get();
  windows_checked_ = true;
  Device* device = nullptr;
  GidEntry gid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    device = device_.get();
    gid = local_gid_;
  }
  std::string why;
  if (device == nullptr || !WindowBinder::supported(*device)) {
    why = strcat(device == nullptr ? std::string("no device") : device->name(), " has no memory windows");
  } else if (gid.index < 0) {
    why = "no local vNIC address was used before the first registration";
  } else {
    try {
      binder_ = std::make_unique<WindowBinder>(device, gid);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (!binder_) {
    MAESTRO_INFO("verbs: no memory windows (", why, "): a registered region stays remotely writable with its "
                 "MR's rkey until it is deregistered");
  }
  return binder_.get();
}

uint64_t VerbsTransport::expose(const Region& region) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = regions_.find(region.id);
  MAESTRO_CHECK(it != regions_.end(), "verbs: expose of unknown region ", region.id);
  Registered& r = it->second;
  if (binder_ == nullptr) return r.mr->rkey;
  if (r.exposed == 0) {
    if (r.mw == nullptr) {
      r.mw = ibv_alloc_mw(r.mr->pd, IBV_MW_TYPE_1);
      MAESTRO_CHECK(r.mw != nullptr, "verbs: ibv_alloc_mw for region ", region.id, " failed: ", std::strerror(errno));
    }
    r.rkey = binder_->bind(r.mw, r.mr);
    MAESTRO_TRACE("verbs: region ", region.id, " exposed with rkey 0x", std::hex, r.rkey);
  }
  ++r.exposed;
  return r.rkey;
}

void VerbsTransport::conceal(const Region& region) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = regions_.find(region.id);
  if (it == regions_.end()) {
    MAESTRO_CHECK(shut_down_, "verbs: conceal of unknown region ", region.id);
    return;  // every window went with shutdown
  }
  Registered& r = it->second;
  if (binder_ == nullptr || r.exposed == 0) return;
  if (--r.exposed == 0) binder_->unbind(r.mw, r.mr);
}

void VerbsTransport::releaseWindow(Registered& r) {
  // Deallocating a bound window invalidates it.
  if (r.mw != nullptr && ibv_dealloc_mw(r.mw) != 0) MAESTRO_WARN("verbs: ibv_dealloc_mw failed: ", std::strerror(errno));
  r.mw = nullptr;
}

void VerbsTransport::deregisterMemory(const Region& region) {
  Registered r;
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    auto it = regions_.find(region.id);
    if (it == regions_.end()) {
      // After shutdown every region is already gone; before it, this is a bug.
      MAESTRO_CHECK(shut_down_, "verbs: deregisterMemory of unknown region ", region.id);
      return;
    }
    r = it->second;
    regions_.erase(it);
    releaseWindow(r);
  }
  if (ibv_dereg_mr(r.mr) != 0) {
    MAESTRO_WARN("verbs: ibv_dereg_mr(region ", region.id, ") failed: ", std::strerror(errno));
  }
}

// ---- data path ----------------------------------------------------------------

void VerbsTransport::postWrite(int peer, int path, const WriteRequest& req) {
  Path* p = livePath(peer, path);
  MAESTRO_CHECK(p != nullptr, "verbs: postWrite on path ", path, " to peer ", peer, ", which is not connected");
  if (p->postWrite(req) == Path::PostResult::kClosed) {
    // Reported from the progress thread, after onPathError: never from inside
    // the caller's postWrite(), where the caller may hold its own locks.
    enqueue(Task{Task::kFlushWrite, p, req.wr_id, {}});
  }
}

void VerbsTransport::postSend(int peer, int path, const void* data, size_t length) {
  Path* p = livePath(peer, path);
  MAESTRO_CHECK(p != nullptr, "verbs: postSend on path ", path, " to peer ", peer, ", which is not connected");
  // A control message on a dead path is dropped; the path's onPathError
  // (raised by the task, if not already) tells the layer above.
  if (p->postSend(data, length) == Path::PostResult::kClosed) enqueue(Task{Task::kFailPath, p, 0, p->closeReason()});
}

void VerbsTransport::closePath(int peer, int path, const std::string& why) {
  Path* p = livePath(peer, path);
  if (p == nullptr) {
    MAESTRO_INFO("verbs: closePath(", peer, ", ", path, "): no such path");
    return;
  }
  requestPathFailure(p, why);
}

std::string VerbsTransport::describePath(int peer, int path) const {
  Path* p = livePath(peer, path);
  return p == nullptr ? strcat("(verbs: no path ", path, " to peer ", peer, ")") : p->description();
}

PathCounters VerbsTransport::pathCounters(int peer, int path) const {
  PathCounters c;
  if (Path* p = livePath(peer, path)) c.nic_port = nicPortDir(p->device().name(), p->port());
  return c;
}

// ---- shutdown -------------------------------------------------------------------

void VerbsTransport::shutdown() {
  if (shut_down_.exchange(true)) return;
  stopping_ = true;
  const uint64_t one = 1;
  (void)!write(cm_wake_fd_, &one, sizeof(one));
  (void)!write(progress_wake_fd_, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> lock(mu_);  // so no waiter misses the notification
    cm_cv_.notify_all();
  }
  if (cm_thread_.joinable()) cm_thread_.join();
  if (progress_thread_.joinable()) progress_thread_.join();

  // Both threads are gone and every retrieved cm event was acknowledged, so
  // rdma_destroy_id cannot block. Order: QPs, cm ids, then the MRs, and the
  // CQ/PD last (the PD cannot go while an MR or QP still uses it).
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<rdma_cm_id*> listeners;
  std::vector<Parked> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.clear();
    conns.swap(conns_);
    listeners.swap(listeners_);
    parked.swap(parked_);
  }
  for (const Parked& p : parked) rdma_destroy_id(p.id);  // never answered: the peer's connect times out
  for (auto& conn : conns) {
    if (conn->path) conn->path->release();
    if (conn->id != nullptr) rdma_destroy_id(conn->id);  // sends a DREQ if still connected
  }
  conns.clear();  // frees the paths' control buffers and their MRs
  for (rdma_cm_id* id : listeners) rdma_destroy_id(id);
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    for (auto& entry : regions_) {
      releaseWindow(entry.second);
      ibv_dereg_mr(entry.second.mr);
    }
    regions_.clear();
    binder_.reset();
  }
  device_.reset();
  rdma_destroy_event_channel(cm_channel_);
  rdma_free_devices(device_list_);
  close(cm_wake_fd_);
  close(progress_wake_fd_);
}

// ---- public functions ---------------------------------------------------------------

std::unique_ptr<Transport> makeVerbsTransport(const TransportOptions& options) {
  return std::make_unique<VerbsTransport>(options);
}

bool verbsUsableFor(const std::vector<std::string>& vnic_addrs, std::string* why) {
  auto no = [why](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const std::vector<std::string> devices = rdmaDeviceNames();
  if (devices.empty()) return no("no RDMA device (/sys/class/infiniband is empty or missing)");
  if (access("/dev/infiniband/rdma_cm", R_OK | W_OK) != 0) {
    return no("no usable /dev/infiniband/rdma_cm (is the rdma_ucm module loaded?)");
  }
  if (vnic_addrs.empty()) return no("no vNIC addresses given");
  std::string device;
  for (const std::string& addr : vnic_addrs) {
    GidEntry entry;
    if (!findRoceV2Gid(addr, &entry)) {
      std::string names;
      for (const std::string& name : devices) names += (names.empty() ? "" : ", ") + name;
      return no(strcat(addr, " has no RoCE v2 GID on any RDMA device (", names, ")"));
    }
    if (device.empty()) {
      device = entry.device;
    } else if (entry.device != device) {
      return no(strcat("vNIC addresses are on different RDMA devices (", device, " and ", entry.device,
                       " for ", addr, ")"));
    }
  }
  if (why != nullptr) {
    *why = strcat("RDMA device ", device, " has a RoCE v2 GID for each of the ", vnic_addrs.size(), " vNICs");
  }
  return true;
}

ibv_qp* verbsPathQp(Transport& transport, int peer, int path) {
  auto* verbs = dynamic_cast<VerbsTransport*>(&transport);
  return verbs == nullptr ? nullptr : verbs->pathQp(peer, path);
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
