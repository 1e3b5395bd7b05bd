#include "train/run_folder.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>

#include "datasets/data.h"
#include "figures/plot.h"
#include "tensor/files.h"
#include "tensor/safetensors.h"
#include "tensor/text.h"
#include "train/checkpoint.h"
#include "train/trace.h"  // human_bytes
#include "train/stop.h"  // shell_quote
#include "train/tasks.h"

namespace cast::train {

using json = nlohmann::json;

std::string default_run_dir(const TrainConfig& c) {
  return fmt::format("runs/{}-{}", c.task, nn::mechanism_name(c.model.attention.mechanism));
}

std::vector<std::string> run_folder_files(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const char* name : {"metrics.jsonl", "checkpoint.safetensors", "best.safetensors", "summary.json"})
    out.push_back(run_dir + "/" + name);
  return out;
}

std::string folder_of(const std::string& file) {
  const std::string folder = std::filesystem::path(file).parent_path().string();
  return folder.empty() ? "." : folder;
}

namespace {

// Where a write to `out` lands: through a link to a file (which the writers follow once), its
// target; else `out`.
std::string written_path(const std::string& out) {
  std::error_code ec;
  if (!std::filesystem::is_symlink(out, ec)) return out;
  const std::filesystem::path to = std::filesystem::read_symlink(out, ec);
  if (ec) return out;  // refused by the writer's own checks
  return (to.is_absolute() ? to : std::filesystem::path(folder_of(out)) / to).lexically_normal().string();
}

// The data set `folder` lies in, at any depth (a Pathfinder set's images sit two folders down),
// or "" for none: found up the path as the user spelled it, else up its real path (through
// links and "..", and above the working folder).
std::string data_set_around(const std::string& folder) {
  const auto marked = [](const std::filesystem::path& at) {
    return files::exists((at.empty() ? std::filesystem::path(".") : at).string() + "/" + data::kDataFolderMark);
  };
  for (std::filesystem::path at = std::filesystem::path(folder).lexically_normal();; at = at.parent_path()) {
    if (marked(at)) return at.empty() ? "." : at.string();
    if (at.empty() || at == at.parent_path()) break;
  }
  std::error_code ec;
  std::filesystem::path at = std::filesystem::weakly_canonical(std::filesystem::absolute(folder, ec), ec);
  if (ec) return "";
  for (;; at = at.parent_path()) {
    if (marked(at)) return at.string();
    if (at == at.parent_path()) return "";
  }
}

}  // namespace

void check_not_in_a_data_set(const std::string& folder, const std::string& what, const std::string& option,
                             bool may_be_the_set) {
  const std::string set = data_set_around(folder);
  if (may_be_the_set && !set.empty() && files::same_path(folder, set)) return;
  CAST_CHECK_USAGE(set.empty(), "{} {}: is {}the data set {}, whose files only cast data writes: choose another {}",
                   what, folder, files::same_path(folder, set) ? "" : "inside ", set, option);
}

