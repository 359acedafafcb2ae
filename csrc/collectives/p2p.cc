#include "collectives/p2p.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/decomposer.h"

namespace maestro {
namespace collectives {
namespace {

using multipath::ControlType;

// GRANT payload (and an eager message's ACCEPT: a GRANT of no pieces);
// the engine tags of the pieces follow (uint32 each), then ReleasedWire,
// then, with kLendsSlots, SlotsWire.
struct GrantWire {
  uint32_t status;  // kGranted, kSizeMismatch, kTooLarge, kEagerTaken
  uint32_t pieces;
  uint32_t region_id;
  uint32_t flags;   // kLendsSlots
  uint64_t key;
  uint64_t addr;
  uint64_t length;
  uint64_t base;
  uint64_t piece_bytes;
  uint64_t recv_bytes;  // the receiver's buffer
};
static_assert(sizeof(GrantWire) == 64, "GrantWire is a wire format");
constexpr int kSlots = PointToPoint::kEagerSlots;
// The uses of each slot the receiver lends the sender that it gave back.
struct ReleasedWire {
  uint64_t released[kSlots];
};
static_assert(sizeof(ReleasedWire) == 8 * kSlots, "ReleasedWire is a wire format");
// The slots themselves: kSlots slots of slot_bytes, one engine tag each.
struct SlotsWire {
  uint32_t region_id;
  uint32_t slots;
  uint64_t key;
  uint64_t addr;
  uint64_t length;
  uint64_t slot_bytes;
  uint32_t tags[kSlots];
};
static_assert(sizeof(SlotsWire) == 40 + 4 * kSlots, "SlotsWire is a wire format");
// An eager READY's payload (a rendezvous READY carries `bytes` only).
struct EagerReadyWire {
  uint64_t bytes;
  uint32_t slot;
  uint32_t reserved;
  uint64_t use;  // the slot's use this is: one more than the uses given back
};
static_assert(sizeof(EagerReadyWire) == 24, "EagerReadyWire is a wire format");
constexpr uint32_t kGranted = 0, kSizeMismatch = 1, kTooLarge = 2, kEagerTaken = 3;
constexpr uint32_t kLendsSlots = 1;
constexpr uint32_t kDoneOk = 0, kDoneCancelled = 1;
constexpr size_t kMaxPieces =
    (transport::kMaxControlBytes - 16 - sizeof(GrantWire) - sizeof(ReleasedWire) - sizeof(SlotsWire)) /
    sizeof(uint32_t);

std::exception_ptr error(const std::string& what) { return std::make_exception_ptr(Error(what)); }

std::string peerName(int peer) { return peer < 0 ? std::string("any rank") : strcat("rank ", peer); }

}  // namespace

struct PointToPoint::Send {
  Send(int peer_, uint32_t tag_, const Window& buffer_, uint64_t bytes_, Deadline deadline_, Done done_)
      : peer(peer_), tag(tag_), buffer(buffer_), bytes(bytes_), deadline(deadline_), done(std::move(done_)) {}
  int peer;
  uint32_t tag;
  Window buffer;
  uint64_t bytes;
  Deadline deadline;
  Done done;
  uint64_t seq = 0;
  bool granted = false;
  bool finished = false;
  std::vector<std::shared_ptr<multipath::SendOp>> writes;
  int slot = -1;          // eager: the borrowed slot written
  bool accepted = false;  // eager: the receiver's ACCEPT came (accept_error: it refused)
  std::exception_ptr accept_error;
};

struct PointToPoint::Recv {
  int peer;  // -1: any source
  uint32_t tag;
  Window buffer;
  uint64_t bytes;
  Deadline deadline;
  Done done;
  bool finished = false;
};

struct PointToPoint::Matched {
  std::shared_ptr<Recv> recv;
  int peer = -1;
  uint64_t seq = 0;
  std::vector<uint32_t> tags;
  std::vector<std::shared_ptr<multipath::RecvOp>> ops;
  bool exposed = false;
  bool sender_done = false;  // DONE arrived: the tags may be reused once ours are released
  int slot = -1;             // eager: the lent slot the data is in (tags: its tag)
};

int PointToPoint::Borrowing::freeSlot() const {
  for (size_t i = 0; i < tags.size(); ++i)
    if (uses[i] == released[i]) return static_cast<int>(i);
  return -1;
}

PointToPoint::PointToPoint(multipath::Engine& engine, uint64_t max_piece_bytes)
    : engine_(engine),
      n_(engine.size()),
      max_piece_bytes_(max_piece_bytes),
      next_send_seq_(n_, 1),
      sends_(n_),
      cancelled_(n_),
      next_ready_(n_, 1),
      early_ready_(n_),
      matched_(n_),
      want_tags_(n_),
      free_tags_(n_),
      awaiting_(n_, 0),
      eager_bytes_(engine.config().eager_size / 64 * 64),
      lending_(n_),
      told_slots_(n_, 0),
      eager_refused_(n_, 0),
      borrowing_(n_) {
  for (int p = 0; p < n_; ++p) {
    if (p == engine.rank()) continue;
    // Handed out from the back, taken back at the front: a freed tag is the
    // last to be reused.
    for (uint32_t t = multipath::kP2PTagBase; t < multipath::kUsedTags; ++t) free_tags_[p].push_back(t);
  }
}

PointToPoint::~PointToPoint() { stop("the process group was shut down"); }

uint64_t PointToPoint::pieceBytes() const {
  const uint64_t most = static_cast<uint64_t>(multipath::kMaxChunksPerMessage) * engine_.config().chunk_size;
  return max_piece_bytes_ ? std::min(max_piece_bytes_, most) : most;
}

void PointToPoint::ensureThread() {
  if (thread_.joinable()) return;
  const int rank = engine_.rank();
  thread_ = startNamedThread("maestro-p2p", [this, rank] {
    setLogRank(rank);
    loop();
  });
}

void PointToPoint::send(int peer, uint32_t tag, const Window& buffer, uint64_t bytes, Deadline deadline, Done done) {
  MAESTRO_CHECK(peer >= 0 && peer < n_, "send: destination rank ", peer, " is not a rank of this group of ", n_);
  MAESTRO_CHECK(peer != engine_.rank(), "send: destination rank ", peer, " is this rank; a rank cannot send to itself");
  auto s = std::make_shared<Send>(peer, tag, buffer, bytes, deadline, std::move(done));
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_, "send: ", stop_why_);
    ensureThread();
    new_sends_.push_back(std::move(s));
  }
  engine_.connect(peer);  // in the background, if this is the pair's first message
  engine_.wake();
}

