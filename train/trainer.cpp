// The training loop. train_on reads top to bottom as its stages: where the run starts, its
// checks, its folder, its model, the steps, and the final evaluation.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <sstream>
#include <system_error>

#include "autograd/tape.h"
#include "train/adamw.h"
#include "ops/ops.h"
#include "tensor/device_memory.h"
#include "tensor/files.h"
#include "tensor/philox.h"
#include "tensor/precision.h"
#include "train/memory_estimate.h"
#include "figures/plot.h"
#include "train/run_folder.h"
#include "train/stop.h"
#include "train/trace.h"
#include "train/training_step.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace cast::train {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double learning_rate(const TrainConfig& c, int64_t step) {
  const double s = static_cast<double>(step), w = static_cast<double>(std::max<int64_t>(c.warmup, 1));
  if (c.schedule == "rsqrt") return c.lr * std::min(1.0, s / w) / std::sqrt(std::max(s, w));
  if (c.schedule == "constant") return c.lr * std::min(1.0, s / w);
  if (step <= c.warmup) return c.lr * s / w;
  const double progress = (s - c.warmup) / std::max(1.0, static_cast<double>(c.steps - c.warmup));
  return c.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, progress)));
}

std::string run_title(const TrainConfig& c) {
  return fmt::format("{}, {} attention, {} layer{}, D {}: {} steps of batch {}", c.task,
                     nn::mechanism_name(c.model.attention.mechanism), c.model.layers, c.model.layers == 1 ? "" : "s",
                     c.model.dim, c.steps, c.batch);
}

// ---------------------------------------------------------------- devices
Device resolve_device(const std::string& name, bool from_checkpoint) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") {
    // named by --device, or kept in the checkpoint of a run resumed without --device
    CAST_CHECK(device_memory::cuda_available(),
               "device cuda: no CUDA GPU is available here; pass --device cpu to run on the CPU{}",
               from_checkpoint ? " (a run resumed from a GPU checkpoint keeps its device and precision: add "
                                 "--precision fp32 to a tf32 or bf16 one)"
                               : "");
    return Device::cuda;
  }
  CAST_CHECK(name == "auto", "--device must be auto, cpu or cuda, got '{}'", name);
  return device_memory::cuda_available() ? Device::cuda : Device::cpu;
}

void reset_peak_memory(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) return cuda::reset_peak_memory();
#endif
  (void)device;
  reset_host_peak_memory();
}

size_t peak_memory(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) return cuda::memory_stats().peak;
#endif
  (void)device;
  return host_memory_stats().peak;
}

void use_precision(const std::string& name, Device device, const char* option, const char* hint) {
  const Precision p = parse_precision(name);
  CAST_CHECK_USAGE(device == Device::cuda || p == Precision::fp32,
                   "{} is {}: the CPU computes in fp32 only (tf32 and bf16 need --device cuda{})", option, name, hint);
  set_precision(p);
}

// A cluster count beyond a sequence's tokens fills nothing and only costs time and memory
// (C = 65536 on 49 tokens ran for minutes a step): refused, naming the setting. (A cluster size
// beyond them is the whole sequence: the layer holds it at N, and the run is noted as full attention.)
void check_clusters_fit(const nn::ModelConfig& m, int64_t length) {
  const nn::AttentionConfig& a = m.attention;
  if (a.mechanism == nn::Mechanism::full) return;
  const int64_t tokens = length / (m.patch * m.patch) + (m.cls_pooling ? 1 : 0);
  CAST_CHECK_USAGE(a.clusters <= tokens, "setting 'clusters' is {}: more than the {} tokens a sequence has", a.clusters,
                   tokens);
  // top keys beyond the tokens would be cut to them without a word; the default (32) is cut to
  // a shorter sequence, as the paper's setting is for sequences of thousands
  CAST_CHECK_USAGE(a.mechanism != nn::Mechanism::iclustered || a.topk <= tokens || a.topk == nn::AttentionConfig{}.topk,
                   "setting 'topk' is {}: more than the {} tokens a sequence has", a.topk, tokens);
}

namespace {

// ---------------------------------------------------------------- the data order
// Epoch e visits the training set in a Philox permutation drawn from (seed, e), so the batch of
// any step is known from the step alone (and a resumed run sees the same data).
class Sampler {
 public:
  Sampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> batch(int64_t step, int64_t size) {  // step is 1-based
    std::vector<int64_t> out;
    for (int64_t j = 0; j < size; ++j) {
      const int64_t global = (step - 1) * size + j, epoch = global / n_;
      if (epoch != epoch_) shuffle(epoch);
      out.push_back(order_[global % n_]);
    }
    return out;
  }