void check_user_output(const std::string& out, const std::string& option, const std::string& kind,
                       std::string_view mark, bool overwrite, const std::string& owner, std::string_view remedy) {
  // the checks hold for the file written, a link's target too
  const std::string target = out.empty() ? out : written_path(out);
  // a data set's marks, which only cast data writes: made by another output, one would pass a
  // user's folder off as cast's (cast data would then replace its files), the other make a whole
  // set unreadable
  const std::string name_written = std::filesystem::path(target).filename().string();
  CAST_CHECK_USAGE(name_written != data::kDataFolderMark && name_written != data::kDataUnfinishedMark,
                   "{} {}: is the name of a data set's mark ({}), which only cast data writes; choose another name",
                   option, out, name_written);

  // where it goes, now rather than after the work: its folder is there and takes files, and it is
  // no folder, FIFO or link chain (these commands make no folders for their outputs)
  if (!out.empty()) files::output_target(out, option, files::Link::follow_once);
  const std::string folder = folder_of(target);
  const bool own = !owner.empty() && files::same_path(folder, owner);
  // not while another cast process holds a folder it lies in (a comparison around a run's folder
  // too), and no other takes them while this output is written; the command's own folder is its
  if (!target.empty())
    for (const std::string& above : files::cast_folders_above(folder))
      if (!own || !files::same_path(above, owner)) files::share_folder(above, fmt::format("{} {}: folder", option, out));
  const std::string data = target.empty() ? "" : data_set_around(folder);
  const bool held = !data.empty() || (!target.empty() && files::exists(folder + "/.cast.lock"));
  if (!held || own) return files::check_may_replace(out, option, kind, mark, overwrite, remedy);
  const char* held_by = "a folder cast holds for a run, a comparison or a data set";
  const std::string through = target == out ? "" : fmt::format(" (a link to {})", target);
  CAST_CHECK_USAGE(data.empty(),
                   "{} {}{}: is inside {}, {}, whose files only cast data writes: choose a path outside it", option,
                   out, through, data.empty() || files::same_path(data, folder) ? folder : data, held_by);
  // the run's files, and those a comparison keeps beside its runs
  std::vector<std::string> kept = run_folder_files(folder);
  for (const char* name : {"curves.svg", "results.md", "results.json", "comparison.svg"})
    kept.push_back(folder + "/" + name);
  for (const std::string& file : kept)
    CAST_CHECK_USAGE(std::filesystem::path(file).filename() != name_written,
                     "{} {}{}: {} is {}, which keeps its own {} there: choose another path", option, out, through,
                     folder, held_by, name_written);
  // an existing file of another kind: no --overwrite applies in a held folder
  files::check_may_replace(
      out, option, kind, mark, false,
      fmt::format("{} is {}; --overwrite replaces no other kind of file there: choose another path", folder, held_by));
}

// The step of the checkpoint at `path`, or -1 where it cannot be read as one.
static int64_t step_or_none(const std::string& path) {
  try {
    return read_checkpoint_header(path).step;
  } catch (const Error&) {
    return -1;
  }
}

// The records a resume continues (folder's metrics.jsonl, and in place its summary.json) are the
// checkpoint's run's: each carries the id of the run that wrote it. A checkpoint or a metrics file
// copied in from another run would join two runs' histories in one file. Records after the
// checkpoint's step are left out anyway, and a checkpoint or record of an older cast has no id.
static void check_records_are_the_runs(const Checkpoint& ck, const std::string& resume_from,
                                       const std::string& folder, bool in_place) {
  const std::string id = run_id_of(ck);  // an older cast's checkpoint: the id its resumes give their records
  const char* remedy = ck.run_id.empty()
                           ? "a checkpoint and records of two runs, or a checkpoint whose run id was taken out; put "
                             "the run's own back beside each other"
                           : "a checkpoint and records of two runs; put the run's own back beside each other";
  const std::string metrics = folder + "/metrics.jsonl";
  if (files::exists(metrics)) {
    std::istringstream in(files::read_file(metrics, "metrics file"));
    int64_t number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      json j;
      try {  // as the run's figure reads it (a key given twice refused); what it refuses, it says
        j = files::parse_json(line, "metrics line");
      } catch (const std::exception&) {
        continue;
      }
      if (!j.is_object() || !j.contains("run") || !j["run"].is_string() ||
          !text::is_run_id(j["run"].get<std::string>()) || !j.contains("step") || !j["step"].is_number_integer() ||
          j["step"].get<int64_t>() > ck.step)
        continue;
      const std::string run = j["run"].get<std::string>();
      CAST_CHECK_USAGE(run == id, "{} line {} is a record of run {}, but checkpoint {} is of run {}: {}", metrics,
                       number, files::json_excerpt(json(run)), resume_from, id, remedy);
    }
  }
  const std::string summary = folder + "/summary.json";
  if (!in_place || !files::exists(summary)) return;
  std::string run;
  try {
    run = json::parse(files::read_file(summary, "run summary")).value("run_id", std::string());
  } catch (const std::exception&) {
    return;  // unreadable, or not a run's: said by the checks of the run's files
  }
  CAST_CHECK_USAGE(run.empty() || run == id, "{} is the summary of run {}, but checkpoint {} is of run {}: {}",
                   summary, files::json_excerpt(json(run)), resume_from, id, remedy);
}

void check_records_are_the_runs(const std::string& resume_from, const std::string& folder, bool in_place) {
  check_records_are_the_runs(read_checkpoint_header(resume_from), resume_from, folder, in_place);
}

