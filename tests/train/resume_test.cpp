// Checkpoints and resuming: a resumed run equal bit for bit to an uninterrupted one, also after a stop
// request; checkpoints round-trip, are parsed strictly, refuse a different model and never hold NaN;
// the occupied-folder and resume-settings rules.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>  // getpid: the plain and the emulated test process run side by side
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "tensor/device_memory.h"
#include "tensor/files.h"
#include "tensor/philox.h"
#include "tensor/safetensors.h"
#include "tests/folder_holder.h"
#include "tests/test_util.h"
#include "figures/cluster_changes.h"
#include "figures/clusters_figure.h"
#include "train/memory_estimate.h"
#include "train/run_folder.h"
#include "train/stop.h"
#include "train/trainer.h"
#include "tests/train/train_test_util.h"

using namespace cast;
using namespace cast::testing;

TEST(Training, ResumeIsBitIdentical) {
  data::TaskData task = counting_task(500, 50, 12);
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("straight"));
  c.steps = 40;
  c.model.dropout = 0.1;  // the dropout stream must resume where it stopped
  c.schedule = "cosine";
  auto straight = train::train_on(c, task, "", 0, true);
  train::TrainConfig half = c;
  half.run_dir = temp_dir("halves");
  auto first = train::train_on(half, task, "", 20, true);
  ASSERT_EQ(first.losses.size(), 20u);
  auto second = train::train_on(half, task, half.run_dir + "/checkpoint.safetensors", 0, true);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  ASSERT_EQ(joined.size(), straight.losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], straight.losses[i]) << "step " << i + 1;
  EXPECT_EQ(second.test.accuracy, straight.test.accuracy);
}

TEST(Training, ANewRunRefusesAFolderHoldingARun) {
  data::TaskData task = counting_task(200, 20, 13);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("occupied"));
  c.steps = 4;
  train::train_on(c, task, "", 0, true);
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  const auto written = std::filesystem::last_write_time(ckpt);
  EXPECT_CAST_ERROR(train::train_on(c, task, "", 0, true), "already holds a run");
  EXPECT_EQ(std::filesystem::last_write_time(ckpt), written) << "the old run's checkpoint was touched";
  c.overwrite = true;
  c.eval_best = true;
  c.eval_every = 2;
  train::train_on(c, task, "", 0, true);
  EXPECT_GT(std::filesystem::last_write_time(ckpt), written);
}

TEST(Training, AResumedRunDropsMetricsWrittenAfterItsCheckpoint) {
  data::TaskData task = counting_task(200, 20, 14);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("metrics_after_kill"));
  c.steps = 20;
  c.log_every = 5;
  train::train_on(c, task, "", 10, true);  // checkpoint at step 10
  {                                        // what a process killed at step 15 would have appended
    std::ofstream more(c.run_dir + "/metrics.jsonl", std::ios::app);
    more << R"({"step": 15, "split": "train", "loss": 99.0, "accuracy": 0.0})" << '\n';
  }
  train::train_on(c, task, c.run_dir + "/checkpoint.safetensors", 0, true);
  std::ifstream in(c.run_dir + "/metrics.jsonl");
  std::vector<int64_t> train_steps;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_NE(j["loss"].get<double>(), 99.0) << "a line from after the checkpoint survived";
    if (j["split"] == "train") train_steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(train_steps, (std::vector<int64_t>{5, 10, 15, 20}));
}

// A validation a stop cut short (the step saved, its validation not written) is done first when
// the run resumes, so the resumed run validates at the steps the unstopped one did.
TEST(Training, AValidationCutShortIsDoneWhenTheRunResumes) {
  data::TaskData task = counting_task(200, 20, 15);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("validation_cut"));
  c.steps = 8;
  c.eval_every = 4;
  c.log_every = 4;
  train::train_on(c, task, "", 4, true);  // checkpoint at step 4, with its validation
  const std::string metrics = c.run_dir + "/metrics.jsonl";
  std::string kept;  // as a stop during step 4's validation leaves them: no val line of step 4
  {
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json::parse(line)["split"] != "val") kept += line + "\n";
  }
  std::ofstream(metrics, std::ios::trunc) << kept;
  train::train_on(c, task, c.run_dir + "/checkpoint.safetensors", 0, true);
  std::vector<int64_t> validated;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["split"] == "val") validated.push_back(j["step"].get<int64_t>());
  }
  // 4 redone, 8 in training, which the final evaluation of the same model takes rather than writing it twice
  EXPECT_EQ(validated, (std::vector<int64_t>{4, 8}));
}

TEST(Training, CheckpointRoundTripAndMismatch) {
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("ckpt"));
  std::filesystem::create_directories(c.run_dir);
  nn::Transformer model(c.model);
  model.rng_offset = 1234;
  std::vector<Tensor> m, v;
  for (auto& [name, t] : model.parameters()) {
    m.push_back(Tensor::uniform(t->shape(), 1, 0));
    v.push_back(Tensor::uniform(t->shape(), 2, 0));
  }
  const std::string path = c.run_dir + "/a.safetensors";
  train::save_checkpoint(path, c, model, m, v, 17, 0.5);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  train::Checkpoint header = train::read_checkpoint_header(path);
  EXPECT_EQ(header.step, 17);
  EXPECT_EQ(header.config.model.to_json(), c.model.to_json());
  nn::ModelConfig other_seed = c.model;
  other_seed.seed = 99;  // same architecture, other initial values
  nn::Transformer copy(other_seed);
  // a different seed is a different config: refused
  EXPECT_CAST_ERROR(train::load_checkpoint(path, copy, nullptr, nullptr), "'seed' is 0 in the checkpoint but 99");
  nn::Transformer same(c.model);
  for (auto& [name, t] : same.parameters()) t->fill_zero();
  std::vector<Tensor> m2(m.size()), v2(v.size());
  for (size_t i = 0; i < m.size(); ++i) m2[i] = Tensor::zeros(m[i].shape()), v2[i] = Tensor::zeros(v[i].shape());
  train::load_checkpoint(path, same, &m2, &v2);
  auto a = model.parameters(), b = same.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(max_abs_diff(*a[i].second, *b[i].second), 0.0) << a[i].first;
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(max_abs_diff(m[i], m2[i]), 0.0);
  EXPECT_EQ(same.rng_offset, 1234u);

  nn::ModelConfig wider = c.model;
  wider.dim = 16;
  nn::Transformer different(wider);
  EXPECT_CAST_ERROR(train::load_checkpoint(path, different, nullptr, nullptr), "'dim' is 32 in the checkpoint but 16");
}

