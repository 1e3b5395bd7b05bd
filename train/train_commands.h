#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/cli.h"

namespace cast {
int command_train(const std::vector<std::string>& argv);
int command_eval(const std::vector<std::string>& argv);
int command_data(const std::vector<std::string>& argv);
int command_clusters(const std::vector<std::string>& argv);
int command_plot(const std::vector<std::string>& argv);
int command_compare(const std::vector<std::string>& argv);

// The settings of a run as options (their help names each task's default), shared by
// `cast train` and `cast compare`; and the ones given, as the JSON keys a config file uses.
void declare_train_settings(cli::Args& args, const std::vector<std::string>& except);
// One setting's value from text ("--vary lr=1e-3,3e-3"), typed as the setting is.
nlohmann::json setting_from_text(const std::string& key, const std::string& text);
nlohmann::json settings_from_flags(const cli::Args& args);
nlohmann::json read_json_file(const std::string& path);
}  // namespace cast