void check_figure_output(const std::string& out, const std::string& option, const std::string& checkpoint,
                         bool overwrite) {
  std::vector<std::string> inputs = run_folder_files(folder_of(checkpoint));
  inputs.push_back(checkpoint);
  files::check_not_an_input(out, "--" + option, inputs);
  check_user_output(out, "--" + option, "a figure drawn by cast", files::kFigureMark, overwrite);
}

namespace {

// The latest step of the records in a metrics file (-1: none, or no file); lines that are no
// record are skipped here (the resume checks them as it copies the file).
int64_t latest_record_step(const std::string& path) {
  if (!files::exists(path)) return -1;
  std::istringstream in(files::read_file(path, "metrics file"));
  int64_t latest = -1;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
      latest = std::max(latest, j["step"].get<int64_t>());
  }
  return latest;
}

// A run writes a checkpoint every --checkpoint-every steps: its records reach past its newest
// checkpoint by at most that many (a run killed before its next one). Records further on mean a
// newer checkpoint was written and this older one put back in its place (a copy kept aside):
// continuing from it would drop them. Where either the checkpoint's run or this one writes no
// periodic checkpoints (0), the records cannot tell, and nothing is refused. A run killed after
// a resume that raised --checkpoint-every may be refused here too; it continues into a new folder.
void check_checkpoint_is_the_newest(const TrainConfig& c, const std::string& resume_from, const Checkpoint& resumed) {
  // the reach is the run's own setting, as the checkpoint holds it: the resume's --checkpoint-every
  // is for the steps to come and says nothing of the records already written
  const int64_t reach = resumed.config.checkpoint_every, resume_step = resumed.step;
  if (reach <= 0) return;
  const std::string metrics = c.run_dir + "/metrics.jsonl";
  const int64_t latest = latest_record_step(metrics);
  CAST_CHECK_USAGE(latest <= resume_step + reach,
                   "--resume {} is of step {}, but run {} has records up to step {} ({}), more than --checkpoint-every "
                   "({}) steps on: a newer checkpoint was written since and this older one put back, and continuing "
                   "from it would drop those records; give --run with a new folder to train on from it",
                   resume_from, resume_step, c.run_dir, latest, metrics, reach);
}

// The best checkpoint of a run is never of a step after its checkpoint (a new best saves the
// checkpoint first). One that is (written by an older cast, which saved only the best, before
// the process was killed) is of steps the resume trains again on another path: the run's end
// would refuse it after all its steps, so it is refused now, before the first.
void check_best_is_the_runs(const TrainConfig& c, const std::string& folder, const Checkpoint& resumed) {
  const int64_t resume_step = resumed.step;
  const std::string best = folder + "/best.safetensors";
  if (!files::exists(best)) return;
  int64_t best_step = -1;
  std::string other_run, unusable;
  try {
    const Checkpoint header = read_checkpoint_header(best);
    best_step = header.step;
    // a setting the run cannot change (its lr, its seed), then the model's own
    other_run = fixed_setting_difference(header.config, c);
    if (other_run.empty()) other_run = model_difference(header.config.model, c.model);
    // where every setting agrees (another run of other --steps or --data), the id each run drew
    // at its start (a branch draws its own); a file of an older cast has none, and says nothing
    const std::string& run_id = resumed.run_id;
    if (other_run.empty() && !header.run_id.empty() && !run_id.empty() && header.run_id != run_id)
      other_run = fmt::format("its run id is {}, the checkpoint's {}: each run draws its own at step 0 and keeps it "
                              "through every resume",
                              header.run_id, run_id);
    // the checkpoint names its best validation's step: a best of another step is not that model,
    // but where the checkpoint is of that very step, the best's write was cut off after it, and
    // the resume writes the best again from the checkpoint (restore_best)
    if (other_run.empty() && resumed.best_step >= 0 && resumed.best_step != resumed.step &&
        header.step != resumed.best_step)
      other_run = fmt::format("it is of step {}, but the checkpoint's best validation was at step {} (accuracy {:.4g})",
                              header.step, resumed.best_step, resumed.best_val);
    // read whole where the run's end evaluates it (--eval-best): a truncated copy reads its header
    if (c.eval_best)
      if (const std::string damage = checkpoint_damage(best); !damage.empty()) unusable = damage + " is not finite";
  } catch (const Error& e) {
    if (!c.eval_best) return;  // never read by this run
    unusable = e.what();
  }
  // what the run's end would refuse after every step, refused before the first; but a best of
  // the checkpoint's own best step is written again from it (restore_best)
  if (!unusable.empty() && resumed.best_step >= 0 && resumed.best_step == resumed.step) return;
  CAST_CHECK_USAGE(unusable.empty(),
                   "{} cannot be read as this run's best model ({}), which its end evaluates (--eval-best); move it "
                   "out of {}, then resume",
                   best, unusable, folder);
  // a best of another run (copied in), which a branch would also take along
  CAST_CHECK_USAGE(other_run.empty(),
                   "{} is of another run than this one ({}): it is no best of this run; move it out of {} to keep "
                   "it, then resume",
                   best, other_run, folder);
  CAST_CHECK_USAGE(best_step <= resume_step,
                   "{} is of step {}, after the checkpoint's step {} (the process that wrote it was stopped before "
                   "its next checkpoint): the resumed run would train those steps again on another path; move it "
                   "out of {} to keep it, then resume",
                   best, best_step, resume_step, folder);
}

