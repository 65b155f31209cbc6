// The settings table (plugin/settings.h) against the C ABI's config and ToSessionConfig:
//   - every field of wsync_config_t is listed here, in order, as a setting or not; the list tiles
//     the struct (a field added to wsync.h and not here fails), and each setting has exactly one
//     row, at its field's offset, of a type of the field's size;
//   - a config with every setting unset converts to the table's defaults;
//   - an unset field takes its variable; a bad variable is refused naming it; a set field wins.

#include "plugin/settings.h"

#include <cstddef>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "plugin/c_config.h"
#include "wsync/wsync.h"

namespace wsync {
namespace {

struct Field {
  const char* name;
  size_t offset;
  size_t size;
  bool setting;
};

#define FIELD(name, setting) \
  Field { #name, offsetof(wsync_config_t, name), sizeof(wsync_config_t::name), setting }

// Every field of wsync_config_t, in order (settings.h says why the others are not settings).
const std::vector<Field>& AllFields() {
  static const std::vector<Field>* const fields = new std::vector<Field>{
      FIELD(struct_size, false),
      FIELD(role, false),
      FIELD(rank, false),
      FIELD(num_trainers, false),
      FIELD(num_rollouts, false),
      FIELD(job_id, false),
      FIELD(coordinator_host, true),
      FIELD(coordinator_port, true),
      FIELD(host_coordinator, false),
      FIELD(secret_file, true),
      FIELD(secret_env, true),
      FIELD(node_id, true),
      FIELD(staging_budget_bytes, true),
      FIELD(deadline_seconds, true),
      FIELD(replica_policy, true),
      FIELD(path_transports, true),
      FIELD(metrics_address, true),
      FIELD(calibration_file, true),
      FIELD(verify, true),
      FIELD(heartbeat_interval_seconds, true),
      FIELD(silence_limit_seconds, true),
      FIELD(has_device_index, false),
      FIELD(device_index, false),
      FIELD(delta, true),
      FIELD(secret, true),
      FIELD(secret_length, false),
      FIELD(metrics_allow_any_address, true),
      FIELD(delta_budget_bytes, true),
  };
  return *fields;
}

#undef FIELD

size_t SizeOf(SettingType type) {
  switch (type) {
    case SettingType::kBool:
    case SettingType::kPort:
    case SettingType::kEnum:
      return sizeof(int32_t);
    case SettingType::kBytes:
      return sizeof(int64_t);
    case SettingType::kSeconds:
      return sizeof(double);
    case SettingType::kString:
    case SettingType::kSecret:
      return sizeof(const char*);
  }
  return 0;
}

// Clears every variable of the table for the test, and restores nothing (the test's process
// has none set by the suite).
class SettingsTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearVariables(); }
  void TearDown() override { ClearVariables(); }
  static void ClearVariables() {
    for (const Setting& setting : Settings()) {
      if (!setting.variable.empty()) unsetenv(std::string(setting.variable).c_str());
    }
  }
  static wsync_config_t MinimalConfig() {
    wsync_config_t c{};
    c.struct_size = sizeof(c);
    c.role = WSYNC_ROLE_TRAINER;
    c.num_trainers = 1;
    c.job_id = "settings-test";
    return c;
  }
  template <typename T>
  static T Default(absl::string_view name) {
    const Setting* setting = FindSetting(name);
    EXPECT_NE(setting, nullptr) << name;
    return std::get<T>(setting->default_value);
  }
};

TEST_F(SettingsTest, EveryFieldIsListedAndEverySettingHasExactlyOneRow) {
  size_t end = 0;
  int settings = 0;
  for (const Field& field : AllFields()) {
    // In order, and nothing but padding between fields (less than the next field's size).
    EXPECT_GE(field.offset, end) << field.name;
    EXPECT_LT(field.offset - end, std::max<size_t>(field.size, 1)) << field.name;
    end = field.offset + field.size;
    int rows = 0;
    for (const Setting& setting : Settings()) rows += setting.name == field.name;
    EXPECT_EQ(rows, field.setting ? 1 : 0) << field.name;
    if (!field.setting || rows != 1) continue;
    ++settings;
    const Setting& setting = *FindSetting(field.name);
    EXPECT_EQ(setting.offset, field.offset) << field.name;
    EXPECT_EQ(SizeOf(setting.type), field.size) << field.name;
    EXPECT_FALSE(setting.help.empty()) << field.name;
    if (!setting.variable.empty()) {
      EXPECT_EQ(setting.variable, "WSYNC_" + absl::AsciiStrToUpper(setting.name)) << field.name;
    }
  }
  // A field appended to wsync.h and not listed above leaves the struct longer than the list.
  EXPECT_LT(sizeof(wsync_config_t) - end, alignof(wsync_config_t));
  EXPECT_EQ(static_cast<int>(Settings().size()), settings);
}

TEST_F(SettingsTest, UnsetFieldsTakeTheTablesDefaults) {
  absl::StatusOr<SessionConfig> config = ToSessionConfig(MinimalConfig());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator_host, Default<std::string>("coordinator_host"));
  EXPECT_EQ(config->coordinator_port, Default<int64_t>("coordinator_port"));
  EXPECT_EQ(config->secret.kind, SecretSource::Kind::kEnvironment);
  EXPECT_EQ(config->secret.name, Default<std::string>("secret_env"));
  EXPECT_EQ(config->node_id, Default<std::string>("node_id"));  // Empty: the host name.
  EXPECT_EQ(config->staging_budget_bytes, Default<int64_t>("staging_budget_bytes"));
  EXPECT_EQ(config->staging_budget_bytes, 64 << 20);
  EXPECT_EQ(config->deadline, absl::Seconds(Default<double>("deadline_seconds")));
  EXPECT_EQ(config->replica_policy, Default<std::string>("replica_policy"));
  EXPECT_EQ(config->path_transports, Default<std::string>("path_transports"));
  EXPECT_EQ(config->metrics_address, Default<std::string>("metrics_address"));
  EXPECT_EQ(config->calibration_file, Default<std::string>("calibration_file"));
  EXPECT_EQ(static_cast<int64_t>(config->verify), Default<int64_t>("verify"));
  EXPECT_EQ(config->heartbeat_interval,
            absl::Seconds(Default<double>("heartbeat_interval_seconds")));
  EXPECT_EQ(config->heartbeat_interval, absl::Milliseconds(250));
  EXPECT_EQ(config->silence_limit, absl::Seconds(Default<double>("silence_limit_seconds")));
  EXPECT_EQ(static_cast<int64_t>(config->delta), Default<int64_t>("delta"));
  EXPECT_EQ(config->metrics_allow_any_address, Default<int64_t>("metrics_allow_any_address") != 0);
  EXPECT_EQ(config->delta_budget_bytes, Default<int64_t>("delta_budget_bytes"));
  EXPECT_EQ(config->delta_budget_bytes, int64_t{16} << 30);
}

