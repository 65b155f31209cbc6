#ifndef WSYNC_TRANSPORT_FORWARDING_TRANSPORT_H_
#define WSYNC_TRANSPORT_FORWARDING_TRANSPORT_H_

// A Transport that passes every call to another one: a borrowed transport handed to an owner
// that wants a unique_ptr (the CUDA IPC backend's messenger is the session's UCX worker), and the
// base of decorators that watch or change a few calls (record sends, count bytes, refuse a memory
// kind) and must forward all the others, DiscardStaleMessages included. Thread safety: that of the
// inner transport.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/transport.h"

namespace wsync {

class ForwardingTransport : public Transport {
 public:
  // Forwards to `inner`, which must outlive this transport.
  explicit ForwardingTransport(Transport& inner) : inner_(&inner) {}
  // Forwards to `inner` and owns it.
  explicit ForwardingTransport(std::unique_ptr<Transport> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}

  int32_t process() const override { return inner_->process(); }
  std::string name() const override { return inner_->name(); }
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override {
    return inner_->RegisterMemory(address, bytes, kind);
  }
  absl::Status DeregisterMemory(RegistrationId id) override { return inner_->DeregisterMemory(id); }
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    return inner_->PostSend(peer, tag, data, bytes);
  }
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    return inner_->PostReceive(peer, tag, data, bytes);
  }
  absl::StatusOr<bool> Test(RequestId request) override { return inner_->Test(request); }
  void ProgressInFlight() override { inner_->ProgressInFlight(); }
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override {
    return inner_->WaitAll(requests, deadline);
  }
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override {
    return inner_->WaitAny(requests, deadline, finished);
  }
  bool NeedsRoundOrder() const override { return inner_->NeedsRoundOrder(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  void PeerLost(int32_t peer, const absl::Status& reason) override {
    inner_->PeerLost(peer, reason);
  }
  int64_t DiscardStaleMessages(uint64_t sync_id) override {
    return inner_->DiscardStaleMessages(sync_id);
  }

  // The transport every call goes to.
  Transport& inner() const { return *inner_; }

 private:
  std::unique_ptr<Transport> owned_;  // Null when the inner transport is borrowed.
  Transport* inner_;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_FORWARDING_TRANSPORT_H_