 private:
  void shuffle(int64_t epoch) {
    order_.resize(n_);
    std::iota(order_.begin(), order_.end(), 0);
    const uint64_t key = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch);
    for (int64_t i = n_ - 1; i > 0; --i)
      std::swap(order_[i], order_[std::min<int64_t>(i, static_cast<int64_t>(philox::uniform(key, i) * (i + 1)))]);
    epoch_ = epoch;
  }
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---------------------------------------------------------------- a run in this process
// The training statistics since the last progress line; a resumed run starts with those its
// checkpoint carried, whose tokens its own clock did not time.
struct Window : LogWindow {
  double untimed_tokens = 0;
  Clock::time_point start;
};

struct Run {
  Run(const TrainConfig& config, const data::TaskData& data, bool silent) : c(config), task(data), quiet(silent) {}
  TrainConfig c;
  const data::TaskData& task;
  bool quiet = false, terminal = false;
  Device device = Device::cpu;
  std::string checkpoint;  // the run folder's checkpoint.safetensors
  int64_t checkpoint_steps = -1;  // the --steps its config holds: the resumed one's, then this run's
  std::string schedule_note;  // said once the run is accepted, not before a refusal
  // Where this process starts: step 0, or a checkpoint's step, best validation and cost.
  int64_t start_step = 0, step = 0;
  int64_t saved_step = -1;  // the step of the checkpoint this process wrote last (not written twice)
  double best_val = -1;
  int64_t best_step = -1;  // the step of the best validation
  RunCost earlier;  // what the processes before this one spent
  // The model and its AdamW moments.
  std::unique_ptr<nn::Transformer> model;
  nn::ParamList params;
  std::vector<Tensor> m, v;
  std::optional<files::AppendFile> metrics;
  files::FolderLock folder_lock;  // the run folder is this process's until the run ends
  Clock::time_point t0;
  double step_seconds = 0;  // this process's, steps only
  Window window;            // since the last progress line
  std::string data;         // data::fingerprint(task), kept in each checkpoint
  std::string run_id;       // the checkpoint's, or drawn now (checkpoint.h)
};

// The command that continues the run: the comparison's own, or a resume from its checkpoint.
std::string resume_with(const Run& run) {
  if (!run.c.resume_command.empty()) return run.c.resume_command;
  // a checkpoint of a run now resumed for more steps still holds its own: they are said again
  const bool other_steps = run.checkpoint_steps >= 0 && run.checkpoint_steps != run.c.steps;
  return "cast train --resume " + shell_quote(run.checkpoint) +
         (other_steps ? fmt::format(" --steps {}", run.c.steps) : "");
}

// A resumed run given other --steps runs the rest of a new schedule: cosine's rate at the
// checkpoint's step moves with the run's length (a finished run resumed for more steps starts
// again near --lr), while its curves and summary.json show the new schedule alone. Said.
std::string changed_schedule_note(const TrainConfig& before, const TrainConfig& now, int64_t step) {
  if (before.steps == now.steps || step == 0) return "";
  const double was = learning_rate(before, step), is = learning_rate(now, step);
  if (std::abs(is - was) <= 1e-3 * std::max(now.lr, 1e-300)) return "";
  return fmt::format("note: the {} schedule now spans {} steps, not the checkpoint's {}: the learning rate at step {} "
                     "is {:.3g} under it, {:.3g} under the old one, and goes on from there",
                     now.schedule, now.steps, before.steps, step, is, was);
}

void read_resume_point(Run& run, const std::string& resume_from) {
  run.run_id = new_run_id();  // a new run's (a branch draws its own once its folder is known)
  if (resume_from.empty()) return;
  const Checkpoint ck = read_checkpoint_header(resume_from);  // a different model is refused by load_checkpoint
  run.run_id = run_id_of(ck);
  run.start_step = run.step = ck.step;
  run.checkpoint_steps = ck.config.steps;
  run.best_val = ck.best_val;
  run.best_step = ck.best_step;
  run.earlier = ck.cost;
  static_cast<LogWindow&>(run.window) = ck.window;
  run.window.untimed_tokens = ck.window.tokens;
  const std::string note = other_set_note(ck, run.data, data_folder(run.c));
  if (!note.empty() && !run.quiet) fmt::print("{}\n", note);
  run.schedule_note = changed_schedule_note(ck.config, run.c, ck.step);
}

void check_run_settings(const Run& run, const std::string& resume_from) {
  const TrainConfig& c = run.c;
  CAST_CHECK_USAGE(c.steps >= run.start_step, "setting 'steps' is {}: the checkpoint {} is already at step {}", c.steps,
                   resume_from, run.start_step);
  if (c.eval_best && c.eval_every <= 0) {
    // a resumed run keeps the flag from its checkpoint, where the user may not have typed it
    const bool kept = !resume_from.empty() && read_checkpoint_header(resume_from).config.eval_best;
    throw UsageError(fmt::format(
        "setting 'eval-best' needs 'eval-every' above 0: the best checkpoint is chosen at the validations during "
        "training{}",
        kept ? fmt::format(" ('eval-best' is kept from checkpoint {}; a --config file holding {{\"eval-best\": false}} "
                           "turns it off)",
                           resume_from)
             : ""));
  }
}

// A GPU run resumed on the CPU keeps its checkpoint's precision: the refusal says how to change it.
constexpr const char* kResumedPrecisionHint =
    "; a run resumed from a GPU checkpoint keeps its precision: add --precision fp32";

// The device, and what computes on it: TF32, the CPU's matmul, the fused attention kernels.
void choose_compute(Run& run) {
  run.device = resolve_device(run.c.device, true);
  use_precision(run.c.precision, run.device, "setting 'precision'", kResumedPrecisionHint);
  ops::set_cpu_gemm(run.c.reference ? ops::CpuGemm::loops : ops::CpuGemm::blas);
  run.c.model.attention.fused = !run.c.reference;
  run.c.model.recompute = run.c.recompute;
}

}  // namespace

// The most tokens of an example of any split (of either text, where there are two).
static int64_t longest_example(const data::TaskData& task) {
  size_t most = 0;
  for (const auto* split : {&task.train, &task.val, &task.test})
    for (const data::Example& e : *split) most = std::max({most, e.tokens.size(), e.tokens2.size()});
  return static_cast<int64_t>(most);
}

