#include "integration/simulation/simgrid/platform.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "simgrid/s4u.hpp"

namespace wsync::simgrid_backend {
namespace sg4 = simgrid::s4u;

absl::StatusOr<std::vector<sg4::Host*>> StarPlatform::Build(int32_t processes) const {
  if (!(spec_.link_bytes_per_second > 0) || !std::isfinite(spec_.link_bytes_per_second) ||
      !(spec_.link_latency_seconds >= 0) || !std::isfinite(spec_.link_latency_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "star platform: link bandwidth must be positive and latency non-negative, got ",
        spec_.link_bytes_per_second, " B/s and ", spec_.link_latency_seconds, " s"));
  }
  if (processes <= 0) return absl::InvalidArgumentError("star platform: no processes");
  sg4::NetZone* zone = sg4::create_star_zone("wsync-star");
  std::vector<sg4::Host*> hosts;
  hosts.reserve(processes);
  for (int32_t p = 0; p < processes; ++p) {
    // Actors only wait; the host's speed is never used.
    sg4::Host* host = zone->create_host(absl::StrCat("p", p), 1e9)->seal();
    sg4::Link* link =
        zone->create_split_duplex_link(absl::StrCat("link", p), spec_.link_bytes_per_second)
            ->set_latency(spec_.link_latency_seconds)
            ->seal();
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr,
                    {sg4::LinkInRoute(link, sg4::LinkInRoute::Direction::UP)}, true);
    hosts.push_back(host);
  }
  zone->seal();
  return hosts;
}

std::string StarPlatform::Describe() const {
  return absl::StrFormat("star: one link per process to one switch, %.4g GB/s each way, %.3g us",
                         spec_.link_bytes_per_second / 1e9, spec_.link_latency_seconds * 1e6);
}

}  // namespace wsync::simgrid_backend