void PointToPoint::recv(int peer, uint32_t tag, const Window& buffer, uint64_t bytes, Deadline deadline, Done done) {
  MAESTRO_CHECK(peer >= -1 && peer < n_, "recv: source rank ", peer, " is not a rank of this group of ", n_);
  MAESTRO_CHECK(peer != engine_.rank(), "recv: source rank ", peer, " is this rank; a rank cannot receive from itself");
  MAESTRO_CHECK(n_ > 1 || peer >= 0, "recv from any source in a group of one rank: no other rank can send");
  auto r = std::make_shared<Recv>(Recv{peer, tag, buffer, bytes, deadline, std::move(done)});
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_, "recv: ", stop_why_);
    ensureThread();
    new_recvs_.push_back(std::move(r));
  }
  // The lower rank of a pair opens its paths, so a receiver asks too: from
  // any source, every rank (their sends cannot reach it otherwise).
  for (int p = 0; p < n_; ++p)
    if (p != engine_.rank() && (peer < 0 || p == peer)) engine_.connect(p);
  engine_.wake();
}

void PointToPoint::control(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* body, size_t length) {
  engine_.sendControl(peer, type, seq, sub, body, length);
}

// ---------------------------------------------------------------- the thread

void PointToPoint::loop() {
  struct Release {  // the thread ends: it waits on no one any more
    PointToPoint& p2p;
    ~Release() {
      for (int p = 0; p < p2p.n_; ++p)
        if (p2p.awaiting_[p]) p2p.engine_.awaiting(p, -1);
    }
  } release{*this};
  for (;;) {
    const uint64_t seen = engine_.eventCount();
    std::vector<std::shared_ptr<Send>> sends;
    std::vector<std::shared_ptr<Recv>> recvs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      sends.swap(new_sends_);
      recvs.swap(new_recvs_);
    }
    // Sends and recvs posted together (batch_isend_irecv) go out in the
    // order each kind was posted; the two kinds never wait on each other.
    for (auto& s : sends) {
      s->seq = next_send_seq_[s->peer]++;
      sends_[s->peer][s->seq] = s;
      try {
        if (!sendEager(*s)) control(s->peer, ControlType::kP2PReady, s->seq, s->tag, &s->bytes, sizeof s->bytes);
      } catch (const Error& e) {
        finish(s, error(strcat("maestro send to rank ", s->peer, " (tag ", s->tag, "): ", e.what())));
      }
    }
    for (auto& r : recvs) {
      auto it = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const Ready& u) {
        return (r->peer < 0 || r->peer == u.peer) && r->tag == u.tag;
      });
      if (it == unexpected_.end()) {
        posted_.push_back(r);
        continue;
      }
      Ready ready = *it;
      unexpected_.erase(it);
      match(r, ready);
    }
    // A peer is marked unreachable only after all it sent before it left has
    // been delivered: one found unreachable now has nothing more to come
    // for what this round looks at. One marked later (its last write landing
    // meanwhile) is judged next round, which its mark wakes.
    std::vector<char> waits(n_, 0);
    for (const auto& r : posted_) {
      if (r->peer >= 0) waits[r->peer] = 1;
      else waits.assign(n_, 1);
    }
    std::vector<std::string> lost(n_);
    for (int p = 0; p < n_; ++p) {
      // A send waiting for its GRANT or a recv for its READY waits on the
      // peer's word: the engine fails a peer silent past peer_timeout.
      const char awaited = p != engine_.rank() && (waits[p] || !sends_[p].empty());
      if (awaited != awaiting_[p]) engine_.awaiting(p, awaited ? +1 : -1);
      awaiting_[p] = awaited;
      if (p == engine_.rank() || !(waits[p] || !sends_[p].empty() || !matched_[p].empty())) continue;
      try {
        engine_.checkPeer(p);
      } catch (const Error& e) {
        lost[p] = e.what();
      }
    }
    std::vector<multipath::P2PMessage> messages;
    engine_.takeP2P(&messages);
    for (auto& m : messages) handle(m);
    progress(lost);

    // Sleep until something happens or the nearest deadline.
    Deadline wake = Clock::now() + std::chrono::milliseconds(200);
    for (const auto& peer : sends_)
      for (const auto& kv : peer)
        if (!kv.second->granted) wake = std::min(wake, kv.second->deadline);
    for (const auto& r : posted_) wake = std::min(wake, r->deadline);
    for (const auto& peer : matched_)
      for (const auto& kv : peer)
        if (!kv.second->recv->finished) wake = std::min(wake, kv.second->recv->deadline);
    engine_.waitEvent(seen, wake);
  }
}