// A resume into the checkpoint's own folder continues the run from its newest checkpoint only;
// a finished run there continues only with more steps.
void check_resume_goes_forward(const TrainConfig& c, const std::string& resume_from, const Checkpoint& resumed) {
  const int64_t resume_step = resumed.step;
  const std::string newest = c.run_dir + "/checkpoint.safetensors";
  CAST_CHECK_USAGE(files::exists(newest),
                   "--resume {}: its folder {} holds no checkpoint.safetensors, so it is no run to continue in "
                   "place: give --run with a new folder to train on from it",
                   resume_from, c.run_dir);
  if (!files::same_file(resume_from, newest)) {
    const int64_t newest_step = step_or_none(newest);  // unreadable: the run's own is still the one to resume
    const bool best = std::filesystem::path(resume_from).filename() == "best.safetensors";
    std::string what;
    if (best && newest_step >= 0 && resume_step >= newest_step)
      what = fmt::format("is run {}'s best model, of step {}, and a resume in place continues from the run's newest "
                         "checkpoint {} (step {})",
                         c.run_dir, resume_step, newest, newest_step);
    else if (best)
      what = fmt::format("would rewind run {}, whose newest checkpoint is {}", c.run_dir, newest);
    else if (newest_step == resume_step)
      what = fmt::format("is a copy of step {} beside run {}'s own checkpoint {}, of that step", resume_step, c.run_dir,
                         newest);
    else if (newest_step >= 0 && newest_step < resume_step)
      what = fmt::format("is of step {}, after run {}'s own checkpoint {} (step {}): a checkpoint of elsewhere",
                         resume_step, c.run_dir, newest, newest_step);
    else
      what = fmt::format("would rewind run {}, whose newest checkpoint is {}", c.run_dir, newest);
    throw UsageError(fmt::format("--resume {} {}: resume from that, or give --run with a new folder to train on from {}",
                                 resume_from, what, resume_from));
  }
  // a checkpoint older than the run's own end (put back, or copied in from elsewhere): continuing
  // from it would drop the records and summary of the steps after it
  const std::string summary = c.run_dir + "/summary.json";
  if (files::exists(summary)) {
    int64_t finished_at = -1;
    try {
      finished_at = json::parse(files::read_file(summary, "run summary")).value("steps", int64_t{-1});
    } catch (const json::exception&) {
      finished_at = -1;  // a summary that does not parse is no evidence either way
    }
    CAST_CHECK_USAGE(finished_at <= resume_step,
                     "--resume {} is of step {}, but run {} finished at step {} (its summary.json): the checkpoint "
                     "is older than the run, and continuing from it would drop that run's later records; give --run "
                     "with a new folder to train on from it",
                     resume_from, resume_step, c.run_dir, finished_at);
  }
  check_checkpoint_is_the_newest(c, resume_from, resumed);
  check_best_is_the_runs(c, c.run_dir, resumed);
  CAST_CHECK_USAGE(!(resume_step >= c.steps && files::exists(c.run_dir + "/summary.json")),
                   "run {} is finished (step {} of {}, summary.json written): evaluate it with cast eval "
                   "--checkpoint {}, or train on with a larger --steps",
                   c.run_dir, resume_step, c.steps, shell_quote(newest));
}

}  // namespace

