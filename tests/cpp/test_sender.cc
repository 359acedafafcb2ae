// The sender alone (multipath/sender.h): where its chunks go, what moves
// when a path fails, what a failed peer or operation leaves behind -- with
// links of the test's own in place of the engine and the transport, on one
// thread, without a network or a clock to wait on.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "multipath/reassembler.h"
#include "multipath/sender.h"

namespace maestro {
namespace multipath {
namespace {

constexpr int kPeer = 1;
constexpr uint64_t kChunk = 1000;

// The engine's side, as the test sets it: which paths are usable, what was
// posted, which peer was given up.
class Links : public SenderLinks {
 public:
  struct Post {
    int path;
    transport::WriteRequest req;
  };
  bool linked_ = true;
  std::vector<bool> usable_;
  std::vector<Post> posts;
  std::vector<std::string> given_up;
  Sender* sender = nullptr;

  bool linked(int) const override { return linked_; }
  bool usable(int, int path) const override { return usable_[path]; }
  double rtt(int, int) const override { return 0; }
  void postWrite(int peer, int path, const transport::WriteRequest& req) override {
    EXPECT_EQ(kPeer, peer);
    posts.push_back({path, req});
  }
  void noPath(int peer, const std::string& why) override {  // as the engine does: the peer fails
    given_up.push_back(why);
    sender->fail(peer, why);
  }
};

class SenderTest : public ::testing::Test {
 protected:
  void make(const std::string& policy, int window, int paths, size_t samples = 64) {
    auto links = std::make_unique<Links>();
    links_ = links.get();
    links_->usable_.assign(paths, true);
    const Config config = Config::resolve({{"policy", policy}, {"window", std::to_string(window)}});
    sender_ = std::make_unique<Sender>(config, std::vector<Chunking>(2, chunking_), std::move(links), samples);
    links_->sender = sender_.get();
    sender_->install(kPeer, paths, Clock::now());
  }
  std::shared_ptr<SendOp> write(uint64_t length, uint32_t tag = 5, int window = 0, Cut cut = Cut::kDefault) {
    Region src;
    src.id = 1;
    src.addr = buffer_.data();
    src.length = buffer_.size();
    RemoteRegion dst{7, 9, 0, buffer_.size()};
    auto op = sender_->message(kPeer, src, 0, dst, 0, length, tag, window, cut);
    if (!op->done()) sender_->send(op);
    return op;
  }
  ChunkDesc* chunk(size_t post) { return reinterpret_cast<ChunkDesc*>(links_->posts[post].req.wr_id); }
  uint32_t index(size_t post) { return immChunk(links_->posts[post].req.imm); }
  int path(size_t post) { return links_->posts[post].path; }
  // The post's write completed (ok) or was flushed, as the engine hands it
  // over; true: its message is finished.
  bool complete(size_t post, bool ok = true) {
    ChunkDesc* c = chunk(post);
    const Sender::Completed done = sender_->completed(kPeer, c, ok);
    EXPECT_EQ(path(post), done.path);
    return sender_->settle(kPeer, c, done.path, ok);
  }
  // Completes every post from `from` on, those it leads to included.
  void drain(size_t from) {
    for (size_t i = from; i < links_->posts.size(); ++i) complete(i);
  }
  std::vector<int> paths(size_t from = 0) {
    std::vector<int> out;
    for (size_t i = from; i < links_->posts.size(); ++i) out.push_back(path(i));
    return out;
  }
  std::vector<uint32_t> indices(size_t from = 0) {
    std::vector<uint32_t> out;
    for (size_t i = from; i < links_->posts.size(); ++i) out.push_back(index(i));
    return out;
  }
  PathStats stats(int p) {
    PathStats st;
    sender_->stats(kPeer, p, &st);
    return st;
  }

  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(1 << 16);
  Chunking chunking_ = Chunking(kChunk);  // make() hands it to the sender
  Links* links_ = nullptr;
  std::unique_ptr<Sender> sender_;
};

// A message with a window of its own (the exchange's): a path takes its
// chunks only while it holds fewer than that many, of any message, and
// takes the next as each completes; the path's window still bounds the rest.
TEST_F(SenderTest, AMessagesOwnWindowBoundsWhatAPathHoldsOfIt) {
  for (const std::string policy : {"round_robin", "adaptive"}) {
    SCOPED_TRACE(policy);
    make(policy, 8, 3);
    auto op = write(30 * kChunk, 5, /*window=*/2);
    EXPECT_EQ(6u, links_->posts.size()) << "two chunks a path";
    for (int p = 0; p < 3; ++p) EXPECT_EQ(2, sender_->inflight(kPeer, p));
    // Each completion lets its path take one more of it.
    EXPECT_FALSE(complete(0));
    EXPECT_EQ(7u, links_->posts.size());
    EXPECT_EQ(path(0), path(6));
    drain(1);
    EXPECT_TRUE(op->done());
    EXPECT_EQ(30u, links_->posts.size()) << "every chunk once";
    // A message of the path's window beside one of 2: the path fills to 8.
    links_->posts.clear();
    auto narrow = write(6 * kChunk, 6, 2), wide = write(40 * kChunk, 7);
    int most = 0;
    for (int p = 0; p < 3; ++p) most = std::max(most, sender_->inflight(kPeer, p));
    EXPECT_EQ(8, most);
    drain(0);
    EXPECT_TRUE(narrow->done() && wide->done());
  }
}

// A message cut fine (the exchange's, to another host) goes in chunks of the
// smallest size, a whole one in whole chunks; a receiver told the same cut
// takes each posted chunk as new and completes the message on the last.
TEST_F(SenderTest, AFineCutMessageGoesInTheSmallestChunksTheReceiverExpects) {
  chunking_ = Chunking(kChunk, kChunk / 4, 3);
  make("round_robin", 64, 3);
  for (Cut cut : {Cut::kDefault, Cut::kFine}) {
    SCOPED_TRACE(cut == Cut::kFine ? "fine" : "whole");
    links_->posts.clear();
    const uint64_t length = 10 * kChunk + 70, piece = cut == Cut::kFine ? kChunk / 4 : kChunk;
    auto op = write(length, 5, 0, cut);
    ASSERT_EQ((length + piece - 1) / piece, links_->posts.size());
    Reassembler receiver(chunking_);
    receiver.expect(5, length, nullptr, cut);
    std::vector<transport::WriteRequest> reqs;
    for (const auto& post : links_->posts) reqs.push_back(post.req);
    for (size_t i = 0; i < reqs.size(); ++i) {  // in the order posted
      ChunkSpan span;
      std::shared_ptr<ChunkHook> hook;
      std::string err;
      ASSERT_EQ(Reassembler::Landed::kNew, receiver.land(5, immChunk(reqs[i].imm), reqs[i].length, &span, &hook, &err))
          << err;
      EXPECT_EQ(reqs[i].remote_offset, span.offset);
      EXPECT_EQ(i + 1 == reqs.size(), receiver.processed(5));
    }
    std::sort(reqs.begin(), reqs.end(), [](const auto& a, const auto& b) { return a.remote_offset < b.remote_offset; });
    uint64_t at = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {  // in the message's order: every byte once
      EXPECT_EQ(i + 1 < reqs.size() ? piece : length % piece, reqs[i].length) << i;
      EXPECT_EQ(at, reqs[i].remote_offset) << i;
      at += reqs[i].length;
    }
    EXPECT_EQ(length, at);
    drain(0);
    EXPECT_TRUE(op->done());
  }
  // A chunking with no smaller chunk (one host, verbs) cuts it whole.
  EXPECT_EQ(kChunk, messageChunkSize(10 * kChunk, cutWith(Chunking(kChunk), Cut::kFine)));
}

TEST_F(SenderTest, PlacesChunksInTurnWithinEachPathsWindow) {
  make("round_robin", 2, 3);
  auto op = write(8 * kChunk, 5);
  // Chunk i goes to path i mod 3; each path posts two, the rest wait on it.
  EXPECT_EQ((std::vector<int>{0, 0, 1, 1, 2, 2}), paths());
  EXPECT_EQ((std::vector<uint32_t>{0, 3, 1, 4, 2, 5}), indices());
  for (size_t i = 0; i < links_->posts.size(); ++i) {
    const transport::WriteRequest& req = links_->posts[i].req;
    EXPECT_EQ(encodeImm(5, index(i)), req.imm);
    EXPECT_TRUE(req.with_imm);
    EXPECT_EQ(kChunk, req.length);
    EXPECT_EQ(index(i) * kChunk, req.remote_offset);
    EXPECT_EQ(buffer_.data() + index(i) * kChunk, req.src);
    EXPECT_EQ(7u, req.remote.id);
  }
  for (int p = 0; p < 3; ++p) EXPECT_EQ(2, sender_->inflight(kPeer, p));
  // A completion frees room on its path, which posts what waits there.
  EXPECT_FALSE(complete(0));
  EXPECT_EQ((std::vector<int>{0}), paths(6));
  EXPECT_EQ(6u, index(6));
  EXPECT_EQ(2, sender_->inflight(kPeer, 0));
  drain(1);
  EXPECT_TRUE(op->done());
  EXPECT_FALSE(op->failed());
  EXPECT_FALSE(sender_->sending(kPeer));
  EXPECT_EQ(8u, links_->posts.size());
  EXPECT_EQ(3 * kChunk, stats(0).bytes_sent);
  EXPECT_EQ(3u, stats(1).chunks_sent);
  EXPECT_EQ(2u, stats(2).chunks_sent);
  EXPECT_EQ(0u, stats(0).resent);
  EXPECT_EQ(0, sender_->inflight(kPeer, 0));
}

TEST_F(SenderTest, AnEmptyMessageIsDoneWithoutAChunk) {
  make("round_robin", 2, 2);
  auto op = write(0);
  EXPECT_TRUE(op->done());
  EXPECT_TRUE(links_->posts.empty());
  EXPECT_FALSE(sender_->sending(kPeer));
}

TEST_F(SenderTest, ChunksWaitForThePairsPathsThenArePlaced) {
  make("round_robin", 2, 2);
  links_->linked_ = false;
  auto op = write(3 * kChunk);
  EXPECT_TRUE(links_->posts.empty());
  EXPECT_TRUE(sender_->waiting(kPeer));
  sender_->pumpAll(kPeer);  // not linked: nothing moves
  EXPECT_TRUE(links_->posts.empty());
  links_->linked_ = true;
  sender_->placeWaiting(kPeer);
  EXPECT_FALSE(sender_->waiting(kPeer));
  EXPECT_EQ((std::vector<int>{0, 0, 1}), paths());
  drain(0);
  EXPECT_TRUE(op->done());
}

TEST_F(SenderTest, AFailedPathsChunksMoveToItsSiblings) {
  make("round_robin", 1, 3);
  auto op = write(6 * kChunk);
  EXPECT_EQ((std::vector<int>{0, 1, 2}), paths());
  // Path 1 goes down: the chunk queued on it moves to a live path ...
  links_->usable_[1] = false;
  sender_->requeue(kPeer, 1);
  EXPECT_EQ(3u, links_->posts.size());  // every live path's window is full
  // ... and so does the one in flight once its flush comes back.
  EXPECT_FALSE(complete(1, /*ok=*/false));
  EXPECT_EQ(0, sender_->inflight(kPeer, 1));
  EXPECT_EQ(1u, stats(1).resent);
  EXPECT_EQ(0u, stats(1).chunks_sent);
  complete(0);
  complete(2);
  drain(3);
  EXPECT_TRUE(op->done());
  EXPECT_FALSE(op->failed());
  // Nothing went to path 1 after its first chunk: its queued chunk (4) and
  // its flushed one (1) went to paths 0 and 2, in the order they moved.
  EXPECT_EQ((std::vector<int>{0, 2, 0, 2}), paths(3));
  EXPECT_EQ((std::vector<uint32_t>{3, 5, 4, 1}), indices(3));
  EXPECT_EQ(6u, stats(0).chunks_sent + stats(2).chunks_sent);
}

TEST_F(SenderTest, AFlushFromAReplacedConnectionDoesNotCountOnTheNewOne) {
  make("round_robin", 2, 2);
  auto op = write(2 * kChunk);
  EXPECT_EQ((std::vector<int>{0, 1}), paths());
  // Path 0 reconnects: what the old connection held is not in flight on the new one.
  sender_->pathUp(kPeer, 0, /*new_route=*/false, Clock::now());
  EXPECT_EQ(0, sender_->inflight(kPeer, 0));
  // Its late flush is not counted there, and the chunk is sent again.
  ChunkDesc* c = chunk(0);
  const Sender::Completed done = sender_->completed(kPeer, c, false);
  EXPECT_FALSE(done.current);
  EXPECT_EQ(0, sender_->inflight(kPeer, 0));
  EXPECT_FALSE(sender_->settle(kPeer, c, done.path, false));
  ASSERT_EQ(3u, links_->posts.size());
  EXPECT_EQ(0u, index(2));
  EXPECT_EQ(1, sender_->inflight(kPeer, path(2)));
  drain(1);
  EXPECT_TRUE(op->done());
  EXPECT_EQ(0, sender_->inflight(kPeer, 0));
  EXPECT_EQ(0, sender_->inflight(kPeer, 1));
}

TEST_F(SenderTest, AWithdrawnChunkIsSentAgainOnAnotherPath) {
  make("round_robin", 4, 2);
  auto op = write(2 * kChunk);
  EXPECT_EQ((std::vector<int>{0, 1}), paths());
  links_->usable_[0] = false;  // set aside (a fence withdraws what it held)
  EXPECT_FALSE(sender_->withdrawn(kPeer, chunk(0)));
  EXPECT_EQ(0, sender_->inflight(kPeer, 0));
  EXPECT_EQ(1u, stats(0).resent);
  ASSERT_EQ(3u, links_->posts.size());
  EXPECT_EQ(1, path(2));
  EXPECT_EQ(0u, index(2));
  drain(1);
  EXPECT_TRUE(op->done());
}

TEST_F(SenderTest, AFailedPeerKeepsOnlyTheMessagesWithChunksPosted) {
  make("round_robin", 1, 1);
  auto op = write(3 * kChunk);
  EXPECT_EQ(1u, links_->posts.size());
  sender_->fail(kPeer, "rank 1 is gone");
  EXPECT_TRUE(op->failed());
  EXPECT_EQ("rank 1 is gone", op->error());
  EXPECT_TRUE(sender_->sending(kPeer));  // its flush completion points at it
  // The flush finishes it; nothing is sent again.
  EXPECT_TRUE(complete(0, /*ok=*/false));
  EXPECT_FALSE(sender_->sending(kPeer));
  EXPECT_EQ(1u, links_->posts.size());
  EXPECT_EQ(0u, stats(0).resent);
}

TEST_F(SenderTest, ACancelledOperationsChunksAreDroppedAndTheOthersGoOn) {
  make("round_robin", 1, 1);
  auto a = write(2 * kChunk, 1u << kEpochShift);  // operation of epoch 1
  auto b = write(2 * kChunk, 2u << kEpochShift);  // epoch 2
  EXPECT_EQ(1u, links_->posts.size());
  EXPECT_FALSE(sender_->cancel(kPeer, 3, "nothing of it"));
  EXPECT_TRUE(sender_->cancel(kPeer, 1, "operation #5 failed"));
  EXPECT_TRUE(a->failed());
  EXPECT_FALSE(b->failed());
  EXPECT_EQ(1u, sender_->posted(kPeer, 1));
  EXPECT_EQ(0u, sender_->posted(kPeer, 2));
  EXPECT_EQ((std::vector<int>{0}), sender_->holding(kPeer, 1));
  EXPECT_TRUE(sender_->holding(kPeer, 2).empty());
  // Its posted chunk completes: it is forgotten, and the other's chunks follow.
  EXPECT_TRUE(complete(0));
  EXPECT_EQ(0u, sender_->posted(kPeer, 1));
  drain(1);
  EXPECT_EQ((std::vector<uint32_t>{0, 0, 1}), indices());
  EXPECT_TRUE(b->done());
  EXPECT_FALSE(a->done());
  EXPECT_FALSE(sender_->sending(kPeer));
}

TEST_F(SenderTest, NoUsablePathGivesThePeerUp) {
  make("round_robin", 2, 2);
  links_->usable_.assign(2, false);
  auto op = write(2 * kChunk);
  EXPECT_TRUE(links_->posts.empty());
  ASSERT_FALSE(links_->given_up.empty());
  EXPECT_EQ("no path to rank 1 is up", links_->given_up[0]);
  EXPECT_TRUE(op->failed());
  EXPECT_FALSE(sender_->sending(kPeer));
}

// The caller may let its message go while a chunk of it is still posted
// (a failed operation's thread returns first). A flush then gives the peer
// up when no path is left to place the chunk on: fail() forgets the
// message, and the completion still reads it -- it must be held to the end
// (ASan's build sees a use after free otherwise).
TEST_F(SenderTest, AFlushThatGivesThePeerUpOutlivesAMessageItsCallerLetGo) {
  make("round_robin", 2, 1);
  write(kChunk);  // the caller's reference goes at once
  ASSERT_EQ(1u, links_->posts.size());
  links_->usable_.assign(1, false);  // the path went down: nowhere to place the chunk again
  EXPECT_TRUE(complete(0, false));
  ASSERT_EQ(1u, links_->given_up.size());
  EXPECT_FALSE(sender_->sending(kPeer));
}

// The same, for the engine's order: the completion is counted, then the
// engine takes the path down and gives the peer up, then it is settled.
TEST_F(SenderTest, APeerGivenUpBetweenCompletionAndSettleKeepsTheMessage) {
  make("round_robin", 2, 1);
  write(kChunk);
  ChunkDesc* c = chunk(0);
  const Sender::Completed done = sender_->completed(kPeer, c, false);
  sender_->fail(kPeer, "rank 1: every path is down");  // as pathDown() does
  EXPECT_TRUE(sender_->settle(kPeer, c, done.path, false));
  EXPECT_FALSE(sender_->sending(kPeer));
}

// A withdrawn chunk that cannot be placed again: the same.
TEST_F(SenderTest, AWithdrawnChunkThatGivesThePeerUpOutlivesItsMessage) {
  make("round_robin", 2, 1);
  write(kChunk);
  links_->usable_.assign(1, false);
  EXPECT_TRUE(sender_->withdrawn(kPeer, chunk(0)));
  EXPECT_FALSE(sender_->sending(kPeer));
}

TEST_F(SenderTest, SharedChunksArePulledByThePathsWithRoom) {
  make("adaptive", 1, 2);
  auto op = write(4 * kChunk);
  // One chunk per path's window; the rest wait in the shared queue.
  EXPECT_EQ(2u, links_->posts.size());
  const std::vector<int> first = paths();
  EXPECT_EQ((std::set<int>{0, 1}), std::set<int>(first.begin(), first.end()));
  EXPECT_TRUE(sender_->waiting(kPeer));
  // A completion lets its own path pull the next.
  complete(0);
  ASSERT_EQ(3u, links_->posts.size());
  EXPECT_EQ(path(0), path(2));
  drain(1);
  EXPECT_TRUE(op->done());
  EXPECT_FALSE(sender_->waiting(kPeer));
}

TEST_F(SenderTest, KeepsTheLatestChunkTimes) {
  make("round_robin", 8, 1, /*samples=*/4);
  write(6 * kChunk);
  drain(0);
  EXPECT_EQ(4u, sender_->chunkTimes(false).size());
  EXPECT_EQ(4u, sender_->chunkTimes(true).size());
  EXPECT_TRUE(sender_->chunkTimes(false).empty());
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
