// wsync_fuzz_seeds DIR: writes the seed corpus of the fuzz targets (tests/fuzz/corpus/ holds its
// output): valid manifests of named layouts, control frames of every kind and calibrations, so
// that fuzzing starts from inputs that reach deep into each parser.

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "control/framing.h"
#include "cost/link_model.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace {

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(
        stderr,
        "usage: wsync_fuzz_seeds DIR (with DIR/manifest_fuzz, frame_fuzz, calibration_fuzz)\n");
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;
  int n = 0;
  for (const char* layout : {"megatron(tp=2)", "vllm(tp=2)", "fsdp(dp=2)"}) {
    auto model = wsync::GetModel("qwen2.5-tiny");
    if (!model.ok()) return 1;
    auto side = wsync::BuildNamedLayout(*model, layout);
    if (!side.ok()) continue;
    ok &= Write(absl::StrCat(dir, "/manifest_fuzz/side-", n), wsync::SerializeLayout(*side));
    ok &= Write(absl::StrCat(dir, "/manifest_fuzz/part-", n),
                wsync::SerializeLayout(wsync::LayoutPart(*side, 0)));
    ++n;
  }
  using wsync::control::Frame;
  Frame f;
  f.mutable_challenge()->set_protocol_version(1);
  f.mutable_challenge()->set_nonce(std::string(32, 'n'));
  ok &= Write(dir + "/frame_fuzz/challenge", f.SerializeAsString());
  f.Clear();
  auto* hello = f.mutable_hello();
  hello->set_protocol_version(1);
  hello->set_job_id("job");
  hello->set_role(wsync::control::ROLE_ROLLOUT);
  hello->set_rank(1);
  hello->set_node_id("node");
  hello->set_client_nonce(std::string(32, 'c'));
  hello->set_mac(std::string(32, 'm'));
  ok &= Write(dir + "/frame_fuzz/hello", f.SerializeAsString());
  f.Clear();
  f.mutable_join()->set_manifest("m");
  f.mutable_join()->set_address("a");
  ok &= Write(dir + "/frame_fuzz/join", f.SerializeAsString());
  f.Clear();
  auto* roster = f.mutable_roster();
  roster->set_num_trainers(1);
  roster->set_num_rollouts(1);
  for (int p = 0; p < 2; ++p) {
    auto* e = roster->add_processes();
    e->set_process(p);
    e->set_role(p == 0 ? wsync::control::ROLE_TRAINER : wsync::control::ROLE_ROLLOUT);
    e->set_manifest(0);
    e->set_address("addr");
  }
  roster->add_blobs("blob");
  ok &= Write(dir + "/frame_fuzz/roster", f.SerializeAsString());
  f.Clear();
  auto* c = f.mutable_contribute();
  c->set_number(7);
  c->set_kind(wsync::control::COLLECTIVE_DECIDE);
  c->set_ok(false);
  c->set_reason("why");
  c->set_timeout_ms(1000);
  ok &= Write(dir + "/frame_fuzz/contribute", f.SerializeAsString());
  f.Clear();
  auto* r = f.mutable_result();
  r->set_number(7);
  r->add_payloads("x");
  r->add_payloads("y");
  ok &= Write(dir + "/frame_fuzz/result", f.SerializeAsString());
  for (const char* spec : {"intra_node=5us,200GB/s;inter_node=20us,25GB/s", "local=1us,1000GB/s",
                           "local=1us,20GB/s;quantize=0us,3GB/s"}) {
    auto calibration = wsync::SyntheticCalibration(spec);
    if (!calibration.ok()) continue;
    ok &= Write(absl::StrCat(dir, "/calibration_fuzz/synthetic-", n++),
                wsync::SerializeCalibration(*calibration));
  }
  return ok ? 0 : 1;
}
