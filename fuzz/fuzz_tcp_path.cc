// libFuzzer target: the TCP path's receive side itself. A TcpPath (the real
// one, on the process's event loop) holds one end of a socketpair; the input
// is the byte stream its peer sends, written into the other end in chunks
// of sizes the input chooses, so every frame may be cut anywhere (a partial
// header, payload, message or by-reference address) and the path's
// resumable parser has to pick it up on the next readiness event. Between
// chunks the input may conceal, expose or remove a region (a write landing
// in it is revoked: its grant dropped, the rest drained) or mark the
// sender's connection dead (its by-reference writes are dropped unread).
// Each input gets a fresh path, socketpair and region table; it ends with
// the peer closing its end, which must fail the path exactly once.
//
// The regions are exact-size heap allocations, so AddressSanitizer sees any
// byte a bounds check let through, including the bytes process_vm_readv
// copies for a write by reference. A region that was never exposed during
// the input, and the one removed before it, must come out untouched.
//
// What the fuzzer cannot guess is put in by the harness: an 8-byte
// little-endian value in the stream is replaced, just before the chunk that
// holds its first byte is written, by
//   0x00000000'SS6b6579  ("yek" SS):  region SS&0xf's current key (SS>>4 == 0)
//                                     or its previous one (SS>>4 == 1); regions
//                                     0-3 are 1, 64, 4096 and 65536 bytes, 4
//                                     was removed before the input
//   0x00000072'6566LLLL  ("fer"):     the address of byte LLLL of a 64 KiB
//                                     source buffer (a by-reference payload)
//   0x00000000'706964SS  ("dip"):     this process's single-copy offer: its pid
//                                     (SS 0), cookie address (1), liveness
//                                     word's address (2), cookie bytes 0-7 (3)
//                                     and 8-15 (4) -- the "peer" is this process
//
// Input layout:
//   byte 0  bits 0-3: region i is exposed at the start (every region was
//                     exposed and concealed once before, so it has a previous key)
//           bit 4:    the path does single copy (offers itself, accepts an offer)
//           bit 5:    the sender's connection is live at the start
//           bits 6-7: writes the path itself posts first (so ACKs may be valid)
//   byte 1  n % 9 chunk entries of 3 bytes follow: chunk size (uint16 LE; a
//           size past the end takes the rest) and what to do after it:
//           action >> 4: 1 conceal, 2 expose, 3 remove region (action & 3),
//           4 flip the sender's liveness, 5 a fence notice: drop writes until
//           mark (action & 15) (this path's connection number is 0, so the
//           stream's MARKs of 0-15 end it), 6 withdraw the path's own writes;
//           anything else nothing
//   rest    the stream; what the entries left over is the last chunk
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/event_loop.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/same_host.h"
#include "transport/tcp/tcp_path.h"
#include "transport/transport.h"

namespace tcp = maestro::transport::tcp;
namespace same_host = maestro::transport::tcp::same_host;

namespace {

constexpr size_t kSizes[] = {1, 64, 4096, 65536};
constexpr size_t kRegions = 4;         // live ones; index 4 is the removed one
constexpr size_t kSourceBytes = 65536;  // by-reference payloads come from here
constexpr uint8_t kUntouched = 0x5C;
constexpr auto kDeadline = std::chrono::seconds(30);  // a live path takes microseconds

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "ERROR: fuzz_tcp_path: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

// What the path reports. Called on the loop thread.
class Sink : public maestro::transport::CompletionSink {
 public:
  void onWriteComplete(int, int, uint64_t wr_id, bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    (ok ? completed : flushed).push_back(wr_id);
  }
  void onWriteArrived(int, int, uint32_t, uint32_t length) override {
    if (length > kSizes[kRegions - 1]) finding("a write larger than any region arrived");
  }
  void onMessage(int, int, const uint8_t*, size_t length) override {
    if (length > maestro::transport::kMaxControlBytes) finding("a control message over the limit was delivered");
  }
  void onPathError(int, int, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++errors;
    cv_.notify_all();
  }
  bool waitError() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return errors > 0; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int errors = 0;
  std::vector<uint64_t> completed, flushed;
};

struct Process {
  std::shared_ptr<tcp::EventLoop> loop = tcp::EventLoop::shared();
  std::atomic<uint64_t>* alive = same_host::newLivenessWord();  // the "sender's" connection
  same_host::Offer offer = same_host::makeOffer(alive);
  std::vector<uint8_t> source = std::vector<uint8_t>(kSourceBytes);
  std::vector<uint8_t> outgoing = std::vector<uint8_t>(64, 0x0F);  // what the path's own writes send
  Process() {
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
  }
};

Process& process() {
  static Process* p = new Process();  // lives past exit: the loop thread may still run
  return *p;
}

struct Regions {
  tcp::RegionTable table;
  std::unique_ptr<uint8_t[]> memory[kRegions + 1];
  size_t size[kRegions + 1];
  maestro::Region region[kRegions + 1];
  uint64_t key[kRegions + 1] = {}, previous[kRegions + 1] = {};
  bool exposed[kRegions + 1] = {}, present[kRegions + 1] = {}, ever_exposed[kRegions + 1] = {};

