// The metrics of a session: the text exposition after known syncs (a qwen2.5-tiny
// megatron(tp=2) -> vllm(tp=2) job with every process as a thread, as in
// tests/plugin/session_test.cc) has the expected families, labels and values; the HTTP exporter
// serves the same text; the facade's helpers.

#include "metrics/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "metrics/descriptors.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// GET http://127.0.0.1:<port><path>; the whole response (headers and body), or "" on failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char chunk[4096];
  ssize_t n;
  while ((n = read(fd, chunk, sizeof(chunk))) > 0) response.append(chunk, n);
  close(fd);
  return response;
}

// The sum of the samples of `name` whose labels contain every one of `labels` (each `key="v"`);
// NaN when none matches.
double Sum(const std::string& text, const std::string& name,
           const std::vector<std::string>& labels = {}) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    const absl::string_view metric = series.substr(0, brace);
    if (metric != name) continue;
    const absl::string_view label_text =
        brace == absl::string_view::npos ? absl::string_view() : series.substr(brace);
    bool match = true;
    for (const std::string& label : labels) match = match && absl::StrContains(label_text, label);
    if (!match) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    sum += value;
    found = true;
  }
  return found ? sum : std::nan("");
}

using Process = test::TinySessionProcess;

Process MakeProcess(Role role, int32_t rank, int port, const std::string& job,
                    const std::string& metrics_address = "", const std::string& node_id = "") {
  SessionConfig config = test::TinyJobConfig(role, rank, port, job, "WSYNC_METRICS_TEST_SECRET");
  if (!node_id.empty()) config.node_id = node_id;
  // Short: the disagreeing sync below ends at the deadline on the processes that wait for the
  // one that refused.
  config.deadline = absl::Seconds(8);
  config.metrics_address = metrics_address;
  return test::MakeTinySessionProcess(config);
}

