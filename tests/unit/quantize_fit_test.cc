// The quantize rate of a calibration (cost/, schema 3): "quantize" samples fit
// per process, the slowest process's rate is the one predictions use, files of schema 1 and 2
// still load (without a rate), and StandInNote names a prediction priced at a stand-in rate.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cost/link_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A calibration with a local link and nothing else.
proto::Calibration LocalOnly() { return *SyntheticCalibration("local=1us,20GB/s"); }

// Adds process `process`'s quantize samples: 3 repeats of `bytes` at `rate` bytes per second.
void AddQuantize(proto::Calibration& calibration, int32_t process, const std::string& node,
                 int64_t bytes, double rate) {
  proto::CalibrationSample* sample = calibration.add_samples();
  sample->set_pattern("quantize");
  sample->set_from(process);
  sample->set_to(process);
  sample->set_path("local");
  sample->set_from_node(node);
  sample->set_bytes(bytes);
  for (const double factor : {1.0, 1.1, 0.95}) {
    sample->add_seconds(factor * static_cast<double>(bytes) / rate);
  }
}

TEST(QuantizeFitTest, EveryProcessFitsAndTheSlowestRatePrices) {
  proto::Calibration calibration = LocalOnly();
  calibration.set_processes(2);
  calibration.add_nodes("a");
  calibration.add_nodes("b");
  AddQuantize(calibration, 0, "a", int64_t{32} << 20, 8e9);
  AddQuantize(calibration, 1, "b", int64_t{32} << 20, 3e9);
  const absl::StatusOr<proto::Calibration> parsed =
      ParseCalibration(SerializeCalibration(calibration));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const absl::StatusOr<LinkFits> fits = FitLinks(*parsed);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->quantize.size(), 2u);
  // One size: the line through the origin at the median repeat.
  EXPECT_DOUBLE_EQ(fits->quantize.at(0).bytes_per_second, 8e9);
  EXPECT_EQ(fits->quantize.at(0).alpha_seconds, 0);
  EXPECT_DOUBLE_EQ(fits->quantize.at(1).bytes_per_second, 3e9);
  EXPECT_DOUBLE_EQ(fits->quantize_bytes_per_second, 3e9);
  EXPECT_THAT(fits->skipped, IsEmpty());
}

TEST(QuantizeFitTest, OlderSchemasLoadWithoutARateAndRefuseQuantizeSamples) {
  for (const uint32_t version : {1u, 2u}) {
    proto::Calibration old = LocalOnly();
    old.set_schema_version(version);
    const absl::StatusOr<proto::Calibration> parsed = ParseCalibration(SerializeCalibration(old));
    ASSERT_TRUE(parsed.ok()) << version << ": " << parsed.status();
    const absl::StatusOr<LinkFits> fits = FitLinks(*parsed);
    ASSERT_TRUE(fits.ok()) << version << ": " << fits.status();
    EXPECT_THAT(fits->quantize, IsEmpty());
    EXPECT_EQ(fits->quantize_bytes_per_second, 0);
    EXPECT_TRUE(fits->by_path.contains("local"));
    // The pattern did not exist before schema 3.
    AddQuantize(old, 0, "a", 1 << 20, 1e9);
    EXPECT_THAT(std::string(FitLinks(old).status().message()),
                HasSubstr(absl::StrCat("unknown pattern 'quantize' for schema ", version)));
  }
  EXPECT_EQ(kCalibrationSchemaVersion, 3u);
}

TEST(QuantizeFitTest, RefusesTwoProcessesAndSkipsATimeThatDoesNotGrow) {
  proto::Calibration two = LocalOnly();
  AddQuantize(two, 0, "a", 1 << 20, 1e9);
  two.mutable_samples(two.samples_size() - 1)->set_to(1);
  EXPECT_THAT(std::string(FitLinks(two).status().message()),
              HasSubstr("(quantize) names two processes, 0 and 1"));
  // A process whose times fit no rate is left out and named; the others still price.
  proto::Calibration flat = LocalOnly();
  AddQuantize(flat, 0, "a", 1 << 20, 2e9);
  AddQuantize(flat, 1, "a", 1 << 20, 1e9);
  for (double& seconds : *flat.mutable_samples(flat.samples_size() - 1)->mutable_seconds()) {
    seconds = 0;
  }
  const absl::StatusOr<LinkFits> fits = FitLinks(flat);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_DOUBLE_EQ(fits->quantize_bytes_per_second, 2e9);
  ASSERT_EQ(fits->skipped.size(), 1u);
  EXPECT_THAT(fits->skipped[0], HasSubstr("quantize fit"));
}

TEST(QuantizeFitTest, SyntheticCalibrationStatesARate) {
  const absl::StatusOr<proto::Calibration> stated =
      SyntheticCalibration("local=1us,20GB/s;quantize=0us,3GB/s");
  ASSERT_TRUE(stated.ok()) << stated.status();
  const absl::StatusOr<LinkFits> fits = FitLinks(*stated);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_NEAR(fits->quantize_bytes_per_second / 3e9, 1.0, 1e-9);
  EXPECT_FALSE(fits->by_path.contains("quantize"));
}

TEST(QuantizeFitTest, StandInNoteNamesAStandInRate) {
  const LinkFits fits = *FitLinks(LocalOnly());
  Prediction prediction;
  prediction.quantize_seconds = 0.5;
  prediction.quantize_bytes_per_second = 5.5e9;
  EXPECT_THAT(StandInNote(fits, prediction), IsEmpty());
  prediction.quantize_stand_in = true;
  EXPECT_EQ(StandInNote(fits, prediction),
            "quantize priced at the stand-in 5.50 GB/s of input (the calibration measured no "
            "quantize rate)");
  prediction.quantize_seconds = 0;  // Nothing quantized: nothing to name.
  EXPECT_THAT(StandInNote(fits, prediction), Not(HasSubstr("quantize")));
}

}  // namespace
}  // namespace wsync
