// Loaders on small files written here in the release formats, and on broken ones: each error
// names the file (and line or record).
#include <unistd.h>  // getpid: the plain and the emulated test process run side by side
#include <png.h>
#include <sys/stat.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <csignal>

#include "tests/folder_holder.h"
#include "tests/test_util.h"
#include "commands/commands.h"
#include "datasets/data.h"
#include "datasets/png.h"
#include "tensor/files.h"
#include "train/stop.h"
#include "train/tasks.h"
#include "train/trainer.h"

using namespace cast;
using namespace cast::testing;
namespace fs = std::filesystem;

static std::string fresh_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("cast_data_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

static void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// ---------------------------------------------------------------- ListOps
TEST(ListOps, EvaluatesTheFourOperators) {
  EXPECT_EQ(data::evaluate_listops("( ( ( [MAX 2 ) 9 ) ] )"), 9);
  EXPECT_EQ(data::evaluate_listops("[MAX 2 9 [MIN 4 7 ] 0 ]"), 9);
  EXPECT_EQ(data::evaluate_listops("[MED 1 2 8 9 ]"), 5);  // (2 + 8) / 2
  EXPECT_EQ(data::evaluate_listops("[MED 1 2 ]"), 1);      // 1.5 truncated
  EXPECT_EQ(data::evaluate_listops("[SM 5 6 [MIN 9 3 ] ]"), 4);
  EXPECT_EQ(data::tokenize_listops("( [MAX 2 ) ]", "x"), (std::vector<int32_t>{12, 3, 15}));
}

TEST(ListOps, GeneratorWritesTheReleaseLayoutAndLabelsMatch) {
  const std::string dir = fresh_dir("listops");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 200, spec.val = 20, spec.test = 20;
  data::generate_listops(dir, spec, 3);
  std::ifstream in(dir + "/basic_train.tsv");
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "Source\tTarget");
  int rows = 0;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    EXPECT_EQ(data::evaluate_listops(line.substr(0, tab)), std::stoi(line.substr(tab + 1)));
    EXPECT_NE(line.find('('), std::string::npos);  // parentheses as in the release
    ++rows;
  }
  EXPECT_EQ(rows, 200);
  data::TaskData t = data::load_listops(dir, 48);
  EXPECT_EQ(t.train.size(), 200u);
  EXPECT_EQ(t.test.size(), 20u);
  for (const auto& e : t.train) {
    EXPECT_GT(e.tokens.size(), 6u);
    EXPECT_LT(e.tokens.size(), 48u);
  }
}

// A generator stopped part-way (cast data on Ctrl-C) once its files began to change leaves its
// folder marked unfinished, which every reader refuses; one stopped while it drew its examples
// in memory leaves the set as it was, readable (twenty-first attack: the mark was made at the
// start, so an interrupted identical rerun made a whole set unusable). An output it cannot write
// is refused before the mark, so a set whose regeneration was refused stays readable.
TEST(ListOps, AStoppedGeneratorLeavesTheSetUnfinishedAndARefusedOneLeavesItWhole) {
  const std::string dir = fresh_dir("listops_stopped");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 600, spec.val = 20, spec.test = 20;
  data::generate_listops(dir, spec, 3);
  const std::string train_rows = slurp(dir + "/basic_train.tsv");
  int checks = 0;
  struct Stop {};
  // seed 4 is another set: --overwrite says it may replace this one
  EXPECT_THROW(data::generate_listops(dir, spec, 4, true, [&] { if (++checks == 2) throw Stop{}; }), Stop);
  EXPECT_EQ(checks, 2);
  EXPECT_FALSE(fs::exists(dir + "/" + data::kDataUnfinishedMark));  // still drawing: nothing written
  EXPECT_EQ(data::load_listops(dir, 48).train.size(), 600u);
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);
  // stopped between its files: half new, marked
  EXPECT_THROW(data::generate_listops(dir, spec, 4, true,
                                      [&] { if (fs::exists(dir + "/" + data::kDataUnfinishedMark)) throw Stop{}; }),
               Stop);
  EXPECT_TRUE(fs::exists(dir + "/" + data::kDataUnfinishedMark));
  EXPECT_CAST_ERROR(data::load_listops(dir, 48), "did not finish");
  // the mark names the settings of the stopped run (seed 4): the set's own settings (seed 3) need
  // overwrite to make the set again (thirty-third attack: a stopped rerun that had changed no file
  // was replaced by a third set's settings without it)
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 3), "holds an unfinished ListOps set of other settings");
  data::generate_listops(dir, spec, 3, true);  // the rerun completes it
  EXPECT_FALSE(fs::exists(dir + "/" + data::kDataUnfinishedMark));
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);

  fs::remove(dir + "/basic_val.tsv");
  fs::create_directory(dir + "/basic_val.tsv");  // an output that cannot be written
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 4, true), "basic_val.tsv");
  EXPECT_FALSE(fs::exists(dir + "/" + data::kDataUnfinishedMark));
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);
}