void PointToPoint::handle(multipath::P2PMessage& m) {
  switch (m.type) {
    case ControlType::kP2PReady: {
      uint64_t bytes = 0;
      if (m.body.size() == sizeof bytes) {
        std::memcpy(&bytes, m.body.data(), sizeof bytes);
        onReady(Ready{m.peer, m.seq, m.sub, bytes});
        return;
      }
      if (m.seq < next_ready_[m.peer]) return;  // a copy of one already taken (its slot may be in use again)
      EagerReadyWire w{};
      const Lending& lent = lending_[m.peer];
      if (m.body.size() == sizeof w) std::memcpy(&w, m.body.data(), sizeof w);
      if (m.body.size() != sizeof w || !lent.lent() || w.slot >= static_cast<uint32_t>(kSlots) || w.bytes == 0 ||
          w.bytes > eager_bytes_ || w.use != lent.released[w.slot] + 1) {
        MAESTRO_WARN("malformed point-to-point READY from rank ", m.peer, " ignored");
        return;
      }
      onReady(Ready{m.peer, m.seq, m.sub, w.bytes, static_cast<int>(w.slot)});
      return;
    }
    case ControlType::kP2PGrant: onGrant(m); return;
    case ControlType::kP2PDone: onDone(m); return;
    default: return;
  }
}

void PointToPoint::onReady(const Ready& r) {
  const int p = r.peer;
  if (r.seq < next_ready_[p]) return;  // a copy of one already taken
  if (r.seq > next_ready_[p]) {        // an earlier one is still on its way (re-sent after a failover)
    early_ready_[p].emplace(r.seq, r);
    return;
  }
  std::vector<Ready> now{r};
  ++next_ready_[p];
  for (auto it = early_ready_[p].begin(); it != early_ready_[p].end() && it->first == next_ready_[p];) {
    now.push_back(it->second);
    ++next_ready_[p];
    it = early_ready_[p].erase(it);
  }
  for (const Ready& ready : now) {
    if (ready.slot >= 0) lending_[p].busy[ready.slot] = 1;
    auto it = std::find_if(posted_.begin(), posted_.end(), [&](const std::shared_ptr<Recv>& x) {
      return (x->peer < 0 || x->peer == ready.peer) && x->tag == ready.tag;
    });
    if (it == posted_.end()) {
      unexpected_.push_back(ready);
      continue;
    }
    auto recv = *it;
    posted_.erase(it);
    match(recv, ready);
  }
}

