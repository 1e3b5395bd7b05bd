// `cast data`: generates a task's files in the LRA release layout.
#include "commands/commands.h"

#include <unistd.h>

#include <filesystem>

#include "datasets/data.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "train/run_folder.h"
#include "train/stop.h"
#include "train/tasks.h"

namespace cast {

namespace {

// The folders of `out` that do not exist yet, deepest first, and its lock file where there is
// none: a cast data that is refused or stopped before any file of its set is written removes
// them again, so that it leaves nothing behind (a refusal changes nothing; a stopped one holds what
// it held before). A folder that holds anything else stays.
class NewFolders {
 public:
  explicit NewFolders(const std::string& out) : lock_((std::filesystem::path(out) / ".cast.lock").string()) {
    lock_existed_ = files::exists(lock_);
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(out, ec).lexically_normal();
    for (; !ec && p.has_relative_path(); p = p.parent_path()) {
      std::error_code missing;  // a path that is not there is an error here, and that is the answer
      if (std::filesystem::exists(std::filesystem::symlink_status(p, missing))) break;
      if (p.filename().empty()) continue;  // a trailing '/'
      made_.push_back(p);
    }
  }
  void remove_if_empty() const {
    std::error_code ec;
    // the lock file this command made, where none was before (it names this process)
    if (!lock_existed_ && files::exists(lock_) && files::read_file(lock_, "lock file") == std::to_string(::getpid()))
      std::filesystem::remove(lock_, ec);
    for (const std::filesystem::path& p : made_)
      if (!std::filesystem::remove(p, ec)) return;  // not empty (or not ours to remove): it and its parents stay
  }

