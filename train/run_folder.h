#pragma once
// A run folder: checkpoint.safetensors, best.safetensors, metrics.jsonl (one JSON line per log
// interval and evaluation), curves.svg and summary.json. Made ready before any step is spent;
// the metrics of a resumed run continue from its checkpoint's step.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/files.h"
#include "train/settings.h"

namespace cast::train {

// A run's or a comparison's folder never lies in a data set, at any depth (cast data there
// would replace its files): `what` ("run folder") and the `option` that names it in the refusal.
// may_be_the_set: a folder that is itself the set passes (cast data making it again).
void check_not_in_a_data_set(const std::string& folder, const std::string& what, const std::string& option,
                             bool may_be_the_set = false);

// A new run's folder that holds no run: the files it would write may replace only what a cast
// run left there, or anything with --overwrite (read only: prepare_run_folder, and cast compare
// for every run before its first).
void check_new_run_files(const TrainConfig& c);
// runs/<task>-<mechanism>: a run's folder when none is named.
std::string default_run_dir(const TrainConfig& c);
// The files of a run folder that no other output may replace (metrics, checkpoints, summary).
std::vector<std::string> run_folder_files(const std::string& run_dir);
// The folder a file is in ("." for a bare name).
std::string folder_of(const std::string& file);
// An output the user names (--out, --figure, --json, --trace): refused when it lies in a folder
// cast holds for a run, a comparison or a data set (the folder has `.cast.lock` or `.made-by-cast`)
// and would be one of that folder's own files, --overwrite or not: anywhere in a data set, a name
// the run or comparison keeps (checkpoint, best, metrics, summary, curves, results, comparison),
// or an existing file of another kind. `owner`: the folder the command itself writes (its run),
// exempt. Then the rule of files::check_may_replace.
void check_user_output(const std::string& out, const std::string& option, const std::string& kind,
                       std::string_view mark, bool overwrite, const std::string& owner = "",
                       std::string_view remedy = "pass --overwrite to replace it, or choose another path");
// A figure drawn from `checkpoint` goes to `out` (given as --`option`): refused before any work
// when it would replace the checkpoint or its run's other files, or a file that is not an SVG.
// An existing file there is replaced only when it is a cast figure, or with `overwrite`.
void check_figure_output(const std::string& out, const std::string& option, const std::string& checkpoint,
                         bool overwrite);

// The records a resume continues (folder's metrics.jsonl, and in place its summary.json) are the
// run's of the checkpoint `resume_from`: a record of another run's id is refused, naming its line.
void check_records_are_the_runs(const std::string& resume_from, const std::string& folder, bool in_place);

// Makes c.run_dir ready to take the run's files, or refuses it before any step: a folder another
// process holds, a folder that cannot be written, a FIFO or link where a file goes, a folder
// holding another run (unless c.overwrite, which removes that run's best checkpoint, summary and
// figure). A resume goes forward only: into the checkpoint's own folder only from its newest
// checkpoint (best.safetensors there would rewind the run: it may start a new folder instead),
// and a finished run (summary.json) only with more steps.
struct RunFolder {
  bool in_place = false;   // resuming into the checkpoint's own folder
  files::FolderLock lock;  // this process's hold on the folder, for the whole run
  std::string note;        // temporary files an interrupted write left there, or ""
};
RunFolder prepare_run_folder(const TrainConfig& c, const std::string& resume_from);

// A resumed run continues the metrics of its checkpoint's step: lines an interrupted process
// wrote after that step are dropped, so no step appears twice. In a new folder it starts from
// the checkpoint's folder's lines and best checkpoint, which are read, never written.
// Returns how many metrics records after the checkpoint's step were left out.
// A branch (a new folder) takes them under its own run id (`run_id`): its records and best model
// are its own from then on, and no other run's.
struct KeptRecords {
  int64_t kept = 0;       // records continued
  int64_t dropped = 0;    // records after the checkpoint's step, left out
  bool cut_line = false;  // a last line cut short (the process killed while writing it), left out
};
KeptRecords continue_run_files(const std::string& resume_from, int64_t step, const std::string& run_dir, bool in_place,
                               const std::string& run_id);
// A new best validation writes the checkpoint, then best.safetensors: a run stopped between the
// two (killed, or a full disk at the second) left a checkpoint of the best step and no best model
// of that step in run_dir. The checkpoint resumed from, where it is of its best step, is that
// model: written again under the best's name. Returns a note saying so, or "".
std::string restore_best(const std::string& resume_from, const std::string& run_dir, const std::string& run_id);

// The mark in every summary.json a run writes ("made_by": "cast train").
constexpr const char* kSummaryMark = "\"made_by\": \"cast train\"";
// summary.json: the run's result, atomically, with its mark.
void write_summary(const std::string& run_dir, nlohmann::json summary);
// A finished run resumed for more steps: once a checkpoint past its end is written, the old
// summary.json describes a run the folder no longer holds, and is removed (a run with no summary
// is one still under way). Only a cast run's summary of an earlier step goes.
void remove_passed_summary(const std::string& run_dir, int64_t step);

}  // namespace cast::train
