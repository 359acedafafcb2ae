// The one clock of maestro: monotonic, and the deadlines every blocking wait
// takes.
#pragma once

#include <chrono>

namespace maestro {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

}  // namespace maestro