// The missing-GPU line advises what works for who asked: a resume keeps its checkpoint's device
// and precision, so it is told to add --precision fp32; --device cuda named by hand is not.
TEST(Training, AMissingGpuIsAdvisedByWhoAskedForIt) {
  if (device_memory::cuda_available()) GTEST_SKIP() << "a GPU is here: --device cuda is not refused";
  EXPECT_CAST_ERROR(train::resolve_device("cuda", true), "add --precision fp32 to a tf32 or bf16 one");
  try {
    train::resolve_device("cuda");
    ADD_FAILURE() << "--device cuda was accepted with no GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass --device cpu"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("resumed"), std::string::npos) << e.what();
  }
}

// Settings whose next update overflows f32: the largest float as the learning rate, and a
// weight decay that takes AdamW's step (lr · (m̂/√v̂ + wd · p)) past it wherever m̂/√v̂ and p
// share a sign. (A rate above the largest float would overflow in the conversion itself.)
static void overflowing(train::TrainConfig& c) {
  c.lr = std::numeric_limits<float>::max();
  c.warmup = 0;
  c.schedule = "constant";
  c.weight_decay = 2;
}

TEST(Training, NanLossStopsAndKeepsTheLastGoodCheckpoint) {
  // A run whose update overflowed (overflowing()): the next loss is not finite. The run must
  // stop naming the step and the checkpoint it checked, and leave that checkpoint as it was.
  data::TaskData task = counting_task(200, 20, 13);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("nan"));
  train::train_on(c, task, "", 3, true);  // a good checkpoint at step 3
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  const auto before = std::filesystem::file_size(ckpt);
  const auto stamp = std::filesystem::last_write_time(ckpt);
  overflowing(c);
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true),
                    "step 5: the loss is nan; training stopped before the update. The last good checkpoint is " + ckpt +
                        " (step 3, every value checked finite)");
  EXPECT_EQ(std::filesystem::file_size(ckpt), before);
  EXPECT_EQ(std::filesystem::last_write_time(ckpt), stamp);
  EXPECT_EQ(train::read_checkpoint_header(ckpt).step, 3);
}

TEST(Training, ACheckpointIsNeverWrittenWithANonFiniteValue) {
  // the update of step 4 makes the parameters infinite: the step-4 checkpoint is refused, and
  // the message names the step and the step-3 checkpoint, read back and found finite
  data::TaskData task = counting_task(200, 20, 13);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("inf_update"));
  c.checkpoint_every = 1;
  train::train_on(c, task, "", 3, true);
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  overflowing(c);
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true),
                    "step 4: the update made a parameter or moment non-finite");
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true), "The last good checkpoint is " + ckpt + " (step 3");
  EXPECT_EQ(train::read_checkpoint_header(ckpt).step, 3);
  EXPECT_EQ(train::checkpoint_damage(ckpt), "");
  // with no checkpoint yet, none is called good
  train::TrainConfig fresh = c;
  fresh.run_dir = temp_dir("inf_update_fresh");
  EXPECT_CAST_ERROR(train::train_on(fresh, task, "", 0, true),
                    "step 1: the update made a parameter or moment "
                    "non-finite");
  EXPECT_CAST_ERROR(train::train_on(fresh, task, "", 0, true), "No checkpoint was written yet");
  EXPECT_FALSE(std::filesystem::exists(fresh.run_dir + "/checkpoint.safetensors"));
}

// A run folder moved away while the run went on: its missing checkpoint is not called "not
// written yet".
TEST(Training, AMissingCheckpointSaysWhetherItsFolderIsGone) {
  const std::string dir = temp_dir("folder_gone");
  std::filesystem::create_directories(dir);
  EXPECT_EQ(train::no_checkpoint_at(dir + "/checkpoint.safetensors"), "No checkpoint was written yet");
  EXPECT_EQ(train::last_good_checkpoint(dir + "/checkpoint.safetensors"), "No checkpoint was written yet");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(train::no_checkpoint_at(dir + "/checkpoint.safetensors"),
            "The run folder " + dir + " is gone (moved or removed while the run went on), its checkpoints with it");
}

TEST(Training, ResumeAndEvaluationRefuseACheckpointHoldingNan) {
  data::TaskData task = counting_task(200, 20, 13);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("nan_ckpt"));
  train::train_on(c, task, "", 2, true);
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  TensorFile f = read_safetensors(ckpt);
  const std::string name = "param/" + nn::Transformer(c.model).parameters()[1].first;
  f.tensors[name].data<float>()[3] = std::nanf("");
  write_safetensors(ckpt, f.tensors, f.metadata);
  const auto stamp = std::filesystem::last_write_time(ckpt);
  EXPECT_EQ(train::checkpoint_damage(ckpt), "'" + name + "' holds nan at element 3");
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true),
                    ckpt + ": '" + name + "' holds nan at element 3: the checkpoint holds non-finite values");
  nn::Transformer model(c.model);
  EXPECT_CAST_ERROR(train::load_checkpoint(ckpt, model, nullptr, nullptr), "holds nan at element 3");
  f.tensors[name].data<float>()[3] = -std::numeric_limits<float>::infinity();  // infinity too, in a moment
  write_safetensors(ckpt, f.tensors, f.metadata);
  EXPECT_CAST_ERROR(train::load_checkpoint(ckpt, model, nullptr, nullptr), "holds -inf at element 3");
  EXPECT_EQ(std::filesystem::last_write_time(ckpt) >= stamp, true);
}