// A whole set made with other settings is replaced only with overwrite: the runs trained on it
// would find other examples under its name (twenty-second attack). The same settings regenerate
// it, an unfinished set is completed by the settings its marks record, and a mark from before
// marks kept settings says nothing against a regeneration.
TEST(ListOps, ASetOfOtherSettingsIsReplacedOnlyWithOverwrite) {
  const std::string dir = fresh_dir("listops_settings");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 60, spec.val = 10, spec.test = 10;
  data::generate_listops(dir, spec, 3);
  const std::string train_rows = slurp(dir + "/basic_train.tsv");
  EXPECT_EQ(data::marked_settings(dir),
            "60 training, 10 validation and 10 test examples, depth at most 3, at most 5 arguments, lengths 6 to 48, "
            "seed 3");
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 4),
                    fmt::format("data folder {}: holds a ListOps set cast data made with other settings (60 training, "
                                "10 validation and 10 test examples, depth at most 3, at most 5 arguments, lengths 6 "
                                "to 48, seed 3), not these (",
                                dir));
  data::ListOpsSpec more = spec;
  more.train = 80;
  EXPECT_CAST_ERROR(data::generate_listops(dir, more, 3), "made with other settings");
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);
  data::generate_listops(dir, spec, 3);  // the same settings: the same files again
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);
  data::generate_listops(dir, more, 3, true);
  EXPECT_EQ(data::load_listops(dir, 48).train.size(), 80u);
  // unfinished: its mark records the settings of the run that stopped, and only those finish it
  // (thirty-third attack: a stopped rerun may have changed no file of the whole set); a mark that
  // records none (an older cast data's) stands for the settings of the set the folder's mark
  // names, whose files it may still hold
  write_text(dir + "/" + data::kDataUnfinishedMark, "stopped\n");
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 3), "holds an unfinished ListOps set of other settings (80 training");
  write_text(dir + "/" + data::kDataUnfinishedMark,
             "stopped\nsettings: 60 training, 10 validation and 10 test examples, depth at most 3, at most 5 "
             "arguments, lengths 6 to 48, seed 3\n");
  data::generate_listops(dir, spec, 3);
  EXPECT_EQ(slurp(dir + "/basic_train.tsv"), train_rows);
  // a mark of before marks kept settings, or a digest: it cannot tell a hand edit, so only
  // --overwrite replaces the set (twenty-sixth attack: an edit older than the mark was lost)
  write_text(dir + "/" + data::kDataFolderMark, "a ListOps data set generated by cast data; cast data may replace it\n");
  EXPECT_EQ(data::marked_settings(dir), "");
  EXPECT_CAST_ERROR(data::generate_listops(dir, more, 3),
                    "its mark .made-by-cast holds no digest of its files (an older cast data made it)");
  data::generate_listops(dir, more, 3, true);
  EXPECT_EQ(data::load_listops(dir, 48).train.size(), 80u);
}

// A whole set whose files were changed by hand after cast data made it (newer than its mark) is
// not replaced by a regeneration, even of the same settings, unless told (twenty-third attack:
// a hand-added example was undone with exit 0).
TEST(ListOps, ASetChangedByHandIsNotRegeneratedWithoutOverwrite) {
  const std::string dir = fresh_dir("listops_hand_edited");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 40, spec.val = 10, spec.test = 10;
  data::generate_listops(dir, spec, 3);
  data::generate_listops(dir, spec, 3);  // untouched: made again
  const std::string mark = dir + "/" + data::kDataFolderMark;
  for (const char* name : {"basic_train.tsv", "basic_val.tsv", "basic_test.tsv"})
    EXPECT_FALSE(files::modified_after(dir + "/" + name, mark, 0.0)) << name;
  write_text(dir + "/basic_val.tsv", slurp(dir + "/basic_val.tsv") + "( [MAX 1 2 ] )\t2\n");
  fs::last_write_time(dir + "/basic_val.tsv", fs::last_write_time(mark) + std::chrono::seconds(10));
  const std::string edited = slurp(dir + "/basic_val.tsv");
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 3),
                    fmt::format("data folder {}: basic_val.tsv was changed after cast data made the set", dir));
  EXPECT_EQ(slurp(dir + "/basic_val.tsv"), edited);
  data::generate_listops(dir, spec, 3, true);
  EXPECT_NE(slurp(dir + "/basic_val.tsv"), edited);
  // the contents tell, not the time (twenty-fifth attack: a file copied in with cp -p, older than
  // the mark, was replaced): an edit dated before the mark is seen, a touch alone is not an edit
  EXPECT_NE(slurp(mark).find("\ncontents: "), std::string::npos);
  fs::last_write_time(dir + "/basic_train.tsv", fs::last_write_time(mark) + std::chrono::seconds(10));
  data::generate_listops(dir, spec, 3);
  write_text(dir + "/basic_val.tsv", edited);
  fs::last_write_time(dir + "/basic_val.tsv", fs::last_write_time(mark) - std::chrono::hours(24 * 365));
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 3),
                    fmt::format("data folder {}: its files differ from those cast data made (their digest in {} no "
                                "longer matches",
                                dir, data::kDataFolderMark));
  EXPECT_EQ(slurp(dir + "/basic_val.tsv"), edited);
  write_text(dir + "/notes.txt", "mine\n");  // a file added
  fs::last_write_time(dir + "/notes.txt", fs::last_write_time(mark) - std::chrono::hours(1));
  data::generate_listops(dir, spec, 3, true);
  EXPECT_NE(slurp(dir + "/basic_val.tsv"), edited);
  fs::remove(dir + "/notes.txt");  // kept by --overwrite, so one of the set's files: now missing
  EXPECT_CAST_ERROR(data::generate_listops(dir, spec, 3), "its files differ from those cast data made");
}

