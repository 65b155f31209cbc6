// FP8 rollouts through the Session (the C ABI's path): a qwen2.5-tiny megatron(tp=2) -> vllm(tp=2,
// quant=...) job of four processes, each naming its layout with set_named_layout and registering
// host buffers, syncs over UCX; every FP8 weight and scale of the rollouts equals the reference
// quantizer applied to the whole bf16 tensor, and every other parameter is copied.

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "planner/job.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"
#include "tests/unit/quant_plan_support.h"

namespace wsync {
namespace {

constexpr char kModel[] = "qwen2.5-tiny";

void SyncNamed(const std::string& from, const std::string& to, const std::string& job_id) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(*GetModel(kModel), from, to);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(layouts->source, layouts->target);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->HasQuantizedParams());
  std::mt19937_64 rng(7);
  std::vector<fp8_test::Tensor> tensors;
  for (const ParamInfo& param : job->source().params) {
    const int64_t cols = param.shape.back();
    const int64_t rows = param.shape.size() >= 2 ? param.shape[param.shape.size() - 2] : 1;
    tensors.push_back(
        fp8_test::RandomTensor(rng, Volume(WholeBox(param.shape)) / (rows * cols), rows, cols));
  }
  quant_plan_test::Memory memory = quant_plan_test::AllocateMemory(*job, tensors);

  const int port = test::FreeLoopbackPort();
  std::vector<std::unique_ptr<Session>> sessions;
  for (const Role role : {Role::kTrainer, Role::kRollout}) {
    for (int32_t rank = 0; rank < 2; ++rank) {
      SessionConfig config = test::TinyJobConfig(role, rank, port, job_id, "WSYNC_QUANT_SECRET");
      config.deadline = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(config);
      ASSERT_TRUE(session.ok()) << session.status();
      const bool trainer = role == Role::kTrainer;
      const Layout part = LayoutPart(trainer ? job->source() : job->target(), rank);
      const int32_t global = trainer ? job->SourceId(rank) : job->TargetId(rank);
      for (const BufferInfo& buffer : part.buffers) {
        std::vector<uint8_t>& bytes = memory.at({global, buffer.id});
        ASSERT_TRUE(
            (*session)
                ->RegisterBuffer(buffer.id, bytes.data(), buffer.bytes, MemoryKind::kHost, 0)
                .ok());
      }
      const absl::Status named = (*session)->SetNamedLayout(kModel, trainer ? from : to);
      ASSERT_TRUE(named.ok()) << named;
      sessions.push_back(*std::move(session));
    }
  }
  std::vector<absl::Status> results(sessions.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < sessions.size(); ++p) {
    threads.emplace_back([&, p] {
      results[p] = sessions[p]->Connect();
      if (results[p].ok()) results[p] = sessions[p]->Sync(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t p = 0; p < sessions.size(); ++p)
    ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
  quant_plan_test::ExpectMatchesReference(*job, tensors, memory);
}

class QuantSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_QUANT_SECRET", "quant-session-secret-0123456789abcdef", 1);
  }
};

// Two rollout replicas: megatron(tp=2) cuts qwen2.5-tiny's 64 x 128 blocks of k, v, gate, up, o
// and down (receivers quantize those), q's are whole on a trainer (senders quantize them).
TEST_F(QuantSessionTest, BlockScaledFp8) {
  SyncNamed("megatron(tp=2)", "vllm(dp=2, quant=fp8_block)", "fp8-block");
}

TEST_F(QuantSessionTest, PerChannelFp8FromAnotherCut) {
  SyncNamed("megatron(tp=2)", "vllm(dp=2, quant=fp8_channel)", "fp8-channel");
}

}  // namespace
}  // namespace wsync