namespace {

// A comparison's folder: its results.json carries cast compare's mark.
bool is_comparison_folder(const std::string& folder) {
  const std::string results = folder + "/results.json";
  if (!files::exists(results)) return false;
  try {
    return files::read_file(results, "results file").find("\"made_by\": \"cast compare\"") != std::string::npos;
  } catch (const Error&) {
    return false;  // not readable: no comparison's
  }
}

// Never a second writer in a comparison: a run folder that is a comparison folder, or lies in
// a folder another process holds (a comparison whose run it is, not started yet).
void check_not_in_a_comparison(const std::string& run_dir) {
  CAST_CHECK_USAGE(!is_comparison_folder(run_dir),
                   "run folder {}: is a comparison folder (it holds cast compare's results.json): choose another --run",
                   run_dir);
  const std::string parent = folder_of(run_dir);
  if (files::exists(parent + "/.cast.lock"))
    files::check_not_held_elsewhere(parent, fmt::format("run folder {}: its folder", run_dir));
}

}  // namespace

void check_new_run_files(const TrainConfig& c) {
  // No run here: the files a run writes may replace only what a cast run left (say, one stopped
  // before its first checkpoint), not a user's own files of the same names; a best checkpoint
  // without the run's own is no run's.
  // the remedy holds for cast train and for the runs of cast compare (whose --overwrite is its own files')
  const char* remedy = "move it away or choose another folder (cast train's --overwrite replaces it)";
  CAST_CHECK_USAGE(c.overwrite || !files::exists(c.run_dir + "/best.safetensors"),
                   "run file {}/best.safetensors: exists without the run's checkpoint.safetensors, so no cast run "
                   "here wrote it; not replacing it ({})",
                   c.run_dir, remedy);
  files::check_may_replace(c.run_dir + "/metrics.jsonl", "run file", "a cast run's metrics", "\"split\":", c.overwrite,
                           remedy, files::Digest::none);
  files::check_may_replace(c.run_dir + "/summary.json", "run file", "a cast run's summary", kSummaryMark, c.overwrite,
                           remedy);
  files::check_may_replace(c.run_dir + "/curves.svg", "run file", "a figure drawn by cast", files::kFigureMark,
                           c.overwrite, remedy);
  // a finished run whose checkpoint was moved away: its results (a cast run's summary, as checked
  // above) are no leftovers of a stopped run
  CAST_CHECK_USAGE(c.overwrite || !files::exists(c.run_dir + "/summary.json"),
                   "run folder {}: holds a finished run's summary.json without its checkpoint.safetensors; not "
                   "replacing that run's files (move them away or choose another folder; cast train's --overwrite "
                   "replaces them)",
                   c.run_dir);
}

namespace {

// The files a run writes in its folder, each through a temporary <name>.tmp or <name>.N.tmp.
constexpr const char* kRunFileNames[] = {"checkpoint.safetensors", "best.safetensors", "summary.json", "curves.svg",
                                         "metrics.jsonl"};

// Temporary files an interrupted write left (SIGKILL, a power cut) are said, with their size. No
// cast process writes them now (this one holds the folder), but a file of such a name may be the
// user's own, which cast never removes: they are left to the user to delete.
std::string left_temporaries_note(const std::string& run_dir) {
  std::vector<std::string> left;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const char* file : kRunFileNames) {
      const std::string stem = std::string(file) + ".";
      if (name.compare(0, stem.size(), stem) != 0) continue;
      const std::string rest = name.substr(stem.size());  // "tmp" or "N.tmp"
      const size_t digits = rest.find_first_not_of("0123456789");
      const bool temporary = rest == "tmp" || (digits > 0 && digits != std::string::npos && rest.substr(digits) == ".tmp");
      std::error_code size_ec;
      if (temporary && entry.is_regular_file(size_ec))
        left.push_back(fmt::format("{} ({})", name, human_bytes(entry.file_size(size_ec))));
    }
  }
  if (left.empty()) return "";
  std::sort(left.begin(), left.end());
  // hundreds of them: the first few named, the rest counted
  constexpr size_t kNamed = 5;
  if (left.size() > kNamed + 1) {
    const size_t more = left.size() - kNamed;
    left.resize(kNamed);
    left.push_back(fmt::format("and {} more of those names", more));
  }
  return fmt::format("note: run folder {} holds {}, left by a write that was cut short (the process killed); no cast "
                     "process writes {} now: delete {} to free the space",
                     run_dir, fmt::join(left, ", "), left.size() == 1 ? "it" : "them", left.size() == 1 ? "it" : "them");
}

