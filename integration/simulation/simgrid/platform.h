#ifndef WSYNC_INTEGRATION_SIMULATION_SIMGRID_PLATFORM_H_
#define WSYNC_INTEGRATION_SIMULATION_SIMGRID_PLATFORM_H_

// The simulated machines a job runs on: one SimGrid host per process and the links between them,
// built in code inside a running engine. StarPlatform is the first topology (a link per host to
// one switch); a cluster topology (GPUs and NICs per node, NVLink inside a node, a fat tree
// between nodes) is another Platform, built from a cluster file, with the same Build contract.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace simgrid::s4u {
class Host;
}  // namespace simgrid::s4u

namespace wsync::simgrid_backend {

class Platform {
 public:
  virtual ~Platform() = default;
  // Creates the hosts and links of `processes` processes in the engine that is alive on this
  // thread (before it runs) and returns the host of each process, by global process id.
  // InvalidArgument for a description it cannot build.
  virtual absl::StatusOr<std::vector<simgrid::s4u::Host*>> Build(int32_t processes) const = 0;
  // One line for reports: "star: 1 link per host, 50 GB/s, 10 us".
  virtual std::string Describe() const = 0;
};

// Every process on a host of its own with one full-duplex link to a single switch: a message from
// p to q crosses p's link up and q's link down, so its time is bytes / bandwidth plus twice the
// latency when alone, and each host's sends (receives) share its link's bandwidth up (down).
// Nothing else is shared: the switch has no limit.
struct StarPlatformSpec {
  double link_bytes_per_second = 0;  // Each direction.
  double link_latency_seconds = 0;   // Per link: a route has two.
};

class StarPlatform final : public Platform {
 public:
  explicit StarPlatform(const StarPlatformSpec& spec) : spec_(spec) {}
  absl::StatusOr<std::vector<simgrid::s4u::Host*>> Build(int32_t processes) const override;
  std::string Describe() const override;
  const StarPlatformSpec& spec() const { return spec_; }

 private:
  StarPlatformSpec spec_;
};

}  // namespace wsync::simgrid_backend

#endif  // WSYNC_INTEGRATION_SIMULATION_SIMGRID_PLATFORM_H_
