#include "integration/bench/bench_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace wsync::bench {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Min(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::min_element(values.begin(), values.end());
}

double Max(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

double JobLimitSeconds(double base_seconds, int32_t versions, int64_t process_bytes,
                       bool element_check) {
  const double seconds_per_gb = 10.0 + (element_check ? 150.0 : 0.0);
  return base_seconds + std::max(0, versions) * seconds_per_gb * (process_bytes / 1e9);
}

namespace {

double PositiveRatio(double a, double b) { return b > 0 ? a / b : 0; }

std::string Goal(double ratio) {
  return absl::StrFormat("goal <= %.2f: %s", kQuantWireRatioGoal,
                         ratio > 0 && ratio <= kQuantWireRatioGoal ? "met" : "NOT met");
}

}  // namespace

double WireRatio(const QuantComparison& c) {
  return PositiveRatio(c.fp8_wire_bytes, c.bf16_wire_bytes);
}
double QuantizedWireRatio(const QuantComparison& c) {
  return PositiveRatio(c.fp8_wire_bytes - c.plain_bytes, c.bf16_wire_bytes - c.plain_bytes);
}
double PlanRatio(const QuantComparison& c) {
  return PositiveRatio(c.fp8_plan_bytes, c.bf16_plan_bytes);
}
double QuantizedPlanRatio(const QuantComparison& c) {
  return PositiveRatio(c.fp8_bytes + c.scale_bytes + c.gathered_bytes, c.quantized_bf16_bytes);
}
double TimeRatio(const QuantComparison& c) { return PositiveRatio(c.fp8_seconds, c.bf16_seconds); }
double WholeRatioFloor(const QuantComparison& c) {
  const double plain = static_cast<double>(c.plain_bytes);
  const double quantized = static_cast<double>(c.quantized_bf16_bytes);
  return PositiveRatio(plain + quantized / 2, plain + quantized);
}

std::string FormatQuantComparison(const QuantComparison& c) {
  return absl::StrFormat(
      "FP8 rollouts against bf16 over %s (medians of the same alternating rounds):\n"
      "  bytes on the wire (sent, the library's metrics): bf16 %.0f B, fp8 %.0f B: ratio %.4f "
      "(%s)\n"
      "  of them the quantized parameters (less the %d B of parameters both send in bf16):\n"
      "    bf16 %.0f B, fp8 %.0f B: ratio %.4f (%s)\n"
      "  floor of the whole ratio set by the parameters kept in bf16 (tied embedding, norms,\n"
      "    biases): (%d B + %d B / 2) / (%d B + %d B) = %.4f\n"
      "  the plans: bf16 %d B, fp8 %d B: ratio %.4f; quantized parameters: bf16 %d B ->\n"
      "    e4m3 %d B + scales %d B (sender-side) + bf16 %d B gathered (receiver-side): "
      "ratio %.4f\n"
      "  seconds per sync: bf16 %.4f s, fp8 %.4f s: ratio %.3f\n",
      c.transport, c.bf16_wire_bytes, c.fp8_wire_bytes, WireRatio(c), Goal(WireRatio(c)),
      c.plain_bytes, c.bf16_wire_bytes - c.plain_bytes, c.fp8_wire_bytes - c.plain_bytes,
      QuantizedWireRatio(c), Goal(QuantizedWireRatio(c)), c.plain_bytes, c.quantized_bf16_bytes,
      c.plain_bytes, c.quantized_bf16_bytes, WholeRatioFloor(c), c.bf16_plan_bytes,
      c.fp8_plan_bytes, PlanRatio(c), c.quantized_bf16_bytes, c.fp8_bytes, c.scale_bytes,
      c.gathered_bytes, QuantizedPlanRatio(c), c.bf16_seconds, c.fp8_seconds, TimeRatio(c));
}

std::string QuantComparisonJson(const QuantComparison& c) {
  return absl::StrFormat(
      "{\"transport\": %s, \"bf16_wire_bytes\": %.0f, \"fp8_wire_bytes\": %.0f, "
      "\"wire_ratio\": %.6f, \"quantized_wire_ratio\": %.6f, \"bf16_plan_bytes\": %d, "
      "\"fp8_plan_bytes\": %d, \"plan_ratio\": %.6f, \"plain_bytes\": %d, \"fp8_bytes\": %d, "
      "\"scale_bytes\": %d, \"gathered_bytes\": %d, \"quantized_bf16_bytes\": %d, "
      "\"quantized_plan_ratio\": %.6f, \"whole_ratio_floor\": %.6f, \"bf16_seconds\": %.6f, "
      "\"fp8_seconds\": %.6f, \"time_ratio\": %.6f}",
      JsonString(c.transport), c.bf16_wire_bytes, c.fp8_wire_bytes, WireRatio(c),
      QuantizedWireRatio(c), c.bf16_plan_bytes, c.fp8_plan_bytes, PlanRatio(c), c.plain_bytes,
      c.fp8_bytes, c.scale_bytes, c.gathered_bytes, c.quantized_bf16_bytes, QuantizedPlanRatio(c),
      WholeRatioFloor(c), c.bf16_seconds, c.fp8_seconds, TimeRatio(c));
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {

const Measured* Find(const Scenario& scenario, const std::string& id) {
  for (const Measured& m : scenario.results) {
    if (m.id == id) return &m;
  }
  return nullptr;
}

double GbpsPerRollout(const Scenario& scenario, const Measured& m) {
  const double seconds = Median(m.seconds);
  return seconds > 0 ? scenario.rollout_bytes / seconds / 1e9 : 0;
}

std::optional<double> FractionOf(const Scenario& scenario, const Measured& m,
                                 const std::string& limit_id) {
  const Measured* limit = Find(scenario, limit_id);
  if (limit == nullptr || limit->seconds.empty() || m.seconds.empty()) return std::nullopt;
  const double limit_rate = GbpsPerRollout(scenario, *limit);
  if (limit_rate <= 0) return std::nullopt;
  return GbpsPerRollout(scenario, m) / limit_rate;
}

std::vector<const Measured*> Contestants(const Scenario& scenario) {
  std::vector<const Measured*> out;
  for (const Measured& m : scenario.results) {
    if (!m.limit) out.push_back(&m);
  }
  return out;
}

std::string Fixed(const std::optional<double>& value, int digits) {
  return value.has_value() ? absl::StrFormat("%.*f", digits, *value) : "-";
}

std::string JsonNumber(const std::optional<double>& value) {
  return value.has_value() ? absl::StrFormat("%.6g", *value) : "null";
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.0f", bytes / 1048576.0); }

}  // namespace

std::optional<Summary> Summarize(const Scenario& scenario, const std::string& id) {
  const Measured* m = Find(scenario, id);
  if (m == nullptr || m->seconds.empty()) return std::nullopt;
  Summary s;
  s.seconds_median = Median(m->seconds);
  s.seconds_min = Min(m->seconds);
  s.seconds_max = Max(m->seconds);
  s.gbps_per_rollout = GbpsPerRollout(scenario, *m);
  if (!m->limit) {
    for (const Measured* other : Contestants(scenario)) {
      if (other->seconds.empty() || s.seconds_median <= 0) continue;
      s.speedup[other->id] = Median(other->seconds) / s.seconds_median;
    }
  }
  if (!m->link_limit.empty()) s.fraction_of_link = FractionOf(scenario, *m, m->link_limit);
  if (m->id != "memcpy") s.fraction_of_memcpy = FractionOf(scenario, *m, "memcpy");
  return s;
}

std::string FormatTable(const Scenario& scenario) {
  const std::vector<const Measured*> contestants = Contestants(scenario);
  std::string out = absl::StrFormat(
      "%s, %s -> %s: %d trainer and %d rollout processes; the busiest rollout process must "
      "receive %.2f MiB per sync\n",
      scenario.model, scenario.from, scenario.to, scenario.trainers, scenario.rollouts,
      scenario.rollout_bytes / 1048576.0);
  absl::StrAppendFormat(&out, "%-12s %-22s %4s %8s %8s %8s %9s", "result", "transport", "runs",
                        "s/sync", "min", "max", "GB/s/roll");
  for (const Measured* c : contestants) absl::StrAppendFormat(&out, " %10s", "x " + c->id);
  absl::StrAppendFormat(&out, " %7s %7s  %s\n", "of link", "of mcpy", "verified");
  for (const Measured& m : scenario.results) {
    const std::optional<Summary> s = Summarize(scenario, m.id);
    if (!s.has_value()) {
      absl::StrAppendFormat(&out, "%-12s %-22s %4d  (no samples)\n", m.id, m.transport, 0);
      continue;
    }
    absl::StrAppendFormat(&out, "%-12s %-22s %4d %8.4f %8.4f %8.4f %9.3f", m.id, m.transport,
                          m.seconds.size(), s->seconds_median, s->seconds_min, s->seconds_max,
                          s->gbps_per_rollout);
    for (const Measured* c : contestants) {
      auto it = s->speedup.find(c->id);
      absl::StrAppendFormat(
          &out, " %10s",
          it == s->speedup.end() || c->id == m.id ? "-" : absl::StrFormat("%.2f", it->second));
    }
    absl::StrAppendFormat(&out, " %7s %7s  %s\n", Fixed(s->fraction_of_link, 2),
                          Fixed(s->fraction_of_memcpy, 2),
                          m.limit && !m.verified ? "n/a" : (m.verified ? "yes" : "NO"));
  }
  out += "peak RSS per process (MiB):\n";
  for (const Measured& m : scenario.results) {
    if (m.peak_rss_bytes.empty()) continue;
    absl::StrAppendFormat(
        &out, "  %-12s %s\n", m.id,
        absl::StrJoin(m.peak_rss_bytes, ", ", [](std::string* o, const auto& entry) {
          absl::StrAppend(o, entry.first, " ", MiB(entry.second));
        }));
  }
  for (const std::string& note : scenario.notes) absl::StrAppend(&out, note, "\n");
  return out;
}

std::string ToJson(const std::vector<Scenario>& scenarios, const std::string& date,
                   const std::string& machine, const std::string& command) {
  std::string json = absl::StrFormat("{\n  \"date\": %s,\n  \"machine\": %s,\n  \"command\": %s,\n",
                                     JsonString(date), JsonString(machine), JsonString(command));
  json += "  \"scenarios\": [";
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& sc = scenarios[i];
    absl::StrAppendFormat(
        &json,
        "%s\n    {\"model\": %s, \"from\": %s, \"to\": %s, \"trainers\": %d, \"rollouts\": %d, "
        "\"rollout_bytes\": %d,\n     \"notes\": [%s],\n     \"results\": [",
        i == 0 ? "" : ",", JsonString(sc.model), JsonString(sc.from), JsonString(sc.to),
        sc.trainers, sc.rollouts, sc.rollout_bytes,
        absl::StrJoin(sc.notes, ", ",
                      [](std::string* o, const std::string& n) { o->append(JsonString(n)); }));
    for (size_t j = 0; j < sc.results.size(); ++j) {
      const Measured& m = sc.results[j];
      const Summary s = Summarize(sc, m.id).value_or(Summary{});
      absl::StrAppendFormat(
          &json,
          "%s\n      {\"id\": %s, \"description\": %s, \"transport\": %s, \"limit\": %s, "
          "\"link_limit\": %s,\n       \"verified\": %s, \"verification\": %s,\n"
          "       \"seconds\": [%s],\n       \"seconds_median\": %.6g, \"seconds_min\": %.6g, "
          "\"seconds_max\": %.6g, \"gbps_per_rollout\": %.6g,\n       \"speedup\": {%s}, "
          "\"fraction_of_link\": %s, \"fraction_of_memcpy\": %s,\n       \"peak_rss_bytes\": "
          "{%s}}",
          j == 0 ? "" : ",", JsonString(m.id), JsonString(m.description), JsonString(m.transport),
          m.limit ? "true" : "false", JsonString(m.link_limit), m.verified ? "true" : "false",
          JsonString(m.verification),
          absl::StrJoin(m.seconds, ", ",
                        [](std::string* o, double v) { absl::StrAppendFormat(o, "%.6g", v); }),
          s.seconds_median, s.seconds_min, s.seconds_max, s.gbps_per_rollout,
          absl::StrJoin(s.speedup, ", ",
                        [](std::string* o, const auto& e) {
                          absl::StrAppendFormat(o, "%s: %.6g", JsonString(e.first), e.second);
                        }),
          JsonNumber(s.fraction_of_link), JsonNumber(s.fraction_of_memcpy),
          absl::StrJoin(m.peak_rss_bytes, ", ", [](std::string* o, const auto& e) {
            absl::StrAppendFormat(o, "%s: %d", JsonString(e.first), e.second);
          }));
    }
    json += "]}";
  }
  json += "\n  ]\n}\n";
  return json;
}

}  // namespace wsync::bench