// Every check of the run's files that may refuse the run, and (act) what the run then removes:
// true where the run resumes in its checkpoint's own folder.
bool check_run_files(const TrainConfig& c, const std::string& resume_from, const Checkpoint* resumed, bool act) {
  for (const char* name : kRunFileNames)  // a FIFO or link there: refused now
    files::output_target(c.run_dir + "/" + name, "run file", files::Link::refuse);
  const std::string checkpoint = c.run_dir + "/checkpoint.safetensors";
  // Resuming into the checkpoint's own folder continues that run; any other folder is a new
  // home, under the same rule as a new run's.
  const bool in_place = !resume_from.empty() && files::same_file(folder_of(resume_from), c.run_dir);
  if (in_place) {
    // --overwrite replaces a run; resuming in place keeps it: the two together name no one action
    CAST_CHECK_USAGE(!c.overwrite,
                     "--overwrite with --resume {}: resuming into the checkpoint's own folder continues that run and "
                     "replaces none of it; drop --overwrite, or start a new run there with --overwrite and no --resume",
                     resume_from);
    // the files the resumed run writes there are a run's (a fresh run refuses a user's of those names too)
    const char* remedy = "move it away: the run writes its own there";
    files::check_may_replace(c.run_dir + "/summary.json", "run file", "a cast run's summary", kSummaryMark, false,
                             remedy);
    files::check_may_replace(c.run_dir + "/curves.svg", "run file", "a figure drawn by cast", files::kFigureMark,
                             false, remedy);
    check_resume_goes_forward(c, resume_from, *resumed);
    return true;
  }
  // a finished run copied elsewhere with no step to train would only be evaluated again
  const std::string source = folder_of(resume_from);
  const int64_t resume_step = resumed ? resumed->step : 0;
  CAST_CHECK_USAGE(!resumed || resume_step < c.steps || !files::exists(source + "/summary.json"),
                   "run {} is finished (step {} of {}, summary.json written): evaluate it with cast eval "
                   "--checkpoint {}, or train on into --run {} with a larger --steps",
                   source, resume_step, c.steps, shell_quote(resume_from), shell_quote(c.run_dir));
  if (std::filesystem::exists(checkpoint)) {
    if (!c.overwrite) {
      // advice to resume holds for a cast checkpoint only, not a file of the user's of that name
      bool readable = true;
      try {
        read_checkpoint_header(checkpoint);
      } catch (const Error&) {
        readable = false;
      }
      CAST_CHECK_USAGE(readable,
                       "run folder {}: holds {}, which cannot be read as a cast checkpoint; not replacing it (move it "
                       "away or choose another --run; --overwrite replaces it)",
                       c.run_dir, checkpoint);
    }
    CAST_CHECK_USAGE(c.overwrite,
                     "run folder {} already holds a run ({}): continue it with --resume {}, choose another "
                     "--run, or pass --overwrite to replace it",
                     c.run_dir, checkpoint, shell_quote(checkpoint));
    // the old run's files, never to be mistaken for the new one's (a new run that fails before
    // its first checkpoint must not point at the old run's as its own)
    if (act)
      for (const char* stale : {"/checkpoint.safetensors", "/best.safetensors", "/summary.json", "/curves.svg"})
        std::filesystem::remove(c.run_dir + stale);
    return false;
  }
  check_new_run_files(c);
  // --overwrite said so: a best checkpoint no run here wrote is not left beside the new run's files
  if (act && c.overwrite) std::filesystem::remove(c.run_dir + "/best.safetensors");
  return false;
}

}  // namespace