// Every process connects and syncs `versions` in order (trainers fill them first); returns each
// process's first failure.
std::vector<absl::Status> RunJob(std::vector<Process>& processes,
                                 const std::vector<std::vector<int64_t>>& versions, bool connect) {
  std::vector<absl::Status> results(processes.size());
  std::vector<std::thread> threads;
  for (int p = 0; p < static_cast<int>(processes.size()); ++p) {
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      if (connect) results[p] = me.session->Connect();
      for (int64_t v : versions[p]) {
        if (!results[p].ok()) break;
        if (p < 2) results[p] = test::FillLogical(me.part, v, me.memory.get());
        if (results[p].ok()) results[p] = me.session->Sync(v);
        if (results[p].ok() && p >= 2) results[p] = test::CheckLogical(me.part, *me.memory, v);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_METRICS_TEST_SECRET", "metrics-test-secret-0123456789abcdef", 1);
  }
};

TEST_F(MetricsTest, ExpositionAfterThreeSyncsHasTheFamiliesLabelsAndValues) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, "m"));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, "m"));
  const std::vector<int64_t> three = {1, 2, 3};
  std::vector<absl::Status> results = RunJob(processes, {three, three, three, three}, true);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];

  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    const bool rollout = p >= 2;
    const std::string role = rollout ? "role=\"rollout\"" : "role=\"trainer\"";
    const std::string text = processes[p].session->MetricsText();
    const TransferStats stats = processes[p].session->LastStats().stats;
    for (const char* family :
         {"wsync_syncs_total", "wsync_sync_duration_seconds", "wsync_last_sync_duration_seconds",
          "wsync_sync_predicted_seconds", "wsync_rounds", "wsync_rounds_total",
          "wsync_bytes_sent_total", "wsync_bytes_received_total", "wsync_direct_bytes_total",
          "wsync_staged_bytes_total", "wsync_local_copy_bytes_total", "wsync_arena_bytes",
          "wsync_arena_peak_bytes", "wsync_version", "wsync_state", "wsync_errors_total",
          "wsync_plan_info", "wsync_plan_inter_node_bytes"}) {
      EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", family, " "))) << family;
    }
    EXPECT_EQ(Sum(text, "wsync_version", {role}), 3);
    EXPECT_EQ(Sum(text, "wsync_state", {role, "state=\"consistent\""}), 1);
    EXPECT_EQ(Sum(text, "wsync_state", {"state=\"dirty\""}), 0);
    EXPECT_EQ(Sum(text, "wsync_syncs_total", {role, "result=\"ok\""}), 3);
    EXPECT_EQ(Sum(text, "wsync_syncs_total", {"result=\"failed\""}), 0);
    EXPECT_EQ(Sum(text, "wsync_sync_duration_seconds_count", {role}), 3);
    EXPECT_EQ(Sum(text, "wsync_sync_duration_seconds_bucket", {"le=\"0.001\""}) >= 0, true);
    EXPECT_EQ(Sum(text, "wsync_sync_duration_seconds_bucket", {"le=\"600\""}), 3);
    EXPECT_TRUE(std::isnan(Sum(text, "wsync_sync_predicted_seconds")));
    EXPECT_EQ(Sum(text, "wsync_rounds", {role}), stats.rounds);
    EXPECT_EQ(Sum(text, "wsync_rounds_total", {role}), 3 * stats.rounds);
    // Bytes by path class and transport: every peer of this job is intra_node over UCX shared
    // memory; the sums are the stats' figures, three times.
    EXPECT_EQ(Sum(text, "wsync_bytes_received_total"), 3 * stats.received_bytes);
    EXPECT_EQ(Sum(text, "wsync_bytes_sent_total"), 3 * stats.sent_bytes);
    EXPECT_EQ(Sum(text, rollout ? "wsync_bytes_received_total" : "wsync_bytes_sent_total",
                  {role, "path_class=\"intra_node\"", "transport=\"ucx:sm,cma,self\""}),
              3 * (rollout ? stats.received_bytes : stats.sent_bytes));
    EXPECT_EQ(Sum(text, "wsync_direct_bytes_total") + Sum(text, "wsync_staged_bytes_total"),
              3 * (stats.direct_bytes + stats.staged_bytes));
    EXPECT_EQ(Sum(text, "wsync_direct_bytes_total",
                  {rollout ? "direction=\"send\"" : "direction=\"receive\""}),
              0);
    EXPECT_EQ(Sum(text, "wsync_local_copy_bytes_total"), 3 * stats.local_copy_bytes);
    EXPECT_EQ(Sum(text, "wsync_arena_peak_bytes"), stats.peak_arena_bytes);
    EXPECT_GE(Sum(text, "wsync_arena_bytes"), 0);
    EXPECT_EQ(Sum(text, "wsync_errors_total"), 0);
    EXPECT_EQ(Sum(text, "wsync_errors_total", {role, "kind=\"ranks_disagree\""}), 0);
    EXPECT_EQ(Sum(text, "wsync_plan_info", {"digest=\""}), 1);
    // Every process of this job is on one node: nothing crosses a node boundary.
    EXPECT_EQ(Sum(text, "wsync_plan_inter_node_bytes", {"relay=\"with\""}), 0);
    EXPECT_EQ(Sum(text, "wsync_plan_inter_node_bytes", {"relay=\"without\""}), 0);
    // No calibration: the age family has no series, so the exposition leaves it out.
    EXPECT_TRUE(std::isnan(Sum(text, "wsync_calibration_age_seconds")));
    EXPECT_THAT(text, Not(HasSubstr("wsync_calibration_age_seconds")));
    if (rollout) {
      EXPECT_GT(stats.received_bytes, 0);
      EXPECT_EQ(Sum(text, "wsync_bytes_sent_total"), 0);
    }
  }
  // Every process agreed on one plan: one digest label everywhere.
  const std::string first = processes[0].session->MetricsText();
  const size_t at = first.find("digest=\"");
  ASSERT_NE(at, std::string::npos);
  const std::string digest = first.substr(at, first.find('"', at + 8) - at + 1);
  EXPECT_EQ(digest.size(), 8 + 16 + 1) << digest;
  for (int p = 1; p < 4; ++p) {
    EXPECT_THAT(processes[p].session->MetricsText(), HasSubstr(digest));
  }

  // A version the ranks disagree on fails everywhere: rollouts become dirty, errors count.
  results = RunJob(processes, {{4}, {5}, {4}, {4}}, false);
  for (int p = 0; p < 4; ++p) EXPECT_FALSE(results[p].ok()) << p;
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    const std::string text = processes[p].session->MetricsText();
    EXPECT_EQ(Sum(text, "wsync_syncs_total", {"result=\"failed\""}), 1);
    EXPECT_EQ(Sum(text, "wsync_syncs_total", {"result=\"ok\""}), 3);
    EXPECT_GE(Sum(text, "wsync_errors_total"), 1);
    EXPECT_EQ(Sum(text, "wsync_version"), 3);
    if (p >= 2) {
      EXPECT_EQ(Sum(text, "wsync_state", {"state=\"dirty\""}), 1);
    }
  }
  EXPECT_EQ(
      Sum(processes[1].session->MetricsText(), "wsync_errors_total", {"kind=\"ranks_disagree\""}),
      1);
}

