#include "executor/agreement.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/status.h"
#include "executor/agreement.pb.h"

namespace wsync {
namespace {

// VerifyMode values (executor/execute.h), which this file does not include.
std::string VerifyModeName(int32_t mode) {
  switch (mode) {
    case 0:
      return "none (off)";
    case 1:
      return "xxh3 hashes";
    case 2:
      return "keyed MACs";
  }
  return absl::StrCat("unknown mode ", mode);
}

}  // namespace

absl::Status AgreeOnBatch(Group& group, const absl::Status& local, uint64_t plan_digest,
                          double budget_bytes, int32_t verify_mode, absl::Time deadline,
                          const DeltaClaim& delta,
                          std::vector<std::optional<uint64_t>>* held_versions,
                          std::optional<double>* changed_fraction) {
  proto::Agreement mine;
  mine.set_ok(local.ok());
  mine.set_error(std::string(local.message()));
  mine.set_plan_digest(plan_digest);
  mine.set_budget_bytes(budget_bytes);
  mine.set_verify_mode(verify_mode);
  mine.set_delta(delta.on);
  mine.set_holds_version(delta.held_version.has_value());
  mine.set_held_version(delta.held_version.value_or(0));
  mine.set_delta_rule(delta.rule_digest);
  mine.set_delta_changed_elements(delta.changed_elements);
  mine.set_delta_compared_elements(delta.compared_elements);
  WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> payloads,
                         group.AllGather(mine.SerializeAsString(), deadline));
  std::vector<proto::Agreement> all(payloads.size());
  for (size_t p = 0; p < payloads.size(); ++p) {
    if (!all[p].ParseFromString(payloads[p])) {
      return absl::DataLossError(absl::StrCat("process ", p, " sent an unreadable agreement"));
    }
  }
  if (!local.ok()) return local;
  std::vector<std::string> rejections;
  for (size_t p = 0; p < all.size(); ++p) {
    if (!all[p].ok()) rejections.push_back(absl::StrCat("process ", p, ": ", all[p].error()));
  }
  if (!rejections.empty()) {
    return WithErrorKind(
        absl::FailedPreconditionError(absl::StrCat(
            "the batch was rejected before any byte moved by ", absl::StrJoin(rejections, "; "))),
        kErrorRanksDisagree);
  }
  for (size_t p = 0; p < all.size(); ++p) {
    if (all[p].plan_digest() != plan_digest) {
      return WithErrorKind(
          absl::FailedPreconditionError(absl::StrCat(
              "plan digests differ: process ", group.process(), " has ", DigestHex(plan_digest),
              ", process ", p, " has ", DigestHex(all[p].plan_digest()))),
          kErrorRanksDisagree);
    }
    if (all[p].budget_bytes() != budget_bytes) {
      return WithErrorKind(
          absl::FailedPreconditionError(absl::StrCat(
              "staging budgets differ: process ", group.process(), " has ", budget_bytes,
              " bytes, process ", p, " has ", all[p].budget_bytes(), " bytes")),
          kErrorRanksDisagree);
    }
    if (all[p].verify_mode() != verify_mode) {
      return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                               "verify modes differ: process ", group.process(), " verifies with ",
                               VerifyModeName(verify_mode), ", process ", p, " with ",
                               VerifyModeName(all[p].verify_mode()),
                               "; every process of a job must set the same verify")),
                           kErrorRanksDisagree);
    }
    if (all[p].delta() != delta.on) {
      return WithErrorKind(
          absl::FailedPreconditionError(absl::StrCat(
              "delta settings differ: process ", group.process(), " has delta ",
              delta.on ? "on" : "off", ", process ", p, " has it ", all[p].delta() ? "on" : "off",
              "; every process of a job must set the same delta")),
          kErrorRanksDisagree);
    }
    if (all[p].delta_rule() != delta.rule_digest) {
      return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                               "delta=auto rules differ: process ", group.process(), " has ",
                               DigestHex(delta.rule_digest), ", process ", p, " has ",
                               DigestHex(all[p].delta_rule()),
                               "; every process must decide its lanes from the same calibration")),
                           kErrorRanksDisagree);
    }
  }
  if (changed_fraction != nullptr) {
    int64_t changed = 0, compared = 0;
    for (const proto::Agreement& claim : all) {
      changed += claim.delta_changed_elements();
      compared += claim.delta_compared_elements();
    }
    *changed_fraction =
        compared > 0
            ? std::optional<double>(static_cast<double>(changed) / static_cast<double>(compared))
            : std::nullopt;
  }
  if (held_versions != nullptr) {
    held_versions->assign(all.size(), std::nullopt);
    for (size_t p = 0; p < all.size(); ++p) {
      if (all[p].holds_version()) (*held_versions)[p] = all[p].held_version();
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync
