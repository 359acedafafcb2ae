// The key-value store ranks meet through at start-up (the c10d Store in
// production, an in-process map in the C++ tests).
#pragma once

#include <string>

#include "common/clock.h"

namespace maestro {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; throws maestro::Error at the deadline.
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  // Non-blocking: the value if the key exists.
  virtual bool tryGet(const std::string& key, std::string* value) = 0;
  // Remove a key (a secret nobody needs any more). Where a store cannot
  // delete, its value is blanked.
  virtual void erase(const std::string& key) { set(key, ""); }
};

}  // namespace maestro