TEST_F(MetricsTest, PlanInterNodeBytesCountWhatCrossesNodes) {
  // Trainers on node "a", rollouts on node "b": every byte the rollouts receive crosses, and
  // tp=2 rollouts need disjoint halves, so relaying saves nothing (with == without).
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) {
    processes.push_back(MakeProcess(Role::kTrainer, r, port, "nodes", "", "a"));
  }
  for (int r = 0; r < 2; ++r) {
    processes.push_back(MakeProcess(Role::kRollout, r, port, "nodes", "", "b"));
  }
  std::vector<absl::Status> results = RunJob(processes, {{1}, {1}, {1}, {1}}, true);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
  const int64_t crossing = processes[2].session->LastStats().stats.received_bytes +
                           processes[3].session->LastStats().stats.received_bytes;
  ASSERT_GT(crossing, 0);
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    const std::string text = processes[p].session->MetricsText();
    EXPECT_EQ(Sum(text, "wsync_plan_inter_node_bytes", {"relay=\"with\""}), crossing);
    EXPECT_EQ(Sum(text, "wsync_plan_inter_node_bytes", {"relay=\"without\""}), crossing);
  }
}

TEST_F(MetricsTest, ExporterServesTheExpositionOverHttp) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) {
    processes.push_back(MakeProcess(Role::kTrainer, r, port, "http", "127.0.0.1:0"));
  }
  for (int r = 0; r < 2; ++r) {
    processes.push_back(MakeProcess(Role::kRollout, r, port, "http", "127.0.0.1:0"));
  }
  for (const Process& process : processes) {
    EXPECT_GT(process.session->metrics_port(), 0);
    EXPECT_EQ(process.session->metrics_url(),
              absl::StrCat("http://127.0.0.1:", process.session->metrics_port(), "/metrics"));
  }
  const std::vector<int64_t> one = {1};
  std::vector<absl::Status> results = RunJob(processes, {one, one, one, one}, true);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
  const std::string response = HttpGet(processes[3].session->metrics_port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("wsync_version{role=\"rollout\"} 1"));
  EXPECT_EQ(Sum(response, "wsync_bytes_received_total"),
            processes[3].session->LastStats().stats.received_bytes);
  // A second exporter on a port in use is refused at Create.
  SessionConfig config;
  config.role = Role::kRollout;
  config.num_trainers = 1;
  config.num_rollouts = 1;
  config.job_id = "busy";
  config.coordinator_port = port;
  config.secret = SecretSource::Environment("WSYNC_METRICS_TEST_SECRET");
  config.metrics_address = absl::StrCat("127.0.0.1:", processes[0].session->metrics_port());
  absl::StatusOr<std::unique_ptr<Session>> busy = Session::Create(config);
  EXPECT_TRUE(absl::IsInvalidArgument(busy.status())) << busy.status();
  // Finalize stops the exporter.
  const int exporter = processes[3].session->metrics_port();
  processes[3].session->Finalize();
  EXPECT_EQ(processes[3].session->metrics_port(), 0);
  EXPECT_EQ(HttpGet(exporter, "/metrics"), "");
}