// On CUDA the statistics stay on the device until a log, evaluation or checkpoint step: the
// run stops there, names the first bad step, and no checkpoint was written in between.
TEST(Training, NanLossOnTheDeviceStopsAtTheNextReadAndKeepsTheCheckpoint) {
  SKIP_WITHOUT_GPU();
  data::TaskData task = counting_task(200, 20, 13);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("nan-cuda"));
  c.device = "cuda";
  c.batch = 4;  // emulated steps are slow
  c.checkpoint_every = 4;
  c.log_every = 4;
  std::filesystem::create_directories(c.run_dir);
  nn::Transformer model(c.model);
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  std::vector<Tensor> m, v;
  for (auto& [name, t] : model.parameters())
    m.push_back(Tensor::zeros(t->shape())), v.push_back(Tensor::zeros(t->shape()));
  train::save_checkpoint(ckpt, c, model, m, v, 5, -1);
  const auto stamp = std::filesystem::last_write_time(ckpt);
  // overflowing(): step 6's update makes the parameters huge or infinite, step 7's statistics
  // are bad but unread, step 8 logs and would save: the read there stops the run, naming step 7
  // and the step-5 checkpoint, which is left as it was.
  overflowing(c);
  try {
    train::train_on(c, task, ckpt, 0, true);
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("step 7: the ", 0), 0u) << what;
    EXPECT_NE(what.find("training stopped at step 8. The last good checkpoint is " + ckpt + " (step 5"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(std::filesystem::last_write_time(ckpt), stamp);
  EXPECT_NO_THROW(train::read_checkpoint_header(ckpt));
}

TEST(Training, CheckpointMetadataIsParsedStrictly) {
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("strict_ckpt"));
  std::filesystem::create_directories(c.run_dir);
  nn::Transformer model(c.model);
  std::vector<Tensor> m, v;
  for (auto& [name, t] : model.parameters()) {
    m.push_back(Tensor::zeros(t->shape()));
    v.push_back(Tensor::zeros(t->shape()));
  }
  const std::string good = c.run_dir + "/good.safetensors";
  train::save_checkpoint(good, c, model, m, v, 3, 0.5);
  TensorFile f = read_safetensors(good);
  auto with = [&](const std::string& key, const std::string& value) {
    const std::string path = c.run_dir + "/bad_" + key + ".safetensors";
    auto meta = f.metadata;
    meta[key] = value;
    write_safetensors(path, f.tensors, meta);
    return path;
  };
  // a step of "12oops" once read as 12; a negative one indexed the sampler out of bounds
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("step", "12oops")), "'step' is '12oops', not a number");
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("step", "-4")), "'step' is -4");
  // sizes stored in a checkpoint are input too
  auto model_json = nlohmann::json::parse(f.metadata.at("model"));
  model_json["layers"] = 1000000;
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("model", model_json.dump())), "setting 'layers' is 1000000");
  model_json["layers"] = 1e30;  // a float where an integer belongs: once undefined behaviour
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("model", model_json.dump())),
                    "'layers' is 1e+30, not an integer");
  model_json["layers"] = 2;
  model_json["heads"] = 0;
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("model", model_json.dump())), "setting 'heads' is 0");
  // more clusters than a sequence's tokens, which no training writes: the file's fault (an Error,
  // exit 1), not a setting the user gave (eighth attack)
  auto clustered = nlohmann::json::parse(f.metadata.at("model"));
  clustered["attention"]["mechanism"] = "clustered", clustered["attention"]["clusters"] = 100000;
  try {
    train::read_checkpoint_header(with("model", clustered.dump()));
    ADD_FAILURE() << "a checkpoint with more clusters than tokens was read";
  } catch (const UsageError& e) {
    ADD_FAILURE() << "a usage error: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt checkpoint metadata: setting 'clusters' is 100000"), std::string::npos)
        << e.what();
  }
  // an unsigned offset: "-1" was read as 18446744073709551615 and saved back so
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("rng_offset", "-1")), "'rng_offset' is '-1', not a number");
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("step", "99999999999999999999")), "not a number in range");
  // an accuracy, or -1 before the first validation
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("best_val", "7.5")), "'best_val' is 7.5");
  EXPECT_NO_THROW(train::read_checkpoint_header(with("best_val", "-1")));
  // a cost out of range names its own key (twenty-seventh attack: one line named all three)
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("peak_bytes", "-1")),
                    "'peak_bytes' is '-1': a cost is a finite number from 0 to 1e+18");
  // beyond what the run's summary is read with (thirty-first attack: a resumed run wrote a
  // summary.json of 1.8e308 seconds that cast compare then refused)
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("wall_seconds", "1.7976931348623157e308")),
                    "'wall_seconds' is '1.7976931348623157e308': a cost is a finite number from 0 to 1e+12");
  EXPECT_CAST_ERROR(train::read_checkpoint_header(with("step_seconds", "inf")), "'step_seconds' is 'inf'");
  // the run's cost is kept whole: one of its three keys missing is said once, with the path once
  // (twenty-third attack: "X: corrupt checkpoint metadata: X: not a cast checkpoint (no 'peak_bytes'…")
  auto meta = f.metadata;
  meta.erase("peak_bytes");
  const std::string partial_cost = c.run_dir + "/partial_cost.safetensors";
  write_safetensors(partial_cost, f.tensors, meta);
  EXPECT_CAST_ERROR(train::read_checkpoint_header(partial_cost),
                    partial_cost + ": corrupt checkpoint metadata: 'wall_seconds', 'step_seconds' and 'peak_bytes' are "
                                   "kept together, but it holds 2 of them");
  // a tensor that is not the model's was ignored, then dropped from the next checkpoint
  auto tensors = f.tensors;
  tensors["notes/extra"] = Tensor::zeros({2});
  const std::string extra = c.run_dir + "/extra.safetensors";
  write_safetensors(extra, tensors, f.metadata);
  EXPECT_CAST_ERROR(train::load_checkpoint(extra, model, &m, &v),
                    "tensor 'notes/extra' is neither a parameter of this model nor an AdamW moment");
  EXPECT_NO_THROW(train::load_checkpoint(good, model, &m, &v));
}

TEST(Training, ConfigIntegersMustBeIntegers) {
  // found by the config fuzzer: a float for an integer setting converted with undefined behaviour
  train::TrainConfig c = train::preset("listops-short");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json::parse(R"({"steps": 6.66667e+24})")),
                    "setting 'steps' is 6.66667e+24: out of range (a whole number of at most 9223372036854775807)");
  // a whole number beyond 64 bits, which the JSON parser reads as a float: out of range, not "no integer"
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json::parse(R"({"steps": 3000000000000000000000})")),
                    "setting 'steps' is 3e+21: out of range");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json::parse(R"({"steps": 2.5})")),
                    "setting 'steps' is 2.5: it must be an integer");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json::parse(R"({"seed": -3})")), "setting 'seed' is -3");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json::parse(R"({"heads": 18446744073709551615})")),
                    "setting 'heads' is 18446744073709551615: out of range (at most 9223372036854775807)");
}

