#include "tests/unit/fake_cuda_fabric.h"

#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/unit/fake_cuda_state.h"

namespace wsync::test {

FakeCudaFabric::FakeCudaFabric(int devices) : state_(std::make_shared<State>()) {
  state_->devices = devices;
}

FakeCudaFabric::~FakeCudaFabric() {
  absl::MutexLock lock(&state_->mu);
  state_->streams.clear();  // Queued items may reference memory about to go.
}

std::unique_ptr<NcclApi> FakeCudaFabric::Api() { return MakeFakeApi(state_); }

void FakeCudaFabric::AddDeviceRange(const void* memory, int64_t bytes) {
  absl::MutexLock lock(&state_->mu);
  state_->device_ranges[reinterpret_cast<uintptr_t>(memory)] = bytes;
}

int64_t FakeCudaFabric::live_allocations() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int64_t>(state_->allocations.size());
}

int64_t FakeCudaFabric::peak_allocated_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->peak;
}

void FakeCudaFabric::FailMallocAfter(int k) {
  absl::MutexLock lock(&state_->mu);
  state_->fail_malloc_after = k;
}

void FakeCudaFabric::FlipByteOfReceivedMessage(int k) {
  absl::MutexLock lock(&state_->mu);
  state_->flip_received_after = k;
}

std::vector<std::pair<int, int>> FakeCudaFabric::flipped_messages() const {
  absl::MutexLock lock(&state_->mu);
  return state_->flipped;
}

void FakeCudaFabric::set_refuses_duplicate_devices(bool refuses) {
  absl::MutexLock lock(&state_->mu);
  state_->refuses_duplicate_devices = refuses;
}

void FakeCudaFabric::FailCommunicators() {
  absl::MutexLock lock(&state_->mu);
  for (auto& [uid, clique] : state_->cliques) clique.error = "injected communicator failure";
}

int64_t FakeCudaFabric::kernel_launches() const {
  absl::MutexLock lock(&state_->mu);
  return state_->kernel_launches;
}

int64_t FakeCudaFabric::ipc_handles_made() const {
  absl::MutexLock lock(&state_->mu);
  return state_->ipc_handles_made;
}

int64_t FakeCudaFabric::ipc_opens() const {
  absl::MutexLock lock(&state_->mu);
  return state_->ipc_opens;
}

int64_t FakeCudaFabric::ipc_closes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->ipc_closes;
}

void FakeCudaFabric::set_opens_own_ipc_handles(bool opens) {
  absl::MutexLock lock(&state_->mu);
  state_->opens_own_ipc_handles = opens;
}

int FakeCudaFabric::aborts() const {
  absl::MutexLock lock(&state_->mu);
  return state_->aborts;
}

}  // namespace wsync::test