void PointToPoint::match(std::shared_ptr<Recv> r, const Ready& ready) {
  const int p = ready.peer;
  GrantWire g{};
  g.recv_bytes = r->bytes;
  g.piece_bytes = pieceBytes();
  const uint64_t pieces = ready.bytes == 0 ? 0 : (ready.bytes + g.piece_bytes - 1) / g.piece_bytes;
  std::string refused;
  if (ready.bytes != r->bytes) {
    g.status = kSizeMismatch;
    refused = strcat("maestro recv from ", peerName(r->peer), " (tag ", r->tag, "): its buffer has ", r->bytes,
                     " bytes but the message rank ", p, " sent has ", ready.bytes, " bytes");
  } else if (pieces > kMaxPieces) {
    g.status = kTooLarge;
    refused = strcat("maestro recv from rank ", p, " (tag ", r->tag, "): a message of ", ready.bytes,
                     " bytes needs ", pieces, " pieces of ", g.piece_bytes, " bytes; at most ", kMaxPieces,
                     " (raise MAESTRO_CHUNK_SIZE)");
  }
  // The source is known from here on (a recv from any source reports it).
  r->peer = p;
  if (ready.slot >= 0) {  // eager: the data is (or will be) in the lent slot
    auto m = std::make_shared<Matched>();
    m->recv = r;
    m->peer = p;
    m->seq = ready.seq;
    m->slot = ready.slot;
    m->tags = {lending_[p].tags[ready.slot]};
    matched_[p][ready.seq] = m;  // until the sender's DONE gives the slot back
    try {
      if (refused.empty()) {
        m->ops.push_back(engine_.expect(p, m->tags[0], ready.bytes));
        // Taken: the sender hears it while the data lands (its send ends
        // once its write is acknowledged too); progress() copies it out.
        g.status = kEagerTaken;
        grantTo(p, ready.seq, &g, {});
        return;
      }
      grantTo(p, ready.seq, &g, {});
    } catch (const Error& e) {
      if (refused.empty()) refused = strcat("maestro recv from rank ", p, " (tag ", r->tag, "): ", e.what());
    }
    finish(r, error(refused));
    return;
  }
  if (!refused.empty() || pieces == 0) {  // refused, or empty: no data moves
    try {
      grantTo(p, ready.seq, &g, {});
    } catch (const Error& e) {
      if (refused.empty()) refused = strcat("maestro recv from rank ", p, " (tag ", r->tag, "): ", e.what());
    }
    finish(r, refused.empty() ? nullptr : error(refused));
    return;
  }
  auto m = std::make_shared<Matched>();
  m->recv = r;
  m->peer = p;
  m->seq = ready.seq;
  m->tags.resize(pieces);
  matched_[p][ready.seq] = m;
  if (free_tags_[p].size() < pieces) {
    want_tags_[p].push_back(m);  // flow control: a DONE frees some
    return;
  }
  grant(*m);
}

void PointToPoint::grant(Matched& m) {
  const int p = m.peer;
  Recv& r = *m.recv;
  for (auto& t : m.tags) {
    t = free_tags_[p].back();
    free_tags_[p].pop_back();
  }
  GrantWire g{};
  g.status = kGranted;
  g.pieces = static_cast<uint32_t>(m.tags.size());
  g.piece_bytes = pieceBytes();
  g.recv_bytes = r.bytes;
  try {
    const uint64_t key = engine_.expose(r.buffer.region);
    m.exposed = true;
    g.region_id = r.buffer.region.id;
    g.key = key;
    g.addr = reinterpret_cast<uint64_t>(r.buffer.region.addr);
    g.length = r.buffer.region.length;
    g.base = r.buffer.base;
    for (size_t i = 0; i < m.tags.size(); ++i) {
      const uint64_t off = i * g.piece_bytes;
      m.ops.push_back(engine_.expect(p, m.tags[i], std::min(g.piece_bytes, r.bytes - off)));
    }
    try {
      lend(p);  // the pair's first GRANT lends the sender its eager slots
    } catch (const Error& e) {  // its messages go by rendezvous
      MAESTRO_WARN("point to point: no eager slots for rank ", p, ": ", e.what());
      eager_refused_[p] = 1;
    }
    grantTo(p, m.seq, &g, m.tags);
  } catch (const Error& e) {
    finish(m.recv, error(strcat("maestro recv from rank ", p, " (tag ", r.tag, "): ", e.what())));
  }
}

