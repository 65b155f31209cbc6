#ifndef WSYNC_PLUGIN_TRANSPORT_SETUP_H_
#define WSYNC_PLUGIN_TRANSPORT_SETUP_H_

// The data-path transports of one process, in two steps around the rendezvous: before it, one UCX
// worker per distinct transport choice of the process's path configuration and the address bundle
// to publish; after it, once the job (and so every peer's path class) is known, the routed
// transport that carries each peer's messages over the choice for its path class. Used by the
// session and by test workers that drive the same steps by hand. Not thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/job.h"
#include "transport/selector/selector.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {

class PathTransportSetup {
 public:
  // Starts the UCX workers. InvalidArgument for a backend other than ucx.
  static absl::StatusOr<PathTransportSetup> Create(int32_t process, PathTransports paths);

  // What this process publishes at rendezvous (an AddressBundle, one address per choice).
  const std::string& address_bundle() const { return bundle_; }

  // Routes every peer by its path class, connects each worker to its peers from their published
  // bundles (indexed by global process id) and returns the routed transport. The setup is spent.
  // InvalidArgument when a peer published a bundle of another configuration.
  absl::StatusOr<std::unique_ptr<RoutedTransport>> Connect(
      const Job& job, const std::vector<std::string>& bundles) &&;
  // The same with each peer's path class from `path_class(this process, peer)`, for callers that
  // have no Job (the link calibration).
  absl::StatusOr<std::unique_ptr<RoutedTransport>> Connect(
      const std::function<std::string(int32_t, int32_t)>& path_class,
      const std::vector<std::string>& bundles) &&;

  // Points a transport made by Connect at the peers' current bundles (a replacement process took
  // a rank and published new addresses): each UCX worker reconnects to the peers whose address
  // changed or whose endpoint failed and keeps the others. InvalidArgument for a bundle of another
  // configuration.
  static absl::Status Reconnect(RoutedTransport& transport,
                                const std::vector<std::string>& bundles);

 private:
  int32_t process_ = 0;
  PathTransports paths_;
  std::vector<TransportChoice> choices_;
  std::vector<std::unique_ptr<UcxTransport>> backends_;
  std::string bundle_;
};

}  // namespace wsync

#endif  // WSYNC_PLUGIN_TRANSPORT_SETUP_H_