// A Ctrl-C that cast data first sees after the set's last file is written stops nothing: the set
// is whole, the command succeeds and says the signal came too late (twenty-second attack: the
// set was complete and `wrote` printed, yet the exit read as a stop). The signal is answered at
// the k-th poll: every earlier k stops the generator, the first that does not is that case.
TEST(ListOps, ASignalDuringCastDatasLastWritesStopsNothing) {
  const std::string dir = fresh_dir("listops_late_signal");
  for (int k = 0; k < 64; ++k) {
    train::request_stop_after_polls(SIGINT, k);
    ::testing::internal::CaptureStderr();
    int code = -1;
    bool stopped = false;
    try {
      code = command_data({"listops-short", "--count", "20", "--out", dir});
    } catch (const train::Stopped&) {
      stopped = true;
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    const int seen = train::stop_signal();
    train::clear_stop();
    if (stopped) continue;
    EXPECT_EQ(seen, SIGINT) << "the command ended before the signal was answered, at poll " << k;
    EXPECT_EQ(code, 0);
    EXPECT_NE(err.find("cast data: SIGINT came while the set's last files were written; it was finished, not stopped"),
              std::string::npos)
        << err;
    EXPECT_FALSE(fs::exists(dir + "/" + data::kDataUnfinishedMark));
    EXPECT_EQ(data::load_listops(dir, 48).train.size(), 20u);
    return;
  }
  FAIL() << "cast data was stopped at each of 64 polls";
}

// A set that another cast data is still writing is refused with its writer, not with advice to
// run cast data again (which that writer's lock would refuse).
TEST(ListOps, ASetStillBeingWrittenNamesItsWriter) {
  const std::string dir = fresh_dir("listops_writing");
  data::ListOpsSpec spec = data::ListOpsSpec::short_cpu();
  spec.train = 40, spec.val = 10, spec.test = 10;
  data::generate_listops(dir, spec, 3);
  write_text(dir + "/" + data::kDataUnfinishedMark, "being written\n");
  {
    const FolderHeldElsewhere writer(dir, "data folder");
    EXPECT_CAST_ERROR(data::load_listops(dir, 48),
                      fmt::format("data folder {} is in use by another cast process (pid {})", dir, writer.pid()));
  }
  EXPECT_CAST_ERROR(data::load_listops(dir, 48), "did not finish");  // the writer gone: the set is unfinished
}

TEST(ListOps, BrokenFilesNameFileAndLine) {
  const std::string dir = fresh_dir("listops_bad");
  auto with_train = [&](const std::string& text) {
    write_text(dir + "/basic_train.tsv", text);
    write_text(dir + "/basic_val.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\n");
    write_text(dir + "/basic_test.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\n");
    return data::load_listops(dir, 100);
  };
  EXPECT_CAST_ERROR(with_train("Input\tOutput\n"), "basic_train.tsv:1: expected the header");
  EXPECT_CAST_ERROR(with_train("Source\tTarget\n[MAX 1 2 ]\t2\n[MIN 3 ]\t12\n"), "basic_train.tsv:3: label '12'");
  EXPECT_CAST_ERROR(with_train("Source\tTarget\n[MAX 1 2 ]\n"), "basic_train.tsv:2: expected 2 tab-separated columns");
  EXPECT_CAST_ERROR(with_train("Source\tTarget\n[MAX 1 2 ]\t2\textra\n"), "basic_train.tsv:2: expected 2");
  EXPECT_CAST_ERROR(with_train("Source\tTarget\n[MAX 1 x ]\t2\n"), "basic_train.tsv:2: unknown ListOps token 'x'");
  EXPECT_CAST_ERROR(with_train(std::string("Source\tTarget\n[MAX 1") + '\0' + " 2 ]\t2\n"),
                    "basic_train.tsv:2: a NUL byte at column 7");
  with_train("Source\tTarget\n[MAX 1 2 ]\t2\n");
  fs::remove(dir + "/basic_test.tsv");
  EXPECT_CAST_ERROR(data::load_listops(dir, 100), "basic_test.tsv: no such file or folder");
}

// ---------------------------------------------------------------- IMDb
TEST(Imdb, ReadsTheAclImdbLayout) {
  const std::string dir = fresh_dir("imdb");
  for (const char* split : {"train", "test"}) {
    write_text(fmt::format("{}/{}/pos/0_9.txt", dir, split), "Great film!");
    write_text(fmt::format("{}/{}/neg/1_2.txt", dir, split), "Bad.\xff");
  }
  data::TaskData t = data::load_imdb(dir, 8);
  ASSERT_EQ(t.train.size(), 2u);
  EXPECT_EQ(t.train[0].label, 0);  // neg first
  EXPECT_EQ(t.train[0].tokens, (std::vector<int32_t>{'B' + 1, 'a' + 1, 'd' + 1, '.' + 1, 256}));
  EXPECT_EQ(t.train[1].tokens.size(), 8u);  // cut to max_len
  EXPECT_EQ(t.train[1].label, 1);
  // the classes alternate, the larger's rest at the end: a split's first examples hold both
  // (--eval-limit takes them; one folder after the other gave a limit of one class)
  for (const char* name : {"2_1.txt", "3_1.txt"}) write_text(dir + "/test/neg/" + name, "No.");
  const std::vector<data::Example> test = data::load_imdb(dir, 8).test;
  std::vector<int> labels;
  for (const data::Example& e : test) labels.push_back(e.label);
  EXPECT_EQ(labels, (std::vector<int>{0, 1, 0, 0}));
  fs::remove_all(dir + "/test/neg");
  EXPECT_CAST_ERROR(data::load_imdb(dir, 8), "test/neg: no such file or folder");
}

// ---------------------------------------------------------------- AAN
TEST(Aan, ReadsPairsAndRejectsBrokenRows) {
  const std::string dir = fresh_dir("aan");
  const std::string good = "1\tid1\tid2\tfirst paper\tsecond\n0\ta\tb\tx\ty\n";
  for (const char* s : {"train", "eval", "test"}) write_text(fmt::format("{}/new_aan_pairs.{}.tsv", dir, s), good);
  data::TaskData t = data::load_aan(dir, 5);
  ASSERT_EQ(t.train.size(), 2u);
  EXPECT_TRUE(t.dual);
  EXPECT_EQ(t.train[0].label, 1);
  EXPECT_EQ(t.train[0].tokens.size(), 5u);
  EXPECT_EQ(t.train[0].tokens2.size(), 5u);
  write_text(dir + "/new_aan_pairs.eval.tsv", good + "1\tonly\tthree\n");
  EXPECT_CAST_ERROR(data::load_aan(dir, 5), "new_aan_pairs.eval.tsv:3: expected 5 tab-separated columns");
  write_text(dir + "/new_aan_pairs.eval.tsv", "yes\ta\tb\tc\td\n");
  EXPECT_CAST_ERROR(data::load_aan(dir, 5), "new_aan_pairs.eval.tsv:1: label 'yes'");
}

// ---------------------------------------------------------------- CIFAR-10
TEST(Cifar, GrayscalePixelsAndTruncation) {
  const std::string dir = fresh_dir("cifar");
  std::string record(3073, '\0');
  record[0] = 7;
  for (int i = 0; i < 1024; ++i) record[1 + i] = static_cast<char>(200), record[1 + 1024 + i] = static_cast<char>(100);
  std::string batch = record + record;
  for (int b = 1; b <= 5; ++b) write_text(fmt::format("{}/data_batch_{}.bin", dir, b), batch);
  write_text(dir + "/test_batch.bin", record);
  data::TaskData t = data::load_cifar10(dir);
  EXPECT_EQ(t.train.size() + t.val.size(), 10u);
  EXPECT_EQ(t.test[0].label, 7);
  EXPECT_EQ(t.test[0].tokens.size(), 1024u);
  EXPECT_EQ(t.test[0].tokens[0], 118);  // round(0.2989·200 + 0.5870·100 + 0.1140·0) = round(118.48)
  EXPECT_TRUE(t.fixed_length);          // pixel value 0 is data, not padding
  nn::Batch b = data::make_batch(t, t.test, {0}, DType::f32, Device::cpu);
  for (double m : b.mask.to_double_vector()) EXPECT_EQ(m, 1.0);
  write_text(dir + "/data_batch_3.bin", batch.substr(0, 5000));
  EXPECT_CAST_ERROR(data::load_cifar10(dir), "data_batch_3.bin: 5000 bytes is not a whole number");
  write_text(dir + "/data_batch_3.bin", "");  // no records: said so, not as a fraction of one
  EXPECT_CAST_ERROR(data::load_cifar10(dir), "data_batch_3.bin: is empty, where a CIFAR-10 batch holds 3073-byte");
  std::string bad = record;
  bad[0] = 12;
  write_text(dir + "/data_batch_3.bin", bad);
  EXPECT_CAST_ERROR(data::load_cifar10(dir), "data_batch_3.bin: record 0 has label 12");
}

// ---------------------------------------------------------------- Fashion-MNIST
static void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}
static std::string be32(uint32_t v) {
  return std::string{char(v >> 24), char((v >> 16) & 255), char((v >> 8) & 255), char(v & 255)};
}

