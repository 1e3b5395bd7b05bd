#pragma once
// Checkpoints: parameters, AdamW moments, step, RNG offset and the run's settings, written
// atomically and only when every value is finite; read back strictly; and the settings of a
// resumed run.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/transformer.h"
#include "datasets/data.h"
#include "train/settings.h"

namespace cast::train {

// What a run has spent so far, summed over every process that worked on it.
struct RunCost {
  double wall_seconds = 0;  // steps, evaluations and checkpoints
  double step_seconds = 0;  // training steps only
  int64_t peak_bytes = 0;   // most memory tensors held at once (host, or the GPU's allocator)
};
// The training statistics since the last progress line. A checkpoint written between two lines
// (a stop) carries them, so that a resumed run's next line covers the same steps, with the same
// sums, as the line of a run that was not stopped.
struct LogWindow {
  double loss = 0, correct = 0, examples = 0, tokens = 0;  // loss summed over examples
};
struct Checkpoint {
  TrainConfig config;
  int64_t step = 0;
  uint64_t rng_offset = 0;
  double best_val = -1;
  int64_t best_step = -1;  // the step of that validation; -1 where not recorded (an older cast's)
  RunCost cost;       // zero in checkpoints written before it was recorded
  LogWindow window;   // empty in checkpoints written before it was recorded
  std::string data;   // data::fingerprint of the set it trained on; "" where not recorded
  // Drawn when the run starts at step 0 and kept by every resume and branch of it, so a file of
  // another run (a best.safetensors copied in) is told apart even where every setting agrees;
  // "" in checkpoints written before it was recorded.
  std::string run_id;
};
// A fresh run id: 16 lowercase hexadecimal digits from the system's random source.
std::string new_run_id();
// The run id of a checkpoint: its own, or for one written before ids were kept, one derived from
// its settings, step and dropout offset, so that every process resuming it gives its records the
// same id.
std::string run_id_of(const Checkpoint& ck);
// save_checkpoint refuses to write a NaN or infinity (so the checkpoint on disk stays the last
// good one): this error names the tensor.
class NonFiniteCheckpoint : public Error {
 public:
  using Error::Error;
};
void save_checkpoint(const std::string& path, const TrainConfig& c, nn::Transformer& model,
                     const std::vector<Tensor>& m, const std::vector<Tensor>& v, int64_t step, double best_val,
                     const RunCost& cost = {}, const LogWindow& window = {}, const std::string& data = "",
                     const std::string& run_id = "", int64_t best_step = -1);
// Reads the configs and counters; loads parameters (and moments when m, v are given) into
// `model`, which must have been built from the same model config.
Checkpoint read_checkpoint_header(const std::string& path);
// "" when a checkpoint of model `theirs` loads into a model built from `mine`, else the first
// setting where they differ ("'seed' is 7 in the checkpoint but 1 in this model").
std::string model_difference(const nn::ModelConfig& theirs, const nn::ModelConfig& mine);
// Refuses (naming the tensor) a file holding a NaN or infinity: such a model evaluates to a
// plausible-looking accuracy and poisons a resumed run.
void load_checkpoint(const std::string& path, nn::Transformer& model, std::vector<Tensor>* m, std::vector<Tensor>* v);

// "" when every floating-point value in `tensors` (or the file at `path`) is finite, else the
// first that is not: "'param/x' holds nan at element 3".
std::string non_finite_in(const std::map<std::string, Tensor>& tensors);
std::string checkpoint_damage(const std::string& path);
// What a stopped run can go back to, said only of a checkpoint read back and found finite.
// `usable`, when given, says whether it names a checkpoint a run may resume from.
std::string last_good_checkpoint(const std::string& path, bool* usable = nullptr);
// Why there is no checkpoint at `path`: none written yet, or its folder gone (moved away while
// the run went on), as the first words of a sentence.
std::string no_checkpoint_at(const std::string& path);

// Refuses a checkpoint (at `path`) of a task cast does not have, or whose model's classes are
// not its task's: an edited file's, said as such (the commands that read a task's data from a
// checkpoint; the library's own tasks, in tests, are not the registry's).
void check_task_of(const Checkpoint& ck, const std::string& path);

// The settings of a resumed run: the checkpoint's, with `changes` (a config file's keys, then
// the flags') applied where a run may change on the way (the table's resumable settings) and a
// UsageError naming any other setting asked to differ. The run folder is the checkpoint's own
// unless `changes` has "run"; "steps" must lie above the checkpoint's step.
TrainConfig resume_config(const std::string& checkpoint, const nlohmann::json& changes);

// A checkpoint with its model loaded and its task's data read (for `cast eval`, `cast clusters`).
struct TrainedRun {
  Checkpoint checkpoint;
  std::unique_ptr<nn::Transformer> model;
  data::TaskData task;
  std::string data_note;  // where the set read is not the one the run trained on: a line saying so
};
// A note where `now`, the fingerprint of the set read from `folder`, is not the checkpoint's (a
// folder regenerated since, another set by the same relative name); "" where they agree or the
// checkpoint recorded none.
std::string other_set_note(const Checkpoint& ck, const std::string& now, const std::string& folder);
// `e`, an error reading `folder`, the data folder checkpoint `path` recorded (which the user did
// not type; `task_default`: it recorded none, and `folder` is the task's default), thrown again as
// the same kind of error saying whose folder it is.
[[noreturn]] void throw_from_recorded_data_folder(const Error& e, const std::string& folder, const std::string& path,
                                                  bool task_default = false);
// data_dir empty: the folder the run used.
TrainedRun open_trained_run(const std::string& path, const std::string& data_dir, Device device);
// Refuses an output of a command on a trained run (its settings, `trained`) that would go inside
// the data folder it reads (`data_dir`, or the run's own when empty). Checked first: no
// --overwrite allows it, so no other refusal should suggest one before it.
void check_outside_data(const std::string& out, const std::string& option, const TrainConfig& trained,
                        const std::string& data_dir);

// The run's model with another attention mechanism and the same weights, as the clustered-
// attention paper approximates a trained model without retraining. Full, clustered and
// improved clustered attention share their weights (the projections); CAST has surrogate
// tokens and a gate that the others lack, and is refused either way.
void swap_attention(TrainedRun& run, const nn::AttentionConfig& attention, Device device);
// The trained model with another mechanism and the same weights, on `device`; `trained` is left
// as it is (swap_attention's work, for a sweep over several mechanisms).
std::unique_ptr<nn::Transformer> with_attention(nn::Transformer& trained, const nn::AttentionConfig& attention,
                                                Device device);
// The usage error swap_attention gives when a model trained with `from` cannot run `to`.
void check_swappable(nn::Mechanism from, nn::Mechanism to);

}  // namespace cast::train
