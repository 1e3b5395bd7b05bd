// The table of training settings (train/settings.h): every setting has a flag that --help
// lists, a key the config reader takes, and a place in the checkpoint's metadata that it
// survives; checkpoints written before the table (other spellings) still load and resume.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <map>
#include <set>

#include "tensor/safetensors.h"
#include "test_util.h"
#include "train/cli.h"
#include "train/settings.h"
#include "train/trainer.h"

using namespace cast;
using json = nlohmann::json;

namespace {

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("cast_settings_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// A value of every setting other than the listops-short preset's, all valid together and small
// enough to build the model. A setting added to the table must be added here.
const std::map<std::string, json>& changed_values() {
  static const std::map<std::string, json> values = {{"steps", 7},
                                                     {"log-every", 3},
                                                     {"eval-every", 2},
                                                     {"checkpoint-every", 5},
                                                     {"eval-limit", 9},
                                                     {"eval-best", true},
                                                     {"data", "elsewhere"},
                                                     {"run", "a-run"},
                                                     {"device", "cpu"},
                                                     {"precision", "bf16"},
                                                     {"reference", true},
                                                     {"recompute", true},
                                                     {"batch", 5},
                                                     {"lr", 0.25},
                                                     {"schedule", "rsqrt"},
                                                     {"warmup", 4},
                                                     {"weight-decay", 0.5},
                                                     {"clip", 0.0},
                                                     {"seed", 9},
                                                     {"max-len", 16},
                                                     {"patch", 2},
                                                     {"dim", 12},
                                                     {"heads", 3},
                                                     {"mlp-dim", 10},
                                                     {"layers", 1},
                                                     {"dropout", 0.125},
                                                     {"positions", "learned"},
                                                     {"pooling", "mean"},
                                                     {"attention", "clustered"},
                                                     {"clusters", 3},
                                                     {"cluster-size", 5},
                                                     {"clustering", "satopk"},
                                                     {"f", "laplace"},
                                                     {"summaries", "off"},
                                                     {"mix", "query"},
                                                     {"cast-heads", "shared"},
                                                     {"surrogates", "frozen"},
                                                     {"topk", 6},
                                                     {"bits", 7},
                                                     {"iterations", 2}};
  return values;
}

}  // namespace

TEST(Settings, EveryNameIsOneSettingAndTheTestKnowsIt) {
  std::set<std::string> names;
  for (const train::Setting& s : train::settings()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " twice";
    EXPECT_EQ(train::find_setting(s.name), &s);
    EXPECT_TRUE(changed_values().count(s.name)) << s.name << ": add a value to changed_values()";
    EXPECT_FALSE(s.help.empty() && s.kind != train::Kind::choice) << s.name << " has no help";
  }
  EXPECT_EQ(names.size(), changed_values().size());
  EXPECT_EQ(train::find_setting("cluster_size"), nullptr);  // one spelling
}

TEST(Settings, EverySettingHasAFlagThatHelpListsWithItsDefault) {
  cli::Args args("train", "");
  train::declare_setting_flags(args, {});
  const std::string help = args.help();
  for (const train::Setting& s : train::settings()) {
    if (s.kind == train::Kind::flag) {
      EXPECT_NE(help.find("--" + s.name + " "), std::string::npos) << s.name;
    } else {
      const size_t at = help.find("--" + s.name + " <value>");
      ASSERT_NE(at, std::string::npos) << s.name;
      EXPECT_NE(help.find("; default ", at), std::string::npos) << s.name;
    }
  }
}

TEST(Settings, EveryFlagIsReadAsItsSettingAndEveryKeyByTheConfigReader) {
  for (const auto& [name, value] : changed_values()) {
    const train::Setting& s = *train::find_setting(name);
    // the flag: its text, as the command line gives it
    cli::Args args("train", "");
    train::declare_setting_flags(args, {});
    std::vector<std::string> argv = {"--" + name};
    if (s.kind != train::Kind::flag) argv.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    ASSERT_TRUE(args.parse(argv));
    const json from_flags = train::settings_from_flags(args);
    ASSERT_TRUE(from_flags.contains(name)) << name;
    EXPECT_EQ(from_flags[name], value) << name;
    // the config file's key: the same name, the same value
    train::TrainConfig c = train::preset("listops-short");
    EXPECT_NE(s.get(c), value) << name << ": choose a value other than the preset's";
    train::apply_overrides(c, json{{name, value}, {"dim", 12}, {"heads", 3}, {"max-len", 16}});
    EXPECT_EQ(s.get(c), value) << name;
    // and its text (--vary) the same again
    EXPECT_EQ(train::setting_from_text(name, train::setting_value(c, name)), value) << name;
  }
}

TEST(Settings, EverySettingRoundTripsThroughACheckpoint) {
  train::TrainConfig c = train::preset("listops-short");
  json all = json::object();
  for (const auto& [name, value] : changed_values()) all[name] = value;
  train::apply_overrides(c, all);
  const std::string dir = temp_dir("round_trip");
  nn::Transformer model(c.model);
  std::vector<Tensor> m, v;
  train::save_checkpoint(dir + "/ck.safetensors", c, model, m, v, 3, 0.5);
  const train::TrainConfig back = train::read_checkpoint_header(dir + "/ck.safetensors").config;
  for (const train::Setting& s : train::settings()) EXPECT_EQ(s.get(back), s.get(c)) << s.name;
  EXPECT_EQ(train::all_settings_json(back), train::all_settings_json(c));
  EXPECT_EQ(back.model.to_json(), c.model.to_json());  // the task's sizes and the model's seed too
  // each setting under its own name: the run's in "train", the model's in "model"
  const TensorFile f = read_safetensors(dir + "/ck.safetensors");
  const json run = json::parse(f.metadata.at("train")), stored_model = json::parse(f.metadata.at("model"));
  for (const train::Setting& s : train::settings()) {
    const std::string key = s.name == "attention" ? "mechanism" : s.name;
    const json& where = s.home == train::Home::run         ? run
                        : s.home == train::Home::attention ? stored_model.at("attention")
                                                           : stored_model;
    ASSERT_TRUE(where.contains(key)) << s.name;
    EXPECT_EQ(where.at(key), changed_values().at(s.name)) << s.name;
  }
}

TEST(Settings, PresetsHoldTheTablesDefaults) {
  for (const std::string& task : train::task_names()) {
    const train::TrainConfig c = train::preset(task);
    EXPECT_EQ(c.model.seed, 0u) << task;  // the model's initialisation of every preset run
    for (const train::Setting& s : train::settings()) {
      std::string text = s.default_text;
      for (const auto& [name, value] : s.per_task)
        if (name == task) text = value;
      EXPECT_EQ(s.get(c), train::setting_from_text(s.name, text)) << task << " " << s.name;
    }
  }
  EXPECT_CAST_ERROR(train::preset("sudoku"), "unknown task 'sudoku' (listops-short, listops");
}

// A checkpoint written by the engine before the table: the model stored as "max_len",
// "mlp_dim", "cluster_size", and the two-word settings as bools ("mix_query": true, ...).
// cast train --data data --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1
//   --max-len 24 --schedule constant --warmup 1 --attention cast --clusters 2 --cluster-size 4
//   --mix query --clustering satopk --cast-heads shared --positions learned --pooling mean
//   --summaries off --f laplace --device cpu --eval-limit 4 --log-every 1
// on `cast data listops-short --count 64 --max-length 24 --seed 5`.
TEST(Settings, ACheckpointWrittenBeforeTheTableLoadsAndResumesBitIdentically) {
  const std::string old = std::string(CAST_TEST_DATA_DIR) + "/checkpoint_before_settings_table.safetensors";
  const train::Checkpoint ck = train::read_checkpoint_header(old);
  const train::TrainConfig& c = ck.config;
  EXPECT_EQ(ck.step, 2);
  const std::map<std::string, json> expected = {{"max-len", 24},
                                                {"mlp-dim", 8},
                                                {"dim", 8},
                                                {"heads", 2},
                                                {"layers", 1},
                                                {"cluster-size", 4},
                                                {"clusters", 2},
                                                {"mix", "query"},
                                                {"clustering", "satopk"},
                                                {"cast-heads", "shared"},
                                                {"positions", "learned"},
                                                {"pooling", "mean"},
                                                {"summaries", "off"},
                                                {"f", "laplace"},
                                                {"attention", "cast"},
                                                {"log-every", 1},
                                                {"eval-limit", 4},
                                                {"schedule", "constant"},
                                                {"warmup", 1},
                                                {"batch", 4},
                                                {"steps", 2}};
  for (const auto& [name, value] : expected) EXPECT_EQ(train::find_setting(name)->get(c), value) << name;

  // The data it was trained on, generated again.
  const std::string dir = temp_dir("before_table");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 64, spec.max_length = 24, spec.min_length = 6;
  data::generate_listops(dir + "/data", spec, 5);
  // Two more steps from the old checkpoint at once, and the same two steps one at a time through
  // a checkpoint written in the table's spelling: the same model, bit for bit. (Against a run
  // straight from step 0 the first two steps would be this build's and the fixture's, whose
  // float arithmetic differs between builds and processors.)
  auto copy_of_old = [&](const std::string& name) {
    const std::string copy = dir + "/" + name + "/checkpoint.safetensors";
    std::filesystem::create_directories(dir + "/" + name);
    std::filesystem::copy_file(old, copy);
    return copy;
  };
  const std::string at_once = copy_of_old("at_once"), one_by_one = copy_of_old("one_by_one");
  train::run_training(train::resume_config(at_once, {{"steps", 4}, {"data", dir + "/data"}}), at_once, 0, true);
  train::run_training(train::resume_config(one_by_one, {{"steps", 3}, {"data", dir + "/data"}}), one_by_one, 0, true);
  train::run_training(train::resume_config(one_by_one, {{"steps", 4}, {"data", dir + "/data"}}), one_by_one, 0, true);
  const TensorFile a = read_safetensors(at_once), b = read_safetensors(one_by_one);
  ASSERT_EQ(train::read_checkpoint_header(at_once).step, 4);
  ASSERT_EQ(train::read_checkpoint_header(one_by_one).step, 4);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    ASSERT_TRUE(b.has(name)) << name;
    const Tensor& u = b.tensors.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    EXPECT_EQ(std::memcmp(t.data<float>(), u.data<float>(), t.numel() * sizeof(float)), 0) << name << " differs";
  }
  // and the checkpoint it wrote spells each setting once, the table's way
  const json model = json::parse(a.metadata.at("model"));
  EXPECT_EQ(model.at("attention").at("mix"), "query");
  EXPECT_FALSE(model.at("attention").contains("mix_query"));
  EXPECT_EQ(model.at("max-len"), 24);
}