  explicit Regions(uint8_t exposed_mask) {
    for (size_t i = 0; i <= kRegions; ++i) {
      size[i] = i < kRegions ? kSizes[i] : 16;
      memory[i].reset(new uint8_t[size[i]]);
      std::memset(memory[i].get(), kUntouched, size[i]);
      region[i] = table.add(memory[i].get(), size[i]);
      present[i] = true;
      key[i] = table.expose(region[i].id);
      table.conceal(region[i].id);
      previous[i] = key[i];
    }
    table.remove(region[kRegions].id);  // its keys are remembered: a write to it is stale
    present[kRegions] = false;
    for (size_t i = 0; i < kRegions; ++i)
      if ((exposed_mask >> i) & 1) expose(i);
  }
  void expose(size_t i) {
    if (!present[i] || exposed[i]) return;
    previous[i] = key[i];
    key[i] = table.expose(region[i].id);
    exposed[i] = ever_exposed[i] = true;
  }
  void conceal(size_t i) {
    if (!present[i] || !exposed[i]) return;
    table.conceal(region[i].id);
    exposed[i] = false;
  }
  void remove(size_t i) {
    if (!present[i]) return;
    table.remove(region[i].id);
    present[i] = exposed[i] = false;
  }
  // The 8-byte value that replaces `v`, or `v` itself.
  uint64_t substitute(uint64_t v) const {
    if ((v & 0xffffffff00ffffffull) == 0x6b6579) {
      const unsigned s = static_cast<unsigned>(v >> 24);
      const size_t i = s & 0xf;
      if (i <= kRegions && (s >> 4) <= 1) return (s >> 4) ? previous[i] : key[i];
      return v;
    }
    if ((v >> 16) == 0x726566) return reinterpret_cast<uint64_t>(process().source.data()) + (v & 0xffff);
    if ((v >> 8) == 0x706964) {
      const same_host::Offer& o = process().offer;
      uint64_t cookie[2];
      std::memcpy(cookie, o.cookie, sizeof cookie);
      switch (v & 0xff) {
        case 0: return o.pid;
        case 1: return o.cookie_addr;
        case 2: return o.alive_addr;
        case 3: return cookie[0];
        case 4: return cookie[1];
      }
    }
    return v;
  }
};

// Wait until the path has read everything written so far (or failed) and
// the loop has finished with it.
void settle(tcp::TcpPath& path, int path_fd, tcp::EventLoop& loop) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!path.failed()) {
    int queued = 0;
    if (::ioctl(path_fd, FIONREAD, &queued) != 0 || queued == 0) break;
    if (std::chrono::steady_clock::now() > deadline) finding("the path stopped reading a live connection");
    std::this_thread::yield();
  }
  loop.quiesce();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Process& proc = process();
  const uint8_t config = data[0];
  const size_t entries = std::min<size_t>(data[1] % 9, (size - 2) / 3);
  const uint8_t* plan = data + 2;
  std::vector<uint8_t> stream(data + 2 + 3 * entries, data + size);

  proc.alive->store((config >> 5) & 1);
  auto regions = std::make_unique<Regions>(config & 0xf);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) finding("socketpair failed");
  const int peer_fd = fds[1];
  timeval limit{static_cast<time_t>(kDeadline.count()), 0};
  ::setsockopt(peer_fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);

  Sink sink;
  auto path = std::make_shared<tcp::TcpPath>(fds[0], 1, 0, "fuzz", &sink, &regions->table, proc.loop.get(),
                                             (config >> 4) & 1);
  std::atomic<bool> over{false};
  regions->table.setRevoker([&](uint32_t id) {
    if (over) finding("a failed path still holds a region");
    path->revoke(id);
  });
  path->start();
  const uint64_t posted = config >> 6;
  for (uint64_t w = 1; w <= posted; ++w) {
    maestro::transport::WriteRequest req;
    req.src = proc.outgoing.data();
    req.length = proc.outgoing.size();
    req.remote = maestro::RemoteRegion{1, 1, 0, 1 << 20};
    req.wr_id = w;
    path->postWrite(req);
  }

  // Write the stream chunk by chunk; the last chunk is what the entries left.
  size_t at = 0;
  std::vector<uint8_t> discard(65536);
  for (size_t e = 0; e <= entries; ++e) {
    size_t len = stream.size() - at;
    uint8_t action = 0;
    if (e < entries) {
      len = std::min<size_t>(len, plan[3 * e] | (plan[3 * e + 1] << 8));
      action = plan[3 * e + 2];
    }
    for (size_t i = at; i < at + len && i + 8 <= stream.size(); ++i) {
      uint64_t v;
      std::memcpy(&v, &stream[i], 8);
      const uint64_t w = regions->substitute(v);
      if (w != v) std::memcpy(&stream[i], &w, 8);
    }
    if (len > 0 && !path->failed()) {
      size_t sent = 0;
      while (sent < len) {
        ssize_t n = ::send(peer_fd, stream.data() + at + sent, len - sent, MSG_NOSIGNAL);
        if (n > 0) {
          sent += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) finding("the path stopped reading a live connection");
        break;  // the path failed and shut its end
      }
    }
    at += len;
    settle(*path, fds[0], *proc.loop);
    while (::recv(peer_fd, discard.data(), discard.size(), MSG_DONTWAIT) > 0) {
    }  // what the path sent (its offer, ACKs, writes)
    const size_t r = action & 3;
    switch (action >> 4) {
      case 1: regions->conceal(r); break;
      case 2: regions->expose(r); break;
      case 3: regions->remove(r); break;
      case 4: proc.alive->store(proc.alive->load() ^ 1); break;
      case 5: path->dropUntil(action & 15); break;
      case 6: path->withdraw(); break;
      default: break;
    }
  }

  // The peer closes: the path fails, once, and lets go of everything.
  ::shutdown(peer_fd, SHUT_WR);
  if (!sink.waitError()) finding("the path did not fail when its peer closed");
  proc.loop->quiesce();
  proc.loop->quiesce();  // what the failure posted
  {
    std::lock_guard<std::mutex> lock(sink.mu_);
    if (sink.errors != 1) finding("the path reported its failure more than once");
    // The path's own writes: an ACKed prefix, in order, then the rest flushed, each once.
    std::vector<uint64_t> all = sink.completed;
    all.insert(all.end(), sink.flushed.begin(), sink.flushed.end());
    if (all.size() != posted) finding("a posted write completed more or less than once");
    for (size_t i = 0; i < sink.completed.size(); ++i)
      if (sink.completed[i] != i + 1) finding("writes were acknowledged out of order");
    std::vector<bool> seen(posted + 1, false);
    for (uint64_t w : all) {
      if (w < 1 || w > posted || seen[w]) finding("a posted write completed more or less than once");
      seen[w] = true;
    }
  }
  over = true;  // a region still pinned now makes remove() call the revoker
  for (size_t i = 0; i < kRegions; ++i) regions->remove(i);
  std::weak_ptr<tcp::TcpPath> gone = path;
  path.reset();
  if (!gone.expired()) finding("the failed path is still referenced");
  ::close(peer_fd);
  for (size_t i = 0; i <= kRegions; ++i) {
    if (regions->ever_exposed[i]) continue;
    for (size_t b = 0; b < regions->size[i]; ++b)
      if (regions->memory[i][b] != kUntouched) finding("a byte landed in a region that was never exposed");
  }
  return 0;
}