void PointToPoint::lend(int peer) {
  Lending& l = lending_[peer];
  if (eager_bytes_ == 0 || l.lent() || eager_refused_[peer] ||
      free_tags_[peer].size() < static_cast<size_t>(kSlots))
    return;
  const uint64_t bytes = eager_bytes_ * kSlots;
  auto memory = std::make_unique<uint8_t[]>(bytes);
  Region region = engine_.registerMemory(memory.get(), bytes);
  try {
    l.key = engine_.expose(region);
  } catch (...) {
    engine_.deregisterMemory(region);
    throw;
  }
  l.memory = std::move(memory);
  l.region = region;
  for (int i = 0; i < kSlots; ++i) {
    l.tags.push_back(free_tags_[peer].back());
    free_tags_[peer].pop_back();
  }
  l.released.assign(kSlots, 0);
  l.busy.assign(kSlots, 0);
}

void PointToPoint::releaseSlot(int peer, int slot) {
  Lending& l = lending_[peer];
  engine_.recycleTag(peer, l.tags[slot]);
  l.busy[slot] = 0;
  ++l.released[slot];  // told with the next GRANT or ACCEPT to the peer
}

void PointToPoint::grantTo(int peer, uint64_t seq, const void* grant, const std::vector<uint32_t>& tags) {
  GrantWire g;
  std::memcpy(&g, grant, sizeof g);
  const Lending& l = lending_[peer];
  const bool tell = l.lent() && !told_slots_[peer];
  if (tell) g.flags |= kLendsSlots;
  std::vector<uint8_t> body(sizeof g + tags.size() * sizeof(uint32_t) + sizeof(ReleasedWire) +
                            (tell ? sizeof(SlotsWire) : 0));
  uint8_t* at = body.data();
  std::memcpy(at, &g, sizeof g);
  at += sizeof g;
  if (!tags.empty()) std::memcpy(at, tags.data(), tags.size() * sizeof(uint32_t));
  at += tags.size() * sizeof(uint32_t);
  ReleasedWire released{};
  for (int i = 0; i < kSlots && l.lent(); ++i) released.released[i] = l.released[i];
  std::memcpy(at, &released, sizeof released);
  at += sizeof released;
  if (tell) {
    SlotsWire w{};
    w.region_id = l.region.id;
    w.slots = kSlots;
    w.key = l.key;
    w.addr = reinterpret_cast<uint64_t>(l.region.addr);
    w.length = l.region.length;
    w.slot_bytes = eager_bytes_;
    for (int i = 0; i < kSlots; ++i) w.tags[i] = l.tags[i];
    std::memcpy(at, &w, sizeof w);
  }
  control(peer, ControlType::kP2PGrant, seq, 0, body.data(), body.size());
  if (tell) told_slots_[peer] = 1;
}

void PointToPoint::readLending(int peer, const uint8_t* trailer, size_t length) {
  Borrowing& b = borrowing_[peer];
  ReleasedWire released;
  std::memcpy(&released, trailer, sizeof released);
  if (length == sizeof released + sizeof(SlotsWire) && b.tags.empty()) {
    SlotsWire w;
    std::memcpy(&w, trailer + sizeof released, sizeof w);
    bool ok = w.slots == static_cast<uint32_t>(kSlots) && w.slot_bytes > 0 && w.slot_bytes % 64 == 0 &&
              w.length >= w.slot_bytes * kSlots;
    for (int i = 0; i < kSlots; ++i) ok = ok && multipath::isP2PTag(w.tags[i]);
    if (!ok) {
      MAESTRO_WARN("malformed eager slots from rank ", peer, " ignored: its messages go by rendezvous");
    } else {
      b.region = RemoteRegion{w.region_id, w.key, w.addr, w.length};
      b.slot_bytes = w.slot_bytes;
      b.tags.assign(w.tags, w.tags + kSlots);
      b.uses.assign(kSlots, 0);
      b.released.assign(kSlots, 0);
    }
  }
  // A count only grows: a re-sent copy of an older GRANT gives nothing back twice.
  for (size_t i = 0; i < b.tags.size(); ++i)
    b.released[i] = std::max(b.released[i], std::min(released.released[i], b.uses[i]));
}

bool PointToPoint::sendEager(Send& s) {
  Borrowing& b = borrowing_[s.peer];
  if (b.tags.empty() || s.bytes == 0 || s.bytes > b.slot_bytes) return false;
  const int slot = b.freeSlot();
  if (slot < 0) return false;
  const uint64_t use = ++b.uses[slot];
  s.slot = slot;
  s.writes.push_back(engine_.write(s.peer, s.buffer.region, s.buffer.base, b.region, slot * b.slot_bytes, s.bytes,
                                   b.tags[slot]));
  EagerReadyWire w{s.bytes, static_cast<uint32_t>(slot), 0, use};
  control(s.peer, ControlType::kP2PReady, s.seq, s.tag, &w, sizeof w);
  eager_sent_.fetch_add(1);
  return true;
}