RunFolder prepare_run_folder(const TrainConfig& c, const std::string& resume_from) {
  // a run among the data it reads: a later cast data there would replace the data under it
  files::check_not_inside(c.run_dir, "run folder", data_folder(c), "data folder");
  // nor among another data set's files, at any depth: cast data there would replace the run's
  check_not_in_a_data_set(c.run_dir, "run folder", "--run");
  check_not_in_a_comparison(c.run_dir);
  // the checkpoint resumed from, read once for every check below
  std::optional<Checkpoint> resumed;
  if (!resume_from.empty()) resumed = read_checkpoint_header(resume_from);
  const Checkpoint* from = resumed ? &*resumed : nullptr;
  const std::string source = folder_of(resume_from);
  // the best a branch takes along (copy_best) is held to the rule of a resume in place, before
  // the branch's folder is made
  if (from && !files::same_file(source, c.run_dir) && !files::same_file(resume_from, source + "/best.safetensors"))
    check_best_is_the_runs(c, source, *from);
  if (from) check_records_are_the_runs(*from, resume_from, source, files::same_file(source, c.run_dir));
  // What would refuse the run is checked before the folder is made or locked, so that a refusal
  // leaves it as it was (no lock file in a user's folder), and again once it is held. First what
  // the folder is: one that takes no files, or one another cast process holds, is said as such
  // rather than as its files (the probe of a free lock takes it and lets it go).
  if (files::exists(c.run_dir)) {
    files::make_writable_folder(c.run_dir, "run folder");
    if (files::exists(c.run_dir + "/.cast.lock") && !files::held_here(c.run_dir))
      files::FolderLock probe(c.run_dir, "run folder");
    check_run_files(c, resume_from, from, /*act=*/false);
  }
  files::make_writable_folder(c.run_dir, "run folder");
  RunFolder folder;
  folder.lock = files::FolderLock(c.run_dir, "run folder");  // before anything in it is written or removed
  folder.in_place = check_run_files(c, resume_from, from, /*act=*/true);
  folder.note = left_temporaries_note(c.run_dir);
  return folder;
}

namespace {

// Writes to `out` the lines of the metrics file `path` of steps up to `last_step` (atomically;
// `out` may be `path`); returns how many records after it were left out. No file at `path`:
// `out` starts empty.
KeptRecords keep_metrics_until(const std::string& path, int64_t last_step, const std::string& out,
                               const std::string& run_id) {
  const std::string text = files::exists(path) ? files::read_file(path, "metrics file") : std::string();
  std::istringstream in(text);
  std::string kept, checked, line;  // checked: the kept lines in their places, the others blank
  int64_t number = 0;
  KeptRecords result;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) {  // a blank line holds nothing to keep
      checked += '\n';
      continue;
    }
    const json j = json::parse(line, nullptr, false);
    const bool record = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    // a last line cut short (no newline: the run was killed while writing it) is left behind;
    // any other line that is not a record would be lost by the rewrite, so it is refused
    // (a prefix of a record: an object begun and not ended; a whole one, or text, is no cut)
    const bool cut_short = in.eof() && !text.empty() && text.back() != '\n' && line[0] == '{' && j.is_discarded();
    // in place the file is rewritten, and the line would be lost; into a new folder it is copied
    // what is wrong, in its own words: no JSON (a NaN, a torn line), no object, or no step in range
    const std::string why = j.is_discarded()  ? "is not JSON (a number such as NaN, or a line cut or edited)"
                            : !j.is_object()  ? "is not a JSON object"
                            : !j.contains("step") ? "has no \"step\""
                                                  : fmt::format("has \"step\" {}, not a whole number in range",
                                                                files::json_excerpt(j["step"]));
    CAST_CHECK_USAGE(record || cut_short, "{} line {} {}, so it is no metrics record; {}", path, number, why,
               files::same_path(path, out)
                   ? "resuming rewrites the file and would drop that line: fix it, or copy it elsewhere and remove it"
                   : fmt::format("the new run's {} starts from its records: remove or fix that line", out));
    // a new folder (a branch) takes the run's history up to its step, not the evaluation the run
    // did at its end of the model it branches from (test records, and those marked final, carry
    // that model's step though they came after every step of the run)
    const bool end_of_other_run = !files::same_path(path, out) && record &&
                                  ((j.contains("split") && j["split"] == "test") || (j.contains("final") && j["final"] == true));
    const bool keep = record && !end_of_other_run && j["step"].get<int64_t>() <= last_step;
    // into a branch, under the branch's own id (the same text otherwise: records are written
    // with their keys in order, as dump() writes them)
    std::string as_kept = line;
    if (keep && !files::same_path(path, out) && j.contains("run")) {
      json own = j;
      own["run"] = run_id;
      as_kept = own.dump();
    }
    if (keep) kept += as_kept + '\n', ++result.kept;
    else if (record && !end_of_other_run) ++result.dropped;
    result.cut_line = result.cut_line || cut_short;
    checked += (keep ? as_kept : "") + '\n';
  }
  // the run's figure reads every line again at its end: a line it would refuse (a record of
  // another split, a value out of range, a step out of order) is refused now, before any step
  try {
    curves_of_metrics(checked, path, "");
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}; the resumed run would fail on it at its end: fix or remove that line",
                                 e.what()));
  }
  files::write_atomic(out, kept, "metrics file", files::Link::refuse);
  return result;
}

