// Loaders for the LRA release formats: IMDb (Text), AAN (Retrieval), CIFAR-10 (Image), and
// Fashion-MNIST (a real image task installed by a Debian package).
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "tensor/files.h"
#include "datasets/data.h"

namespace cast::data {

namespace fs = std::filesystem;

static std::vector<int32_t> bytes_as_tokens(const std::string& text, int64_t max_len) {
  std::vector<int32_t> t;
  const size_t n = std::min<size_t>(text.size(), static_cast<size_t>(max_len));
  t.reserve(n);
  for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(static_cast<unsigned char>(text[i])) + 1);
  return t;
}

// A review or a CIFAR-10 batch (30 MB) is never near 64 MiB: a larger file is refused before it
// is read into memory.
static std::string read_all(const std::string& path, const std::string& what) {
  return files::read_file(path, what, uint64_t{1} << 26);
}

// ---------------------------------------------------------------- IMDb
// The reviews of both classes alternately (neg, pos, neg, ...; the rest of the larger class at
// the end), so that the first examples of a split, which --eval-limit takes, hold both classes:
// one folder after the other, any limit up to 12 500 evaluated the negative reviews alone.
static std::vector<Example> read_imdb_split(const std::string& dir, int64_t max_len) {
  std::vector<Example> by_class[2];
  for (const char* sentiment : {"neg", "pos"}) {
    std::vector<Example>& out = by_class[std::string(sentiment) == "pos" ? 1 : 0];
    const std::string folder = dir + "/" + sentiment;
    files::require_folder(folder, "IMDb folder (the aclImdb layout {train,test}/{pos,neg}/*.txt)");
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    CAST_CHECK(!files.empty(), "{}: no .txt reviews", folder);
    for (const std::string& f : files) {
      Example e;
      const std::string review = read_all(f, "IMDb review");
      e.tokens = bytes_as_tokens(review, max_len);
      e.cut = static_cast<int64_t>(review.size()) > max_len;
      CAST_CHECK(!e.tokens.empty(), "{}: empty review", f);
      e.label = std::string(sentiment) == "pos" ? 1 : 0;
      out.push_back(std::move(e));
    }
  }
  std::vector<Example> out;
  for (size_t i = 0; i < std::max(by_class[0].size(), by_class[1].size()); ++i)
    for (std::vector<Example>& examples : by_class)
      if (i < examples.size()) out.push_back(std::move(examples[i]));
  return out;
}

TaskData load_imdb(const std::string& dir, int64_t max_len) {
  files::require_folder(dir, "IMDb data folder");
  TaskData t;
  t.name = "text";
  t.vocab = 257;
  t.classes = 2;
  t.max_len = max_len;
  t.train = read_imdb_split(dir + "/train", max_len);
  t.test = read_imdb_split(dir + "/test", max_len);
  t.val = t.test;  // the LRA code evaluates Text on its test split
  return t;
}

// ---------------------------------------------------------------- AAN
static std::vector<Example> read_aan(const std::string& path, int64_t max_len) {
  std::vector<Example> out;
  for_each_line(
      path, "expected new_aan_pairs.{train,eval,test}.tsv", [&](const std::string& line, const std::string& where) {
        std::vector<std::string> cols;
        std::stringstream ss(line);
        for (std::string col; std::getline(ss, col, '\t');) cols.push_back(col);
        if (line.back() == '\t') cols.push_back("");
        CAST_CHECK(cols.size() == 5, "{}: expected 5 tab-separated columns (label, id1, id2, text1, text2), got {}",
                   where, cols.size());
        Example e;
        const std::string& label = cols[0];
        if (label == "0" || label == "0.0") e.label = 0;
        else if (label == "1" || label == "1.0") e.label = 1;
        else throw Error(fmt::format("{}: label '{}' is not 0 or 1", where, label));
        e.tokens = bytes_as_tokens(cols[3], max_len);
        e.tokens2 = bytes_as_tokens(cols[4], max_len);
        e.cut = static_cast<int64_t>(std::max(cols[3].size(), cols[4].size())) > max_len;
        CAST_CHECK(!e.tokens.empty() && !e.tokens2.empty(), "{}: empty text", where);
        out.push_back(std::move(e));
      });
  CAST_CHECK(!out.empty(), "{}: no examples", path);
  return out;
}

