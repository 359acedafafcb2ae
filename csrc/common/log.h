// Logging, NCCL-style: MAESTRO_DEBUG=WARN (default) | INFO | TRACE.
// Lines go to stderr as "maestro[<rank>] <LEVEL> message".
#pragma once

#include <string>

#include "common/error.h"

namespace maestro {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel logLevel();
void setLogLevel(LogLevel level);
LogLevel parseLogLevel(const std::string& text);  // throws on unknown names
// Rank shown in the prefix of this thread's lines (-1: none).
void setLogRank(int rank);
void logLine(LogLevel level, const std::string& line);

}  // namespace maestro

#define MAESTRO_LOG(level, ...)                                         \
  do {                                                                  \
    if (::maestro::logLevel() >= ::maestro::LogLevel::level)            \
      ::maestro::logLine(::maestro::LogLevel::level, ::maestro::strcat(__VA_ARGS__)); \
  } while (0)
#define MAESTRO_WARN(...) MAESTRO_LOG(kWarn, __VA_ARGS__)
#define MAESTRO_INFO(...) MAESTRO_LOG(kInfo, __VA_ARGS__)
#define MAESTRO_TRACE(...) MAESTRO_LOG(kTrace, __VA_ARGS__)
