// FP8 target parameters declared through the C ABI (declare_fp8_parameter) of libwsync.so, loaded
// with dlopen as an engine loads it (the test links nothing of wsync but the reference quantizer,
// which needs Abseil, a library libwsync.so shares with its host):
//   - a job of two trainers and two rollouts (four sessions of one process, on threads) syncs bf16
//     trainer shards into FP8 rollout parameters of the three schemes (block 128 x 128 with the
//     trainers' TP cut inside a block, per channel, per tensor of an expert tensor split by EP)
//     and an unquantized norm; every FP8 byte and scale equals the reference quantizer
//     (integration/fill/fp8_reference.h) over the whole bf16 tensor, bit for bit;
//   - rollouts that declare one parameter quantized differently fail connect everywhere with
//     WSYNC_LAYOUT_REFUSED naming the parameter;
//   - each bad declaration is refused with WSYNC_INVALID_ARGUMENT and a message saying why.

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "integration/fill/fp8_reference.h"
#include "wsync/wsync.h"

namespace {

using Dims = std::vector<int64_t>;

constexpr char kSecretEnv[] = "WSYNC_FP8_ABI_TEST_SECRET";
constexpr int64_t kWhole = INT64_MAX;  // A block over the whole axis.

const wsync_plugin_v1_t* Api() {
  static const wsync_plugin_v1_t* api = [] {
    void* library = dlopen(WSYNC_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return static_cast<const wsync_plugin_v1_t*>(nullptr);
    return static_cast<const wsync_plugin_v1_t*>(dlsym(library, "wsyncPlugin_v1"));
  }();
  return api;
}

int64_t Volume(const Dims& dims) {
  int64_t volume = 1;
  for (int64_t d : dims) volume *= d;
  return volume;
}

// One logical parameter of the job: its trainers' bf16 values and, quantized, its scheme.
struct Param {
  std::string name;
  Dims shape;              // [rows, cols] or [experts, rows, cols].
  int32_t scheme = 0;      // 0: stays bf16.
  int64_t block_rows = 0;  // Reference blocks (kWhole: the whole axis).
  int64_t block_cols = 0;
  std::string scale_name;
  Dims scale_shape;
  std::vector<uint16_t> bf16;  // Row-major over shape.
};

// One piece of a process: box [origin, origin + extent) of `param` (its scale tensor when
// `scale`) in a buffer of its own, row-major.
struct PieceSpec {
  int param = 0;
  bool scale = false;
  Dims origin;
  Dims extent;
};

Dims RowMajorStrides(const Dims& extent) {
  Dims strides(extent.size(), 1);
  for (int a = static_cast<int>(extent.size()) - 2; a >= 0; --a) {
    strides[a] = strides[a + 1] * extent[a + 1];
  }
  return strides;
}

// Calls `fn(index into the box, index into the whole tensor)` for every element of the box.
void ForEachElement(const Dims& shape, const Dims& origin, const Dims& extent,
                    const std::function<void(int64_t, int64_t)>& fn) {
  const Dims whole_strides = RowMajorStrides(shape);
  const int64_t count = Volume(extent);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i;
    int64_t global = 0;
    for (int a = static_cast<int>(extent.size()) - 1; a >= 0; --a) {
      global += (origin[a] + rest % extent[a]) * whole_strides[a];
      rest /= extent[a];
    }
    fn(i, global);
  }
}

std::vector<Param> JobParams(uint64_t seed) {
  std::vector<Param> params = {
      {"model.layers.0.mlp.down_proj.weight",
       {200, 300},
       WSYNC_QUANT_FP8_BLOCK,
       128,
       128,
       "model.layers.0.mlp.down_proj.weight_scale_inv",
       {2, 3},
       {}},
      {"model.layers.0.self_attn.o_proj.weight",
       {96, 80},
       WSYNC_QUANT_FP8_CHANNEL,
       1,
       kWhole,
       "model.layers.0.self_attn.o_proj.weight_scale",
       {96, 1},
       {}},
      {"model.layers.0.mlp.experts.w2_weight",
       {4, 64, 96},
       WSYNC_QUANT_FP8_TENSOR,
       kWhole,
       kWhole,
       "model.layers.0.mlp.experts.w2_weight_scale",
       {4, 1, 1},
       {}},
      {"model.norm.weight", {80}, 0, 0, 0, "", {}, {}},
  };
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
  for (Param& param : params) {
    param.bf16.resize(Volume(param.shape));
    float magnitude = 1.0f;  // Per row: blocks mix rows of very different sizes.
    for (int64_t i = 0; i < static_cast<int64_t>(param.bf16.size()); ++i) {
      if (i % param.shape.back() == 0) magnitude = std::pow(10.0f, exponent(rng));
      param.bf16[i] = wsync::testing::Bf16Bits(normal(rng) * magnitude);
    }
  }
  // An all-zero block (the ragged last one of the block-scaled weight) and values far past the
  // FP8 range in another.
  Param& block = params[0];
  for (int64_t r = 128; r < 200; ++r) {
    for (int64_t c = 256; c < 300; ++c) block.bf16[r * 300 + c] = 0;
  }
  for (int64_t c = 0; c < 128; c += 7) block.bf16[5 * 300 + c] = wsync::testing::Bf16Bits(3e30f);
  return params;
}

// The pieces of process (`trainer`, `rank`) in the job of JobParams.
std::vector<PieceSpec> JobPieces(bool trainer, int rank) {
  if (trainer) {
    return {{0, false, {0, 150 * rank}, {200, 150}},  // TP on columns, inside block 128..255.
            {1, false, {48 * rank, 0}, {48, 80}},     // TP on rows.
            {2, false, {2 * rank, 0, 0}, {2, 64, 96}},
            {3, false, {0}, {80}}};
  }
  return {{0, false, {128 * rank, 0}, {rank == 0 ? 128 : 72, 300}},
          {0, true, {rank, 0}, {1, 3}},
          {1, false, {0, 0}, {96, 80}},
          {1, true, {0, 0}, {96, 1}},
          {2, false, {2 * rank, 0, 0}, {2, 64, 96}},
          {2, true, {2 * rank, 0, 0}, {2, 1, 1}},
          {3, false, {0}, {80}}};
}

// A process of the job: its session and its buffers (one per piece).
struct Process {
  bool trainer = false;
  int rank = 0;
  wsync_session_t* session = nullptr;
  std::vector<PieceSpec> pieces;
  std::vector<std::vector<uint8_t>> buffers;
};

wsync_config_t JobConfig(bool trainer, int rank, int port, const char* job_id) {
  wsync_config_t config;
  std::memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT;
  config.rank = rank;
  config.num_trainers = 2;
  config.num_rollouts = 2;
  config.job_id = job_id;
  config.coordinator_port = port;
  config.host_coordinator = trainer && rank == 0;
  // By value: the library removes a variable it reads from the environment.
  config.secret = std::getenv(kSecretEnv);
  config.secret_length = config.secret != nullptr ? std::strlen(config.secret) : 0;
  config.node_id = "local";
  config.path_transports = "*=ucx:sm,cma,self";
  config.deadline_seconds = 30;
  return config;
}

std::string LastError(wsync_session_t* session) { return Api()->last_error(session); }

// declare_fp8_parameter for `param` as declared (the scheme's blocks; 0 for 128 x 128).
wsync_status_t DeclareFp8(wsync_session_t* session, const Param& param) {
  wsync_fp8_parameter_t fp8;
  std::memset(&fp8, 0, sizeof(fp8));
  fp8.struct_size = sizeof(fp8);
  fp8.parameter = param.name.c_str();
  fp8.scheme = param.scheme;
  fp8.scale_name = param.scale_name.c_str();
  fp8.scale_dtype = "fp32";
  fp8.scale_num_axes = static_cast<int32_t>(param.scale_shape.size());
  fp8.scale_shape = param.scale_shape.data();
  return Api()->declare_fp8_parameter(session, &fp8);
}

// Initializes the process and declares its layout through the C ABI; trainers' buffers get
// their boxes of the bf16 values, rollouts' are poisoned. `params` as the process declares them.
void Declare(Process& p, const std::vector<Param>& params, int port, const char* job_id) {
  const wsync_plugin_v1_t* api = Api();
  const wsync_config_t config = JobConfig(p.trainer, p.rank, port, job_id);
  ASSERT_EQ(api->init(&config, &p.session), WSYNC_OK) << LastError(nullptr);
  for (const Param& param : params) {
    const bool fp8 = !p.trainer && param.scheme != 0;
    ASSERT_EQ(api->declare_parameter(p.session, param.name.c_str(), fp8 ? "fp8_e4m3" : "bf16",
                                     static_cast<int32_t>(param.shape.size()), param.shape.data()),
              WSYNC_OK)
        << LastError(p.session);
    if (fp8) {
      ASSERT_EQ(DeclareFp8(p.session, param), WSYNC_OK) << LastError(p.session);
    }
  }
  p.pieces = JobPieces(p.trainer, p.rank);
  p.buffers.resize(p.pieces.size());
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const PieceSpec& piece = p.pieces[i];
    const Param& param = params[piece.param];
    const bool fp8 = !p.trainer && param.scheme != 0;
    const int64_t element = piece.scale ? 4 : fp8 ? 1 : 2;
    std::vector<uint8_t>& bytes = p.buffers[i];
    bytes.assign(Volume(piece.extent) * element, 0xA5);
    if (p.trainer) {
      ForEachElement(param.shape, piece.origin, piece.extent, [&](int64_t at, int64_t from) {
        std::memcpy(&bytes[at * 2], &param.bf16[from], 2);
      });
    }
    ASSERT_EQ(api->register_buffer(p.session, i, bytes.data(), bytes.size(), WSYNC_MEMORY_HOST, 0),
              WSYNC_OK)
        << LastError(p.session);
    const std::string& name = piece.scale ? param.scale_name : param.name;
    const Dims strides = RowMajorStrides(piece.extent);
    ASSERT_EQ(
        api->declare_piece(p.session, name.c_str(), i, static_cast<int32_t>(piece.extent.size()),
                           piece.origin.data(), piece.extent.data(), 0, strides.data()),
        WSYNC_OK)
        << name << ": " << LastError(p.session);
  }
}