TEST(FashionMnist, ReadsGzippedIdxAndRejectsTruncation) {
  const std::string dir = fresh_dir("fashion");
  std::string images = be32(2051) + be32(3) + be32(28) + be32(28) + std::string(3 * 784, '\x05');
  std::string labels = be32(2049) + be32(3) + std::string{1, 9, 0};
  for (const char* s : {"train", "t10k"}) {
    write_gz(fmt::format("{}/{}-images-idx3-ubyte.gz", dir, s), images);
    write_gz(fmt::format("{}/{}-labels-idx1-ubyte.gz", dir, s), labels);
  }
  data::TaskData t = data::load_fashion_mnist(dir);
  ASSERT_EQ(t.test.size(), 3u);
  EXPECT_EQ(t.test[1].label, 9);
  EXPECT_EQ(t.test[0].tokens.size(), 784u);
  EXPECT_EQ(t.test[0].tokens[100], 5);
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", images.substr(0, 1000));
  EXPECT_CAST_ERROR(data::load_fashion_mnist(dir),
                    "t10k-images-idx3-ubyte.gz: 3 images declared, 2368 bytes, but 1000 bytes present (truncated?)");
  // bytes beyond the declared images are no truncation (ninth attack, J11)
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", images + std::string(100, '\0'));
  EXPECT_CAST_ERROR(data::load_fashion_mnist(dir), "t10k-images-idx3-ubyte.gz: 100 bytes beyond the 3 images declared");
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", be32(1234) + images.substr(4));
  EXPECT_CAST_ERROR(data::load_fashion_mnist(dir), "not an IDX image file");
}