 private:
  std::string lock_;
  bool lock_existed_ = false;
  std::vector<std::filesystem::path> made_;
};

}  // namespace

// Ctrl-C or SIGTERM stops the generator between examples; the folder keeps its unfinished mark
// (every reader refuses it until a rerun completes it), and the line says what to run.
static data::StopCheck stop_check(const std::string& out) {
  train::set_second_signal_note(fmt::format(
      ": data folder {} is unfinished if it is marked so (training refuses it then); run the same cast data again",
      out));
  const bool existed = files::exists(out);  // what a stop before the first file leaves: what was there
  return [out, existed] {
    const int signal = train::stop_signal();
    if (signal == 0) return;
    // stopped while the examples were drawn in memory: no file of the set has changed
    if (!files::exists(out + "/" + data::kDataUnfinishedMark))
      throw train::Stopped(signal, fmt::format("stopped by {} before any file of the set was written: data folder {} "
                                               "{}",
                                               train::signal_name(signal), out,
                                               existed ? "holds what it held before" : "was not made"));
    throw train::Stopped(signal, fmt::format("stopped by {}: data folder {} is unfinished (training refuses it); "
                                             "run the same cast data again to complete it",
                                             train::signal_name(signal), out));
  };
}

static void generate(const std::string& task, const std::string& out, int64_t count, int64_t max_length, int64_t min_length,
              int64_t seed, bool overwrite, const std::string& rerun) {
  const bool listops = task == "listops" || task == "listops-short";
  if (listops) {
    data::ListOpsSpec spec = task == "listops" ? data::ListOpsSpec::release() : data::ListOpsSpec::short_cpu();
    if (count > 0) spec.train = count;
    if (max_length > 0) {
      spec.max_length = static_cast<int>(max_length);
      spec.min_length = static_cast<int>(max_length / 4);
    }
    if (min_length > 0) spec.min_length = static_cast<int>(min_length);
    CAST_CHECK_USAGE(spec.min_length >= 1 && spec.min_length + 1 < spec.max_length,
                     "ListOps keeps lengths strictly between the shortest ({}{}) and the longest ({}): none are; give "
                     "--min-length at least 1 and --max-length at least 2 above it",
                     spec.min_length,
                     min_length > 0 || max_length == 0 ? "" : fmt::format(", a quarter of --max-length {}", max_length),
                     spec.max_length);
    data::generate_listops(out, spec, static_cast<uint64_t>(seed), overwrite, stop_check(out), rerun);
  } else {
    data::PathfinderSpec spec =
        task == "pathx" ? data::PathfinderSpec::pathx128() : data::PathfinderSpec::pathfinder32();
    // the readers split a set 80/10/10 into training, validation and test, each at least one image
    CAST_CHECK_USAGE(count == 0 || count >= 10,
                     "--count {}: a {} set is split 80/10/10 into training, validation and test; at least 10 images "
                     "give each split one",
                     count, task);
    if (count > 0) spec.count = count;
    data::generate_pathfinder(out, spec, static_cast<uint64_t>(seed), overwrite, stop_check(out), rerun);
  }
}

int command_data(const std::vector<std::string>& argv) {
  cli::Args args("data",
                 "Generate a task in the LRA release layout: --task listops | listops-short | pathfinder | pathx.");
  args.option("task", "", "listops | listops-short | pathfinder | pathx")
      .option("out", "", "output folder (default: data/<name>)")
      .option("count", "0",
              "training examples for ListOps (0: 96000, short 6000); images for pathfinder/pathx "
              "(0: 2000)")
      .option("max-length", "0", "ListOps: longest expression in tokens (0: 2000 as in LRA, short 48)")
      .option("min-length", "0",
              "ListOps: shortest expression (0: the task's, 500 for listops and 6 for listops-short; with "
              "--max-length, a quarter of it, as LRA's 500 of 2000)")
      .option("seed", "1", "seed")
      .flag("overwrite", "replace a data set in --out that cast did not generate, or generated with other settings")
      .usage("cast data <task> [options]   (or --task <task>)")
      .example("cast data listops")
      .example("cast data listops --max-length 512 --count 20000 --out data/listops-512")
      .example("cast data pathfinder --count 500 --out data/pf-small")
      .example("cast data pathx --count 200 --seed 3");
  std::vector<std::string> rest = argv;
  if (!rest.empty() && rest[0].rfind("--", 0) != 0) rest.insert(rest.begin(), "--task");  // `cast data listops`
  if (!args.parse(rest)) return 0;
  CAST_CHECK_USAGE(!args.str("task").empty(),
                   "no task given: cast data <task> [options], the task one of listops, listops-short, pathfinder, pathx");
  const std::string task = args.choice("task", {"listops", "listops-short", "pathfinder", "pathx"});
  // the command itself without its --out and --overwrite: a refusal advises it again with both, and
  // the set's mark keeps it for the advice to a reader that finds files missing
  std::string rerun = "cast data";
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--overwrite" || argv[i].rfind("--out=", 0) == 0) continue;
    if (argv[i] == "--out") {
      ++i;
      continue;
    }
    rerun += " " + train::shell_quote(argv[i]);
  }
  const bool listops = task == "listops" || task == "listops-short";
  const int64_t max_count = listops ? 10'000'000 : 1'000'000;  // a bound on what a disk and a run can take
  const int64_t seed = args.integer("seed", 0, INT64_MAX), count = args.integer("count", 0, max_count);
  CAST_CHECK_USAGE(listops || (!args.is_set("max-length") && !args.is_set("min-length")),
                   "--max-length and --min-length are ListOps options");
  const int64_t max_length = args.integer("max-length", 0, 100000), min_length = args.integer("min-length", 0, 100000);
  std::string out = args.str("out");
  if (out.empty()) out = train::find_task(task).data_dir;
  // a set inside another: the outer set's next cast data would take its files for edits of its own
  train::check_not_in_a_data_set(out, "data folder", "--out", /*may_be_the_set=*/true);
  const NewFolders new_folders(out);
  try {
    generate(task, out, count, max_length, min_length, seed, args.is_set("overwrite"), rerun);
  } catch (...) {
    new_folders.remove_if_empty();
    throw;
  }
  // The set is whole from here: a second signal now loses nothing, and a first one that came
  // during its last writes stopped nothing (the exit says the set was written, not stopped).
  train::set_second_signal_note(fmt::format(": data folder {} was already complete", out));
  fmt::print("cast data: wrote {} into {}\n", task, out);
  if (const int signal = train::stop_signal(); signal != 0)
    fmt::print(stderr, "cast data: {} came while the set's last files were written; it was finished, not stopped\n",
               train::signal_name(signal));
  return 0;
}

}  // namespace cast