TEST(Training, NamedOrStoredDataFoldersAreNeverGenerated) {
  // resuming once generated a new data set wherever the checkpoint said the data had been
  train::TrainConfig c = train::preset("listops-short");
  const std::string missing = temp_dir("no_data") + "/listops";
  c.data_dir = missing;
  c.run_dir = temp_dir("no_data_run");
  c.steps = 1;
  EXPECT_CAST_ERROR(train::run_training(c, "", 0, true), missing);
  EXPECT_FALSE(std::filesystem::exists(missing));
}

TEST(Training, EmptyTrainingSplitAndUnwritableRunFolderFailBeforeTraining) {
  data::TaskData task = counting_task(0, 8, 3);  // no training examples: once a division by zero
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("empty_split"));
  EXPECT_CAST_ERROR(train::train_on(c, task, "", 0, true), "the training split has no examples");
  data::TaskData ok = counting_task(16, 8, 3);
  c.run_dir = "/proc/cast_cannot_write_here";
  EXPECT_CAST_ERROR(train::train_on(c, ok, "", 0, true),
                    "run folder /proc/cast_cannot_write_here: folder /proc is read-only");
}

// ---------------------------------------------------------------- stopping and resuming
namespace {

// Every tensor of two checkpoints equal bit for bit (parameters and both AdamW moments).
void expect_same_tensors(const std::string& a, const std::string& b) {
  const TensorFile fa = read_safetensors(a), fb = read_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (const auto& [name, t] : fa.tensors) {
    ASSERT_TRUE(fb.has(name)) << name;
    const Tensor& u = fb.tensors.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    EXPECT_EQ(std::memcmp(t.data<float>(), u.data<float>(), t.numel() * sizeof(float)), 0) << name << " differs";
  }
}

// The training losses of a run's metrics, in order.
std::vector<double> logged_losses(const std::string& run_dir) {
  std::vector<double> losses;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["split"] == "train") losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// The Interrupted of `fn`, which a stop request made before it must end; the request is cleared.
train::Interrupted interrupted(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const train::Interrupted& e) {
    train::clear_stop();
    return e;
  } catch (...) {  // no request left armed for the tests after this one
    train::clear_stop();
    throw;
  }
  train::clear_stop();
  throw std::runtime_error("the run did not stop");
}

// The stop request the signal handler would raise, honoured by `fn`: its Interrupted.
train::Interrupted stopped_by(int signal, const std::function<void()>& fn) {
  train::request_stop(signal);
  return interrupted(fn);
}

}  // namespace

TEST(Training, AStopRequestSavesAtTheStepAndTheResumedRunIsBitIdentical) {
  data::TaskData task = counting_task(500, 50, 12);
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("stop_straight"));
  c.steps = 12;
  c.log_every = 1;
  c.checkpoint_every = 0;  // only the stop writes a checkpoint before the end
  c.model.dropout = 0.1;
  c.schedule = "cosine";
  auto straight = train::train_on(c, task, "", 0, true);
  train::TrainConfig stopped = c;
  stopped.run_dir = temp_dir("stop_stopped");
  const std::string ckpt = stopped.run_dir + "/checkpoint.safetensors";
  // the flag is up before the first step: the step is finished, saved, and the run ends
  const train::Interrupted first = stopped_by(SIGINT, [&] { train::train_on(stopped, task, "", 0, true); });
  EXPECT_EQ(first.signal(), SIGINT);
  EXPECT_EQ(std::string(first.what()), "stopped by SIGINT after step 1 of 12: checkpoint " + ckpt +
                                           " written; resume with: cast train --resume " + ckpt);
  EXPECT_EQ(train::read_checkpoint_header(ckpt).step, 1);
  const train::Interrupted second = stopped_by(SIGTERM, [&] { train::train_on(stopped, task, ckpt, 0, true); });
  EXPECT_NE(std::string(second.what()).find("stopped by SIGTERM after step 2 of 12"), std::string::npos);
  auto rest = train::train_on(stopped, task, ckpt, 0, true);
  EXPECT_EQ(rest.losses.size(), 10u);
  EXPECT_EQ(logged_losses(stopped.run_dir), logged_losses(c.run_dir));
  EXPECT_EQ(logged_losses(c.run_dir).size(), 12u);
  expect_same_tensors(ckpt, c.run_dir + "/checkpoint.safetensors");
  EXPECT_EQ(rest.test.accuracy, straight.test.accuracy);
}

// A run stopped between two progress lines logs, once resumed, the lines of the run that was not
// stopped: the checkpoint carries the statistics of the steps since the last line (seventh attack:
// the resumed run's first line averaged only its own steps, and those before the stop were lost).
TEST(Training, ARunStoppedBetweenProgressLinesLogsTheStraightRunsLines) {
  data::TaskData task = counting_task(500, 50, 12);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("window_straight"));
  c.steps = 12;
  c.log_every = 5;
  c.checkpoint_every = 0;
  train::train_on(c, task, "", 0, true);
  train::TrainConfig stopped = c;
  stopped.run_dir = temp_dir("window_stopped");
  train::train_on(stopped, task, "", 7, true);  // steps 6 and 7 of the line at step 10 are done here
  train::train_on(stopped, task, stopped.run_dir + "/checkpoint.safetensors", 0, true);
  const auto train_lines = [](const std::string& run_dir) {
    std::vector<std::pair<int64_t, std::pair<double, double>>> out;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["split"] == "train") out.push_back({j["step"], {j["loss"], j["accuracy"]}});
    }
    return out;
  };
  EXPECT_EQ(train_lines(stopped.run_dir), train_lines(c.run_dir));
  EXPECT_EQ(train_lines(c.run_dir).size(), 3u);  // steps 5, 10 and 12
}