TaskData load_aan(const std::string& dir, int64_t max_len) {
  files::require_folder(dir, "AAN data folder");
  TaskData t;
  t.name = "retrieval";
  t.vocab = 257;
  t.classes = 2;
  t.max_len = max_len;
  t.dual = true;
  t.train = read_aan(dir + "/new_aan_pairs.train.tsv", max_len);
  t.val = read_aan(dir + "/new_aan_pairs.eval.tsv", max_len);
  t.test = read_aan(dir + "/new_aan_pairs.test.tsv", max_len);
  return t;
}

// ---------------------------------------------------------------- CIFAR-10
static std::vector<Example> read_cifar_batch(const std::string& path) {
  const std::string bytes = read_all(path, "CIFAR-10 batch");
  constexpr size_t kRecord = 1 + 3072;
  CAST_CHECK(!bytes.empty(), "{}: is empty, where a CIFAR-10 batch holds {}-byte records", path, kRecord);
  CAST_CHECK(bytes.size() % kRecord == 0, "{}: {} bytes is not a whole number of {}-byte CIFAR-10 records (truncated?)",
             path, bytes.size(), kRecord);
  std::vector<Example> out;
  for (size_t r = 0; r < bytes.size() / kRecord; ++r) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + r * kRecord);
    CAST_CHECK(p[0] <= 9, "{}: record {} has label {} (expected 0-9)", path, r, int(p[0]));
    Example e;
    e.label = p[0];
    e.tokens.resize(1024);
    for (int i = 0; i < 1024; ++i)  // ITU-R 601 luma, as tf.image.rgb_to_grayscale
      e.tokens[i] =
          static_cast<int32_t>(std::lround(0.2989 * p[1 + i] + 0.5870 * p[1 + 1024 + i] + 0.1140 * p[1 + 2048 + i]));
    out.push_back(std::move(e));
  }
  return out;
}

TaskData load_cifar10(const std::string& dir) {
  files::require_folder(dir, "CIFAR-10 data folder");
  TaskData t;
  t.name = "image";
  t.vocab = 256;
  t.classes = 10;
  t.max_len = 1024;
  t.fixed_length = true;
  t.image_side = 32;
  for (int b = 1; b <= 5; ++b) {
    auto part = read_cifar_batch(fmt::format("{}/data_batch_{}.bin", dir, b));
    t.train.insert(t.train.end(), part.begin(), part.end());
  }
  t.test = read_cifar_batch(dir + "/test_batch.bin");
  const size_t val = std::min<size_t>(5000, t.train.size() / 10);  // the last tenth of train, up to 5000
  t.val.assign(t.train.end() - val, t.train.end());
  t.train.resize(t.train.size() - val);
  return t;
}

// ---------------------------------------------------------------- Fashion-MNIST
static std::string read_gzip(const std::string& path) {
  // opened through files::open_input: a FIFO or device is refused before gzip reads from it
  files::Fd fd = files::open_input(path, "Fashion-MNIST file");
  gzFile f = gzdopen(fd.get(), "rb");
  CAST_CHECK(f, "Fashion-MNIST file {}: cannot open", path);
  fd.release();  // gzclose closes it
  std::string out;
  char buffer[1 << 16];
  int n;
  constexpr size_t kMax = size_t{1} << 30;  // 16x Fashion-MNIST's largest file: a gzip bomb stops here
  while ((n = gzread(f, buffer, sizeof(buffer))) > 0) {
    out.append(buffer, n);
    if (out.size() > kMax) {
      gzclose(f);
      throw Error(fmt::format("Fashion-MNIST file {}: more than {} bytes uncompressed", path, kMax));
    }
  }
  int err = 0;
  std::string message = gzerror(f, &err);  // a copy: gzclose frees zlib's string
  if (message.rfind("<fd:", 0) == 0 && message.find(": ") != std::string::npos)
    message = message.substr(message.find(": ") + 2);  // zlib's name for the stream; the path is said already
  gzclose(f);
  CAST_CHECK(n == 0 && err == Z_OK, "{}: corrupt or truncated gzip data ({})", path, message);
  return out;
}

