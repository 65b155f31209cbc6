#ifndef WSYNC_INTEGRATION_CLI_PLAN_QUANT_H_
#define WSYNC_INTEGRATION_CLI_PLAN_QUANT_H_

// `wsync plan`'s report of the quantization steps of FP8 targets (planner/quant_plan.h).

#include <cstdio>

#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

// Nothing when the job quantizes nothing. Otherwise the steps by side and the bytes of the
// quantized parameters on the wire: as planned (e4m3 + scales from senders, source-dtype gathers
// for receiver-side blocks), without quantizing at the sender (every block gathered in the source
// dtype) and unquantized, with the planned bytes' ratio to each.
void PrintQuant(std::FILE* out, const Job& job, const Plan& plan);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_QUANT_H_
