// Naming the threads maestro starts, so `top -H`, gdb and /proc/<pid>/task
// show which is which (Linux allows 15 characters).
#pragma once

#include <pthread.h>

#include <string>

namespace maestro {

inline void nameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace maestro