// The task has examples, fits the model, and a step fits in the device's memory.
static void check_task_fits(const TrainConfig& c, const data::TaskData& task, Device device) {
  for (const auto& [split, examples] :
       {std::pair<const char*, const std::vector<data::Example>*>{"training", &task.train},
        {"validation", &task.val},
        {"test", &task.test}})
    CAST_CHECK(!examples->empty(), "task {}: the {} split has no examples (data folder {}: a set too small to split?)",
               task.name, split, data_folder(c));
  CAST_CHECK(task.vocab <= c.model.vocab && task.classes == c.model.classes && task.dual == c.model.dual,
             "task {} (vocab {}, {} classes) does not fit the model (vocab {}, {} classes)", task.name, task.vocab,
             task.classes, c.model.vocab, c.model.classes);
  // an image is read whole: a sequence longer than its pixels (Path-X's model on 32 x 32 images)
  // would be padding, a shorter one a cut image
  if (task.image_side > 0 && c.model.patch == 1)
    CAST_CHECK_USAGE(task.image_side * task.image_side == c.model.max_len,
                     "task {}: the images in {} are {} x {} ({} pixels), not the --max-len {} the model reads",
                     task.name, data_folder(c), task.image_side, task.image_side, task.image_side * task.image_side,
                     c.model.max_len);
  if (c.model.patch > 1) {
    CAST_CHECK_USAGE(task.image_side > 0, "--patch {}: task {} is not an image task", c.model.patch, task.name);
    CAST_CHECK_USAGE(task.image_side * task.image_side == c.model.max_len,
                     "--patch {}: task {}'s images have {} pixels, not --max-len {}", c.model.patch, task.name,
                     task.image_side * task.image_side, c.model.max_len);
  }
  const int64_t length = std::min(c.model.max_len, task.max_len);
  // A batch is padded to its longest example, not to --max-len: the step is sized by the longest
  // the data holds, with the cluster count the model takes from --max-len (nn::Block), and a
  // cluster or top-key count the user gave is held to that sequence
  const int64_t longest = std::min(length, longest_example(task));
  check_clusters_fit(c.model, longest);
  nn::ModelConfig sized = c.model;
  sized.attention.clusters = c.model.cluster_count();
  const StepBytes parts = training_step_parts(sized, c.batch, longest, device == Device::cuda);
  require_memory(parts.total(), device,
                 fmt::format("a training step of batch {} at length {}{}", c.batch, longest,
                             longest < length ? " (the longest example)" : ""),
                 parts.largest());
}

void check_run_fits(TrainConfig c, const data::TaskData& task) {
  // as choose_compute sets them for the run
  c.model.attention.fused = !c.reference;
  c.model.recompute = c.recompute;
  check_task_fits(c, task, resolve_device(c.device, false));
}

