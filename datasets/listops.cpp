// ListOps: the generator (LRA rules) and the release TSV loader.
#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "tensor/files.h"
#include "tensor/philox.h"
#include "datasets/data.h"

namespace cast::data {

ListOpsSpec ListOpsSpec::release() { return ListOpsSpec{}; }

ListOpsSpec ListOpsSpec::short_cpu() {
  ListOpsSpec s;
  s.max_depth = 3;
  s.max_args = 5;
  s.min_length = 6;
  s.max_length = 48;
  s.train = 6000;
  s.val = 500;
  s.test = 500;
  return s;
}

namespace {

const char* kOperators[] = {"[MIN", "[MAX", "[MED", "[SM"};

using Stream = philox::Stream;

// A random tree written in the release layout: ((((op v1) v2) ... ) ]) with parentheses.
std::string random_tree(Stream& rng, int depth, const ListOpsSpec& spec, int& length) {
  const double r = depth < spec.max_depth ? rng.uniform() : 1.0;
  if (r > 0.25) {
    length += 1;
    return std::to_string(rng.integer(0, 9));
  }
  const int args = rng.integer(2, spec.max_args);
  length += 2;  // the operator and its closing bracket
  std::string op = kOperators[rng.integer(0, 3)];
  std::string text = "( " + op + " " + random_tree(rng, depth + 1, spec, length) + " )";
  for (int i = 1; i < args; ++i) text = "( " + text + " " + random_tree(rng, depth + 1, spec, length) + " )";
  return "( " + text + " ] )";
}

void write_split(const std::string& path, const std::vector<std::pair<std::string, int>>& rows) {
  std::string text = "Source\tTarget\n";
  for (const auto& [source, target] : rows) text += source + '\t' + std::to_string(target) + '\n';
  files::write_atomic(path, text, "ListOps file", files::Link::refuse);
}

}  // namespace

std::vector<int32_t> tokenize_listops(const std::string& source, const std::string& where) {
  std::istringstream in(source);
  std::vector<int32_t> tokens;
  std::string word;
  while (in >> word) {
    if (word == "(" || word == ")") continue;
    if (word.size() == 1 && word[0] >= '0' && word[0] <= '9') tokens.push_back(1 + (word[0] - '0'));
    else if (word == "[MIN") tokens.push_back(11);
    else if (word == "[MAX") tokens.push_back(12);
    else if (word == "[MED") tokens.push_back(13);
    else if (word == "[SM") tokens.push_back(14);
    else if (word == "]") tokens.push_back(15);
    else throw Error(fmt::format("{}: unknown ListOps token '{}'", where, word));
  }
  return tokens;
}

int evaluate_listops(const std::string& source, const std::string& where) {
  const std::vector<int32_t> t = tokenize_listops(source, where);
  CAST_CHECK(!t.empty(), "{}: empty expression", where);
  CAST_CHECK(std::count(source.begin(), source.end(), '(') == std::count(source.begin(), source.end(), ')'),
             "{}: unbalanced parentheses", where);
  auto top_level = [&](int& result, int v) {
    CAST_CHECK(result < 0, "{}: more than one value at the top level", where);
    result = v;
  };
  std::vector<std::vector<int>> stack;  // argument lists of the open operators
  std::vector<int32_t> ops;
  int result = -1;
  for (int32_t tok : t) {
    if (tok >= 1 && tok <= 10) {
      if (stack.empty()) top_level(result, tok - 1);
      else stack.back().push_back(tok - 1);
    } else if (tok >= 11 && tok <= 14) {
      ops.push_back(tok);
      stack.emplace_back();
    } else {  // ]
      CAST_CHECK(!stack.empty(), "{}: a ']' closes no operator", where);
      std::vector<int> args = stack.back();
      stack.pop_back();
      const int32_t op = ops.back();
      ops.pop_back();
      CAST_CHECK(!args.empty(), "{}: an operator without arguments", where);
      int v = 0;
      if (op == 11) v = *std::min_element(args.begin(), args.end());
      else if (op == 12) v = *std::max_element(args.begin(), args.end());
      else if (op == 13) {  // integer median: the mean of the middle pair, truncated
        std::sort(args.begin(), args.end());
        const size_t n = args.size();
        v = n % 2 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;
      } else {
        for (int a : args) v += a;
        v %= 10;
      }
      if (stack.empty()) top_level(result, v);
      else stack.back().push_back(v);
    }
  }
  CAST_CHECK(stack.empty() && result >= 0, "{}: incomplete expression ({} operator{} not closed)", where, stack.size(),
             stack.size() == 1 ? "" : "s");
  return result;
}

void generate_listops(const std::string& dir, const ListOpsSpec& spec, uint64_t seed, bool overwrite,
                      const StopCheck& stop_check, const std::string& rerun) {
  const std::string settings =
      fmt::format("{} training, {} validation and {} test examples, depth at most {}, at most {} arguments, lengths "
                  "{} to {}, seed {}",
                  spec.train, spec.val, spec.test, spec.max_depth, spec.max_args, spec.min_length, spec.max_length, seed);
  const files::FolderLock lock =
      claim_data_folder(dir, overwrite, {dir + "/basic_train.tsv", dir + "/basic_val.tsv", dir + "/basic_test.tsv"},
                        "ListOps", settings, rerun);
  Stream rng{seed};
  std::set<std::string> seen;
  std::vector<std::pair<std::string, int>> rows;
  const int64_t total = spec.train + spec.val + spec.test;
  int64_t attempts = 0, since_last = 0;
  // Bounds that admit fewer distinct trees than asked for are found by the draws:
  //  - none new for kStall draws in a row (the full task's trees are long, so a bound on the
  //    whole count would take minutes);
  //  - or new ones coming so seldom that the rest would take more than kSlower times as many
  //    draws as the whole set at the rate of its first sixteenth: near a space's last trees each
  //    new one takes ever more draws, and a set a few per cent larger than the space would run on
  //    for hours.
  constexpr int64_t kStall = 200000, kWindow = int64_t{1} << 16, kSlower = 4;
  const int64_t first_part = std::max<int64_t>(1, total / 16);
  int64_t first_part_attempts = 0, window_new = 0;
  const auto too_tight = [&] {
    return UsageError(fmt::format("ListOps data {}: the length bounds ({}, {}: --min-length, --max-length) are too "
                                  "tight to fill {} distinct examples; widen them or lower --count",
                                  dir, spec.min_length, spec.max_length, total));
  };
  while (static_cast<int64_t>(rows.size()) < total) {
    // bounds few trees fall within take many draws an example: a stop is honoured between draws
    if (stop_check && attempts % 4096 == 0) stop_check();
    if (++attempts >= total * 10000 || ++since_last >= kStall) throw too_tight();
    if (attempts % kWindow == 0) {
      const int64_t left = total - static_cast<int64_t>(rows.size());
      // the draws the rest needs at this window's rate, against the whole set's at the first rate
      if (first_part_attempts > 0 && window_new > 0 &&
          static_cast<double>(left) * kWindow / window_new >
              static_cast<double>(kSlower) * first_part_attempts * total / first_part)
        throw too_tight();
      window_new = 0;
    }
    int length = 0;
    std::string tree = random_tree(rng, 0, spec, length);
    if (length <= spec.min_length || length >= spec.max_length || !seen.insert(tree).second) continue;
    since_last = 0;
    ++window_new;
    rows.push_back({tree, evaluate_listops(tree)});
    if (static_cast<int64_t>(rows.size()) == first_part) first_part_attempts = attempts;
    if (stop_check && rows.size() % 256 == 0) stop_check();
  }
  auto part = [&](int64_t begin, int64_t n) {
    return std::vector<std::pair<std::string, int>>(rows.begin() + begin, rows.begin() + begin + n);
  };
  mark_data_unfinished(dir, "ListOps", settings, rerun);  // the examples are drawn: the set's files change from here
  write_split(dir + "/basic_train.tsv", part(0, spec.train));
  if (stop_check) stop_check();
  write_split(dir + "/basic_val.tsv", part(spec.train, spec.val));
  write_split(dir + "/basic_test.tsv", part(spec.train + spec.val, spec.test));
  mark_data_folder(dir, "ListOps", settings, rerun);
}

static std::vector<Example> read_listops_tsv(const std::string& path, int64_t max_len) {
  std::vector<Example> out;
  bool header = true;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const std::string there = marked_kind(dir.empty() ? "." : dir);
  const std::string hint =
      !there.empty() && there != "ListOps"  // generating ListOps there would be refused: name the mix-up
          ? fmt::format("{} holds a {} set made by cast data, not ListOps: give --data a ListOps folder",
                        dir.empty() ? "." : dir, there)
          : generate_hint(dir.empty() ? "." : dir, [](const std::string& out) {
              // the loader reads both tasks: the hint names both commands
              return fmt::format("`cast data listops-short --out {0}` (the short task) or `cast data listops --out {0}`",
                                 out);
            });
  for_each_line(path, hint, [&](const std::string& line, const std::string& where) {
    if (header) {
      CAST_CHECK(line == "Source\tTarget", "{}: expected the header 'Source<TAB>Target', got '{}'", where,
                 line.substr(0, 40));
      header = false;
      return;
    }
    const size_t tab = line.find('\t');
    CAST_CHECK(tab != std::string::npos && line.find('\t', tab + 1) == std::string::npos,
               "{}: expected 2 tab-separated columns", where);
    const std::string target = line.substr(tab + 1);
    CAST_CHECK(target.size() == 1 && target[0] >= '0' && target[0] <= '9', "{}: label '{}' is not a digit 0-9", where,
               target);
    Example e;
    evaluate_listops(line.substr(0, tab), where);  // a well-formed expression, checked whole before it is cut
    e.tokens = tokenize_listops(line.substr(0, tab), where);
    CAST_CHECK(!e.tokens.empty(), "{}: empty source", where);
    e.cut = static_cast<int64_t>(e.tokens.size()) > max_len;
    if (e.cut) e.tokens.resize(max_len);
    e.label = target[0] - '0';
    out.push_back(std::move(e));
  });
  CAST_CHECK(!header, "{}:1: empty file", path);
  CAST_CHECK(!out.empty(), "{}: no examples", path);
  return out;
}

TaskData load_listops(const std::string& dir, int64_t max_len) {
  check_data_finished(dir);
  files::require_folder(dir, "ListOps data folder");
  TaskData t;
  t.name = "listops";
  t.vocab = 16;
  t.classes = 10;
  t.max_len = max_len;
  t.train = read_listops_tsv(dir + "/basic_train.tsv", max_len);
  t.val = read_listops_tsv(dir + "/basic_val.tsv", max_len);
  t.test = read_listops_tsv(dir + "/basic_test.tsv", max_len);
  return t;
}

}  // namespace cast::data
