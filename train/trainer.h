#pragma once
// Training: AdamW with the LRA settings, warmup + rsqrt or cosine decay, gradient clipping,
// evaluation, checkpoints that resume bit-identically on the CPU, metrics and a loss plot.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "nn/transformer.h"
#include "train/data.h"

namespace cast::train {

struct TrainConfig {
  std::string task = "listops-short";
  std::string data_dir;  // empty: the task's default
  std::string run_dir;   // empty: runs/<task>-<mechanism>
  int64_t steps = 1000, batch = 32, warmup = 100;
  int64_t log_every = 20, eval_every = 0, checkpoint_every = 200;  // eval_every 0: at the end only
  int64_t eval_limit = 0;  // evaluate on at most this many examples per split (0: all)
  double lr = 1e-3, weight_decay = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.98, eps = 1e-9;
  std::string schedule = "cosine";  // rsqrt | cosine | constant
  uint64_t seed = 1;
  bool eval_best = false;  // evaluate the checkpoint of best validation accuracy instead of the final model
  std::string device = "auto";  // auto | cpu | cuda
  bool tf32 = false;
  bool reference = false;  // CPU: step-by-step attention ops and plain-loop matmul (for study)
  // A new run refuses a run folder that already holds a checkpoint unless this is set. Not a
  // setting of the run: it is never stored.
  bool overwrite = false;
  nn::ModelConfig model;

  nlohmann::json to_json() const;  // the training fields (the model has its own)
};

// The reference settings of a task (LRA.md), or the small CPU presets.
TrainConfig preset(const std::string& task);
// Sets the fields named in `j` (flat keys, as the command-line flags without dashes).
void apply_overrides(TrainConfig& c, const nlohmann::json& j);  // then validate(c)
// Every setting within its range; a UsageError naming the setting, its value and the range.
void validate(const TrainConfig& c);
// A setting's value in `c`, as its flag would spell it (the inverse of apply_overrides).
std::string setting_value(const TrainConfig& c, const std::string& key);
const std::vector<std::string>& task_names();  // every preset

double learning_rate(const TrainConfig& c, int64_t step);  // step is 1-based

data::TaskData load_task(const TrainConfig& c, bool generate_if_missing);

// "task, mechanism attention, L layers, D d: S steps of batch B": the title of a run's figures.
std::string run_title(const TrainConfig& c);

struct EvalResult {
  double loss = 0, accuracy = 0;
  double majority = 0;  // the commonest label's share among exactly the examples evaluated
  int64_t examples = 0;
};
EvalResult evaluate(nn::Transformer& model, const data::TaskData& task, const std::vector<data::Example>& split,
                    int64_t batch, int64_t limit, Device device);

struct TrainResult {
  EvalResult val, test;
  double majority = 0;  // majority-class rate of the test split
  int64_t steps = 0;
  std::vector<double> losses;  // per-step training loss (this process only)
};

// Runs (or, with a checkpoint path, resumes) a training run. `stop_after` > 0 stops after that
// many steps of this process (for tests of resume), leaving a checkpoint.
TrainResult run_training(TrainConfig config, const std::string& resume_from = "", int64_t stop_after = 0,
                         bool quiet = false);
// The same on task data already in memory (tests, synthetic tasks).
TrainResult train_on(TrainConfig config, const data::TaskData& task, const std::string& resume_from = "",
                     int64_t stop_after = 0, bool quiet = false);

// Checkpoints: parameters, AdamW moments, step, RNG offset and both configs, written atomically.
// What a run has spent so far, summed over every process that worked on it.
struct RunCost {
  double wall_seconds = 0;   // steps, evaluations and checkpoints
  double step_seconds = 0;   // training steps only
  int64_t peak_bytes = 0;    // most memory tensors held at once (host, or the GPU's allocator)
};
struct Checkpoint {
  TrainConfig config;
  int64_t step = 0;
  uint64_t rng_offset = 0;
  double best_val = -1;
  RunCost cost;  // zero in checkpoints written before it was recorded
};
// save_checkpoint refuses to write a NaN or infinity (so the checkpoint on disk stays the last
// good one): this error names the tensor.
class NonFiniteCheckpoint : public Error {
 public:
  using Error::Error;
};
void save_checkpoint(const std::string& path, const TrainConfig& c, nn::Transformer& model,
                     const std::vector<Tensor>& m, const std::vector<Tensor>& v, int64_t step, double best_val,
                     const RunCost& cost = {});
// Reads the configs and counters; loads parameters (and moments when m, v are given) into
// `model`, which must have been built from the same model config.
Checkpoint read_checkpoint_header(const std::string& path);
// Refuses (naming the tensor) a file holding a NaN or infinity: such a model evaluates to a
// plausible-looking accuracy and poisons a resumed run.
void load_checkpoint(const std::string& path, nn::Transformer& model, std::vector<Tensor>* m, std::vector<Tensor>* v);

// "" when every floating-point value in `tensors` (or the file at `path`) is finite, else the
// first that is not: "'param/x' holds nan at element 3".
std::string non_finite_in(const std::map<std::string, Tensor>& tensors);
std::string checkpoint_damage(const std::string& path);

// The settings of a resumed run: the checkpoint's, with `changes` (a config file's keys, then
// the flags') applied where a run may change on the way (steps, logging, evaluation,
// checkpoint cadence, data folder, device, run folder) and a UsageError naming any other
// setting asked to differ. The run folder is the checkpoint's own unless `changes` has "run";
// "steps" must lie above the checkpoint's step.
TrainConfig resume_config(const std::string& checkpoint, const nlohmann::json& changes);

Device resolve_device(const std::string& name);
// Memory tensors hold on a device: the peak since the last reset.
void reset_peak_memory(Device device);
size_t peak_memory(Device device);

// A checkpoint with its model loaded and its task's data read (for `cast eval`, `cast clusters`).
struct TrainedRun {
  Checkpoint checkpoint;
  std::unique_ptr<nn::Transformer> model;
  data::TaskData task;
};
// data_dir empty: the folder the run used.
TrainedRun open_trained_run(const std::string& path, const std::string& data_dir, Device device);

}  // namespace cast::train