TEST(FashionMnist, PoolingAveragesBlocksAndNoImagesFailBeforeTraining) {
  const std::string dir = fresh_dir("fashion_pool");
  std::string pixels(784, '\0');
  pixels[0] = 10, pixels[1] = 20, pixels[28] = 30, pixels[29] = 41;  // the top-left 2 x 2 block
  pixels[783] = static_cast<char>(255);
  const std::string images = be32(2051) + be32(1) + be32(28) + be32(28) + pixels,
                    labels = be32(2049) + be32(1) + "\x04";
  for (const char* s : {"train", "t10k"}) {
    write_gz(fmt::format("{}/{}-images-idx3-ubyte.gz", dir, s), images);
    write_gz(fmt::format("{}/{}-labels-idx1-ubyte.gz", dir, s), labels);
  }
  const data::TaskData t = data::load_fashion_mnist(dir, 2);
  EXPECT_EQ(t.name, "fashion-mnist-14");
  EXPECT_EQ(t.max_len, 196);
  EXPECT_EQ(t.image_side, 14);
  ASSERT_EQ(t.test[0].tokens.size(), 196u);
  EXPECT_EQ(t.test[0].tokens[0], 25);    // (10 + 20 + 30 + 41) / 4 = 25.25
  EXPECT_EQ(t.test[0].tokens[195], 64);  // 255 / 4 = 63.75, rounded
  EXPECT_EQ(t.test[0].tokens[1], 0);

  // The task under LRA's image configuration reads the same files at full resolution, by its name.
  train::TrainConfig lra = train::preset("fashion-mnist-lra");
  lra.data_dir = dir;
  const data::TaskData pixels_task = train::load_task(lra, false);
  EXPECT_EQ(pixels_task.name, "fashion-mnist-lra");
  EXPECT_EQ(pixels_task.max_len, 784);
  EXPECT_EQ(pixels_task.image_side, 28);
  ASSERT_EQ(pixels_task.test[0].tokens.size(), 784u);
  EXPECT_EQ(pixels_task.test[0].tokens[29], 41);

  // A folder whose files hold no images: a clear error before any step (this once divided by zero).
  const std::string empty_images = be32(2051) + be32(0) + be32(28) + be32(28), empty_labels = be32(2049) + be32(0);
  for (const char* s : {"train", "t10k"}) {
    write_gz(fmt::format("{}/{}-images-idx3-ubyte.gz", dir, s), empty_images);
    write_gz(fmt::format("{}/{}-labels-idx1-ubyte.gz", dir, s), empty_labels);
  }
  EXPECT_TRUE(data::load_fashion_mnist(dir).train.empty());
  train::TrainConfig c = train::preset("fashion-mnist");
  c.data_dir = dir;
  c.run_dir = fresh_dir("fashion_empty_run");
  c.device = "cpu";
  EXPECT_CAST_ERROR(train::run_training(c, "", 0, true), "the training split has no examples");
}

TEST(FashionMnist, TheDebianPackageLoads) {
  if (!fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  data::TaskData t = data::load_fashion_mnist(data::default_fashion_mnist_dir());
  EXPECT_EQ(t.train.size() + t.val.size(), 60000u);
  EXPECT_EQ(t.test.size(), 10000u);
}

// ---------------------------------------------------------------- PNG
// A PNG chunk: its length, type, body and CRC.
static std::string png_chunk(const std::string& type, const std::string& body) {
  const std::string typed = type + body;
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(typed.data()), static_cast<uInt>(typed.size()));
  return be32(static_cast<uint32_t>(body.size())) + typed + be32(static_cast<uint32_t>(crc));
}

