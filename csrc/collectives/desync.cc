#include "collectives/desync.h"

#include <thread>

#include "common/error.h"

namespace maestro {
namespace collectives {

namespace {

std::string markKey(uint64_t seq, int rank) { return strcat("maestro/timed_out/", seq, "/", rank); }

}  // namespace

std::optional<std::vector<int>> ranksAbsentFrom(Rendezvous& store, uint64_t seq, int rank, int size,
                                                Clock::duration wait) {
  std::vector<int> absent;
  try {
    store.set(markKey(seq, rank), "1");
    for (int r = 0; r < size; ++r)
      if (r != rank) absent.push_back(r);
    const auto until = Clock::now() + wait;
    for (;;) {
      std::vector<int> still;
      std::string value;
      for (int r : absent)
        if (!store.tryGet(markKey(seq, r), &value)) still.push_back(r);
      absent.swap(still);
      if (absent.empty() || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    return std::nullopt;  // the store is gone: nothing can be told
  }
  return absent;
}

std::string describeAbsent(const std::optional<std::vector<int>>& absent, int size, const std::string& op,
                           Clock::duration wait) {
  if (!absent) return "the store could not be reached to tell which ranks entered it";
  const double seconds = std::chrono::duration<double>(wait).count();
  if (absent->empty())
    return strcat("all ", size, " ranks entered ", op, " and timed out in it: the data stopped moving between them");
  std::string list;
  for (size_t i = 0; i < absent->size(); ++i)
    list += (i == 0 ? "" : i + 1 == absent->size() ? " and " : ", ") + std::to_string((*absent)[i]);
  const bool one = absent->size() == 1;
  return strcat(one ? "rank " : "ranks ", list, " did not enter ", op, " (", one ? "it" : "they",
                " skipped it, ", one ? "is" : "are", " stuck before it, or entered it over ", seconds,
                " s after the ranks that timed out in it)");
}

}  // namespace collectives
}  // namespace maestro
