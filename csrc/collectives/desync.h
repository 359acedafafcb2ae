// Which ranks were not in an operation that timed out: the explanation a
// hang owes its user ("rank 2 never entered allreduce #9"), as torch's
// desync debugging gives it, without any cost while nothing times out.
//
// A rank whose operation timed out marks it in the group's store and waits
// a little for the marks of the others: every rank in the operation times
// out at about the same moment (it entered at about the same moment), so a
// rank whose mark does not come within the wait did not enter the
// operation -- it skipped it, or is stuck before it -- or entered it more
// than the wait after this rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rendezvous.h"

namespace maestro {
namespace collectives {

// Marks operation `seq` on `rank` and returns the ranks of 0..size-1 whose
// marks did not come within `wait`; nothing if the store cannot be reached.
std::optional<std::vector<int>> ranksAbsentFrom(Rendezvous& store, uint64_t seq, int rank, int size,
                                                Clock::duration wait);

// A sentence for the timeout's message: "rank 2 did not enter ...", "every
// rank entered it ...", or what could not be told.
std::string describeAbsent(const std::optional<std::vector<int>>& absent, int size, const std::string& op,
                           Clock::duration wait);

}  // namespace collectives
}  // namespace maestro