// A PNG whose header claims a huge image is refused before its rows are allocated.
TEST(Png, AHugeHeaderIsRefusedBeforeAllocating) {
  const std::string dir = fresh_dir("png_huge");
  const std::string signature = "\x89PNG\r\n\x1a\n";
  for (auto [w, h] : {std::pair<uint32_t, uint32_t>{100000, 100000}, {5000, 1}, {1, 4097}}) {
    const std::string ihdr = be32(w) + be32(h) + std::string{8, 0, 0, 0, 0};  // 8-bit gray
    // the header is read up to the first data chunk; the check fires there, before any row
    write_text(dir + "/huge.png", signature + png_chunk("IHDR", ihdr) +
                                      png_chunk("IDAT", "\x78\x9c\x03\x00\x00\x00\x00\x01") + png_chunk("IEND", ""));
    EXPECT_CAST_ERROR(png::read_gray(dir + "/huge.png"), fmt::format("huge.png: the image is {} x {} pixels; at most "
                                                                     "4096 x 4096",
                                                                     w, h));
  }
}

// An image stream longer than the header's size (sixteenth attack: a 32 x 32 header over 200 MB
// of zeros was read, the rest inflated and thrown away, with no word) is refused; the same image
// with a stream of exactly its size reads.
TEST(Png, ImageDataBeyondTheHeadersSizeIsRefused) {
  const std::string dir = fresh_dir("png_too_much");
  const std::string signature = "\x89PNG\r\n\x1a\n", ihdr = be32(2) + be32(2) + std::string{8, 0, 0, 0, 0};
  const auto png_of = [&](const std::string& rows) {
    std::string packed(compressBound(static_cast<uLong>(rows.size())), '\0');
    uLongf size = static_cast<uLongf>(packed.size());
    EXPECT_EQ(compress(reinterpret_cast<Bytef*>(packed.data()), &size, reinterpret_cast<const Bytef*>(rows.data()),
                       static_cast<uLong>(rows.size())),
              Z_OK);
    packed.resize(size);
    return signature + png_chunk("IHDR", ihdr) + png_chunk("IDAT", packed) + png_chunk("IEND", "");
  };
  const std::string rows = std::string{0, 10, 20} + std::string{0, 30, 40};  // each row: filter 0, two pixels
  write_text(dir + "/exact.png", png_of(rows));
  EXPECT_EQ(png::read_gray(dir + "/exact.png").pixels, (std::vector<uint8_t>{10, 20, 30, 40}));
  write_text(dir + "/long.png", png_of(rows + std::string(100000, '\0')));
  EXPECT_CAST_ERROR(png::read_gray(dir + "/long.png"), "long.png: its image data is more than its header's 2 x 2 pixels");
  // a damaged file is said to be one, the decoder's reason after it (a CRC that does not match)
  std::string damaged = png_of(rows);
  damaged[damaged.size() - 13] ^= 1;  // the IDAT chunk's CRC, before the 12 bytes of IEND
  write_text(dir + "/damaged.png", damaged);
  EXPECT_CAST_ERROR(png::read_gray(dir + "/damaged.png"), "damaged.png: a damaged or unsupported PNG image (the decoder says:");
}

// ---------------------------------------------------------------- Pathfinder
TEST(Pathfinder, GeneratesTheReleaseLayoutAndLoadsIt) {
  const std::string dir = fresh_dir("pathfinder");
  data::PathfinderSpec spec = data::PathfinderSpec::pathfinder32();
  spec.count = 20;
  data::generate_pathfinder(dir, spec, 5);
  EXPECT_TRUE(fs::exists(dir + "/imgs/0/sample_19.png"));
  data::TaskData t = data::load_pathfinder(dir);
  EXPECT_EQ(t.train.size() + t.val.size() + t.test.size(), 20u);
  EXPECT_EQ(t.max_len, 1024);
  int ones = 0, inked = 0;
  for (const auto& e : t.train) {
    ones += e.label;
    for (int32_t p : e.tokens) inked += p > 0;
  }
  EXPECT_GT(ones, 0);
  EXPECT_LT(ones, static_cast<int>(t.train.size()));
  EXPECT_GT(inked, 16 * 30);  // strokes and markers are drawn
}

TEST(Pathfinder, PathXGeneratesWithEverySeed) {
  // 128 x 128 images: the long snakes must fit whatever the seed (they steer off the border)
  int ones = 0, total = 0;
  for (uint64_t seed : {1, 2, 3, 4}) {
    const std::string dir = fresh_dir("pathx_" + std::to_string(seed));
    data::PathfinderSpec spec = data::PathfinderSpec::pathx128();
    spec.count = 5;
    data::generate_pathfinder(dir, spec, seed);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(fs::exists(dir + "/imgs/0/sample_" + std::to_string(i) + ".png")) << seed;
    data::TaskData t = data::load_pathfinder(dir);
    EXPECT_EQ(t.max_len, 128 * 128);
    for (const auto* split : {&t.train, &t.val, &t.test})
      for (const auto& e : *split) {
        ASSERT_EQ(e.tokens.size(), 128u * 128u);
        int inked = 0, bright = 0;
        for (int32_t p : e.tokens) inked += p > 0, bright += p == 255;
        EXPECT_GT(inked, 128 * 6) << "seed " << seed;  // two long snakes and distractors
        EXPECT_GT(bright, 2 * 60) << "seed " << seed;  // two filled markers
        ones += e.label;
        ++total;
      }
  }
  EXPECT_EQ(total, 20);
  EXPECT_GT(ones, 0);
  EXPECT_LT(ones, total);
}

