#include "common/process_identity.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace wsync {
namespace {

uint64_t ComputePidNamespace() {
  struct stat ns {};
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (stat("/proc/self/ns/pid", &ns) != 0 || !std::getline(boot, boot_id) || boot_id.empty()) {
    return 0;
  }
  const std::string identity = absl::StrCat(boot_id, "/", ns.st_ino);
  const uint64_t id = Xxh3(identity.data(), identity.size());
  return id == 0 ? 1 : id;
}

}  // namespace

uint64_t OwnPidNamespace() {
  static const uint64_t id = ComputePidNamespace();
  return id;
}

}  // namespace wsync