// The final evaluation runs from the checkpoint's state, so an evaluation of the checkpoint repeats
// it, also where the last step validated during training and clustered attention draws anew at
// each pass (eighth attack: the final evaluation took that validation instead, and cast eval then
// differed); its records carry the evaluated model's step.
TEST(Training, AnEvaluationOfTheCheckpointRepeatsTheFinalOne) {
  for (const nn::Mechanism mechanism : {nn::Mechanism::clustered, nn::Mechanism::iclustered, nn::Mechanism::full}) {
    const std::string name = nn::mechanism_name(mechanism);
    data::TaskData task = counting_task(300, 40, 12);
    train::TrainConfig c = tiny_config(mechanism, temp_dir("final_again_" + name));
    c.steps = 6, c.eval_every = 2;
    const train::TrainResult result = train::train_on(c, task, "", 0, true);
    nn::Transformer model(c.model, DType::f32);
    train::load_checkpoint(c.run_dir + "/checkpoint.safetensors", model, nullptr, nullptr);
    const train::EvalResult val = train::evaluate(model, task, task.val, c.batch, c.eval_limit, Device::cpu);
    const train::EvalResult test = train::evaluate(model, task, task.test, c.batch, c.eval_limit, Device::cpu);
    EXPECT_EQ(val.loss, result.val.loss) << name;
    EXPECT_EQ(val.accuracy, result.val.accuracy) << name;
    EXPECT_EQ(test.loss, result.test.loss) << name;
    // one validation record at step 6 where the figures agree (full attention), else a second marked final
    int at_last = 0, finals = 0;
    std::ifstream in(c.run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["split"] == "val" && j["step"] == 6) ++at_last, finals += j.value("final", false) ? 1 : 0;
    }
    EXPECT_EQ(at_last, 1 + finals) << name;
    if (mechanism == nn::Mechanism::full) EXPECT_EQ(finals, 0);
  }
}

// Clustered and improved clustered attention draw LSH planes and k-means seeds from a count of
// forward passes (validations included): the checkpoint keeps it, so a run stopped and resumed
// draws as the straight run did (sixth attack: it diverged at the first step after the resume).
TEST(Training, ClusteredRunsStoppedAndResumedDrawAsTheStraightRun) {
  for (const nn::Mechanism mechanism : {nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
    const std::string name = nn::mechanism_name(mechanism);
    data::TaskData task = counting_task(300, 40, 12);
    train::TrainConfig c = tiny_config(mechanism, temp_dir("draws_straight_" + name));
    c.steps = 8, c.log_every = 1, c.checkpoint_every = 0, c.eval_every = 3;
    auto straight = train::train_on(c, task, "", 0, true);
    train::TrainConfig stopped = c;
    stopped.run_dir = temp_dir("draws_stopped_" + name);
    const std::string ckpt = stopped.run_dir + "/checkpoint.safetensors";
    stopped_by(SIGINT, [&] { train::train_on(stopped, task, "", 0, true); });
    stopped_by(SIGINT, [&] { train::train_on(stopped, task, ckpt, 0, true); });
    auto rest = train::train_on(stopped, task, ckpt, 0, true);
    EXPECT_EQ(logged_losses(stopped.run_dir), logged_losses(c.run_dir)) << name;
    EXPECT_EQ(rest.test.loss, straight.test.loss) << name;
    expect_same_tensors(ckpt, c.run_dir + "/checkpoint.safetensors");
  }
}

TEST(Training, AStopAfterTheLastStepLeavesOnlyTheEvaluationToResume) {
  data::TaskData task = counting_task(200, 20, 12);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("stop_at_end"));
  c.steps = 3;
  train::train_on(c, task, "", 2, true);
  const std::string ckpt = c.run_dir + "/checkpoint.safetensors";
  const train::Interrupted e = stopped_by(SIGINT, [&] { train::train_on(c, task, ckpt, 0, true); });
  EXPECT_NE(std::string(e.what()).find("after step 3 of 3"), std::string::npos) << e.what();
  EXPECT_FALSE(std::filesystem::exists(c.run_dir + "/summary.json"));
  auto done = train::train_on(c, task, ckpt, 0, true);  // step 3 of 3: evaluates only
  EXPECT_TRUE(done.losses.empty());
  EXPECT_TRUE(std::filesystem::exists(c.run_dir + "/summary.json"));
}

