#include "transport/tcp/same_host.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>

#include "common/error.h"
#include "common/net.h"
#include "common/random.h"

namespace maestro {
namespace transport {
namespace tcp {
namespace same_host {
namespace {

struct Cookie {
  uint8_t bytes[16];
  Cookie() {
    for (size_t i = 0; i < sizeof bytes; i += 8) {
      uint64_t r = randomU64();
      std::memcpy(bytes + i, &r, 8);
    }
  }
};

const Cookie& cookie() {
  static const Cookie c;  // lives as long as the process: peers read it
  return c;
}

// The inode of a process's network namespace (0 if it cannot be read).
ino_t netNamespace(const std::string& proc) {
  struct stat st {};
  return ::stat((proc + "/ns/net").c_str(), &st) == 0 ? st.st_ino : 0;
}

// Read `length` bytes at `src` in process `pid` into `dst`, whole or not at
// all (the kernel may stop short at a page it cannot read).
bool readWhole(uint64_t pid, uint64_t src, void* dst, size_t length, std::string* why) {
  size_t done = 0;
  while (done < length) {
    iovec local{static_cast<uint8_t*>(dst) + done, length - done};
    iovec remote{reinterpret_cast<void*>(src + done), length - done};
    ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = n < 0 ? net::errnoText(errno) : "the peer's memory ended early";
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::atomic<uint64_t>* newLivenessWord() {
  static std::mutex mu;
  static std::deque<std::atomic<uint64_t>>* words = new std::deque<std::atomic<uint64_t>>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  words->emplace_back(1);
  return &words->back();
}

Offer makeOffer(const std::atomic<uint64_t>* alive) {
  Offer o;
  o.pid = static_cast<uint64_t>(::getpid());
  o.cookie_addr = reinterpret_cast<uint64_t>(cookie().bytes);
  o.alive_addr = reinterpret_cast<uint64_t>(alive);
  std::memcpy(o.cookie, cookie().bytes, sizeof o.cookie);
  return o;
}

std::string verify(const Offer& offer) {
  uint8_t seen[sizeof offer.cookie];
  std::string why;
  if (offer.pid == 0 || offer.pid > static_cast<uint64_t>(INT32_MAX)) return strcat("pid ", offer.pid, " is not a pid");
  if (!readWhole(offer.pid, offer.cookie_addr, seen, sizeof seen, &why))
    return strcat("cannot read the memory of pid ", offer.pid, " (", why,
                  "): another host or pid namespace, another user, or Yama's ptrace_scope forbids it");
  if (std::memcmp(seen, offer.cookie, sizeof seen) != 0)
    return strcat("pid ", offer.pid, " on this host is not the peer (another host or pid namespace)");
  ino_t ours = netNamespace("/proc/self");
  ino_t theirs = netNamespace(strcat("/proc/", offer.pid));
  if (ours == 0 || theirs == 0) return "cannot compare the peer's network namespace with ours";
  if (ours != theirs) return "the peer runs in another network namespace: its paths cross that network";
  return "";
}

Read read(const Offer& peer, uint64_t src, void* dst, size_t length, std::string* why) {
  uint64_t alive = 0;
  if (!readWhole(peer.pid, peer.alive_addr, &alive, sizeof alive, why)) return Read::kFailed;
  if (alive != 1) return Read::kSenderGone;
  return readWhole(peer.pid, src, dst, length, why) ? Read::kCopied : Read::kFailed;
}

}  // namespace same_host
}  // namespace tcp
}  // namespace transport
}  // namespace maestro