TEST(MetricsFacadeTest, AddressesErrorKindsAndBuckets) {
  absl::StatusOr<MetricsAddress> address = ParseMetricsAddress("0.0.0.0:9400");
  ASSERT_TRUE(address.ok());
  EXPECT_EQ(address->host, "0.0.0.0");
  EXPECT_EQ(address->port, 9400);
  address = ParseMetricsAddress("9401");
  ASSERT_TRUE(address.ok());
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_EQ(address->port, 9401);
  address = ParseMetricsAddress(":0");
  ASSERT_TRUE(address.ok());
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_EQ(address->port, 0);
  address = ParseMetricsAddress("localhost");
  ASSERT_TRUE(address.ok());
  EXPECT_EQ(address->host, "localhost");
  EXPECT_EQ(address->port, 0);
  EXPECT_FALSE(ParseMetricsAddress("127.0.0.1:70000").ok());
  EXPECT_FALSE(ParseMetricsAddress("127.0.0.1:x").ok());

  EXPECT_EQ(MetricErrorKind(WithErrorKind(absl::InternalError("x"), kErrorLayoutRefused)),
            "layout_refused");
  EXPECT_EQ(MetricErrorKind(absl::DeadlineExceededError("x")), "timed_out");
  EXPECT_EQ(MetricErrorKind(absl::UnavailableError("x")), "peer_lost");
  EXPECT_EQ(MetricErrorKind(WithErrorKind(absl::UnknownError("x"), "no_such_kind")), "internal");
  // Every error kind a status can carry is its own label value.
  for (absl::string_view kind :
       {kErrorWrongState, kErrorLayoutRefused, kErrorRanksDisagree, kErrorAuthentication}) {
    EXPECT_EQ(MetricErrorKind(WithErrorKind(absl::UnknownError("x"), kind)), kind);
  }

  const std::vector<double> buckets = SyncDurationBuckets();
  EXPECT_EQ(buckets.front(), 0.001);
  EXPECT_EQ(buckets.back(), 600);
  for (size_t i = 1; i < buckets.size(); ++i) EXPECT_LT(buckets[i - 1], buckets[i]);

  SessionMetrics metrics("trainer");
  metrics.RecordError(absl::DataLossError("x"));
  metrics.RecordError("not a kind");
  metrics.SetCalibrationTime(absl::Now() - absl::Seconds(100));
  metrics.RecordSync(SyncResult::kOk, 0.5, 0.25);
  const std::string text = metrics.Text();
  EXPECT_EQ(Sum(text, "wsync_errors_total", {"kind=\"data_loss\""}), 1);
  EXPECT_EQ(Sum(text, "wsync_errors_total", {"kind=\"internal\""}), 1);
  EXPECT_GE(Sum(text, "wsync_calibration_age_seconds"), 100);
  EXPECT_EQ(Sum(text, "wsync_sync_predicted_seconds"), 0.25);
  EXPECT_EQ(Sum(text, "wsync_last_sync_duration_seconds"), 0.5);
  EXPECT_EQ(Sum(text, "wsync_sync_duration_seconds_bucket", {"le=\"0.25\""}), 0);
  EXPECT_EQ(Sum(text, "wsync_sync_duration_seconds_bucket", {"le=\"0.5\""}), 1);
  EXPECT_EQ(Sum(text, "wsync_version"), -1);
  EXPECT_EQ(Sum(text, "wsync_state"), 0);
}

}  // namespace
}  // namespace wsync

namespace wsync {
namespace {

// The exposition of a fresh session has every row of kMetricDescriptors, with its help and type,
// and no family the table lacks; every series carries `role` and the row's labels.
TEST(MetricsDescriptorsTest, ExpositionIsTheTable) {
  SessionMetrics metrics("rollout");
  metrics.BindPaths({{"intra_node", "ucx", MetricDirection::kSend, 10},
                     {"intra_node", "ucx", MetricDirection::kReceive, 20}});
  metrics.SetPlanDigest("00ff");
  metrics.SetCalibrationTime(absl::Now());
  metrics.SetCoordinatorSource([] { return CoordinatorFigures{}; });
  const std::string text = metrics.Text();
  int families = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "# TYPE ")) ++families;
  }
  EXPECT_EQ(families, static_cast<int>(kMetricFamilyCount));
  for (const MetricDescriptor& row : kMetricDescriptors) {
    SCOPED_TRACE(row.name);
    const absl::string_view type = row.type == MetricType::kCounter ? "counter"
                                   : row.type == MetricType::kGauge ? "gauge"
                                                                    : "histogram";
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("# HELP ", row.name, " ", row.help, "\n")));
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("# TYPE ", row.name, " ", type, "\n")));
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!absl::StartsWith(line, absl::StrCat(row.name, "{"))) continue;
      EXPECT_TRUE(absl::StrContains(line, "role=\"rollout\"")) << line;
      if (!row.label.empty()) {
        EXPECT_TRUE(absl::StrContains(line, absl::StrCat(row.label, "=\""))) << line;
      }
      if (!row.second_label.empty()) {
        EXPECT_TRUE(absl::StrContains(line, absl::StrCat(row.second_label, "=\""))) << line;
      }
    }
  }
  EXPECT_EQ(FindMetricDescriptor("wsync_no_such_family"), nullptr);
}

