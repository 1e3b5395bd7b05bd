#pragma once
// LRA tasks as token sequences: generators (ListOps, Pathfinder), loaders for the release
// formats, and batching. Every loader names the file and line of the first problem it finds.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/transformer.h"
#include "tensor/files.h"

namespace cast::data {

struct Example {
  std::vector<int32_t> tokens;
  std::vector<int32_t> tokens2;  // Retrieval: the second document
  int32_t label = 0;
  bool cut = false;  // longer than the task's max_len: the loader dropped its tail
};

struct TaskData {
  std::string name;
  std::vector<Example> train, val, test;
  int64_t vocab = 0, classes = 0, max_len = 0;
  bool dual = false;
  // Image tasks: every position is data (pixel value 0 included), never padding.
  bool fixed_length = false;
  int64_t image_side = 0;  // image tasks: width = height, for `cast clusters`
};

// A set as loaded, in one line: "train N val N test N fnv HEX", its split sizes and a 64-bit
// FNV-1a hash of every example (tokens, second document, label) in order. A checkpoint keeps its
// run's, so that evaluating or resuming it on another set is said (a data folder regenerated, or
// a relative --data read from another working folder).
std::string fingerprint(const TaskData& task);

// Pads each sequence with 0 to the longest in the batch (all positions real for fixed-length tasks).
nn::Batch make_batch(const TaskData& task, const std::vector<Example>& split, const std::vector<int64_t>& indices,
                     DType dtype, Device device);
// The majority-class rate of a split (the accuracy of always guessing the commonest label).
// The share of the commonest label among the first `limit` examples (all when limit ≤ 0).
double majority_rate(const std::vector<Example>& split, int64_t classes, int64_t limit = 0);

// Calls fn(line, "path:number") for each non-empty line (a trailing \r removed); `what`
// describes the expected file in the error when it cannot be opened.
void for_each_line(const std::string& path, const std::string& what,
                   const std::function<void(const std::string& line, const std::string& where)>& fn);

// ---------------------------------------------------------------- ListOps
struct ListOpsSpec {
  int max_depth = 10, max_args = 10;
  int min_length = 500, max_length = 2000;  // kept when min < length < max (digits + 2 per operator)
  int64_t train = 96000, val = 2000, test = 2000;
  static ListOpsSpec release();    // the LRA settings
  static ListOpsSpec short_cpu();  // a small variant a CPU trains in minutes
};
// A folder the generators made holds this file. They write into a folder only when it is missing,
// empty or marked, or with `overwrite`: else a usage error, before anything is written.
constexpr const char* kDataFolderMark = ".made-by-cast";
// While a generator writes, the folder also holds kDataUnfinishedMark (made, and flushed to
// disk, before the first data file changes; removed after the last): a set that a signal or a
// full disk cut short, half old and half new, is refused by every reader instead of read.
constexpr const char* kDataUnfinishedMark = ".cast-data-unfinished";
// Takes `dir` for one generator: refuses it (before anything in it changes) when it holds files
// cast did not generate and `overwrite` is off, or when one of `outputs` (in a folder that
// exists) cannot be written there; then locks it. The generator marks it unfinished
// (mark_data_unfinished) just before its first data file changes: a generator stopped while it
// draws its examples in memory leaves the set as it was, usable.
// A finished set made with other `settings` (the generator's words for what decides its examples,
// kept in the mark) is replaced only with `overwrite`: the runs trained on it would find other
// data under the same name (their checkpoints keep its fingerprint).
// `rerun` is the command that asked, without its --out and --overwrite (its refusals advise it
// with both; the mark keeps it, so that advice for a set missing files repeats it); "" for none.
files::FolderLock claim_data_folder(const std::string& dir, bool overwrite, const std::vector<std::string>& outputs,
                                    const std::string& kind, const std::string& settings, const std::string& rerun);
// The unfinished mark records the kind, the settings and the command of the generator writing: only a rerun
// of those settings (or --overwrite) may finish or replace the set it stopped in.
void mark_data_unfinished(const std::string& dir, const std::string& kind, const std::string& settings,
                          const std::string& rerun);
void mark_data_folder(const std::string& dir, const std::string& kind, const std::string& settings,
                      const std::string& rerun);
// The kind of set a folder's mark names ("ListOps", "Pathfinder"); "" for a mark that names none
// (sets made before marks named their kind) or no mark.
std::string marked_kind(const std::string& dir);
// The settings a folder's mark records; "" for a mark that records none (sets made before marks
// kept them) or no mark.
std::string marked_settings(const std::string& dir);
// Advice for a data folder that lacks its set: "generate it with `cast data ... --out DIR`" where
// cast data may write into DIR, else the same command into a folder of its own, saying what DIR
// holds (a run's files, or files cast data did not make). `commands(out)` names the commands.
std::string generate_hint(const std::string& dir, const std::function<std::string(const std::string&)>& commands);
// Refuses a folder whose generation did not finish (kDataUnfinishedMark), naming the remedy.
void check_data_finished(const std::string& dir);

// Called by the generators between examples, from any thread; it throws to stop them (cast data
// stops on Ctrl-C this way, leaving the set marked unfinished and saying so).
using StopCheck = std::function<void()>;

// Writes basic_{train,val,test}.tsv (header Source\tTarget) into `dir`.
void generate_listops(const std::string& dir, const ListOpsSpec& spec, uint64_t seed, bool overwrite = false,
                      const StopCheck& stop_check = {}, const std::string& rerun = "");
// Reads the release layout; tokens: drop ( ), `]` is its own token, split on whitespace.
TaskData load_listops(const std::string& dir, int64_t max_len);
std::vector<int32_t> tokenize_listops(const std::string& source, const std::string& where);
// The value of a ListOps expression; a malformed one (unbalanced brackets or parentheses, an
// operator without arguments, two values at the top level) is an error naming `where`.
int evaluate_listops(const std::string& source, const std::string& where = "listops expression");

// ---------------------------------------------------------------- Text (IMDb)
// aclImdb layout: {train,test}/{pos,neg}/*.txt; bytes as tokens (byte + 1, 0 = pad); val = test.
TaskData load_imdb(const std::string& dir, int64_t max_len);

// ---------------------------------------------------------------- Retrieval (AAN)
// new_aan_pairs.{train,eval,test}.tsv: label, id1, id2, text1, text2; bytes as tokens, each text cut.
TaskData load_aan(const std::string& dir, int64_t max_len);

// ---------------------------------------------------------------- Image
// CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin): to grayscale, pixels as tokens.
TaskData load_cifar10(const std::string& dir);
// Fashion-MNIST gzipped IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte.gz): 784 pixels.
// pool 2: each 2 × 2 block averaged into one pixel (14 × 14 images, 196 tokens).
TaskData load_fashion_mnist(const std::string& dir, int pool = 1);
std::string default_fashion_mnist_dir();  // where the Debian package installs it

// ---------------------------------------------------------------- Pathfinder / Path-X
struct PathfinderSpec {
  int side = 32;            // image width = height
  int contour_length = 14;  // paddles per target snake
  int distractors = 4;      // distractor snakes (length contour_length / 3)
  int64_t count = 2000;     // images per generation
  static PathfinderSpec pathfinder32();
  static PathfinderSpec pathx128();
};
// Writes <dir>/imgs/0/sample_<i>.png and <dir>/metadata/0.npy (text lines: subdir file idx label).
void generate_pathfinder(const std::string& dir, const PathfinderSpec& spec, uint64_t seed, bool overwrite = false,
                         const StopCheck& stop_check = {}, const std::string& rerun = "");
// Reads every metadata/*.npy of `dir`; splits 80/10/10 in file order.
// `task`: pathfinder or pathx, whose generator the advice for a missing set or file names.
TaskData load_pathfinder(const std::string& dir, const std::string& task = "pathfinder");

}  // namespace cast::data