void PointToPoint::onGrant(multipath::P2PMessage& msg) {
  const int p = msg.peer;
  // Whatever it answers, a well-formed GRANT says which lent slots are free.
  GrantWire g{};
  bool well_formed = msg.body.size() >= sizeof g;
  if (well_formed) {
    std::memcpy(&g, msg.body.data(), sizeof g);
    const size_t tags_end = sizeof g + static_cast<size_t>(g.pieces) * sizeof(uint32_t);
    well_formed = g.pieces <= kMaxPieces &&
                  msg.body.size() == tags_end + sizeof(ReleasedWire) + (g.flags & kLendsSlots ? sizeof(SlotsWire) : 0);
    if (well_formed) readLending(p, msg.body.data() + tags_end, msg.body.size() - tags_end);
  }
  auto it = sends_[p].find(msg.seq);
  if (it == sends_[p].end()) {
    // A send that gave up before this GRANT: tell the receiver, which
    // would otherwise wait for the data. (Else: a copy of a GRANT for a
    // send already done, or the ACCEPT of an eager one that gave up and
    // said so.)
    if (cancelled_[p].erase(msg.seq)) {
      uint32_t status = kDoneCancelled;
      try {
        control(p, ControlType::kP2PDone, msg.seq, 0, &status, sizeof status);
      } catch (const Error&) {
      }
    }
    return;
  }
  auto s = it->second;
  if (s->granted || s->accepted) return;  // a copy
  const std::string what = strcat("maestro send to rank ", p, " (tag ", s->tag, ", ", s->bytes, " bytes)");
  if (!well_formed) {
    finish(s, error(strcat(what, ": malformed GRANT from rank ", p)));
    return;
  }
  if (g.status == kSizeMismatch) {
    auto refused = error(strcat(what, ": the matching recv on rank ", p, " has a buffer of ", g.recv_bytes,
                                " bytes; sizes must agree"));
    if (s->slot < 0) {
      finish(s, refused);
      return;
    }
    s->accepted = true;  // eager: finished once its write is over (progress)
    s->accept_error = refused;
    return;
  }
  if (s->slot >= 0) {
    if (g.status != kEagerTaken || g.pieces != 0 || g.recv_bytes != s->bytes) {
      finish(s, error(strcat(what, ": malformed ACCEPT from rank ", p)));
      return;
    }
    s->accepted = true;
    return;
  }
  if (g.status == kTooLarge) {
    finish(s, error(strcat(what, ": rank ", p, " cannot take a message this large (raise MAESTRO_CHUNK_SIZE)")));
    return;
  }
  const uint64_t pieces = s->bytes == 0 || g.piece_bytes == 0 ? 0 : (s->bytes + g.piece_bytes - 1) / g.piece_bytes;
  if (g.status != kGranted || g.pieces != pieces || g.recv_bytes != s->bytes) {
    finish(s, error(strcat(what, ": malformed GRANT from rank ", p)));
    return;
  }
  s->granted = true;
  if (pieces == 0) {
    finish(s, nullptr);
    return;
  }
  const RemoteRegion dst{g.region_id, g.key, g.addr, g.length};
  try {
    for (uint64_t i = 0; i < pieces; ++i) {
      uint32_t tag;
      std::memcpy(&tag, msg.body.data() + sizeof g + i * sizeof tag, sizeof tag);
      MAESTRO_CHECK(multipath::isP2PTag(tag), "rank ", p, " granted tag ", tag, ", not a point-to-point tag");
      const uint64_t off = i * g.piece_bytes;
      const uint64_t len = std::min(g.piece_bytes, s->bytes - off);
      s->writes.push_back(
          engine_.write(p, s->buffer.region, s->buffer.base + off, dst, g.base + off, len, tag));
    }
  } catch (const Error& e) {
    finish(s, error(strcat(what, ": ", e.what())));
  }
}