// Runs `step` on every process at once; the statuses by process.
std::vector<wsync_status_t> OnAll(std::vector<Process>& processes,
                                  const std::function<wsync_status_t(Process&)>& step) {
  std::vector<wsync_status_t> results(processes.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < processes.size(); ++p) {
    threads.emplace_back([&, p] { results[p] = step(processes[p]); });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Trainer 0 hosts the coordinator on a port it picks: it is declared and connects first; the
// others are declared with the port it reports. `rollout_params[r]` as rollout r declares them.
// Returns the connect statuses (trainers, then rollouts).
std::vector<wsync_status_t> DeclareAndConnect(std::vector<Process>& processes,
                                              const std::vector<Param>& trainer_params,
                                              const std::vector<std::vector<Param>>& rollout_params,
                                              const char* job_id) {
  processes.resize(4);
  for (int p = 0; p < 4; ++p) {
    processes[p].trainer = p < 2;
    processes[p].rank = p % 2;
  }
  std::vector<wsync_status_t> results(4, WSYNC_INTERNAL);
  Declare(processes[0], trainer_params, 0, job_id);
  if (processes[0].session == nullptr) return results;
  std::thread host([&] { results[0] = Api()->connect(processes[0].session); });
  int32_t port = 0;
  for (int i = 0; i < 3000 && port == 0; ++i) {
    Api()->listening_ports(processes[0].session, nullptr, &port);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(port, 0);
  std::vector<std::thread> others;
  for (int p = 1; p < 4; ++p) {
    Declare(processes[p], p < 2 ? trainer_params : rollout_params[p - 2], port, job_id);
    others.emplace_back([&, p] {
      results[p] =
          processes[p].session == nullptr ? WSYNC_INTERNAL : Api()->connect(processes[p].session);
    });
  }
  for (std::thread& thread : others) thread.join();
  host.join();
  return results;
}

void FinalizeAll(std::vector<Process>& processes) {
  for (Process& p : processes) {
    if (p.session != nullptr) {
      EXPECT_EQ(Api()->finalize(p.session), WSYNC_OK);
    }
    p.session = nullptr;
  }
}

// Every byte a rollout holds equals the reference: FP8 bytes and scales of the reference
// quantizer over the whole bf16 tensor, the bf16 bits of an unquantized one.
void ExpectReference(const Process& p, const std::vector<Param>& params) {
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const PieceSpec& piece = p.pieces[i];
    const Param& param = params[piece.param];
    const std::vector<uint8_t>& got = p.buffers[i];
    int64_t wrong = 0;
    if (param.scheme == 0) {
      ForEachElement(param.shape, piece.origin, piece.extent, [&](int64_t at, int64_t from) {
        wrong += std::memcmp(&got[at * 2], &param.bf16[from], 2) != 0;
      });
      EXPECT_EQ(wrong, 0) << param.name << " on rollout " << p.rank;
      continue;
    }
    const bool experts = param.shape.size() == 3;
    const int64_t e = experts ? param.shape[0] : 1;
    const int64_t rows = param.shape.end()[-2];
    const int64_t cols = param.shape.back();
    std::vector<double> values(param.bf16.size());
    for (size_t v = 0; v < values.size(); ++v) values[v] = wsync::testing::Bf16Value(param.bf16[v]);
    absl::StatusOr<wsync::testing::ReferenceFp8> reference = wsync::testing::ReferenceQuantizeFp8(
        values, e, rows, cols, param.block_rows, param.block_cols, param.name);
    ASSERT_TRUE(reference.ok()) << reference.status();
    if (piece.scale) {
      ForEachElement(param.scale_shape, piece.origin, piece.extent, [&](int64_t at, int64_t from) {
        wrong += std::memcmp(&got[at * 4], &reference->scales[from], 4) != 0;
      });
    } else {
      ForEachElement(param.shape, piece.origin, piece.extent,
                     [&](int64_t at, int64_t from) { wrong += got[at] != reference->fp8[from]; });
    }
    EXPECT_EQ(wrong, 0) << (piece.scale ? param.scale_name : param.name) << " on rollout " << p.rank
                        << ": " << wrong << " of " << Volume(piece.extent)
                        << " elements differ from the reference quantizer";
  }
}

class Fp8AbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv(kSecretEnv, "fp8-abi-test-secret-0123456789abcdef", 1);
    ASSERT_NE(Api(), nullptr) << dlerror();
  }
};

