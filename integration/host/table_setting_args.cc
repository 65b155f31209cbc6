#include "integration/host/table_setting_args.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plugin/settings.h"

namespace wsync::host {

SettingArgs CompiledSettingArgs() {
  std::vector<SettingRow> rows;
  for (const Setting& setting : Settings()) {
    SettingTexts texts = DescribeSettingTexts(setting);
    rows.push_back({std::move(texts.name), std::move(texts.type), std::move(texts.default_value),
                    std::move(texts.default_note), std::move(texts.variable), std::move(texts.help),
                    std::move(texts.choices)});
  }
  return SettingArgs::FromRows(std::move(rows));
}

absl::StatusOr<SettingArgs> TakeCompiledSettings(int* argc, char** argv) {
  SettingArgs settings = CompiledSettingArgs();
  if (absl::Status taken = settings.Take(argc, argv); !taken.ok()) return taken;
  for (const Setting& setting : Settings()) {
    const std::optional<std::string> text = settings.Value(setting.name);
    if (!text.has_value()) continue;
    if (absl::StatusOr<SettingValue> value = ParseSettingValue(setting, *text); !value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", setting.name, "=", *text, ": ",
                                                     setting.name, " ", value.status().message()));
    }
  }
  return settings;
}

}  // namespace wsync::host