namespace {

// A finished 6-step run with its checkpoint at step 6 (and one line of metrics per step).
std::string six_step_run(const data::TaskData& task, const std::string& name) {
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir(name));
  c.steps = 6;
  c.log_every = 1;
  c.checkpoint_every = 3;
  train::train_on(c, task, "", 0, true);
  return c.run_dir + "/checkpoint.safetensors";
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(Training, AResumedCopyRunsInItsOwnFolderNeverInTheStoredOne) {
  data::TaskData task = counting_task(200, 20, 15);
  const std::string original = six_step_run(task, "resume_original");
  const std::string run = std::filesystem::path(original).parent_path().string();
  const std::string backup = temp_dir("resume_backup");
  std::filesystem::create_directories(backup);
  std::filesystem::copy_file(original, backup + "/checkpoint.safetensors");
  std::filesystem::copy_file(run + "/metrics.jsonl", backup + "/metrics.jsonl");
  const std::string ckpt_before = bytes_of(original), metrics_before = bytes_of(run + "/metrics.jsonl");

  train::TrainConfig c = train::resume_config(backup + "/checkpoint.safetensors", {{"steps", 10}});
  EXPECT_EQ(c.run_dir, backup);
  EXPECT_EQ(c.steps, 10);
  train::train_on(c, task, backup + "/checkpoint.safetensors", 0, true);
  EXPECT_EQ(train::read_checkpoint_header(backup + "/checkpoint.safetensors").step, 10);
  EXPECT_EQ(logged_losses(backup).size(), 10u);
  EXPECT_EQ(bytes_of(original), ckpt_before) << "the original run's checkpoint was written";
  EXPECT_EQ(bytes_of(run + "/metrics.jsonl"), metrics_before) << "the original run's metrics were written";
}

TEST(Training, ResumingIntoAnotherRunFolderObeysTheOccupiedFolderRule) {
  data::TaskData task = counting_task(200, 20, 16);
  const std::string source = six_step_run(task, "resume_source");
  const std::string other = six_step_run(task, "resume_other");
  const std::string other_dir = std::filesystem::path(other).parent_path().string();
  const std::string other_before = bytes_of(other), other_metrics = bytes_of(other_dir + "/metrics.jsonl");
  train::TrainConfig c = train::resume_config(source, {{"steps", 8}, {"run", other_dir}});
  EXPECT_CAST_ERROR(train::train_on(c, task, source, 0, true), "run folder " + other_dir + " already holds a run");
  EXPECT_EQ(bytes_of(other), other_before);
  EXPECT_EQ(bytes_of(other_dir + "/metrics.jsonl"), other_metrics);
  // with --overwrite it becomes the resumed run's folder: the source's metrics, not the old run's
  c.overwrite = true;
  train::train_on(c, task, source, 0, true);
  EXPECT_EQ(train::read_checkpoint_header(other).step, 8);
  const auto source_losses = logged_losses(std::filesystem::path(source).parent_path().string());
  const auto moved = logged_losses(other_dir);
  ASSERT_EQ(moved.size(), 8u);
  EXPECT_EQ(std::vector<double>(moved.begin(), moved.begin() + 6), source_losses);
  // a new folder needs no --overwrite; the checkpoint's own folder named by --run is no other folder
  c = train::resume_config(source, {{"steps", 7}, {"run", temp_dir("resume_new_home")}});
  EXPECT_NO_THROW(train::train_on(c, task, source, 0, true));
  c = train::resume_config(source,
                           {{"steps", 7}, {"run", std::filesystem::path(source).parent_path().string() + "/."}});
  EXPECT_NO_THROW(train::train_on(c, task, source, 0, true));
  EXPECT_EQ(train::read_checkpoint_header(source).step, 7);
}

TEST(Training, ResumeSettingsAreAppliedOrRefusedByName) {
  data::TaskData task = counting_task(200, 20, 17);
  const std::string ckpt = six_step_run(task, "resume_settings");
  const std::string before = bytes_of(ckpt);
  // --steps at or below the checkpoint's step is a usage error
  for (int steps : {6, 3, 0}) try {
      train::resume_config(ckpt, {{"steps", steps}});
      ADD_FAILURE() << "steps " << steps << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("setting 'steps' is {}: a resumed run must end after its "
                                                       "checkpoint's step 6",
                                                       steps)),
                std::string::npos)
          << e.what();
    }
  // what may change is applied
  train::TrainConfig c = train::resume_config(ckpt, {{"steps", 9},
                                                     {"log-every", 3},
                                                     {"eval-every", 2},
                                                     {"checkpoint-every", 1},
                                                     {"eval-limit", 5},
                                                     {"eval-best", true},
                                                     {"recompute", true}});
  EXPECT_EQ(c.steps, 9);
  EXPECT_EQ(c.log_every, 3);
  EXPECT_EQ(c.eval_every, 2);
  EXPECT_EQ(c.checkpoint_every, 1);
  EXPECT_EQ(c.eval_limit, 5);
  EXPECT_TRUE(c.eval_best);
  EXPECT_TRUE(c.recompute);
  // what the checkpoint fixes is refused by name, unless asked equal to what it is
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"dim", 16}}),
                    "setting 'dim' cannot change when resuming: " + ckpt + " was trained with 32, not 16");
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"lr", 0.5}}), "setting 'lr' cannot change when resuming");
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"attention", "cast"}}), "setting 'attention' cannot change");
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"seed", 9}}), "setting 'seed' cannot change");
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"task", "listops"}}), "setting 'task' cannot change");
  EXPECT_CAST_ERROR(train::resume_config(ckpt, {{"stepz", 9}}), "unknown setting 'stepz'");
  EXPECT_NO_THROW(train::resume_config(ckpt, {{"dim", 32}, {"task", "counting"}, {"steps", 7}}));
  EXPECT_EQ(bytes_of(ckpt), before);
}

TEST(Training, EvalBestNeedsValidationsAndNeverClaimsABestItDidNotWrite) {
  data::TaskData task = counting_task(200, 20, 18);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("eval_best"));
  c.steps = 4;
  c.eval_best = true;
  try {
    train::train_on(c, task, "", 0, true);
    ADD_FAILURE() << "--eval-best without --eval-every accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("setting 'eval-best' needs 'eval-every' above 0"), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(c.run_dir)) << "a refused run made its folder";
  c.eval_every = 10;  // no validation within 4 steps: no best checkpoint, so the final model is evaluated
  train::train_on(c, task, "", 0, true);
  EXPECT_FALSE(std::filesystem::exists(c.run_dir + "/best.safetensors"));
  std::ifstream in(c.run_dir + "/summary.json");
  EXPECT_EQ(nlohmann::json::parse(in)["evaluated"], "final");
  c.eval_every = 2;
  c.overwrite = true;
  train::train_on(c, task, "", 0, true);
  std::ifstream again(c.run_dir + "/summary.json");
  const nlohmann::json summary = nlohmann::json::parse(again);
  EXPECT_EQ(summary["evaluated"], "best");
  // the step of the model evaluated is the best checkpoint's, not the run's last (sixth attack)
  EXPECT_EQ(summary["evaluated_step"], train::read_checkpoint_header(c.run_dir + "/best.safetensors").step);
}

// ---------------------------------------------------------------- a resume goes forward (issue 41)
TEST(Training, ResumingFromAnOlderCheckpointIntoItsRunIsRefusedAndRewindsNothing) {
  data::TaskData task = counting_task(200, 20, 17);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("no_rewind"));
  c.steps = 6;
  c.log_every = 1;
  c.eval_every = 2;
  train::train_on(c, task, "", 0, true);
  const std::string best = c.run_dir + "/best.safetensors", ckpt = c.run_dir + "/checkpoint.safetensors";
  ASSERT_TRUE(std::filesystem::exists(best));
  const std::string metrics = bytes_of(c.run_dir + "/metrics.jsonl"), newest = bytes_of(ckpt);
  train::TrainConfig more = c;
  more.steps = 10;
  // an older best rewinds the run; one of the newest checkpoint's step is said as the run's best model
  try {
    train::train_on(more, task, best, 0, true);
    ADD_FAILURE() << "resumed in place from the run's best model";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("would rewind run") != std::string::npos ||
                what.find("'s best model, of step 6, and a resume in place continues from the run's newest "
                          "checkpoint") != std::string::npos)
        << what;
  }
  EXPECT_EQ(bytes_of(c.run_dir + "/metrics.jsonl"), metrics);
  EXPECT_EQ(bytes_of(ckpt), newest);
  // into a new folder, the best checkpoint starts a branch
  more.run_dir = temp_dir("no_rewind_branch");
  EXPECT_NO_THROW(train::train_on(more, task, best, 0, true));
}

