// integration/host/setting_args.h: a host program's settings arguments, taken out of argv before
// its flags are parsed and applied through the loaded libwsync.so's config_set (issue 43).

#include "integration/host/setting_args.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "integration/host/plugin_host.h"

namespace wsync::host {
namespace {

// argv as a program receives it: NULL-terminated, pointing into `arguments`.
struct Argv {
  explicit Argv(std::vector<std::string> list) : arguments(std::move(list)) {
    for (std::string& argument : arguments) pointers.push_back(argument.data());
    pointers.push_back(nullptr);
    argc = static_cast<int>(arguments.size());
  }
  std::vector<std::string> Remaining() const {
    std::vector<std::string> remaining;
    for (int i = 0; i < argc; ++i) remaining.push_back(pointers[i]);
    EXPECT_EQ(pointers[argc], nullptr);
    return remaining;
  }
  std::vector<std::string> arguments;
  std::vector<char*> pointers;
  int argc = 0;
};

SettingArgs SomeRows() {
  return SettingArgs::FromRows({
      {"node_id", "text", "", "the host name", "WSYNC_NODE_ID", "This process's node.", ""},
      {"deadline_seconds", "seconds", "60", "", "WSYNC_DEADLINE_SECONDS", "The limit.", ""},
      {"verify", "choice", "off", "", "WSYNC_VERIFY", "Integrity.", "off,hash,keyed"},
      {"secret", "secret", "", "none", "", "The secret's bytes.", ""},
      {"metrics_allow_any_address", "bool", "0", "", "", "Wildcards.", ""},
  });
}

TEST(SettingArgsTest, TakesEveryFormAndLeavesTheOtherArgumentsInOrder) {
  SettingArgs settings = SomeRows();
  Argv argv({"host", "--steps=3", "--deadline_seconds=5", "--node_id", "n1", "positional",
             "--metrics_allow_any_address", "--deadline_seconds", "7", "--verify=keyed", "--",
             "--node_id=after-the-end"});
  ASSERT_TRUE(settings.Take(&argv.argc, argv.pointers.data()).ok());
  EXPECT_EQ(argv.Remaining(), (std::vector<std::string>{"host", "--steps=3", "positional", "--",
                                                        "--node_id=after-the-end"}));
  EXPECT_EQ(settings.Value("deadline_seconds"), "7");  // The last one given.
  EXPECT_EQ(settings.Value("node_id"), "n1");
  EXPECT_EQ(settings.Value("metrics_allow_any_address"), "1");  // A bool alone.
  EXPECT_EQ(settings.Value("verify"), "keyed");
  EXPECT_EQ(settings.Value("secret"), std::nullopt);
  // In the table's order, to hand on to the processes a launcher starts.
  EXPECT_EQ(settings.Arguments(),
            (std::vector<std::string>{"--node_id=n1", "--deadline_seconds=7", "--verify=keyed",
                                      "--metrics_allow_any_address=1"}));
}

TEST(SettingArgsTest, RefusesTheSecretAndAFlagWithoutItsValue) {
  {
    SettingArgs settings = SomeRows();
    Argv argv({"host", "--secret=0123456789abcdef0123456789abcdef"});
    const absl::Status status = settings.Take(&argv.argc, argv.pointers.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("--secret is never given as an argument"), std::string::npos)
        << status;
  }
  {
    SettingArgs settings = SomeRows();
    Argv argv({"host", "--node_id"});
    const absl::Status status = settings.Take(&argv.argc, argv.pointers.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("--node_id needs a value"), std::string::npos) << status;
  }
}

TEST(SettingArgsTest, PeekFindsTheLastValueBeforeTheEndOfTheFlags) {
  Argv argv({"host", "--library=a.so", "--x", "--library", "b.so", "--", "--library=c.so"});
  EXPECT_EQ(PeekArgument(argv.argc, argv.pointers.data(), "library"), "b.so");
  EXPECT_EQ(PeekArgument(argv.argc, argv.pointers.data(), "missing"), std::nullopt);
}

// Against the library itself: its table is what the arguments are, config_set writes the fields.
TEST(SettingArgsTest, TheLibrarysTableParsesAndWritesTheFields) {
  absl::StatusOr<std::unique_ptr<Plugin>> plugin = Plugin::Load(WSYNC_PLUGIN_PATH);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  absl::StatusOr<SettingArgs> settings = SettingArgs::FromLibrary(**plugin);
  ASSERT_TRUE(settings.ok()) << settings.status();
  std::vector<std::string> names;
  for (const SettingRow& row : settings->rows()) names.push_back(row.name);
  for (const char* name : {"coordinator_host", "deadline_seconds", "staging_budget_bytes", "verify",
                           "delta", "path_transports", "delta_budget_bytes"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  const std::string help = settings->HelpText();
  EXPECT_NE(help.find("--verify=off|hash|keyed"), std::string::npos) << help;
  EXPECT_NE(help.find("WSYNC_DEADLINE_SECONDS"), std::string::npos) << help;
  EXPECT_EQ(help.find("--secret="), std::string::npos) << help;

  Argv argv({"host", "--deadline_seconds=5", "--verify", "keyed", "--delta=on",
             "--path_transports=intra_node=ucx:tcp", "--staging_budget_bytes=1048576"});
  ASSERT_TRUE(settings->Take(&argv.argc, argv.pointers.data()).ok());
  EXPECT_EQ(argv.argc, 1);
  wsync_config_t config = {};
  config.struct_size = sizeof(config);
  ASSERT_TRUE(settings->Apply(**plugin, &config).ok());
  EXPECT_EQ(config.deadline_seconds, 5);
  EXPECT_EQ(config.verify, 2);
  EXPECT_EQ(config.delta, WSYNC_DELTA_ON);
  EXPECT_EQ(config.staging_budget_bytes, 1048576);
  ASSERT_NE(config.path_transports, nullptr);
  EXPECT_STREQ(config.path_transports, "intra_node=ucx:tcp");

  // A value the setting's variable would refuse is refused naming the argument.
  absl::StatusOr<SettingArgs> refusing = SettingArgs::FromLibrary(**plugin);
  ASSERT_TRUE(refusing.ok());
  Argv bad({"host", "--staging_budget_bytes=64MiB"});
  ASSERT_TRUE(refusing->Take(&bad.argc, bad.pointers.data()).ok());
  wsync_config_t untouched = {};
  untouched.struct_size = sizeof(untouched);
  const absl::Status status = refusing->Apply(**plugin, &untouched);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--staging_budget_bytes=64MiB: "), std::string::npos) << status;
  EXPECT_EQ(untouched.staging_budget_bytes, 0);
}

}  // namespace
}  // namespace wsync::host
