#include "transport/verbs/gid_table.h"

#include <arpa/inet.h>
#include <dirent.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace maestro {
namespace transport {
namespace verbs {
namespace {

const char* const kSysfsRoot = "/sys/class/infiniband";

using Gid = std::array<uint8_t, 16>;

// Directory entries, without "." and "..", sorted so lookups are deterministic.
std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return names;
  while (dirent* e = readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

bool readLine(const std::string& path, std::string* line) {
  std::ifstream in(path);
  // Reading the type of an unused GID slot fails with EINVAL: treat as absent.
  return static_cast<bool>(std::getline(in, *line));
}

// The GID an address maps to: IPv4 becomes the v4-mapped IPv6 address.
bool addressToGid(const std::string& ip, Gid* gid) {
  in_addr v4;
  if (inet_pton(AF_INET, ip.c_str(), &v4) == 1) {
    gid->fill(0);
    (*gid)[10] = 0xff;
    (*gid)[11] = 0xff;
    std::memcpy(gid->data() + 12, &v4, 4);
    return true;
  }
  return inet_pton(AF_INET6, ip.c_str(), gid->data()) == 1;
}

}  // namespace

std::vector<std::string> rdmaDeviceNames() { return listDir(kSysfsRoot); }

bool findRoceV2Gid(const std::string& ip, GidEntry* out) {
  Gid wanted;
  if (!addressToGid(ip, &wanted)) return false;
  for (const std::string& dev : rdmaDeviceNames()) {
    const std::string ports = std::string(kSysfsRoot) + "/" + dev + "/ports";
    for (const std::string& port : listDir(ports)) {
      const std::string base = ports + "/" + port;
      for (const std::string& idx : listDir(base + "/gids")) {
        std::string text, type;
        Gid gid;
        // sysfs prints GIDs as eight 16-bit groups, which is valid IPv6 text.
        if (!readLine(base + "/gids/" + idx, &text)) continue;
        if (inet_pton(AF_INET6, text.c_str(), gid.data()) != 1 || gid != wanted) continue;
        if (!readLine(base + "/gid_attrs/types/" + idx, &type) || type != "RoCE v2") continue;
        out->device = dev;
        out->port = std::atoi(port.c_str());
        out->index = std::atoi(idx.c_str());
        return true;
      }
    }
  }
  return false;
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
