#pragma once
// The training loop: AdamW with the LRA settings, warmup + rsqrt or cosine decay, gradient
// clipping, periodic evaluation and checkpoints (a resumed run is bit-identical on the CPU),
// metrics and a loss plot. Its parts each have their own file: the settings
// (train/settings.h), the tasks (train/tasks.h), evaluation (train/evaluate.h), checkpoints
// (train/checkpoint.h) and the run folder (train/run_folder.h).
#include <cstdint>
#include <string>
#include <vector>

#include "nn/transformer.h"
#include "train/checkpoint.h"
#include "datasets/data.h"
#include "train/evaluate.h"
#include "train/settings.h"
#include "train/tasks.h"

namespace cast::train {

double learning_rate(const TrainConfig& c, int64_t step);  // step is 1-based

// "task, mechanism attention, L layers, D d: S steps of batch B": the title of a run's figures.
std::string run_title(const TrainConfig& c);

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

// What a run's start refuses about its task before the folder is touched: a split with no
// examples, a task that does not fit the model, a step beyond the device's memory (cast compare
// asks it of every run before its first).
void check_run_fits(TrainConfig config, const data::TaskData& task);
// Refuses more clusters than a sequence of `length` (tokens, or pixels under patches) has.
void check_clusters_fit(const nn::ModelConfig& m, int64_t length);
// `from_checkpoint`: the name may be a checkpoint's, kept by a resumed run or an evaluation.
Device resolve_device(const std::string& name, bool from_checkpoint = false);
// Sets the process's precision (tensor/precision.h) from its name; tf32 and bf16 need the GPU
// (a usage error on the CPU, naming `option`).
// `hint` ends the refusal's parenthesis (how to get out of it where the value was not the user's).
void use_precision(const std::string& name, Device device, const char* option = "--precision", const char* hint = "");
// Memory tensors hold on a device: the peak since the last reset.
void reset_peak_memory(Device device);
size_t peak_memory(Device device);

}  // namespace cast::train