TEST(Training, AFinishedRunResumedWithoutNewStepsIsRefusedWithTheCommandThatEvaluatesIt) {
  data::TaskData task = counting_task(200, 20, 18);
  const std::string ckpt = six_step_run(task, "finished_resume");
  const std::string run_dir = std::filesystem::path(ckpt).parent_path().string();
  train::TrainConfig c = tiny_config(nn::Mechanism::full, run_dir);
  c.steps = 6;
  const std::string metrics = bytes_of(run_dir + "/metrics.jsonl");
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true), "is finished (step 6 of 6");
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true), "cast eval --checkpoint " + ckpt);
  EXPECT_EQ(bytes_of(run_dir + "/metrics.jsonl"), metrics);  // no second evaluation appended
  // nor copied into a new folder to be evaluated there again (tenth attack, K8)
  c.run_dir = temp_dir("finished_resume_copy");
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true), "is finished (step 6 of 6");
  EXPECT_FALSE(std::filesystem::exists(c.run_dir + "/checkpoint.safetensors"));
  c.steps = 8;  // with more steps it is a branch that trains on
  EXPECT_NO_THROW(train::train_on(c, task, ckpt, 0, true));
}

// A finished run resumed in place for more steps and stopped on the way keeps no summary of the
// step it has passed (twenty-second attack: summary.json said step 6 beside a checkpoint of step
// 7); a run that stops before its first new checkpoint keeps it, and the finished run again
// writes its own.
TEST(Training, AFinishedRunResumedForMoreStepsDropsItsSummaryOncePastIt) {
  data::TaskData task = counting_task(200, 20, 18);
  const std::string ckpt = six_step_run(task, "finished_more");
  const std::string run_dir = std::filesystem::path(ckpt).parent_path().string();
  const std::string summary = run_dir + "/summary.json";
  ASSERT_TRUE(std::filesystem::exists(summary));
  train::TrainConfig c = tiny_config(nn::Mechanism::full, run_dir);
  c.steps = 9;
  c.checkpoint_every = 0;
  const train::Interrupted stop = stopped_by(SIGINT, [&] { train::train_on(c, task, ckpt, 0, true); });
  EXPECT_EQ(train::read_checkpoint_header(ckpt).step, 7);
  EXPECT_FALSE(std::filesystem::exists(summary)) << stop.what();
  EXPECT_NO_THROW(train::train_on(c, task, ckpt, 0, true));
  EXPECT_EQ(nlohmann::json::parse(bytes_of(summary)).at("steps").get<int64_t>(), 9);
  // a summary.json that no cast run wrote is never removed
  std::ofstream(summary, std::ios::trunc) << "{\"steps\": 1}\n";
  train::remove_passed_summary(run_dir, 12);
  EXPECT_EQ(bytes_of(summary), "{\"steps\": 1}\n");
  // nor replaced by the run resumed there (twenty-fourth attack: a fresh run refused it, a resume
  // wrote over it)
  c.steps = 12;
  EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true),
                    "run file " + summary + ": exists and is not a cast run's summary");
  EXPECT_EQ(bytes_of(summary), "{\"steps\": 1}\n");
}

// A stop request during an evaluation ends it between batches.
TEST(Training, AStopRequestEndsAnEvaluation) {
  data::TaskData task = counting_task(40, 40, 19);
  train::TrainConfig c = tiny_config(nn::Mechanism::full, temp_dir("eval_stop"));
  nn::Transformer model(c.model, DType::f32, Device::cpu);
  train::request_stop(SIGTERM);
  try {
    train::evaluate(model, task, task.test, 4, 0, Device::cpu);
    ADD_FAILURE() << "the evaluation did not stop";
  } catch (const train::EvaluationStopped& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
  }
  train::clear_stop();
}

// ---------------------------------------------------------------- one owner per run folder (issue 41)
TEST(Training, ARunFolderHeldByAnotherProcessIsRefusedAndUntouched) {
  data::TaskData task = counting_task(200, 20, 20);
  const std::string ckpt = six_step_run(task, "held_folder");
  const std::string run_dir = std::filesystem::path(ckpt).parent_path().string();
  const std::string metrics = bytes_of(run_dir + "/metrics.jsonl");
  train::TrainConfig c = tiny_config(nn::Mechanism::full, run_dir);
  c.steps = 8;
  {
    const FolderHeldElsewhere holder(run_dir, "run folder");
    EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true),
                      fmt::format("run folder {} is in use by another cast process (pid {})", run_dir, holder.pid()));
  }
  EXPECT_EQ(bytes_of(run_dir + "/metrics.jsonl"), metrics);
  {  // its lock file deleted under it (a clean-up of dot files): the folder itself is still held
    const FolderHeldElsewhere holder(run_dir, "run folder");
    std::filesystem::remove(run_dir + "/.cast.lock");
    EXPECT_CAST_ERROR(train::train_on(c, task, ckpt, 0, true), "is in use by another cast process");
  }
  EXPECT_EQ(bytes_of(run_dir + "/metrics.jsonl"), metrics);
  EXPECT_NO_THROW(train::train_on(c, task, ckpt, 0, true));  // the holder gone, the lock went with it
}