namespace {

// Examples the loader cut to --max-len are said, not trained on silently.
void note_cut_examples(const data::TaskData& task, int64_t max_len) {
  for (const auto& [split, examples] :
       {std::pair<const char*, const std::vector<data::Example>*>{"training", &task.train},
        {"validation", &task.val},
        {"test", &task.test}}) {
    const auto cut = std::count_if(examples->begin(), examples->end(), [](const data::Example& e) { return e.cut; });
    if (cut > 0)
      fmt::print("note: --max-len {} cuts {} of the {} {} examples to their first {} tokens\n", max_len, cut,
                 examples->size(), split, max_len);
  }
}

// A schedule whose rate never reaches --lr, or is 0 at every step, is said, not run silently.
void note_schedule(const TrainConfig& c) {
  if (c.warmup > c.steps)  // at warmup = steps the last step reaches the peak
    fmt::print("note: --warmup {} is above --steps {}: the learning rate rises for the whole run and never reaches "
               "its peak ({:.3g} at step {}{})\n",
               c.warmup, c.steps, learning_rate(c, c.warmup), c.warmup,
               c.schedule == "rsqrt" ? fmt::format(": --lr {} over the square root of --warmup", c.lr)
                                     : fmt::format(", --lr"));
  else if (c.schedule == "cosine" && c.steps == 1 && c.warmup == 0)
    fmt::print("note: the cosine schedule reaches 0 at the last step, and the one step is the last: it trains at "
               "learning rate 0 (give --warmup 1, or more steps)\n");
}

// A batch larger than the training set repeats examples within itself (it spans several epochs
// of the data order): valid, but said.
void note_batch_over_set(const TrainConfig& c, int64_t examples) {
  if (c.batch > examples)
    fmt::print("note: --batch {} is larger than the {} training examples: each batch holds some of them more than "
               "once\n",
               c.batch, examples);
}

// The model and zero moments, or the checkpoint's.
void build_model(Run& run, const std::string& resume_from) {
  run.model = std::make_unique<nn::Transformer>(run.c.model, DType::f32, run.device);
  run.params = run.model->parameters();
  for (auto& [name, t] : run.params) {
    run.m.push_back(Tensor::zeros(t->shape(), t->dtype(), run.device));
    run.v.push_back(Tensor::zeros(t->shape(), t->dtype(), run.device));
  }
  if (!resume_from.empty()) load_checkpoint(resume_from, *run.model, &run.m, &run.v);
}

RunCost cost_now(const Run& run) {
  RunCost cost = run.earlier;
  cost.wall_seconds += seconds_since(run.t0);
  cost.step_seconds += run.step_seconds;
  cost.peak_bytes = std::max<int64_t>(cost.peak_bytes, static_cast<int64_t>(peak_memory(run.device)));
  return cost;
}

// Where the run has no checkpoint yet: the command that starts it again (the comparison's own).
std::string run_again(const Run& run) {
  return run.c.resume_command.empty() ? "run the same command again"
                                      : "run the same command again (" + run.c.resume_command + ")";
}

// Where the run's folder went, when its path no longer names the folder the run holds (moved, or
// another folder or a link put at its name), and how to go on from there; "" while it is in place.
std::string moved_folder(const Run& run) {
  if (run.folder_lock.still_at(run.c.run_dir)) return "";
  std::string now = run.folder_lock.path_now();
  // the held folder removed (the system's name for it ends so), or still at its old path and
  // hidden there by another one (a mount over it, or a rename back and forth)
  constexpr std::string_view kRemoved = " (deleted)";
  const bool removed = now.size() > kRemoved.size() && now.compare(now.size() - kRemoved.size(), kRemoved.size(),
                                                                    kRemoved) == 0;
  if (removed || (!now.empty() && files::same_path(now, run.c.run_dir))) {
    const bool saved = run.checkpoint_steps >= 0;  // a checkpoint written by this process or the one resumed
    return fmt::format("run folder {}: {} while the run went on (what is at {} now is not the run's folder, and "
                       "nothing more is written there); {}",
                       run.c.run_dir,
                       removed ? "was removed" : "is hidden by another folder at its path (one mounted over it)",
                       run.c.run_dir,
                       removed  ? (saved ? "its checkpoints went with it: " : "no checkpoint of it was written yet: ") +
                                      run_again(run)
                       : saved ? fmt::format("once its own folder is back at that path, resume with: {}", resume_with(run))
                               : "no checkpoint of it was written yet: " + run_again(run));
  }
  const bool resumable = !now.empty() && files::exists(now + "/checkpoint.safetensors");
  std::string go_on;
  if (!resumable)
    go_on = now.empty() ? "start it again" : fmt::format("no checkpoint of it was written yet: {}", run_again(run));
  else if (!run.c.resume_command.empty())  // a comparison's run: the comparison goes on from where its folder went
    go_on = fmt::format("run the same cast compare again with --out {}", std::filesystem::path(now).parent_path().string());
  else
    go_on = fmt::format("resume with: cast train --resume {}", shell_quote(now + "/checkpoint.safetensors"));
  return fmt::format("run folder {}: was moved while the run went on{} (what is at {} now is not the run's folder, "
                     "and nothing more is written there); {}",
                     run.c.run_dir, now.empty() ? "" : fmt::format(" and is now {}", now), run.c.run_dir, go_on);
}

// The run's files go into the folder it holds. Where that folder was moved, or another folder (or
// a link elsewhere) now has its name, a write by name would land in someone else's folder: the
// run stops before it. (The check and the write are two steps: a move in between still fails
// the write, which then says where the folder went, through how_to_continue.)
void check_folder_in_place(const Run& run) {
  if (const std::string moved = moved_folder(run); !moved.empty()) throw Error(moved);
}

// After a failed write: which checkpoint the run continues from, and how; or that it starts again.
std::string how_to_continue(const Run& run) {
  if (const std::string moved = moved_folder(run); !moved.empty()) return moved;  // gone from its path, or replaced
  // a file mounted over the checkpoint: what the path reads now is not the run's checkpoint
  if (files::is_mount_point(run.checkpoint))
    return fmt::format("something is mounted at {}, over the run's own checkpoint, which is whole beneath it: unmount "
                       "it, then resume with: {}",
                       run.checkpoint, resume_with(run));
  if (!files::exists(run.checkpoint)) return no_checkpoint_at(run.checkpoint) + ": " + run_again(run);
  bool usable = false;
  const std::string last = last_good_checkpoint(run.checkpoint, &usable);
  return usable ? last + "; resume with: " + resume_with(run) : last;  // else none is left to resume from
}

// What a second Ctrl-C (the process stopped at once) leaves to continue from: the checkpoint,
// once one is written; before that, the same command again.
void note_for_a_second_signal(const Run& run) {
  if (files::exists(run.checkpoint))
    set_second_signal_note(
        fmt::format(": the last checkpoint written ({}) is whole; resume with: {}", run.checkpoint, resume_with(run)));
  else
    set_second_signal_note(": no checkpoint was written yet; " + run_again(run));
}

// Every checkpoint is checked finite before it is written: an update that overflowed stops
// the run here, and the file on disk stays the last good one.
void save(Run& run, const std::string& path) {
  check_folder_in_place(run);
  try {
    save_checkpoint(path, run.c, *run.model, run.m, run.v, run.step, run.best_val, cost_now(run), run.window,
                    run.data, run.run_id, run.best_step);
    if (path == run.checkpoint) {
      run.checkpoint_steps = run.c.steps;
      note_for_a_second_signal(run);
      remove_passed_summary(run.c.run_dir, run.step);
    }
  } catch (const NonFiniteCheckpoint& e) {
    throw Error(fmt::format("step {}: the update made a parameter or moment non-finite ({}); training stopped. {}",
                            run.step, e.what(), last_good_checkpoint(run.checkpoint)));
  } catch (const Error& e) {  // a full disk, a file-size limit: the file it would have replaced is whole
    throw Error(fmt::format("{}. {}", e.what(), how_to_continue(run)));
  } catch (const std::bad_alloc&) {  // the file is laid out whole in memory before it is written
    throw Error(fmt::format("checkpoint {}: out of memory while laying it out for writing (a memory limit such as "
                            "ulimit -v, or the machine's memory, is below the model's state and its copy); nothing "
                            "was written: raise the limit or free memory first. {}",
                            path, how_to_continue(run)));
  }
}

// A metrics line; a write that failed (a full disk, a file-size limit) was taken back, and the
// error says which checkpoint the run continues from.
void append_metrics(Run& run, json record) {
  check_folder_in_place(run);
  record["run"] = run.run_id;  // whose record: a resume refuses a file of another run's
  try {
    run.metrics->append(record.dump() + '\n');
  } catch (const Error& e) {
    throw Error(fmt::format("{}. {}", e.what(), how_to_continue(run)));
  }
}

json evaluation_record(int64_t step, const char* split_name, const EvalResult& r) {
  return json{{"step", step}, {"split", split_name}, {"loss", r.loss}, {"accuracy", r.accuracy}};
}

EvalResult evaluate_split(Run& run, const char* split_name, const std::vector<data::Example>& split) {
  EvalResult r = evaluate(*run.model, run.task, split, run.c.batch, run.c.eval_limit, run.device);
  // a record holds numbers only (JSON would write NaN as null): a model that gives none stops here
  if (!std::isfinite(r.loss))
    throw Error(fmt::format("step {}: the {} loss is {}: the model's outputs are no longer finite; training stopped. {}",
                            run.step, std::string(split_name) == "val" ? "validation" : split_name,
                            std::isnan(r.loss) ? "nan" : "inf",
                            last_good_checkpoint(run.checkpoint)));
  append_metrics(run, evaluation_record(run.step, split_name, r));
  return r;
}

// The steps' statistics, read on the host: a non-finite loss or gradient norm stops the run
// before this step's update and before any checkpoint could hold its damage.
void take_statistics(const Run& run, TrainingStep& training, Window& window, TrainResult& result) {
  for (const StepRecord& r : training.read()) {
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      autograd::clear_tape();
      const bool loss_bad = !std::isfinite(r.loss);
      const double bad = loss_bad ? r.loss : r.grad_norm;
      throw Error(fmt::format("step {}: the {} is {}; training stopped{}. {}", r.step,
                              loss_bad ? "loss" : "gradient norm",
                              std::isnan(bad) ? "nan"
                              : bad > 0       ? "inf"
                                              : "-inf",
                              r.step == run.step ? " before the update" : fmt::format(" at step {}", run.step),
                              last_good_checkpoint(run.checkpoint)));
    }
    window.loss += r.loss * r.examples;
    window.correct += r.correct;
    window.examples += r.examples;
    window.tokens += r.tokens;
    result.losses.push_back(r.loss);
  }
}

