#include "plugin/transport_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transport/selector/addresses.pb.h"

namespace wsync {

absl::StatusOr<PathTransportSetup> PathTransportSetup::Create(int32_t process,
                                                              PathTransports paths) {
  PathTransportSetup setup;
  setup.process_ = process;
  setup.paths_ = std::move(paths);
  setup.choices_ = setup.paths_.Distinct();
  proto::AddressBundle bundle;
  for (const TransportChoice& choice : setup.choices_) {
    if (choice.backend != "ucx") {
      return absl::InvalidArgumentError(
          absl::StrCat("backend '", choice.backend, "' cannot carry host weights here"));
    }
    UcxOptions options;
    options.process = process;
    options.transports = choice.transports;
    options.net_devices = choice.net_devices;
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> ucx, UcxTransport::Create(options));
    bundle.add_addresses(ucx->WorkerAddress());
    setup.backends_.push_back(std::move(ucx));
  }
  setup.bundle_ = bundle.SerializeAsString();
  return setup;
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> PathTransportSetup::Connect(
    const Job& job, const std::vector<std::string>& bundles) && {
  return std::move(*this).Connect(
      [&job](int32_t from, int32_t to) { return std::string(job.PathClass(from, to)); }, bundles);
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> PathTransportSetup::Connect(
    const std::function<std::string(int32_t, int32_t)>& path_class,
    const std::vector<std::string>& bundles) && {
  const int32_t processes = static_cast<int32_t>(bundles.size());
  std::vector<int32_t> route(processes);
  std::vector<std::vector<std::string>> peers_of(choices_.size(),
                                                 std::vector<std::string>(processes));
  for (int32_t p = 0; p < processes; ++p) {
    proto::AddressBundle bundle;
    if (!bundle.ParseFromString(bundles[p]) ||
        bundle.addresses_size() != static_cast<int>(choices_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", p, " uses another path transport configuration than process ", process_));
    }
    const TransportChoice& choice = paths_.For(path_class(process_, p));
    route[p] = static_cast<int32_t>(std::find(choices_.begin(), choices_.end(), choice) -
                                    choices_.begin());
    peers_of[route[p]][p] = bundle.addresses(route[p]);
  }
  std::vector<std::unique_ptr<Transport>> routed;
  for (size_t b = 0; b < backends_.size(); ++b) {
    WSYNC_RETURN_IF_ERROR(backends_[b]->ConnectPeers(peers_of[b]));
    routed.push_back(std::move(backends_[b]));
  }
  return RoutedTransport::Create(process_, std::move(routed), std::move(route));
}

absl::Status PathTransportSetup::Reconnect(RoutedTransport& transport,
                                           const std::vector<std::string>& bundles) {
  const int32_t processes = static_cast<int32_t>(bundles.size());
  for (int32_t b = 0; transport.backend(b) != nullptr; ++b) {
    auto* ucx = dynamic_cast<UcxTransport*>(transport.backend(b));
    if (ucx == nullptr) continue;
    std::vector<std::string> addresses(processes);
    for (int32_t p = 0; p < processes; ++p) {
      if (transport.RouteOf(p) != b) continue;
      proto::AddressBundle bundle;
      if (!bundle.ParseFromString(bundles[p]) || bundle.addresses_size() <= b) {
        return absl::InvalidArgumentError(
            absl::StrCat("process ", p, " uses another path transport configuration than process ",
                         transport.process()));
      }
      addresses[p] = bundle.addresses(b);
    }
    WSYNC_RETURN_IF_ERROR(ucx->ConnectPeers(addresses));
  }
  return absl::OkStatus();
}

}  // namespace wsync