void PointToPoint::onDone(const multipath::P2PMessage& msg) {
  const int p = msg.peer;
  uint32_t status = kDoneOk;
  if (msg.body.size() == sizeof status) std::memcpy(&status, msg.body.data(), sizeof status);
  auto it = matched_[p].find(msg.seq);
  if (it == matched_[p].end()) {
    // An eager message no recv took, whose sender gave up: its slot is free.
    auto u = std::find_if(unexpected_.begin(), unexpected_.end(),
                          [&](const Ready& r) { return r.peer == p && r.seq == msg.seq && r.slot >= 0; });
    if (status == kDoneCancelled && u != unexpected_.end()) {
      const int slot = u->slot;
      unexpected_.erase(u);
      releaseSlot(p, slot);
    }
    return;  // else a copy
  }
  auto m = it->second;
  if (status == kDoneCancelled && !m->recv->finished)
    finish(m->recv, error(strcat("maestro recv from rank ", p, " (tag ", m->recv->tag, "): rank ", p,
                                 " gave up its send (it timed out before this recv matched it)")));
  m->sender_done = true;
  if (m->recv->finished) {
    matched_[p].erase(it);
    over(p, *m);
  }
}

void PointToPoint::freeTags(int peer, const std::vector<uint32_t>& tags) {
  for (uint32_t t : tags) {
    engine_.recycleTag(peer, t);
    free_tags_[peer].insert(free_tags_[peer].begin(), t);
  }
  auto& want = want_tags_[peer];
  while (!want.empty()) {
    auto m = want.front();
    if (m->recv->finished) {
      want.pop_front();
      matched_[peer].erase(m->seq);
      continue;
    }
    if (free_tags_[peer].size() < m->tags.size()) break;
    want.pop_front();
    grant(*m);
  }
}

void PointToPoint::over(int peer, const Matched& m) {
  if (m.slot >= 0) releaseSlot(peer, m.slot);
  else freeTags(peer, m.ops.empty() ? std::vector<uint32_t>{} : m.tags);
}

void PointToPoint::copyOut(const Matched& m) {
  Recv& r = *m.recv;
  const Lending& l = lending_[m.peer];
  if (r.bytes) std::memcpy(static_cast<uint8_t*>(r.buffer.region.addr) + r.buffer.base,
                           l.memory.get() + static_cast<uint64_t>(m.slot) * eager_bytes_, r.bytes);
}

void PointToPoint::finish(std::shared_ptr<Send> s, std::exception_ptr err) {
  if (s->finished) return;
  s->finished = true;
  sends_[s->peer].erase(s->seq);
  // A rendezvous send that gave up answers a later GRANT with DONE(cancelled);
  // an eager one said so already.
  if (err && !s->granted && s->slot < 0) cancelled_[s->peer].insert(s->seq);
  try {
    s->done(err, s->peer);
  } catch (...) {
  }
  s->done = nullptr;
}

void PointToPoint::finish(std::shared_ptr<Recv> r, std::exception_ptr err) {
  if (r->finished) return;
  r->finished = true;
  // A matched recv stops being written before its buffer goes back.
  if (r->peer >= 0) {
    auto& mine = matched_[r->peer];
    for (auto& kv : mine) {
      Matched& m = *kv.second;
      if (m.recv != r) continue;
      for (auto& op : m.ops) engine_.release(op);
      if (m.exposed) engine_.conceal(r->buffer.region);
      m.exposed = false;
      break;
    }
  }
  try {
    r->done(err, r->peer);
  } catch (...) {
  }
  r->done = nullptr;
}

