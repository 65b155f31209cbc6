#include "integration/cli/coordinator_command.h"

#include <signal.h>

#include <cstdio>
#include <fstream>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/coordinator.h"
#include "metrics/metrics.h"
#include "plugin/coordinator_figures.h"

ABSL_FLAG(std::string, job, "wsync", "Job id every process must present.");
ABSL_FLAG(std::string, address, "127.0.0.1",
          "Address to listen on; the wildcard only with --allow_any_address.");
ABSL_FLAG(int32_t, port, 0, "Port to listen on; 0 picks one (see --port_file).");
ABSL_FLAG(bool, allow_any_address, false,
          "Allow listening on 0.0.0.0 or :: (the coordinator's --address and --metrics_address).");
ABSL_FLAG(int32_t, trainers, 0, "Trainer processes of the job.");
ABSL_FLAG(int32_t, rollouts, 0, "Rollout processes of the job.");
ABSL_FLAG(std::string, secret_file, "", "File holding the job secret (mode 0600).");
ABSL_FLAG(std::string, secret_env, "", "Environment variable holding the job secret.");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once listening.");
ABSL_FLAG(double, rendezvous_timeout_s, 600, "Seconds every process has to join.");
ABSL_FLAG(int32_t, heartbeat_interval_ms,
          static_cast<int32_t>(absl::ToInt64Milliseconds(wsync::kDefaultHeartbeatInterval)),
          "Milliseconds between heartbeats; 0: none, and no silence limit.");
ABSL_FLAG(double, silence_limit_s, absl::ToDoubleSeconds(wsync::kDefaultSilenceLimit),
          "Seconds of silence (no frame, not even a heartbeat) after which a process is lost.");
ABSL_FLAG(std::string, metrics_address, "",
          "`wsync coordinator`: serve its Prometheus metrics (wsync_coordinator_*, refused "
          "connections in wsync_rejected_messages_total) on HOST:PORT at /metrics; empty: none.");

namespace wsync::cli {
namespace {

absl::Status Serve() {
  const std::string file = absl::GetFlag(FLAGS_secret_file);
  const std::string env = absl::GetFlag(FLAGS_secret_env);
  if (file.empty() == env.empty()) {
    return absl::InvalidArgumentError("give exactly one of --secret_file and --secret_env");
  }
  CoordinatorOptions options;
  WSYNC_ASSIGN_OR_RETURN(options.secret, LoadSecret(file.empty() ? SecretSource::Environment(env)
                                                                 : SecretSource::File(file)));
  options.job_id = absl::GetFlag(FLAGS_job);
  options.address = absl::GetFlag(FLAGS_address);
  options.port = absl::GetFlag(FLAGS_port);
  options.allow_any_address = absl::GetFlag(FLAGS_allow_any_address);
  options.num_trainers = absl::GetFlag(FLAGS_trainers);
  options.num_rollouts = absl::GetFlag(FLAGS_rollouts);
  options.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  options.silence_limit = absl::Seconds(absl::GetFlag(FLAGS_silence_limit_s));

  // Block the stop signals before any thread starts, so that only sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator,
                         Coordinator::Start(std::move(options)));
  absl::PrintF(
      "wsync coordinator: job %s listening on %s port %d for %d trainers and %d "
      "rollouts\n",
      absl::GetFlag(FLAGS_job), coordinator->address(), coordinator->port(),
      absl::GetFlag(FLAGS_trainers), absl::GetFlag(FLAGS_rollouts));
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    // Written to a temporary name and renamed, so that a reader never sees a partial port.
    const std::string path = absl::GetFlag(FLAGS_port_file);
    const std::string temporary = path + ".tmp";
    std::ofstream(temporary) << coordinator->port() << "\n";
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrFormat("cannot write %s", path));
    }
  }
  std::unique_ptr<SessionMetrics> metrics;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_address); !address.empty()) {
    WSYNC_ASSIGN_OR_RETURN(MetricsAddress parsed, ParseMetricsAddress(address));
    parsed.allow_any_address = absl::GetFlag(FLAGS_allow_any_address);
    metrics = std::make_unique<SessionMetrics>("coordinator");
    WSYNC_RETURN_IF_ERROR(metrics->StartExporter(parsed));
    const Coordinator* served = coordinator.get();
    const int32_t world = absl::GetFlag(FLAGS_trainers) + absl::GetFlag(FLAGS_rollouts);
    metrics->SetCoordinatorSource([served, world] { return FiguresOf(served->counters(), world); });
    absl::PrintF("wsync coordinator: metrics at %s\n", metrics->exporter_url());
    std::fflush(stdout);
  }
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  if (metrics != nullptr) metrics->SetCoordinatorSource(nullptr);
  coordinator->Stop();
  const CoordinatorCounters counters = coordinator->counters();
  absl::PrintF("wsync coordinator: stopped by signal %d; %d joined, %d connections refused\n",
               signal_number, counters.joined, counters.TotalRefused());
  return absl::OkStatus();
}

}  // namespace

std::string CoordinatorUsage() {
  return "usage: wsync coordinator --job J --trainers T --rollouts R (--secret_file F | "
         "--secret_env V)\n"
         "                  [--address A] [--port P] [--port_file F] [--rendezvous_timeout_s S]\n"
         "                  [--metrics_address HOST:PORT]\n"
         "  Runs the job's coordinator until SIGINT or SIGTERM.\n";
}

int CoordinatorMain(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = Serve();
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync coordinator: %s\n", status.ToString());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace wsync::cli