// A file where the set's metadata folder goes is refused before the set is claimed: the folder
// was marked unfinished and an image folder made first (twentieth attack).
TEST(Pathfinder, AFileWhereAFolderGoesIsRefusedBeforeAnythingIsMade) {
  const std::string dir = fresh_dir("pathfinder_file_for_folder");
  write_text(dir + "/metadata", "my notes\n");
  data::PathfinderSpec spec;
  spec.count = 4;
  EXPECT_CAST_ERROR(data::generate_pathfinder(dir, spec, 6, true), "metadata: is a file, not a folder");
  EXPECT_FALSE(fs::exists(dir + "/" + data::kDataUnfinishedMark));
  EXPECT_FALSE(fs::exists(dir + "/imgs"));
  std::ifstream notes(dir + "/metadata");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(notes)), std::istreambuf_iterator<char>()), "my notes\n");
}

TEST(Pathfinder, BrokenMetadataAndImages) {
  const std::string dir = fresh_dir("pathfinder_bad");
  data::PathfinderSpec spec;
  spec.count = 4;
  data::generate_pathfinder(dir, spec, 6);
  write_text(dir + "/metadata/0.npy", "imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1 7\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:2: label '7'");
  write_text(dir + "/metadata/0.npy", "imgs/0 sample_0.png\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:1: expected at least 4 fields");
  // a NUL byte in a path (twentieth attack: the path was cut there, and the folder left blamed)
  write_text(dir + "/metadata/0.npy", std::string("imgs/0 sample_0.png 0 1\nimgs/0") + '\0' + "/sample_1.png 1 0\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:2: a NUL byte at column 7: not a line of text");
  // a NumPy array saved under the name (nineteenth attack: "label 'False,' is not 0 or 1")
  write_text(dir + "/metadata/0.npy", std::string("\x93NUMPY\x01\x00v\x00{'descr': '<U20', 'fortran_order': False, "
                                                  "'shape': (2, 4), }\n"));
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy: is a NumPy binary array (np.save)");
  write_text(dir + "/metadata/0.npy", "imgs/0 sample_0.png 0 1\nimgs/0 missing.png 1 0\nimgs/0 sample_2.png 2 0\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:2: names image " + dir + "/imgs/0/missing.png, which does not exist");
  // a byte-order mark (twenty-fourth attack: said as a missing PNG whose folder began with it)
  write_text(dir + "/metadata/0.npy", "\xEF\xBB\xBFimgs/0 sample_0.png 0 1\nimgs/0 sample_2.png 2 0\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:1: starts with a byte-order mark (U+FEFF)");
  write_text(dir + "/imgs/0/sample_1.png", "not a png");
  write_text(dir + "/metadata/0.npy", "imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1 0\nimgs/0 sample_2.png 2 0\n");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "sample_1.png: not a PNG file");
  // one image named twice, as by a copied metadata file (sixth attack): refused, naming both places
  data::generate_pathfinder(dir, spec, 6, true);
  std::filesystem::copy_file(dir + "/metadata/0.npy", dir + "/metadata/1.npy");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "1.npy:1: image imgs/0/sample_0.png is named again (first at");
}

// ---------------------------------------------------------------- issue 19: inputs checked whole
// An interlaced (Adam7) PNG written with libpng itself: once decoded into scrambled rows.
static void write_interlaced_png(const std::string& path, int side, const std::vector<uint8_t>& pixels) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, side, side, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_ADAM7, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_bytep> rows(side);
  for (int y = 0; y < side; ++y) rows[y] = const_cast<png_bytep>(pixels.data() + static_cast<size_t>(y) * side);
  png_set_rows(png, info, rows.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

TEST(Png, InterlacedImagesDecodeToTheirPixels) {
  const std::string dir = fresh_dir("png_interlaced");
  const int side = 13;  // odd: every Adam7 pass has a ragged edge
  std::vector<uint8_t> pixels(side * side);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7 % 251);
  write_interlaced_png(dir + "/i.png", side, pixels);
  const png::Image img = png::read_gray(dir + "/i.png");
  ASSERT_EQ(img.width, side);
  ASSERT_EQ(img.height, side);
  EXPECT_EQ(img.pixels, pixels);
}

