// A group of engines, one per rank, in one process (the collectives' C++
// tests run the ranks as threads over four real loopback paths).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/op.h"
#include "multipath/engine.h"
#include "test_util.h"

namespace maestro {
namespace testing {

// Small chunks and segments so that modest tensors span many chunks,
// segments and scratch-slot reuses.
inline std::map<std::string, std::string> smallUnits() {
  return {{"chunk_size", "4K"}, {"segment_size", "16K"}, {"scratch_slots", "2"}, {"paths", "4"}};
}

struct World {
  explicit World(int n, std::map<std::string, std::string> opts = smallUnits()) : engines(n) {
    auto errors = runRanks(n, [&](int r) {
      engines[r] = std::make_unique<multipath::Engine>(opts, store, r, n, after(30));
    });
    for (auto& e : errors) EXPECT_EQ("", errorText(e));
  }
  MemoryRendezvous store;
  std::vector<std::unique_ptr<multipath::Engine>> engines;
};

// Empty tensors are not registered: an operation on them only handshakes.
template <typename T>
collectives::Window registered(multipath::Engine& e, std::vector<T>& v) {
  return v.empty() ? collectives::Window{} : collectives::Window{e.registerMemory(v.data(), v.size() * sizeof(T)), 0};
}

}  // namespace testing
}  // namespace maestro