// A checkpoint file written at `to` as `from` holds it, under run id `run_id` (a branch's copy of
// its source's best model; the bytes as they are where the id is already that).
void copy_checkpoint_as(const std::string& from, const std::string& to, const std::string& run_id) {
  TensorFile f = read_safetensors(from, "checkpoint");
  const auto id = f.metadata.find("run_id");
  if (id == f.metadata.end() || id->second == run_id) {
    files::write_atomic(to, files::read_file(from, "checkpoint"), "best checkpoint", files::Link::refuse);
    return;
  }
  id->second = run_id;
  write_safetensors(to, f.tensors, f.metadata, "best checkpoint", files::Link::refuse);
}

// A run resumed into a new folder takes its best checkpoint along, so that --eval-best there
// still finds the best model of the whole run.
void copy_best(const std::string& checkpoint, const std::string& run_dir, const std::string& run_id) {
  const std::string best = folder_of(checkpoint) + "/best.safetensors";
  if (files::exists(best)) copy_checkpoint_as(best, run_dir + "/best.safetensors", run_id);
}


}  // namespace

KeptRecords continue_run_files(const std::string& resume_from, int64_t step, const std::string& run_dir, bool in_place,
                               const std::string& run_id) {
  const KeptRecords kept =
      keep_metrics_until(folder_of(resume_from) + "/metrics.jsonl", step, run_dir + "/metrics.jsonl", run_id);
  if (!in_place) copy_best(resume_from, run_dir, run_id);
  return kept;
}

std::string restore_best(const std::string& resume_from, const std::string& run_dir, const std::string& run_id) {
  const Checkpoint ck = read_checkpoint_header(resume_from);
  if (ck.best_step < 0 || ck.best_step != ck.step) return "";
  const std::string best = run_dir + "/best.safetensors";
  const bool there = files::exists(best);
  std::string damage;  // a best model there that cannot be read whole (damaged since): written again too
  if (there) {
    try {
      damage = checkpoint_damage(best);
      if (damage.empty() && read_checkpoint_header(best).step == ck.best_step) return "";
      if (!damage.empty()) damage += " is not finite";
    } catch (const Error& e) {
      damage = e.what();
    }
  }
  copy_checkpoint_as(resume_from, best, run_id);
  const std::string missing = folder_of(resume_from) + "/best.safetensors";
  if (!damage.empty())
    return fmt::format("note: {} could not be read as the best model of step {} ({}): written again from {}, which is "
                       "of that step",
                       best, ck.best_step, damage, resume_from);
  return fmt::format("note: {} was not written at step {} (the run was stopped, or its disk full, between the "
                     "checkpoint and the best model): written now{} from {}, which is of that step",
                     missing, ck.best_step, files::same_path(missing, best) ? "" : " as " + best, resume_from);
}

void write_summary(const std::string& run_dir, json summary) {
  summary["made_by"] = "cast train";         // kSummaryMark: what a later run may replace
  summary["digest"] = files::kDigestSlot;  // that nobody changed it since
  // a new summary takes the checkpoint's permission bits (a run made private stays so)
  files::write_stamped(run_dir + "/summary.json", summary.dump(2) + "\n", "run summary", files::Link::refuse,
                       run_dir + "/checkpoint.safetensors");
}

void remove_passed_summary(const std::string& run_dir, int64_t step) {
  const std::string summary = run_dir + "/summary.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(summary, ec))) return;
  int64_t finished_at = -1;
  try {
    const std::string text = files::read_file(summary, "run summary");
    // not a run's, or changed by hand since: never cast's to remove
    if (!files::is_unchanged_cast_output(text, kSummaryMark)) return;
    finished_at = json::parse(text).value("steps", int64_t{-1});
  } catch (const std::exception&) {
    return;  // unreadable: left as it is
  }
  if (finished_at >= 0 && finished_at < step) std::filesystem::remove(summary, ec);
}

}  // namespace cast::train