TEST(Settings, OldConfigKeysAreRefusedByName) {
  // the config reader knows each setting by its one name
  train::TrainConfig c = train::preset("listops-short");
  EXPECT_CAST_ERROR(train::apply_overrides(c, json{{"mix_query", true}}), "unknown setting 'mix_query'");
  EXPECT_CAST_ERROR(train::apply_overrides(c, json{{"attention", "sparse"}}),
                    "setting 'attention' is 'sparse': it must be one of full | cast | clustered | iclustered");
}

// A stored model setting of the wrong type names the field and its value (twenty-third attack:
// "a field is missing or of the wrong type (type must be string, but is number)", no field).
TEST(Settings, AStoredModelFieldOfTheWrongTypeIsNamed) {
  const nlohmann::json good = train::model_json(nn::ModelConfig{});
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& message) {
    nlohmann::json j = good;
    edit(j);
    EXPECT_CAST_ERROR(train::model_from_json(j), message);
  };
  refused([](nlohmann::json& j) { j["pooling"] = 3; }, "model config: 'pooling' is 3, where a string is expected");
  refused([](nlohmann::json& j) { j["dropout"] = "0.1"; }, "model config: 'dropout' is \"0.1\", where a number is expected");
  refused([](nlohmann::json& j) { j["attention"]["mechanism"] = nlohmann::json::array({"cast"}); },
          "model config: 'mechanism' is [\"cast\"], where a string is expected");
  refused([](nlohmann::json& j) { j.erase("dual"); }, "model config: 'dual' is missing");
  refused([](nlohmann::json& j) { j["dual"] = 1; }, "model config: 'dual' is 1, where a boolean is expected");
  EXPECT_NO_THROW(train::model_from_json(good));
}
