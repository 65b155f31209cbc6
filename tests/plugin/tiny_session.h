#ifndef WSYNC_TESTS_PLUGIN_TINY_SESSION_H_
#define WSYNC_TESTS_PLUGIN_TINY_SESSION_H_

// One process of a qwen2.5-tiny megatron(tp=2) -> vllm(tp=2) job driven through the C++ Session,
// for tests that run all four processes as threads: the session, its layout part declared through
// the session, and its host memory. Header-only; test code.

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "integration/harness/launcher.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/session.h"

namespace wsync::test {

// A loopback port free a moment ago (the hosting trainer listens on it).
inline int FreeLoopbackPort() {
  absl::StatusOr<int> port = harness::PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

struct TinySessionProcess {
  std::unique_ptr<Session> session;
  Layout part;
  std::unique_ptr<HostBuffers> memory;
};

// The configuration of (role, rank) in the 2 + 2 job: trainer rank 0 hosts the coordinator on
// `port`, every process on node "local" over UCX shared memory, the secret in `secret_env`.
inline SessionConfig TinyJobConfig(Role role, int32_t rank, int port, const std::string& job,
                                   const std::string& secret_env) {
  SessionConfig config;
  config.role = role;
  config.rank = rank;
  config.num_trainers = 2;
  config.num_rollouts = 2;
  config.job_id = job;
  config.coordinator_port = port;
  config.host_coordinator = role == Role::kTrainer && rank == 0;
  // By value: the library removes a variable it reads from the environment, and a test process
  // makes more than one session.
  const char* secret = std::getenv(secret_env.c_str());
  config.secret = SecretSource::Value(secret != nullptr ? secret : "");
  config.node_id = "local";
  config.path_transports = "*=ucx:sm,cma,self";
  return config;
}

// Creates the session and declares the process's buffers (of memory `kind`, on `device` when
// CUDA), parameters and pieces through it.
inline TinySessionProcess MakeTinySessionProcess(const SessionConfig& config,
                                                 MemoryKind kind = MemoryKind::kHost,
                                                 int device = 0) {
  TinySessionProcess process;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(config);
  EXPECT_TRUE(session.ok()) << session.status();
  process.session = *std::move(session);
  const ModelSpec model = *GetModel("qwen2.5-tiny");
  const Layout whole =
      *BuildNamedLayout(model, config.role == Role::kTrainer ? "megatron(tp=2)" : "vllm(tp=2)");
  const int32_t rank = config.rank;
  process.part = LayoutPart(whole, rank);
  process.memory = std::make_unique<HostBuffers>(process.part, kPoison);
  for (const BufferInfo& buffer : process.part.buffers) {
    EXPECT_TRUE(process.session
                    ->RegisterBuffer(buffer.id, process.memory->data({rank, buffer.id}),
                                     buffer.bytes, kind, device)
                    .ok());
  }
  for (const ParamInfo& param : process.part.params) {
    EXPECT_TRUE(process.session->DeclareParameter(param.name, param.dtype, param.shape).ok());
  }
  for (const Piece& piece : process.part.pieces) {
    EXPECT_TRUE(process.session
                    ->DeclarePiece(process.part.params[piece.param].name, piece.buffer, piece.box,
                                   piece.offset, piece.strides)
                    .ok());
  }
  return process;
}

// Runs `call` on each of `ids` (indexes of the job's processes) in a thread of its own; the
// results by index (OK for the others).
inline std::vector<absl::Status> OnEachProcess(size_t processes, const std::vector<int>& ids,
                                               const std::function<absl::Status(int)>& call) {
  std::vector<absl::Status> results(processes);
  std::vector<std::thread> threads;
  for (int p : ids) threads.emplace_back([&, p] { results[p] = call(p); });
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Version `v` on process `p` of the 2 + 2 job (trainers first): a trainer fills its part with it,
// every process syncs it, and a rollout then checks every element of its part.
inline absl::Status SyncAndCheckTinyJob(TinySessionProcess& me, int p, int64_t v) {
  if (p < 2) WSYNC_RETURN_IF_ERROR(test::FillLogical(me.part, v, me.memory.get()));
  WSYNC_RETURN_IF_ERROR(me.session->Sync(v));
  return p >= 2 ? test::CheckLogical(me.part, *me.memory, v) : absl::OkStatus();
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_PLUGIN_TINY_SESSION_H_