// A second stop signal ends the process at once, in the middle of a checkpoint's write too: the
// file being written goes with it, so no half-written temporary stays beside the run.
namespace {
struct Signalled {
  int status = 0;
  std::string said;  // its standard error
};

// A child that arms its handlers (`arm`), then writes a 256 MiB checkpoint, signalled once the
// write has begun (its temporary file has bytes: it is named for removal between its creation
// and its first byte).
Signalled signalled_while_writing(const std::string& dir, const std::function<void()>& arm, int signal) {
  std::filesystem::create_directories(dir);
  const std::string target = dir + "/checkpoint.safetensors", said = dir + "/stderr.txt";
  const pid_t writer = fork();
  if (writer == 0) {
    try {
      const int err = ::open(said.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err < 0 || ::dup2(err, STDERR_FILENO) < 0) _exit(4);
      arm();
      files::write_atomic(target, std::string(size_t(256) << 20, 'x'), "checkpoint");
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  Signalled r;
  bool ended = false;
  const auto start = std::chrono::steady_clock::now();
  const auto writing = [&] {
    std::error_code ec;
    return std::filesystem::file_size(target + ".tmp", ec) > 0 && !ec;
  };
  while (!writing() && !(ended = waitpid(writer, &r.status, WNOHANG) == writer) &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  EXPECT_FALSE(ended) << "the writer ended before it was signalled, status " << r.status;
  EXPECT_TRUE(std::filesystem::exists(target + ".tmp")) << "the write never began";
  if (!ended) {
    kill(writer, signal);
    waitpid(writer, &r.status, 0);
  }
  EXPECT_FALSE(std::filesystem::exists(target + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(target));
  std::ifstream in(said);
  r.said.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return r;
}
}  // namespace

TEST(Training, ASecondStopSignalLeavesNoTemporaryFile) {
  const Signalled r = signalled_while_writing(temp_dir("second_signal"), [] {
    train::install_stop_handlers();
    train::set_second_signal_note(": the last checkpoint stays");
    train::request_stop(SIGTERM);  // the first signal has come: the next one ends the process
  }, SIGTERM);
  // by the signal itself, so that a shell loop running it stops too (the shell reports 143)
  ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status;
  EXPECT_EQ(WTERMSIG(r.status), SIGTERM);
  // and one line says so (ninth attack, J9: it exited without a word)
  EXPECT_EQ(r.said, "cast: stopped at once by a second SIGTERM: the last checkpoint stays\n");
}

// A command with nothing to save (cast attention, plot, layer...) stopped while it writes its
// output leaves no temporary file either (ninth attack, J8: it died by the signal mid-write).
TEST(Training, ASignalDuringAnotherCommandsWriteLeavesNoTemporaryFile) {
  const Signalled r = signalled_while_writing(temp_dir("exit_signal"), [] { train::install_exit_handlers(); }, SIGINT);
  ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status;
  EXPECT_EQ(WTERMSIG(r.status), SIGINT);
  EXPECT_EQ(r.said, "cast: stopped by SIGINT\n");
}

// A cluster count beyond the sequence is refused before the folder is touched; a cluster size
// beyond it is held at the sequence (the whole sequence in one cluster).
TEST(Training, ClustersBeyondTheSequenceAreRefused) {
  data::TaskData task = counting_task(40, 10, 21);
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("too_many_clusters"));
  c.model.attention.clusters = 65536;
  EXPECT_CAST_ERROR(train::train_on(c, task, "", 0, true), "setting 'clusters' is 65536: more than the 17 tokens");
  EXPECT_FALSE(std::filesystem::exists(c.run_dir + "/metrics.jsonl"));
  c.model.attention.clusters = 4;
  c.model.attention.cluster_size = 1 << 22;  // before, (B, H, C, κ) slots of this size were allocated
  c.steps = 1;
  EXPECT_NO_THROW(train::train_on(c, task, "", 0, true));
}

namespace {
// The validation and test records of a run's metrics, in order: (split, step, loss, accuracy).
std::vector<std::string> evaluation_lines(const std::string& run_dir) {
  std::vector<std::string> lines;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("run");  // each run's own id: the two runs compared are two
    if (j["split"] != "train") lines.push_back(j.dump());
  }
  return lines;
}

// The run stopped by a stop request seen at the (polls + 1)-th poll: one a step, one an
// evaluation's batch, one before the final evaluation.
train::Interrupted stopped_at_poll(int64_t polls, const std::function<void()>& run) {
  train::request_stop_after_polls(SIGINT, polls);
  return interrupted(run);
}
}  // namespace

// A stop inside a validation, the last step's too, leaves the checkpoint as the step left it (the
// clustering draws included), and the resumed run does that validation again: it validates,
// chooses its best model and ends as the straight run did (ninth attack, J1 and J2). Stops
// during the final evaluation, twice, write its records once (J7). Polls of a 4-step run with
// 5 batches a validation: steps 1 and 2, the validation after step 2 (3 to 7), steps 3 and 4,
// the validation after step 4 (10 to 14), the check before the final evaluation (15), its
// validation (16 to 20) and test (21 to 25).
TEST(Training, AStopInsideAnEvaluationResumesAsTheStraightRun) {
  for (const nn::Mechanism mechanism : {nn::Mechanism::full, nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
    const std::string name = nn::mechanism_name(mechanism);
    data::TaskData task = counting_task(300, 40, 12);
    train::TrainConfig c = tiny_config(mechanism, temp_dir("eval_stop_straight_" + name));
    c.steps = 4, c.eval_every = 2, c.log_every = 1, c.batch = 8, c.eval_best = true;
    const train::TrainResult straight = train::train_on(c, task, "", 0, true);
    for (const auto& [polls, where] : std::vector<std::pair<int64_t, std::string>>{
             {3, "during the validation after step 2"},
             {11, "during the validation after step 4"},
             {21, "during the final evaluation"}}) {
      SCOPED_TRACE(name + " " + where);
      train::TrainConfig s = c;
      s.run_dir = temp_dir("eval_stop_" + name + "_" + std::to_string(polls));
      const std::string ckpt = s.run_dir + "/checkpoint.safetensors";
      const train::Interrupted e = stopped_at_poll(polls, [&] { train::train_on(s, task, "", 0, true); });
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
      if (polls == 21) {  // once more in the resumed run's final evaluation: its check, validation, 2 test batches
        const train::Interrupted again = stopped_at_poll(7, [&] { train::train_on(s, task, ckpt, 0, true); });
        EXPECT_NE(std::string(again.what()).find("during the final evaluation"), std::string::npos) << again.what();
      }
      const train::TrainResult rest = train::train_on(s, task, ckpt, 0, true);
      EXPECT_EQ(logged_losses(s.run_dir), logged_losses(c.run_dir));
      EXPECT_EQ(evaluation_lines(s.run_dir), evaluation_lines(c.run_dir));
      EXPECT_EQ(rest.test.loss, straight.test.loss);
      EXPECT_EQ(rest.val.accuracy, straight.val.accuracy);
      const auto summary = [](const std::string& dir) {
        return nlohmann::json::parse(slurp(dir + "/summary.json"))["evaluated_step"].get<int64_t>();
      };
      EXPECT_EQ(summary(s.run_dir), summary(c.run_dir));
    }
  }
}

// A blank line in a run's metrics holds no record to lose: a resume goes on (eleventh attack,
// L6: it was refused with advice to move the whole file away).
TEST(Training, ABlankMetricsLineDoesNotStopAResume) {
  data::TaskData task = counting_task(200, 20, 23);
  const std::string ckpt = six_step_run(task, "blank_metrics_line");
  const std::string run_dir = std::filesystem::path(ckpt).parent_path().string();
  std::ofstream(run_dir + "/metrics.jsonl", std::ios::app) << "\n";
  train::TrainConfig c = tiny_config(nn::Mechanism::full, run_dir);
  c.steps = 8;
  EXPECT_NO_THROW(train::train_on(c, task, ckpt, 0, true));
  EXPECT_EQ(train::read_checkpoint_header(ckpt).step, 8);
}