// One metrics line, and the progress line (rewritten in place on a terminal).
void log_progress(Run& run, Window& window, double lr) {
  const auto now = Clock::now();
  const double dt = std::chrono::duration<double>(now - window.start).count();
  const double elapsed = std::chrono::duration<double>(now - run.t0).count();
  const double eta = elapsed / std::max<int64_t>(1, run.step - run.start_step) * (run.c.steps - run.step);
  const double l = window.loss / window.examples, a = window.correct / window.examples;
  const double tokens_per_s = (window.tokens - window.untimed_tokens) / std::max(dt, 1e-9);
  append_metrics(run, json{{"step", run.step},
                           {"split", "train"},
                           {"loss", l},
                           {"accuracy", a},
                           {"lr", lr},
                           {"tokens_per_s", tokens_per_s}});
  if (!run.quiet) {
    const std::string line = fmt::format("step {:>6}/{}  loss {:.4f}  acc {:5.1f}%  lr {:.2e}  {:.0f} tok/s  ETA {}",
                                         run.step, run.c.steps, l, 100 * a, lr, tokens_per_s, format_duration(eta));
    if (run.terminal) fmt::print("\r\033[K{}", line);
    else fmt::print("{}\n", line);
    // a reader gone (`| head -1`) or a full disk: found at this line, not at the end of the run
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw std::system_error(errno != 0 ? errno : EIO, std::generic_category(), "cannot write to file");
  }
  window = Window();
  window.start = now;
}

// A stop request honoured at `when`, after the checkpoint was written.
[[noreturn]] void stopped(const Run& run, int signal, const std::string& when) {
  throw Interrupted(signal,
                    fmt::format("stopped by {} {}: checkpoint {} written", signal_name(signal), when, run.checkpoint),
                    resume_with(run));
}

// Standard output failed (`failed`) with the checkpoint saved: where a stop signal came, the run
// stops as that signal stops it, with its exit code. A terminal that closed fails the write (EIO)
// a moment before its hangup's SIGHUP arrives, so that one is waited for a little.
void stop_if_signalled(const Run& run, const std::system_error& failed, const std::string& when) {
  const int err = failed.code().value();
  if (const int signal = err == EIO ? stop_signal_within(200) : stop_signal())
    stopped(run, signal,
            fmt::format("{} ({})", when,
                        signal == SIGHUP ? "its terminal went away" : "standard output: " + files::standard_output_failure(err)));
}