void PointToPoint::progress(const std::vector<std::string>& lost) {
  const auto now = Clock::now();
  std::string interrupted;
  const bool stop_all = engine_.interrupted(&interrupted);
  auto peerError = [&](int peer, std::string* why) {
    if (lost[peer].empty()) return false;
    *why = lost[peer];
    return true;
  };

  for (int p = 0; p < n_; ++p) {
    std::vector<std::shared_ptr<Send>> sends;
    for (auto& kv : sends_[p]) sends.push_back(kv.second);
    for (auto& s : sends) {
      const std::string what = strcat("maestro send to rank ", p, " (tag ", s->tag, ", ", s->bytes, " bytes)");
      std::string why;
      bool written = true;  // every write acknowledged (none read the buffer any more)
      for (auto& w : s->writes) {
        if (w->failed()) {
          why = w->error();
          break;
        }
        written = written && w->done();
      }
      auto done = [&](uint32_t status) {
        try {
          control(p, ControlType::kP2PDone, s->seq, 0, &status, sizeof status);
        } catch (const Error&) {  // the receiver has the data; only its tags (or slot) stay taken
        }
      };
      if (stop_all) {
        finish(s, error(strcat(what, ": ", interrupted)));
      } else if (!why.empty()) {
        finish(s, error(strcat(what, ": ", why)));
      } else if (s->granted || (s->slot >= 0 && s->accepted)) {
        if (written) {
          done(kDoneOk);
          finish(s, s->accept_error);
        }
      } else if (peerError(p, &why)) {
        finish(s, error(strcat(what, ": ", why)));
      } else if (now >= s->deadline && (s->slot < 0 || written)) {  // eager: once its write is over
        if (s->slot >= 0) done(kDoneCancelled);  // the receiver drops it unless a recv took it
        finish(s, std::make_exception_ptr(TimeoutError(
                      strcat(what, " timed out: rank ", p, " did not post a matching recv"))));
      }
    }

    std::vector<std::shared_ptr<Matched>> matched;
    for (auto& kv : matched_[p]) matched.push_back(kv.second);
    for (auto& m : matched) {
      Recv& r = *m->recv;
      if (r.finished) continue;
      const std::string what = strcat("maestro recv from rank ", p, " (tag ", r.tag, ", ", r.bytes, " bytes)");
      std::string why;
      bool all = !m->ops.empty();
      for (auto& op : m->ops) all = all && op->done();
      if (all) {
        if (m->slot >= 0) copyOut(*m);
        finish(m->recv, nullptr);
        if (m->sender_done) {
          matched_[p].erase(m->seq);
          over(p, *m);
        }
      } else if (stop_all) {
        finish(m->recv, error(strcat(what, ": ", interrupted)));
      } else if (peerError(p, &why)) {
        finish(m->recv, error(strcat(what, ": ", why)));
      } else if (now >= r.deadline) {
        finish(m->recv, std::make_exception_ptr(TimeoutError(strcat(
                            what, " timed out ", m->ops.empty() ? "waiting for free tags" : "while the data arrived"))));
      }
    }
  }

  for (auto it = posted_.begin(); it != posted_.end();) {
    auto r = *it;
    const std::string what = strcat("maestro recv from ", peerName(r->peer), " (tag ", r->tag, ", ", r->bytes, " bytes)");
    std::string why;
    bool dead = false;
    if (r->peer >= 0) {
      dead = peerError(r->peer, &why);
    } else {
      dead = true;
      for (int p = 0; p < n_ && dead; ++p) dead = p == engine_.rank() || peerError(p, &why);
    }
    if (stop_all) {
      finish(r, error(strcat(what, ": ", interrupted)));
    } else if (dead) {
      finish(r, error(strcat(what, ": ", why)));
    } else if (now >= r->deadline) {
      finish(r, std::make_exception_ptr(
                    TimeoutError(strcat(what, " timed out: no matching send from ", peerName(r->peer), " arrived"))));
    } else {
      ++it;
      continue;
    }
    it = posted_.erase(it);
  }
}

void PointToPoint::stop(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_why_ = why;
  }
  engine_.wake();
  if (thread_.joinable()) thread_.join();
  // The thread is gone: its state is ours. Writes already posted read the
  // senders' buffers until they complete or fail (a stuck path is closed
  // after the path timeout): wait for them before handing the buffers back.
  const auto grace = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                        engine_.config().path_timeout * 1000) + 1000);
  for (;;) {
    const uint64_t seen = engine_.eventCount();
    bool posted = false;
    for (auto& peer : sends_)
      for (auto& kv : peer)
        for (auto& w : kv.second->writes) posted = posted || (!w->done() && !w->failed());
    if (!posted || Clock::now() >= grace) break;
    engine_.waitEvent(seen, std::min<Deadline>(grace, Clock::now() + std::chrono::milliseconds(50)));
  }
  const std::string what = strcat("maestro: ", why);
  for (auto& s : new_sends_) s->done(error(what), s->peer);
  for (auto& r : new_recvs_) r->done(error(what), r->peer);
  new_sends_.clear();
  new_recvs_.clear();
  for (int p = 0; p < n_; ++p) {
    std::vector<std::shared_ptr<Send>> sends;
    for (auto& kv : sends_[p]) sends.push_back(kv.second);
    for (auto& s : sends) finish(s, error(what));
    std::vector<std::shared_ptr<Matched>> matched;
    for (auto& kv : matched_[p]) matched.push_back(kv.second);
    for (auto& m : matched) finish(m->recv, error(what));
  }
  for (auto& r : posted_) finish(r, error(what));
  posted_.clear();
  // The slots lent for eager messages: nothing lands in them any more.
  for (auto& l : lending_) {
    if (!l.lent()) continue;
    try {
      engine_.conceal(l.region);
      engine_.deregisterMemory(l.region);
    } catch (const std::exception& e) {
      MAESTRO_WARN("point to point: giving back the eager slots: ", e.what());
    }
    l.region = Region{};
  }
}

}  // namespace collectives
}  // namespace maestro