TEST(ListOps, MalformedExpressionsAndLabelsAreRefusedWhenLoaded) {
  const std::string dir = fresh_dir("listops_malformed");
  auto with_train = [&](const std::string& rows) {
    write_text(dir + "/basic_train.tsv", "Source\tTarget\n" + rows);
    write_text(dir + "/basic_val.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\n");
    write_text(dir + "/basic_test.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\n");
    return data::load_listops(dir, 100);
  };
  EXPECT_CAST_ERROR(with_train("[MAX 1 2 ]\t10\n"), "basic_train.tsv:2: label '10' is not a digit 0-9");
  EXPECT_CAST_ERROR(with_train("[MAX 1 2 ]\t-1\n"), "label '-1' is not a digit");
  EXPECT_CAST_ERROR(with_train("[MAX 1 2\t2\n"), "basic_train.tsv:2: incomplete expression (1 operator not closed)");
  EXPECT_CAST_ERROR(with_train("1 2 ]\t2\n"), "basic_train.tsv:2: more than one value at the top level");
  EXPECT_CAST_ERROR(with_train("[MIN ]\t2\n"), "an operator without arguments");
  EXPECT_CAST_ERROR(with_train("\t3\n"), "basic_train.tsv:2: empty expression");  // tenth attack, K11
  EXPECT_CAST_ERROR(with_train("( [MAX 1 2 ]\t2\n"), "unbalanced parentheses");
  EXPECT_EQ(with_train("( ( [MAX 1 ) 2 ] )\t2\n").train.size(), 1u);
}

TEST(Pathfinder, MetadataPathsStayInsideTheDataFolder) {
  const std::string dir = fresh_dir("pathfinder_escape");
  data::PathfinderSpec spec;
  spec.count = 4;
  data::generate_pathfinder(dir, spec, 6);
  fs::copy_file(dir + "/imgs/0/sample_0.png", dir + "/../outside_" + std::to_string(getpid()) + ".png",
                fs::copy_options::overwrite_existing);
  const std::string rest = "imgs/0 sample_1.png 1 0\nimgs/0 sample_2.png 2 0\n";
  write_text(dir + "/metadata/0.npy", "../.. outside_" + std::to_string(getpid()) + ".png 0 1\n" + rest);
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "0.npy:1: image path '../../outside");
  write_text(dir + "/metadata/0.npy", "/tmp x.png 0 1\n" + rest);
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "leaves the data folder");
  fs::create_directory_symlink(fs::path(dir).parent_path(), dir + "/imgs/up");  // a link inside, leading out
  write_text(dir + "/metadata/0.npy", "imgs/up outside_" + std::to_string(getpid()) + ".png 0 1\n" + rest);
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "leads out of the data folder");
  fs::create_symlink("loop.png", dir + "/imgs/0/loop.png");
  write_text(dir + "/metadata/0.npy", "imgs/0 loop.png 0 1\n" + rest);
  EXPECT_CAST_ERROR(data::load_pathfinder(dir), "loop.png: a symbolic link loop");
}

// A FIFO in place of any data file is one clear error, at once: each of these once blocked forever.
TEST(Loaders, AFifoInPlaceOfADataFileIsRefusedAtOnce) {
  const std::string dir = fresh_dir("fifos");
  auto fifo = [&](const std::string& path) {
    fs::create_directories(fs::path(path).parent_path());
    fs::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
  };
  fifo(dir + "/listops/basic_train.tsv");
  EXPECT_CAST_ERROR(data::load_listops(dir + "/listops", 100), "basic_train.tsv: is a FIFO (named pipe)");
  fifo(dir + "/cifar/data_batch_1.bin");
  EXPECT_CAST_ERROR(data::load_cifar10(dir + "/cifar"), "CIFAR-10 batch " + dir + "/cifar/data_batch_1.bin: is a FIFO");
  for (const char* split : {"train", "test"}) write_text(fmt::format("{}/imdb/{}/pos/0_9.txt", dir, split), "Good");
  write_text(dir + "/imdb/train/neg/0_1.txt", "Bad");
  fifo(dir + "/imdb/test/neg/0_1.txt");
  EXPECT_CAST_ERROR(data::load_imdb(dir + "/imdb", 8), "IMDb review " + dir + "/imdb/test/neg/0_1.txt: is a FIFO");
  fifo(dir + "/fm/train-images-idx3-ubyte.gz");
  EXPECT_CAST_ERROR(data::load_fashion_mnist(dir + "/fm", 1), "train-images-idx3-ubyte.gz: is a FIFO");
  data::PathfinderSpec spec;
  spec.count = 4;
  data::generate_pathfinder(dir + "/pf", spec, 6);
  fifo(dir + "/pf/imgs/0/sample_1.png");
  EXPECT_CAST_ERROR(data::load_pathfinder(dir + "/pf"), "PNG file " + dir + "/pf/imgs/0/sample_1.png: is a FIFO");
}

// Bounds that admit fewer distinct trees than asked for are refused once the draws stop finding
// new ones, not after the whole budget of draws (eleventh attack, L1: the full task's long trees
// drew for minutes). Trees of depth 3 keep the test short; the rule is the same.
TEST(ListOps, BoundsTooTightForTheCountAreRefused) {
  data::ListOpsSpec s = data::ListOpsSpec::short_cpu();
  s.max_depth = 3, s.max_args = 3, s.min_length = 1, s.max_length = 5, s.train = 4000, s.val = 5, s.test = 0;
  EXPECT_CAST_ERROR(data::generate_listops(fresh_dir("listops_tight"), s, 1),
                    "are too tight to fill 4005 distinct examples");
}