// A validation during training; the best model so far is kept as best.safetensors.
void validate_now(Run& run) {
  EvalResult r;
  // the draws a validation starts from (clustered attention's LSH and k-means), which the one a
  // resumed run does again must start from too
  const std::vector<uint64_t> draws_before = run.model->clustering_draws();
  try {
    r = evaluate_split(run, "val", run.task.val);
  } catch (const EvaluationStopped& e) {  // the step is done: kept, the validation is not
    run.model->set_clustering_draws(draws_before);
    save(run, run.checkpoint);
    stopped(run, e.signal(), fmt::format("during the validation after step {}", run.step));
  }
  if (r.accuracy > run.best_val) {
    run.best_val = r.accuracy;
    run.best_step = run.step;
    // the run's checkpoint first: a best model is never of a step after the checkpoint, so a
    // process killed later loses the steps since then, not the best model of the steps kept
    save(run, run.checkpoint);
    run.saved_step = run.step;
    save(run, run.c.run_dir + "/best.safetensors");
  }
  if (!run.quiet)
    fmt::print("{}step {}: validation accuracy {:.1f}%\n", run.terminal ? "\n" : "", run.step, 100 * r.accuracy);
}

// The run's metrics records of `split` at `step`, oldest first.
std::vector<json> recorded(const Run& run, const std::string& split, int64_t step) {
  const std::string metrics = run.c.run_dir + "/metrics.jsonl";
  std::istringstream lines(files::exists(metrics) ? files::read_file(metrics, "metrics file") : std::string());
  std::vector<json> found;
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("split", "") == split && j.value("step", int64_t{-1}) == step) found.push_back(j);
  }
  return found;
}

// Whether the run's metrics hold the validation of `step`.
bool validated(const Run& run, int64_t step) { return !recorded(run, "val", step).empty(); }

// The steps of this process: until the run's last step, or `stop_after` steps (tests), or a
// stop request (the step under way is finished and saved first).
void train_steps(Run& run, int64_t stop_after, TrainResult& result) {
  const TrainConfig& c = run.c;
  // a resumed run whose last step's validation a stop cut short does it first, as the run that
  // was not stopped did (the best checkpoint may be that step's)
  if (run.start_step > 0 && c.eval_every > 0 && run.start_step % c.eval_every == 0 && !validated(run, run.start_step))
    validate_now(run);
  Sampler sampler(static_cast<int64_t>(run.task.train.size()), c.seed);
  // the statistics of the steps between two progress lines, never more than this process runs
  const int64_t window_steps = std::clamp<int64_t>(c.log_every, 1, std::max<int64_t>(c.steps - run.step, 1));
  TrainingStep training(*run.model, run.params, run.m, run.v, window_steps);
  Window& window = run.window;
  window.start = run.t0;
  while (run.step < c.steps && (stop_after <= 0 || run.step - run.start_step < stop_after)) {
    const int64_t step = ++run.step;
    const auto step_start = Clock::now();
    nn::Batch batch = data::make_batch(run.task, run.task.train, sampler.batch(step, c.batch), DType::f32, run.device);
    const uint64_t rng_before = run.model->rng_offset;  // a step cut short is undone to these
    const std::vector<uint64_t> draws_before = run.model->clustering_draws();
    try {
      if (c.trace) c.trace->begin_pass(fmt::format("step {}", step), run.device);
      training.compute(batch, step);
      if (c.trace) c.trace->end_pass();
    } catch (const std::system_error& e) {  // --trace's lines to a standard output that failed mid-step
      autograd::clear_tape();
      if (c.trace) c.trace->abort_pass();
      run.model->rng_offset = rng_before;  // no update was made: the checkpoint is the last step's
      run.model->set_clustering_draws(draws_before);
      --run.step;
      save(run, run.checkpoint);
      stop_if_signalled(run, e, fmt::format("during step {}, which is undone", step));
      throw Error(fmt::format("cannot write to standard output during step {} ({}): checkpoint {} written at step {}; "
                              "resume with: {}",
                              step, files::standard_output_failure(e.code().value()), run.checkpoint, run.step, resume_with(run)));
    }
    // The host reads the steps' statistics (one copy) before it logs, evaluates or saves, and
    // always on the host, where reading costs nothing.
    const bool log_step = step % c.log_every == 0 || step == c.steps;
    const bool eval_step = c.eval_every > 0 && step % c.eval_every == 0;
    const bool save_step = c.checkpoint_every > 0 && step % c.checkpoint_every == 0;
    const bool last_step = stop_after > 0 && step - run.start_step >= stop_after;
    const int stop = stop_signal();  // polled once a step: this step is finished and saved first
    if (run.device != Device::cuda || log_step || eval_step || save_step || last_step || stop)
      take_statistics(run, training, window, result);
    train::AdamWStep s{learning_rate(c, step), c.beta1, c.beta2, c.eps, 0.0, step};
    training.update(s, c.weight_decay, c.clip);
    run.step_seconds += seconds_since(step_start);
    try {
      if (log_step) log_progress(run, window, s.lr);
      if (eval_step) validate_now(run);
    } catch (const std::system_error& e) {  // standard output failed (a reader gone, a full disk): saved, then said
      save(run, run.checkpoint);
      stop_if_signalled(run, e, fmt::format("after step {} of {}", step, c.steps));
      throw Error(
          fmt::format("cannot write to standard output after step {} ({}): checkpoint {} written; resume "
                      "with: {}",
                      step, files::standard_output_failure(e.code().value()), run.checkpoint, resume_with(run)));
    }
    if ((save_step || stop) && run.saved_step != step) save(run, run.checkpoint);
    if (stop) {
      if (run.terminal) fmt::print("\n");
      stopped(run, stop, fmt::format("after step {} of {}", step, c.steps));
    }
  }
  if (run.terminal) fmt::print("\n");
  save(run, run.checkpoint);
}

