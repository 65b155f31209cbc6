#include "integration/cli/plan_quant.h"

#include "absl/strings/str_format.h"
#include "integration/cli/plan_pricing.h"
#include "planner/quant_plan.h"

namespace wsync::cli {

void PrintQuant(std::FILE* out, const Job& job, const Plan& plan) {
  if (!job.HasQuantizedParams()) return;
  int64_t sender = 0, receiver = 0;
  for (const QuantTransform& step : plan.quant.transforms) {
    ++(step.side == QuantSide::kSender ? sender : receiver);
  }
  const QuantWireBytes bytes = CountQuantWireBytes(job, plan.quant);
  auto ratio = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / b : 0.0; };
  absl::FPrintF(out,
                "\nquantization: %d steps at the sender, %d at the receiver (%d gathers)\n"
                "quantized parameters on the wire: %s (%d B: e4m3 %s, scales %s, gathered %s)\n"
                "  without quantizing at the sender: %s (%d B), ratio %.3f\n"
                "  unquantized (source dtype): %s (%d B), ratio %.3f\n",
                sender, receiver, plan.quant.gathers.size(), HumanBytes(bytes.total()),
                bytes.total(), HumanBytes(bytes.fp8), HumanBytes(bytes.scales),
                HumanBytes(bytes.gathered), HumanBytes(bytes.without_sender_quant),
                bytes.without_sender_quant, ratio(bytes.total(), bytes.without_sender_quant),
                HumanBytes(bytes.unquantized), bytes.unquantized,
                ratio(bytes.total(), bytes.unquantized));
}

}  // namespace wsync::cli