TEST_F(SettingsTest, UnsetFieldsTakeTheirVariables) {
  setenv("WSYNC_COORDINATOR_HOST", "10.0.0.7", 1);
  setenv("WSYNC_COORDINATOR_PORT", "29500", 1);
  setenv("WSYNC_NODE_ID", "node7", 1);
  setenv("WSYNC_STAGING_BUDGET_BYTES", "1048576", 1);
  setenv("WSYNC_DEADLINE_SECONDS", "5.5", 1);
  setenv("WSYNC_REPLICA_POLICY", "first_holder", 1);
  setenv("WSYNC_VERIFY", "keyed", 1);
  setenv("WSYNC_HEARTBEAT_INTERVAL_SECONDS", "0.1", 1);
  setenv("WSYNC_SILENCE_LIMIT_SECONDS", "2", 1);
  setenv("WSYNC_DELTA", "1", 1);
  setenv("WSYNC_METRICS_ALLOW_ANY_ADDRESS", "yes", 1);
  setenv("WSYNC_DELTA_BUDGET_BYTES", "4096", 1);
  absl::StatusOr<SessionConfig> config = ToSessionConfig(MinimalConfig());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator_host, "10.0.0.7");
  EXPECT_EQ(config->coordinator_port, 29500);
  EXPECT_EQ(config->node_id, "node7");
  EXPECT_EQ(config->staging_budget_bytes, 1048576);
  EXPECT_EQ(config->deadline, absl::Seconds(5.5));
  EXPECT_EQ(config->replica_policy, "first_holder");
  EXPECT_EQ(config->verify, VerifyMode::kKeyed);
  EXPECT_EQ(config->heartbeat_interval, absl::Seconds(0.1));
  EXPECT_EQ(config->silence_limit, absl::Seconds(2));
  EXPECT_EQ(config->delta, DeltaMode::kAuto);
  EXPECT_TRUE(config->metrics_allow_any_address);
  EXPECT_EQ(config->delta_budget_bytes, 4096);
}