// The final evaluation (of the best checkpoint with --eval-best, when this run wrote one),
// the figure and summary.json.
void finish(Run& run, TrainResult& result) {
  const TrainConfig& c = run.c;
  // Only a best checkpoint this run wrote is evaluated as "best": with no validation during
  // training there is none, and the final model is evaluated and named as such.
  const std::string best = c.run_dir + "/best.safetensors";
  const bool evaluate_best = c.eval_best && std::filesystem::exists(best);
  if (c.eval_best && !evaluate_best && !run.quiet)  // a best validation accuracy: one was written, and is gone
    fmt::print("note: --eval-best, but {} holds no best.safetensors ({}): the final model is evaluated\n", c.run_dir,
               run.best_val >= 0 ? fmt::format("the one the validation of accuracy {:.1f}% wrote has been removed",
                                               100 * run.best_val)
                                 : std::string("no validation wrote one"));
  int64_t evaluated_step = run.step;
  if (evaluate_best) {  // a best from after the run's last step is another run's
    const int64_t best_step = read_checkpoint_header(best).step;
    evaluated_step = best_step;
    CAST_CHECK(best_step <= run.step, "{} is of step {}, after this run's last step {}: not this run's best model",
               best, best_step, run.step);
    load_checkpoint(best, *run.model, nullptr, nullptr);
  }
  try {
    // Both splits are evaluated here, from the checkpoint's state, so that cast eval of it repeats
    // this evaluation (clustered attention draws its hashes anew at each pass). The records carry
    // the step of the model evaluated; a validation the run recorded at that step with the same
    // figures is not written twice, and one with other figures (other draws) is marked final.
    const auto evaluated = [&](const char* split_name, const std::vector<data::Example>& split) {
      const EvalResult r = evaluate(*run.model, run.task, split, c.batch, c.eval_limit, run.device);
      json record = evaluation_record(evaluated_step, split_name, r);
      // a final evaluation a stop cut short and the resumed run did again is written once
      const std::vector<json> earlier = recorded(run, split_name, evaluated_step);
      for (const json& e : earlier)
        if (e["loss"] == record["loss"] && e["accuracy"] == record["accuracy"]) return r;
      if (!earlier.empty()) record["final"] = true;
      append_metrics(run, record);
      return r;
    };
    result.val = evaluated("val", run.task.val);
    result.test = evaluated("test", run.task.test);
  } catch (const EvaluationStopped& e) {
    stopped(run, e.signal(), fmt::format("during the final evaluation, after the last step ({})", run.step));
  }
  result.majority = result.test.majority;
  // a figure or summary changed by hand while the run went on is kept, not replaced (one there
  // at the start was refused then, or --overwrite said it may go)
  std::vector<std::string> kept;
  if (!c.overwrite)
    for (const auto& [name, mark] : {std::pair<const char*, std::string_view>{"curves.svg", files::kFigureMark},
                                     {"summary.json", kSummaryMark}})
      if (const std::string aside = files::set_aside_if_changed(c.run_dir + "/" + name, mark); !aside.empty())
        kept.push_back(fmt::format(
            "note: run folder {}: {} was written or changed by hand while the run went on; it is kept as {}",
            c.run_dir, name, aside));
  check_folder_in_place(run);
  plot_run(c.run_dir + "/curves.svg", run_title(c), read_curves(c.run_dir), files::Link::refuse);
  const RunCost cost = cost_now(run);
  const int64_t step = run.step;
  check_folder_in_place(run);
  write_summary(c.run_dir, {{"task", c.task},
                            {"attention", nn::mechanism_name(c.model.attention.mechanism)},
                            {"steps", step},
                            {"seconds", cost.wall_seconds},
                            {"step_seconds", step > 0 ? cost.step_seconds / step : 0.0},
                            {"peak_bytes", cost.peak_bytes},
                            {"device", device_name(run.device)},
                            {"val_accuracy", result.val.accuracy},
                            {"test_accuracy", result.test.accuracy},
                            {"val_examples", result.val.examples},
                            {"test_examples", result.test.examples},
                            {"majority_rate", result.majority},
                            {"evaluated", evaluate_best ? "best" : "final"},
                            {"evaluated_step", evaluated_step},
                            {"run_id", run.run_id}});
  for (const std::string& note : kept) fmt::print(stderr, "{}\n", note);
  if (run.quiet) return;
  if (evaluate_best)
    fmt::print("done in {}: best model (step {} of {})\n", format_duration(cost.wall_seconds), evaluated_step, step);
  else fmt::print("done in {}: final model after {} steps\n", format_duration(cost.wall_seconds), step);
  if (result.val.examples)
    fmt::print("  validation accuracy {:.1f}%  (loss {:.4f})\n", 100 * result.val.accuracy, result.val.loss);
  else fmt::print("  validation accuracy: no examples\n");
  if (result.test.examples)
    fmt::print("  test accuracy       {:.1f}%  (loss {:.4f})  vs majority class {:.1f}%\n", 100 * result.test.accuracy,
               result.test.loss, 100 * result.majority);
  else fmt::print("  test accuracy: no examples\n");
  fmt::print("  run folder {}: checkpoint.safetensors, metrics.jsonl, curves.svg, summary.json\n", c.run_dir);
  // moved while the run went on: its files are where the folder went
  if (const std::string now = run.folder_lock.path_now(); !now.empty() && !files::same_path(now, c.run_dir))
    fmt::print("note: the run folder was moved while the run went on: it is now {}\n", now);
}

}  // namespace