static uint32_t big_endian(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

static std::vector<Example> read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const std::string images = read_gzip(images_path), labels = read_gzip(labels_path);
  CAST_CHECK(images.size() >= 16 && big_endian(images, 0) == 2051,
             "{}: not an IDX image file (it does not start with the magic number 2051)", images_path);
  CAST_CHECK(labels.size() >= 8 && big_endian(labels, 0) == 2049,
             "{}: not an IDX label file (it does not start with the magic number 2049)", labels_path);
  const uint32_t n = big_endian(images, 4), rows = big_endian(images, 8), cols = big_endian(images, 12);
  CAST_CHECK(rows == 28 && cols == 28, "{}: images are {}x{}, expected 28x28", images_path, rows, cols);
  const size_t expected = 16 + size_t(n) * 784;
  CAST_CHECK(images.size() >= expected, "{}: {} images declared, {} bytes, but {} bytes present (truncated?)",
             images_path, n, expected, images.size());
  CAST_CHECK(images.size() == expected, "{}: {} bytes beyond the {} images declared (not an IDX image file as written)",
             images_path, images.size() - expected, n);
  CAST_CHECK(big_endian(labels, 4) == n && labels.size() == 8 + size_t(n), "{}: label count does not match {} images",
             labels_path, n);
  std::vector<Example> out(n);
  for (uint32_t i = 0; i < n; ++i) {
    out[i].label = uint8_t(labels[8 + i]);
    CAST_CHECK(out[i].label <= 9, "{}: label {} of image {} is not 0-9", labels_path, out[i].label, i);
    out[i].tokens.resize(784);
    for (int p = 0; p < 784; ++p) out[i].tokens[p] = uint8_t(images[16 + size_t(i) * 784 + p]);
  }
  return out;
}

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

// Each pool × pool block of a 28 × 28 image becomes one pixel, the rounded mean of the block.
static void pool_images(std::vector<Example>& images, int pool) {
  const int side = 28 / pool;
  for (Example& e : images) {
    std::vector<int32_t> pooled(size_t(side) * side);
    for (int r = 0; r < side; ++r)
      for (int c = 0; c < side; ++c) {
        int sum = 0;
        for (int i = 0; i < pool; ++i)
          for (int j = 0; j < pool; ++j) sum += e.tokens[size_t(r * pool + i) * 28 + size_t(c * pool + j)];
        pooled[size_t(r) * side + c] = (sum + pool * pool / 2) / (pool * pool);
      }
    e.tokens = std::move(pooled);
  }
}

TaskData load_fashion_mnist(const std::string& dir, int pool) {
  CAST_CHECK(pool == 1 || pool == 2 || pool == 4, "Fashion-MNIST pooling {} is not 1, 2 or 4", pool);
  files::require_folder(dir, "Fashion-MNIST data folder");
  TaskData t;
  t.name = pool == 1 ? "fashion-mnist" : fmt::format("fashion-mnist-{}", 28 / pool);
  t.vocab = 256;
  t.classes = 10;
  t.image_side = 28 / pool;
  t.max_len = t.image_side * t.image_side;
  t.fixed_length = true;
  t.train = read_idx_pair(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz");
  t.test = read_idx_pair(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  if (pool > 1) {
    pool_images(t.train, pool);
    pool_images(t.test, pool);
  }
  const size_t val = std::min<size_t>(5000, t.train.size() / 10);
  t.val.assign(t.train.end() - val, t.train.end());
  t.train.resize(t.train.size() - val);
  return t;
}

}  // namespace cast::data
