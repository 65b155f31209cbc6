// Delta sync in the cost model (plugin/prediction.h): the calibration's encode and apply rates,
// delta=auto's rule per path class (never on a link faster than encoding and patching together,
// such as shared memory; on over a slow link), and the prediction of a delta sync at a changed
// fraction.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "cost/link_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "plugin/prediction.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

LinkFits FitsOf(absl::string_view links) {
  absl::StatusOr<proto::Calibration> calibration = SyntheticCalibration(links);
  EXPECT_TRUE(calibration.ok()) << calibration.status();
  absl::StatusOr<LinkFits> fits = FitLinks(*calibration);
  EXPECT_TRUE(fits.ok()) << fits.status();
  return *std::move(fits);
}

// Shared memory at 10 GB/s, a 1 Gbit/s link, delta encoding at 3 GB/s and patching at 4 GB/s.
constexpr char kLinks[] =
    "local=1us,20GB/s;intra_node=2us,10GB/s;inter_node=50us,125MB/s;"
    "delta_encode=0us,3GB/s;delta_apply=0us,4GB/s";

TEST(DeltaPredictionTest, TheCalibrationCarriesTheEncodeAndApplyRates) {
  const LinkFits fits = FitsOf(kLinks);
  EXPECT_NEAR(fits.delta_encode_bytes_per_second, 3e9, 3e6);
  EXPECT_NEAR(fits.delta_apply_bytes_per_second, 4e9, 4e6);
  EXPECT_EQ(FitsOf("intra_node=2us,10GB/s").delta_encode_bytes_per_second, 0);
}

TEST(DeltaPredictionTest, AutoPaysOverASlowLinkAndNeverOverSharedMemory) {
  const std::map<std::string, double> pays = DeltaPaysBelow(FitsOf(kLinks));
  EXPECT_FALSE(pays.contains("intra_node"));  // 10 GB/s: slower with delta at any fraction.
  EXPECT_FALSE(pays.contains("local"));
  ASSERT_TRUE(pays.contains("inter_node"));
  // 1 - 0.125/3 - 0.125/4: delta pays over 1 Gbit/s up to about 93 % changed.
  EXPECT_NEAR(pays.at("inter_node"), 1 - 0.125 / 3 - 0.125 / 4, 1e-3);
  // A 4 GB/s link pays only while few elements change: 1 - 4/3... below 0: dense.
  EXPECT_TRUE(DeltaPaysBelow(FitsOf("inter_node=5us,4GB/s;delta_encode=0us,3GB/s;"
                                    "delta_apply=0us,4GB/s"))
                  .empty());
  // Without measured rates auto stays dense everywhere.
  EXPECT_TRUE(DeltaPaysBelow(FitsOf("inter_node=50us,125MB/s")).empty());
}

// qwen2.5-tiny, megatron(tp=2) -> vllm(tp=2), priced with kLinks.
struct TinyJob {
  TinyJob()
      : layouts(*BuildNamedJobLayouts(*GetModel("qwen2.5-tiny"), "megatron(tp=2,ppn=1)",
                                      "vllm(tp=2,ppn=1)")),
        job(*Job::Create(layouts.source, layouts.target)),
        plan(*MakePlan(job, *MakeFirstHolderPolicy())),
        fits(FitsOf(kLinks)),
        dense(*PredictSync(job, *MakeFirstHolderPolicy(), fits, StagingBudget{int64_t{1} << 30})) {}
  NamedJobLayouts layouts;
  Job job;
  Plan plan;
  LinkFits fits;
  Prediction dense;
};

TEST(DeltaPredictionTest, ADeltaSyncIsPredictedFromTheChangedFraction) {
  const TinyJob tiny;
  const Job& job = tiny.job;
  const Plan& plan = tiny.plan;
  const LinkFits& fits = tiny.fits;
  const Prediction& dense = tiny.dense;
  absl::StatusOr<DeltaPrediction> small =
      PredictDeltaSync(job, plan, dense, fits, 0.04, kDeltaEncodedPerChanged, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_GT(small->dense_bytes, 0);
  EXPECT_NEAR(static_cast<double>(small->saved_bytes),
              0.96 * static_cast<double>(small->dense_bytes), 1.0);
  EXPECT_DOUBLE_EQ(small->dense_seconds, dense.seconds);
  EXPECT_LT(small->seconds, 0.2 * dense.seconds);  // 1 Gbit/s: the wire dominates.
  EXPECT_GT(small->encode_seconds, 0);
  EXPECT_GT(small->apply_seconds, 0);
  // Every element changed: nothing saved, and the encode and apply cost on top.
  absl::StatusOr<DeltaPrediction> all =
      PredictDeltaSync(job, plan, dense, fits, 1.0, kDeltaEncodedPerChanged, nullptr);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->saved_bytes, 0);
  EXPECT_GT(all->seconds, dense.seconds);
  // delta=auto at a fraction above every class's threshold runs nothing as delta.
  const std::map<std::string, double> pays = DeltaPaysBelow(fits);
  absl::StatusOr<DeltaPrediction> off =
      PredictDeltaSync(job, plan, dense, fits, 0.99, kDeltaEncodedPerChanged, &pays);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->dense_bytes, 0);
  EXPECT_DOUBLE_EQ(off->seconds, dense.seconds);
  EXPECT_THAT(
      DeltaPredictionLine(small, "the last sync's"),
      HasSubstr("at 4.00 % changed and 1 encoded bytes per changed byte (the last sync's)"));
  EXPECT_THAT(DeltaPredictionLine(PredictDeltaSync(job, plan, dense, FitsOf("inter_node=5us,1GB/s"),
                                                   0.04, kDeltaEncodedPerChanged, nullptr),
                                  "x"),
              HasSubstr("no prediction"));
}

TEST(DeltaPredictionTest, TheMeasuredEncodingCostSetsTheBytesOnTheWire) {
  const TinyJob tiny;
  const Job& job = tiny.job;
  const Plan& plan = tiny.plan;
  const LinkFits& fits = tiny.fits;
  const Prediction& dense = tiny.dense;
  const DeltaPrediction assumed =
      *PredictDeltaSync(job, plan, dense, fits, 0.04, kDeltaEncodedPerChanged, nullptr);
  // Half a byte per changed byte (runs of changed elements): half the wire bytes of the assumed.
  const DeltaPrediction measured = *PredictDeltaSync(job, plan, dense, fits, 0.04, 0.5, nullptr);
  EXPECT_EQ(measured.dense_bytes, assumed.dense_bytes);
  EXPECT_NEAR(static_cast<double>(measured.saved_bytes),
              0.98 * static_cast<double>(measured.dense_bytes), 1.0);
  EXPECT_LT(measured.seconds, assumed.seconds);
  EXPECT_DOUBLE_EQ(measured.encode_seconds, assumed.encode_seconds);
  EXPECT_THAT(DeltaPredictionLine(measured, "the last sync's"),
              HasSubstr("0.5 encoded bytes per changed byte"));
  // At most every byte: 3 bytes per changed byte at 40 % changed saves nothing.
  EXPECT_EQ(PredictDeltaSync(job, plan, dense, fits, 0.4, 3.0, nullptr)->saved_bytes, 0);
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(PredictDeltaSync(job, plan, dense, fits, 0.04, bad, nullptr).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace wsync