TEST_F(Fp8AbiTest, SyncsBf16ShardsIntoDeclaredFp8ParametersBitForBit) {
  const std::vector<Param> params = JobParams(22);
  std::vector<Process> processes;
  for (wsync_status_t s : DeclareAndConnect(processes, params, {params, params}, "fp8-abi")) {
    EXPECT_EQ(s, WSYNC_OK);
  }
  for (wsync_status_t s : OnAll(processes, [](Process& p) { return Api()->sync(p.session, 1); })) {
    EXPECT_EQ(s, WSYNC_OK);
  }
  for (Process& p : processes) {
    if (!p.trainer) ExpectReference(p, params);
  }
  FinalizeAll(processes);
}

TEST_F(Fp8AbiTest, RolloutsDeclaringOneParameterDifferentlyAreRefusedEverywhere) {
  const std::vector<Param> params = JobParams(23);
  std::vector<Param> other = params;
  // Rollout 1 takes the per-channel weight as per-tensor FP8.
  other[1].scheme = WSYNC_QUANT_FP8_TENSOR;
  other[1].scale_shape = {1, 1};
  std::vector<Process> processes;
  for (wsync_status_t s : DeclareAndConnect(processes, params, {params, other}, "fp8-abi-differ")) {
    EXPECT_EQ(s, WSYNC_LAYOUT_REFUSED);
  }
  for (Process& p : processes) {
    if (p.session == nullptr) continue;
    EXPECT_NE(LastError(p.session).find("'model.layers.0.self_attn.o_proj.weight' is quantized as"),
              std::string::npos)
        << LastError(p.session);
  }
  FinalizeAll(processes);
}

// A rollout (or trainer) session of a one-process-per-role job, its parameters declared.
wsync_session_t* DeclaredSession(bool trainer) {
  wsync_config_t config = JobConfig(trainer, 0, 1, "fp8-abi-refusals");
  config.num_trainers = 1;
  config.num_rollouts = 1;
  wsync_session_t* session = nullptr;
  EXPECT_EQ(Api()->init(&config, &session), WSYNC_OK) << LastError(nullptr);
  const int64_t matrix[2] = {200, 300};
  const int64_t vector[1] = {300};
  EXPECT_EQ(Api()->declare_parameter(session, "w", trainer ? "bf16" : "fp8_e4m3", 2, matrix),
            WSYNC_OK);
  EXPECT_EQ(Api()->declare_parameter(session, "b", "bf16", 2, matrix), WSYNC_OK);
  EXPECT_EQ(Api()->declare_parameter(session, "v", "fp8_e4m3", 1, vector), WSYNC_OK);
  return session;
}

struct Refusal {
  const char* what;
  std::function<void(wsync_fp8_parameter_t&)> change;
  const char* message;  // A part of last_error's text.
};

TEST_F(Fp8AbiTest, BadDeclarationsAreRefusedWithTheReason) {
  const int64_t good_shape[2] = {2, 3};
  const int64_t channel_shape[2] = {200, 1};
  const int64_t wrong_shape[2] = {3, 3};
  const std::vector<Refusal> refusals = {
      {"scale shape not the scheme's", [&](auto& f) { f.scale_shape = wrong_shape; },
       "has shape (3, 3); blocks of 128 x 128 over (200, 300) need (2, 3)"},
      {"per-channel scales of block shape", [&](auto& f) { f.scheme = WSYNC_QUANT_FP8_CHANNEL; },
       "blocks of 1 x all columns over (200, 300) need (200, 1)"},
      {"per-tensor scales of channel shape",
       [&](auto& f) {
         f.scheme = WSYNC_QUANT_FP8_TENSOR;
         f.scale_shape = channel_shape;
       },
       "the whole matrix over (200, 300) need (1, 1)"},
      {"blocks of 64 with 128's scales", [&](auto& f) { f.block_rows = f.block_cols = 64; },
       "blocks of 64 x 64 over (200, 300) need (4, 5)"},
      {"not e4m3", [&](auto& f) { f.parameter = "b"; }, "'b': declared as bf16, not fp8_e4m3"},
      {"one axis", [&](auto& f) { f.parameter = "v"; }, "has 1 axes"},
      {"undeclared", [&](auto& f) { f.parameter = "x"; }, "'x': not declared"},
      {"NULL parameter", [&](auto& f) { f.parameter = nullptr; }, "fp8->parameter is NULL"},
      {"scale dtype bf16", [&](auto& f) { f.scale_dtype = "bf16"; }, "is bf16; scales are fp32"},
      {"scale dtype unknown", [&](auto& f) { f.scale_dtype = "fp31"; }, "scale_dtype: "},
      {"scale dtype NULL", [&](auto& f) { f.scale_dtype = nullptr; }, "scale_dtype is NULL"},
      {"scale name NULL", [&](auto& f) { f.scale_name = nullptr; }, "scale_name is NULL"},
      {"scale name empty", [&](auto& f) { f.scale_name = ""; }, "needs a name of its own"},
      {"scale name taken", [&](auto& f) { f.scale_name = "b"; }, "'b' is already declared"},
      {"unknown scheme", [&](auto& f) { f.scheme = 4; }, "got 4"},
      {"negative block", [&](auto& f) { f.block_rows = -128; }, "must not be negative"},
      {"blocks without a block scheme",
       [&](auto& f) {
         f.scheme = WSYNC_QUANT_FP8_TENSOR;
         f.block_rows = 128;
       },
       "are for WSYNC_QUANT_FP8_BLOCK"},
      {"scale axes out of range", [&](auto& f) { f.scale_num_axes = 9; }, "num_axes must be"},
      {"scale shape NULL", [&](auto& f) { f.scale_shape = nullptr; }, "scale_shape is NULL"},
      {"struct too small", [&](auto& f) { f.struct_size = 8; }, "fp8->struct_size is 8"},
  };
  wsync_session_t* session = DeclaredSession(/*trainer=*/false);
  ASSERT_NE(session, nullptr);
  const auto good = [&] {
    wsync_fp8_parameter_t f;
    std::memset(&f, 0, sizeof(f));
    f.struct_size = sizeof(f);
    f.parameter = "w";
    f.scheme = WSYNC_QUANT_FP8_BLOCK;
    f.scale_name = "w_scale_inv";
    f.scale_dtype = "fp32";
    f.scale_num_axes = 2;
    f.scale_shape = good_shape;
    return f;
  };
  for (const Refusal& refusal : refusals) {
    wsync_fp8_parameter_t f = good();
    refusal.change(f);
    EXPECT_EQ(Api()->declare_fp8_parameter(session, &f), WSYNC_INVALID_ARGUMENT) << refusal.what;
    EXPECT_NE(LastError(session).find(refusal.message), std::string::npos)
        << refusal.what << ": " << LastError(session);
  }
  EXPECT_EQ(Api()->declare_fp8_parameter(session, nullptr), WSYNC_INVALID_ARGUMENT);
  EXPECT_EQ(Api()->declare_fp8_parameter(nullptr, nullptr), WSYNC_INVALID_ARGUMENT);
  // The good declaration, once; a second is refused, and so is the scale tensor as a parameter.
  wsync_fp8_parameter_t f = good();
  ASSERT_EQ(Api()->declare_fp8_parameter(session, &f), WSYNC_OK) << LastError(session);
  EXPECT_EQ(Api()->declare_fp8_parameter(session, &f), WSYNC_INVALID_ARGUMENT);
  EXPECT_NE(LastError(session).find("already declared"), std::string::npos) << LastError(session);
  f.scale_name = "w_scale_inv_2";
  EXPECT_EQ(Api()->declare_fp8_parameter(session, &f), WSYNC_INVALID_ARGUMENT);
  EXPECT_NE(LastError(session).find("declared FP8 twice"), std::string::npos) << LastError(session);
  const int64_t origin[2] = {0, 0};
  const int64_t strides[2] = {3, 1};
  float scales[6];
  ASSERT_EQ(Api()->register_buffer(session, 7, scales, sizeof(scales), WSYNC_MEMORY_HOST, 0),
            WSYNC_OK);
  EXPECT_EQ(Api()->declare_piece(session, "w_scale_inv", 7, 2, origin, good_shape, 0, strides),
            WSYNC_OK)
      << LastError(session);
  EXPECT_EQ(Api()->finalize(session), WSYNC_OK);

  // A trainer holds its parameters unquantized.
  session = DeclaredSession(/*trainer=*/true);
  ASSERT_NE(session, nullptr);
  f = good();
  EXPECT_EQ(Api()->declare_fp8_parameter(session, &f), WSYNC_INVALID_ARGUMENT);
  EXPECT_NE(LastError(session).find("a trainer holds its parameters unquantized"),
            std::string::npos)
      << LastError(session);
  EXPECT_EQ(Api()->finalize(session), WSYNC_OK);
}

}  // namespace
