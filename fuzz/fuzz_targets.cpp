// libFuzzer targets for every reader of untrusted input. Built once per target with
// -DCAST_FUZZ_TARGET=<n> (scripts/fuzz.sh). Each target puts the fuzzer's bytes into one file of
// an otherwise valid layout (the readers take paths) and calls the reader: it must return or
// throw cast::Error, never crash, hang or touch memory it does not own (AddressSanitizer and
// UndefinedBehaviorSanitizer are on). `<binary> --write-seeds DIR` writes a valid input to start from.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/safetensors.h"
#include "datasets/data.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace cast;

namespace {

void write_bytes(const std::string& path, const void* data, size_t size) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}
void write_text(const std::string& path, const std::string& s) { write_bytes(path, s.data(), s.size()); }

void write_gzip(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

// One small valid input for the target: the seed, and the rest of the layout around the file
// the fuzzer writes.
std::string idx_images(int n) { return be32(2051) + be32(n) + be32(28) + be32(28) + std::string(784 * n, '\x07'); }
std::string idx_labels(int n) { return be32(2049) + be32(n) + std::string(n, '\x03'); }
std::string cifar_record() { return std::string(1, '\x04') + std::string(3072, '\x80'); }
std::string aan_line() { return "1\tdoc1\tdoc2\tfirst text\tsecond text\n"; }

// The work folder of this process, with the valid layout around the fuzzed file.
const std::string& workdir() {
  static const std::string dir = [] {
    const std::string d = (fs::temp_directory_path() / ("cast_fuzz_" + std::to_string(getpid()))).string();
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

#if CAST_FUZZ_TARGET == 1
const char* kName = "safetensors";
std::string seed() {
  const std::string path = workdir() + "/seed.safetensors";
  write_safetensors(path, {{"w", Tensor::uniform({2, 3}, 1, 0)}}, {{"note", "seed"}});
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void run(const std::string& bytes) { parse_safetensors(std::vector<char>(bytes.begin(), bytes.end()), "fuzz"); }
#elif CAST_FUZZ_TARGET == 2
const char* kName = "checkpoint";
std::string seed() {
  train::TrainConfig c = train::preset("listops-short");
  c.model.layers = 1, c.model.dim = 8, c.model.heads = 2, c.model.mlp_dim = 8;
  nn::Transformer model(c.model);
  std::vector<Tensor> m, v;
  for (auto& [name, t] : model.parameters())
    m.push_back(Tensor::zeros(t->shape())), v.push_back(Tensor::zeros(t->shape()));
  const std::string path = workdir() + "/seed_ckpt.safetensors";
  train::save_checkpoint(path, c, model, m, v, 3, 0.5);
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void run(const std::string& bytes) {
  const std::string path = workdir() + "/c.safetensors";
  write_text(path, bytes);
  train::read_checkpoint_header(path);
}
#elif CAST_FUZZ_TARGET == 3
const char* kName = "config";
std::string seed() { return R"({"steps": 10, "heads": 2, "dim": 16, "attention": "cast", "summaries": "off"})"; }
void run(const std::string& bytes) {
  const nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  train::TrainConfig c = train::preset("listops-short");
  train::apply_overrides(c, j);
}
#elif CAST_FUZZ_TARGET == 4
const char* kName = "listops";
std::string seed() { return "Source\tTarget\n( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] )\t9\n"; }
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/listops";
  write_text(dir + "/basic_train.tsv", bytes);
  write_text(dir + "/basic_val.tsv", seed());
  write_text(dir + "/basic_test.tsv", seed());
  data::load_listops(dir, 2000);
}
#elif CAST_FUZZ_TARGET == 5
const char* kName = "imdb";
std::string seed() { return "A film. <br /> Not bad."; }
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/aclImdb";
  write_text(dir + "/train/pos/0_7.txt", bytes);
  for (const char* f : {"/train/neg/1_2.txt", "/test/pos/2_9.txt", "/test/neg/3_1.txt"}) write_text(dir + f, seed());
  data::load_imdb(dir, 4000);
}
#elif CAST_FUZZ_TARGET == 6
const char* kName = "aan";
std::string seed() { return aan_line(); }
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/aan";
  write_text(dir + "/new_aan_pairs.train.tsv", bytes);
  write_text(dir + "/new_aan_pairs.eval.tsv", aan_line());
  write_text(dir + "/new_aan_pairs.test.tsv", aan_line());
  data::load_aan(dir, 4000);
}
#elif CAST_FUZZ_TARGET == 7
const char* kName = "cifar";
std::string seed() { return cifar_record() + cifar_record(); }
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/cifar";
  write_text(dir + "/data_batch_1.bin", bytes);
  for (int b = 2; b <= 5; ++b) write_text(dir + "/data_batch_" + std::to_string(b) + ".bin", cifar_record());
  write_text(dir + "/test_batch.bin", cifar_record());
  data::load_cifar10(dir);
}
#elif CAST_FUZZ_TARGET == 8
const char* kName = "pathfinder_metadata";
std::string seed() { return "imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1 0\n"; }
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/pathfinder";
  static bool generated = false;
  if (!generated) {  // the images, once
    data::PathfinderSpec spec;
    spec.count = 2;
    data::generate_pathfinder(dir, spec, 1);
    generated = true;
  }
  write_text(dir + "/metadata/0.npy", bytes);
  data::load_pathfinder(dir);
}
#elif CAST_FUZZ_TARGET == 9
const char* kName = "pathfinder_png";
std::string seed() {
  const std::string dir = workdir() + "/png_seed";
  data::PathfinderSpec spec;
  spec.count = 1;
  data::generate_pathfinder(dir, spec, 2);
  std::ifstream in(dir + "/imgs/0/sample_0.png", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/pathfinder_png";
  write_text(dir + "/metadata/0.npy", "imgs/0 sample_0.png 0 1\n");
  write_text(dir + "/imgs/0/sample_0.png", bytes);
  data::load_pathfinder(dir);
}
#elif CAST_FUZZ_TARGET == 10
const char* kName = "fashion_mnist";
std::string seed() {
  const std::string path = workdir() + "/seed.gz";
  write_gzip(path, idx_images(2));
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void run(const std::string& bytes) {
  const std::string dir = workdir() + "/fm";
  write_text(dir + "/train-images-idx3-ubyte.gz", bytes);
  write_gzip(dir + "/train-labels-idx1-ubyte.gz", idx_labels(2));
  write_gzip(dir + "/t10k-images-idx3-ubyte.gz", idx_images(1));
  write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx_labels(1));
  data::load_fashion_mnist(dir);
}
#else
#error "CAST_FUZZ_TARGET must name a target (1..10)"
#endif

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i + 1 < *argc; ++i)
    if (std::strcmp((*argv)[i], "--write-seeds") == 0) {  // write the seed and exit
      const std::string s = seed();
      write_bytes(std::string((*argv)[i + 1]) + "/seed_" + kName, s.data(), s.size());
      std::exit(0);
    }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {  // a clear error is the right answer to a bad file
  }
  return 0;
}
