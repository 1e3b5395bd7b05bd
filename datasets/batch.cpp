// Batching and simple statistics over examples.
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <map>

#include "tensor/files.h"
#include "datasets/data.h"

namespace cast::data {

static void fill(const std::vector<int32_t>& seq, int64_t row, int64_t width, bool all_real, std::vector<int32_t>& tok,
                 std::vector<double>& mask) {
  for (int64_t i = 0; i < width; ++i) {
    const bool real = i < static_cast<int64_t>(seq.size());
    tok[row * width + i] = real ? seq[i] : 0;
    mask[row * width + i] = (real || all_real) ? 1.0 : 0.0;
  }
}

nn::Batch make_batch(const TaskData& task, const std::vector<Example>& split, const std::vector<int64_t>& indices,
                     DType dtype, Device device) {
  const int64_t B = static_cast<int64_t>(indices.size());
  int64_t width = 1, width2 = 1;
  for (int64_t i : indices) {
    width = std::max<int64_t>(width, split[i].tokens.size());
    width2 = std::max<int64_t>(width2, split[i].tokens2.size());
  }
  std::vector<int32_t> tok(B * width), tok2(B * width2), labels(B);
  std::vector<double> mask(B * width), mask2(B * width2);
  for (int64_t r = 0; r < B; ++r) {
    const Example& e = split[indices[r]];
    fill(e.tokens, r, width, task.fixed_length, tok, mask);
    if (task.dual) fill(e.tokens2, r, width2, task.fixed_length, tok2, mask2);
    labels[r] = e.label;
  }
  nn::Batch b;
  b.tokens = Tensor::from_vector<int32_t>(tok, {B, width}, device);
  b.mask = Tensor::from_vector<double>(mask, {B, width}).to(dtype).to(device);
  b.labels = Tensor::from_vector<int32_t>(labels, {B}, device);
  b.host_labels = labels;
  for (double m : mask) b.real_tokens += m != 0.0;
  if (task.dual) {
    b.tokens2 = Tensor::from_vector<int32_t>(tok2, {B, width2}, device);
    b.mask2 = Tensor::from_vector<double>(mask2, {B, width2}).to(dtype).to(device);
  }
  return b;
}

void for_each_line(const std::string& path, const std::string& what,
                   const std::function<void(const std::string&, const std::string&)>& fn) {
  try {
    files::require_file(path, "data file");
  } catch (const Error& e) {  // a missing file: say how to make it
    // unless a cast data is making it now (it draws its examples before it writes a file): then
    // the folder's holder is named, as the advice to generate it would be refused by its lock
    const std::string folder = std::filesystem::path(path).parent_path().string();
    if (!folder.empty() && files::exists(folder + "/.cast.lock") && !files::held_here(folder))
      files::FolderLock probe(folder, "data folder");
    throw Error(fmt::format("{} ({})", e.what(), what));
  }
  files::for_each_line(path, "data file", [&](std::string& line, int64_t number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // a NUL byte cuts a name or a token short wherever it is passed on (a Pathfinder image's path
    // was read up to it, and blamed on the folder left): no text line of a data set holds one
    const size_t nul = line.find('\0');
    CAST_CHECK(nul == std::string::npos, "{}:{}: a NUL byte at column {}: not a line of text", path, number, nul + 1);
    if (!line.empty()) fn(line, fmt::format("{}:{}", path, number));
  });
}

std::string fingerprint(const TaskData& task) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&](uint64_t word) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (word >> (8 * byte)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  for (const auto* split : {&task.train, &task.val, &task.test}) {
    mix(split->size());
    for (const Example& e : *split) {
      mix(e.tokens.size());
      for (int32_t t : e.tokens) mix(static_cast<uint32_t>(t));
      mix(e.tokens2.size());
      for (int32_t t : e.tokens2) mix(static_cast<uint32_t>(t));
      mix(static_cast<uint32_t>(e.label));
    }
  }
  return fmt::format("train {} val {} test {} fnv {:016x}", task.train.size(), task.val.size(), task.test.size(), h);
}

double majority_rate(const std::vector<Example>& split, int64_t classes, int64_t limit) {
  const int64_t n = limit > 0 ? std::min<int64_t>(limit, split.size()) : static_cast<int64_t>(split.size());
  if (n == 0) return 0.0;
  std::vector<int64_t> count(std::max<int64_t>(classes, 1), 0);
  for (int64_t i = 0; i < n; ++i)
    if (split[i].label >= 0 && split[i].label < classes) ++count[split[i].label];
  return static_cast<double>(*std::max_element(count.begin(), count.end())) / static_cast<double>(n);
}

}  // namespace cast::data
