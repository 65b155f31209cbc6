#include "planner/waves.h"

#include <map>
#include <utility>

namespace wsync {

bool HasWaves(const Job& job) {
  for (const ParamInfo& param : job.target().params) {
    if (param.wave != 0) return true;
  }
  return false;
}

std::vector<Wave> SplitIntoWaves(const Job& job, absl::Span<const Segment> segments) {
  if (!HasWaves(job)) return {Wave{0, std::vector<Segment>(segments.begin(), segments.end())}};
  const std::vector<ParamInfo>& params = job.target().params;
  std::map<int32_t, std::vector<Segment>> by_wave;
  for (const ParamInfo& param : params) {
    if (Volume(param.shape) > 0) by_wave[param.wave];
  }
  for (const Segment& segment : segments) by_wave[params[segment.param].wave].push_back(segment);
  if (by_wave.empty()) by_wave[0];  // Nothing to move: one empty wave, agreed like any sync.
  std::vector<Wave> waves;
  waves.reserve(by_wave.size());
  for (auto& [wave, wave_segments] : by_wave) waves.push_back(Wave{wave, std::move(wave_segments)});
  return waves;
}

}  // namespace wsync