// A coordinator's figures, read at each exposition: the gauges take the latest values, and the
// refusals add what they grew by since the last reading to wsync_rejected_messages_total (a
// reason outside the set counts as "other"); a new source counts from zero, none leaves the
// last values.
TEST(MetricsCoordinatorTest, FiguresAreReadAtEachExposition) {
  SessionMetrics metrics("trainer");
  EXPECT_TRUE(std::isnan(Sum(metrics.Text(), "wsync_coordinator_processes")));
  CoordinatorFigures figures;
  figures.expected = 4;
  figures.joined = 3;
  figures.lost = 1;
  figures.in_phase = {1, 0, 2, 0, 1};
  figures.sync_bytes_done = 300;
  figures.sync_bytes_total = 1000;
  figures.refused = {{"authentication_failed", 2}, {"no_such_reason", 1}};
  metrics.SetCoordinatorSource([&figures] { return figures; });
  std::string text = metrics.Text();
  EXPECT_EQ(Sum(text, "wsync_coordinator_processes", {"state=\"expected\""}), 4);
  EXPECT_EQ(Sum(text, "wsync_coordinator_processes", {"state=\"joined\""}), 3);
  EXPECT_EQ(Sum(text, "wsync_coordinator_processes", {"state=\"lost\""}), 1);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_processes", {"phase=\"transferring\""}), 2);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_processes", {"phase=\"voting\""}), 1);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_processes"), 4);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_bytes", {"progress=\"done\""}), 300);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_bytes", {"progress=\"total\""}), 1000);
  EXPECT_EQ(Sum(text, "wsync_rejected_messages_total", {"reason=\"authentication_failed\""}), 2);
  EXPECT_EQ(Sum(text, "wsync_rejected_messages_total", {"reason=\"other\""}), 1);
  figures.refused = {{"authentication_failed", 5}, {"no_such_reason", 1}};
  figures.in_phase = {4, 0, 0, 0, 0};
  text = metrics.Text();
  EXPECT_EQ(Sum(text, "wsync_rejected_messages_total", {"reason=\"authentication_failed\""}), 5);
  EXPECT_EQ(Sum(text, "wsync_rejected_messages_total", {"reason=\"other\""}), 1);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_processes", {"phase=\"idle\""}), 4);
  EXPECT_EQ(Sum(text, "wsync_coordinator_sync_processes", {"phase=\"transferring\""}), 0);
  // Another coordinator (a reconnect): its own totals add from zero.
  CoordinatorFigures next;
  next.refused = {{"authentication_failed", 1}};
  metrics.SetCoordinatorSource([&next] { return next; });
  text = metrics.Text();
  EXPECT_EQ(Sum(text, "wsync_rejected_messages_total", {"reason=\"authentication_failed\""}), 6);
  metrics.SetCoordinatorSource(nullptr);
  next.expected = 9;
  EXPECT_EQ(Sum(metrics.Text(), "wsync_coordinator_processes", {"state=\"expected\""}), 0);
}

// The exporter's server thread collects under the exception firewall: a coordinator source that
// throws is counted as an internal error and the scrape is still answered; the process lives.
// As the coordinator (CoordinatorOptions::allow_any_address): every interface only when allowed.
TEST(MetricsFacadeTest, TheExporterRefusesTheWildcardAddressUnlessAllowed) {
  SessionMetrics metrics("trainer");
  for (const char* wildcard : {"0:0", "0.0.0.0:0"}) {  // inet_aton's spellings count too.
    SCOPED_TRACE(wildcard);
    absl::StatusOr<MetricsAddress> address = ParseMetricsAddress(wildcard);
    ASSERT_TRUE(address.ok()) << address.status();
    const absl::Status refused = metrics.StartExporter(*address);
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("wildcard"));
    EXPECT_EQ(metrics.exporter_port(), 0);
  }
  MetricsAddress allowed = *ParseMetricsAddress("0.0.0.0:0");
  allowed.allow_any_address = true;
  const absl::Status started = metrics.StartExporter(allowed);
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_GT(metrics.exporter_port(), 0);
}

TEST(MetricsCoordinatorTest, ASourceThatThrowsIsCountedAndTheScrapeAnswered) {
  SessionMetrics metrics("trainer");
  absl::StatusOr<MetricsAddress> address = ParseMetricsAddress("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  ASSERT_TRUE(metrics.StartExporter(*address).ok());
  metrics.SetCoordinatorSource([]() -> CoordinatorFigures {
    throw std::runtime_error("the coordinator's figures are gone");
  });
  for (int scrape = 1; scrape <= 2; ++scrape) {
    const std::string response = HttpGet(metrics.exporter_port(), "/metrics");
    EXPECT_THAT(response, HasSubstr("200 OK"));
    EXPECT_THAT(response, HasSubstr("wsync_syncs_total"));
  }
  EXPECT_GE(Sum(metrics.Text(), "wsync_errors_total", {"kind=\"internal\""}), 3);
  metrics.StopExporter();
}

}  // namespace
}  // namespace wsync
