// Shared paths: the process groups of one process send on the paths its
// default group opened, each group on a channel of its own.
//
// The transport has one completion sink: the ChannelMux. Each group's engine
// gets a ChannelTransport, the shared transport seen through the group's
// ranks, which marks what the group sends with its channel -- in the
// immediate's top bits (decomposer.h), in the control header's first
// reserved byte, in the top byte of a write's wr_id -- and the mux hands
// every completion to the engine of the channel it carries, with the peer
// renamed to that group's rank. A path's failure or return reaches every
// group that has the peer.
//
// Channel 0 is the group that owns the paths (its ranks are the transport's
// peers). Only it opens, re-opens and hunts paths; the others follow the
// state of the paths through the same completions.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "multipath/decomposer.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

// What a group's engine hears from the mux besides the transport's
// completions: the owner connected the process to `peer` (a rank of the
// group), or could not.
class ChannelSink : public transport::CompletionSink {
 public:
  virtual void onPairUp(int peer) = 0;
  virtual void onPairFailed(int peer, const std::string& why) = 0;
  // The owner is re-opening path `path` to `peer` on another route (path
  // hunting; `route`: its next core hop if known) -- drain it, and count its
  // return as a hunt -- or (moving false) gave that up.
  virtual void onPathMoving(int peer, int path, bool moving, const std::string& route) = 0;
  // Chunks this group has in flight on path `path` to `peer` (a rank of the
  // group): the owner waits for every group's before it swaps a connection.
  virtual int inflightOn(int peer, int path) = 0;
};

class ChannelMux : public transport::CompletionSink {
 public:
  // Byte of the control header that carries the channel (its first
  // reserved byte; see engine_state.h).
  static constexpr size_t kControlChannelByte = 1;

  // Channel 0 goes to `owner`, whose ranks are the transport's peers.
  explicit ChannelMux(ChannelSink* owner);
  // The transport the paths belong to; set once, before any is opened.
  void setTransport(transport::Transport* transport) { transport_ = transport; }
  transport::Transport* transport() const { return transport_; }

  // Channels no group uses (bit c: channel c), 0 excluded.
  uint32_t freeChannels() const;
  // Give `channel` to a group whose rank r is the transport's peer
  // ranks[r]. False if it is taken.
  bool attach(uint32_t channel, ChannelSink* sink, const std::vector<int>& ranks);
  // Take it back; returns once no completion is being handed to its sink.
  void detach(uint32_t channel);
  // The shared transport as a group on `channel` sees it.
  std::unique_ptr<transport::Transport> channelTransport(uint32_t channel, const std::vector<int>& ranks);

  // From the owner: the pair to transport peer `peer` is up / failed to
  // connect. To every other channel with the peer.
  void pairUp(int peer);
  void pairFailed(int peer, const std::string& why);
  // The owner is re-opening a path to transport peer `peer` (or gave up).
  void pathMoving(int peer, int path, bool moving, const std::string& route);
  // Chunks the groups on the paths (channel 0, the owner, excluded) have in
  // flight on path `path` to transport peer `peer`.
  int inflight(int peer, int path);

  // CompletionSink (from the transport)
  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override;
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override;
  bool landedAlready(int peer, uint32_t imm) override;
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override;
  void onPathError(int peer, int path, const std::string& what) override;
  void onPathFenced(int peer, int path, uint64_t mark) override;
  void onPathUp(int peer, int path) override;
  void onWriteWithdrawn(int peer, int path, uint64_t wr_id) override;

 private:
  struct Channel {
    std::atomic<ChannelSink*> sink{nullptr};
    std::atomic<int> delivering{0};  // completions being handed to sink now
    std::vector<int> group_rank;     // transport peer -> rank in the group (-1: not a member); set before sink
  };
  // Hand one completion to `channel`'s sink as `fn(sink, group rank)`;
  // nothing if the channel is free or `peer` is not in its group.
  template <typename Fn>
  void deliver(uint32_t channel, int peer, Fn&& fn);

  transport::Transport* transport_ = nullptr;
  mutable std::mutex mu_;  // attach / detach
  std::array<Channel, kMaxChannels> channels_;
};

// The top byte of a wr_id carries the channel: engines use the address of
// a chunk descriptor, whose top byte is zero in user space.
constexpr int kWrIdChannelShift = 56;

}  // namespace multipath
}  // namespace maestro