TrainResult run_training(TrainConfig c, const std::string& resume_from, int64_t stop_after, bool quiet) {
  // Data is generated only for a new run in the default folder: a resumed run's stored folder,
  // or a folder the user named, is read, never created (a missing one is an error).
  const bool may_generate = resume_from.empty() && c.data_dir.empty();
  // before any data is read or made: tf32 and bf16 need the GPU
  if (c.precision != "fp32")
    use_precision(c.precision, resolve_device(c.device, true), "setting 'precision'",
                  resume_from.empty() ? "" : kResumedPrecisionHint);
  // what the run folder's path is (a file, a '..' out of nothing) is said before data is made;
  // before the default data is made, also that the folder can be made and takes files
  if (!c.run_dir.empty()) files::check_output_folder(c.run_dir, "run folder");
  if (may_generate) files::check_folder_can_be_made(c.run_dir.empty() ? default_run_dir(c) : c.run_dir, "run folder");
  data::TaskData task;
  try {
    task = load_task(c, may_generate);
  } catch (const Error& e) {
    // a resumed run's folder as its checkpoint recorded it, not as the user gave it with --data
    if (resume_from.empty() || c.data_dir != read_checkpoint_header(resume_from).config.data_dir) throw;
    throw_from_recorded_data_folder(e, data_folder(c), resume_from, c.data_dir.empty());
  }
  return train_on(c, task, resume_from, stop_after, quiet);
}

TrainResult train_on(TrainConfig c, const data::TaskData& task, const std::string& resume_from, int64_t stop_after,
                     bool quiet) {
  Run run(c, task, quiet);
  run.data = data::fingerprint(task);
  read_resume_point(run, resume_from);
  check_run_settings(run, resume_from);
  choose_compute(run);
  if (run.c.run_dir.empty()) run.c.run_dir = default_run_dir(run.c);
  check_task_fits(run.c, run.task, run.device);  // before the folder is touched
  // the checkpoint read whole (a non-finite value, another model: refused) before the folder is
  // made or locked, or the run's header printed
  build_model(run, resume_from);
  RunFolder folder = prepare_run_folder(run.c, resume_from);  // before any step is spent
  run.folder_lock = std::move(folder.lock);
  if (!quiet && !folder.note.empty()) fmt::print("{}\n", folder.note);
  if (!quiet && !run.schedule_note.empty()) fmt::print("{}\n", run.schedule_note);
  if (run.c.on_start) run.c.on_start(run.c, run.device);
  if (!quiet) note_cut_examples(run.task, run.c.model.max_len);
  if (!quiet && run.start_step == 0) note_schedule(run.c);
  if (!quiet) note_batch_over_set(run.c, static_cast<int64_t>(run.task.train.size()));
  const bool in_place = folder.in_place;
  run.checkpoint = run.c.run_dir + "/checkpoint.safetensors";
  note_for_a_second_signal(run);

  run.terminal = !quiet && isatty(STDOUT_FILENO);
  if (run.start_step > 0) {
    // a branch is a run of its own from here: its own id, which the history it takes along is given
    if (!in_place) run.run_id = new_run_id();
    // records a stopped (or killed) run wrote after its checkpoint: dropped, as documented, and said
    const KeptRecords kept = continue_run_files(resume_from, run.start_step, run.c.run_dir, in_place, run.run_id);
    const int64_t dropped = kept.dropped;
    if (dropped > 0 && !quiet)
      fmt::print("note: {} metrics record{} after step {} (the checkpoint's) {} left out; the run goes on from its "
                 "checkpoint\n",
                 dropped, dropped == 1 ? "" : "s", run.start_step, dropped == 1 ? "is" : "are");
    if (kept.cut_line && !quiet)
      fmt::print("note: the last line of {}/metrics.jsonl was cut short (the process killed while writing it) and is "
                 "left out\n",
                 folder_of(resume_from));
    if (kept.kept == 0 && !quiet)
      fmt::print("note: {}/metrics.jsonl holds no records up to step {} (missing or emptied): the run's curves start "
                 "at step {}\n",
                 folder_of(resume_from), run.start_step, run.start_step);
    const std::string restored = restore_best(resume_from, run.c.run_dir, run.run_id);
    if (!restored.empty() && !quiet) fmt::print("{}\n", restored);
  }
  run.metrics.emplace(run.c.run_dir + "/metrics.jsonl", run.start_step == 0, "metrics file");
  run.t0 = Clock::now();
  reset_peak_memory(run.device);

  TrainResult result;
  train_steps(run, stop_after, result);
  result.steps = run.step;
  if (stop_after > 0 && run.step < run.c.steps) return result;
  if (const int stop = stop_signal())  // training is done and saved; only the evaluation is left
    stopped(run, stop, fmt::format("after the last step ({}), before the final evaluation", run.step));
  finish(run, result);
  return result;
}

}  // namespace cast::train