TEST_F(SettingsTest, AFieldTheHostSetWinsAndItsVariableIsNotRead) {
  setenv("WSYNC_DEADLINE_SECONDS", "5", 1);
  setenv("WSYNC_REPLICA_POLICY", "first_holder", 1);
  setenv("WSYNC_STAGING_BUDGET_BYTES", "not a number", 1);  // Not read: the field is set.
  wsync_config_t c = MinimalConfig();
  c.deadline_seconds = 30;
  c.replica_policy = "cost_aware";
  c.staging_budget_bytes = 4096;
  absl::StatusOr<SessionConfig> config = ToSessionConfig(c);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->deadline, absl::Seconds(30));
  EXPECT_EQ(config->replica_policy, "cost_aware");
  EXPECT_EQ(config->staging_budget_bytes, 4096);
}

TEST_F(SettingsTest, ABadVariableIsRefusedByName) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"WSYNC_DEADLINE_SECONDS", "soon"},
      {"WSYNC_DEADLINE_SECONDS", "-1"},
      {"WSYNC_DEADLINE_SECONDS", "inf"},
      {"WSYNC_STAGING_BUDGET_BYTES", "0"},
      {"WSYNC_STAGING_BUDGET_BYTES", "64M"},
      {"WSYNC_COORDINATOR_PORT", "70000"},
      {"WSYNC_COORDINATOR_HOST", ""},
      {"WSYNC_VERIFY", "maybe"},
      {"WSYNC_DELTA", "3"},
      {"WSYNC_METRICS_ALLOW_ANY_ADDRESS", "2"},
      {"WSYNC_DELTA_BUDGET_BYTES", "-4096"},
  };
  for (const auto& [variable, value] : bad) {
    setenv(variable, value, 1);
    absl::StatusOr<SessionConfig> config = ToSessionConfig(MinimalConfig());
    EXPECT_TRUE(absl::IsInvalidArgument(config.status())) << variable << "=" << value;
    EXPECT_TRUE(
        absl::StrContains(config.status().message(), absl::StrCat(variable, "='", value, "'")))
        << config.status();
    unsetenv(variable);
  }
}

TEST_F(SettingsTest, ValuesReadAsTheVariablesTakeThem) {
  const Setting& budget = *FindSetting("staging_budget_bytes");
  EXPECT_EQ(FormatSettingValue(budget, budget.default_value), "67108864 (64 MiB)");
  const Setting& delta = *FindSetting("delta");
  EXPECT_EQ(FormatSettingValue(delta, *ParseSettingValue(delta, "2")), "on");
  EXPECT_EQ(std::get<int64_t>(*ParseSettingValue(delta, "auto")), WSYNC_DELTA_AUTO);
  const Setting& node = *FindSetting("node_id");
  EXPECT_EQ(FormatSettingValue(node, node.default_value), "the host name");
  const Setting& secret = *FindSetting("secret");
  EXPECT_TRUE(secret.variable.empty());
  EXPECT_FALSE(ParseSettingValue(secret, "hunter2").ok());
  EXPECT_EQ(FindSetting("rank"), nullptr);
  EXPECT_EQ(FindSetting("job_id"), nullptr);
}

TEST_F(SettingsTest, TheTextNamesEveryVariableAndWhereItsValueComesFrom) {
  setenv("WSYNC_DEADLINE_SECONDS", "7", 1);
  std::string text;
  ASSERT_TRUE(SettingsText(&text).ok());
  for (const Setting& setting : Settings()) {
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("# ", setting.name, " ("))) << setting.name;
  }
  EXPECT_TRUE(absl::StrContains(text,
                                "# default 60; value from the environment\n"
                                "WSYNC_DEADLINE_SECONDS=7\n"));
  EXPECT_TRUE(absl::StrContains(text, "WSYNC_STAGING_BUDGET_BYTES=67108864\n"));
  setenv("WSYNC_DELTA", "sometimes", 1);
  text.clear();
  const absl::Status refused = SettingsText(&text);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_TRUE(absl::StrContains(refused.message(), "WSYNC_DELTA='sometimes'")) << refused;
  EXPECT_TRUE(absl::StrContains(text, "WSYNC_DELTA=sometimes\n"));
}

}  // namespace
}  // namespace wsync
