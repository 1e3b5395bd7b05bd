// The files module (tensor/files.h): inputs checked before they are opened, atomic writes that
// never follow a planted link, appends that never follow one, outputs that never replace inputs.
// Every case writes its own files in a fresh folder.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "tensor/files.h"
#include "tests/test_util.h"

using cast::testing::slurp;

using namespace cast;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("cast_files_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Runs `fn` and fails the test when it takes longer than a few seconds (a FIFO read blocks forever).
template <class Fn>
void within_seconds(Fn fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

}  // namespace

TEST(Files, InputsMustBeRegularFilesAndNeverBlock) {
  const std::string d = fresh_dir("inputs");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  fs::create_directory(d + "/folder");
  fs::create_symlink("loop", d + "/loop");
  fs::create_symlink("/dev/zero", d + "/zero");
  within_seconds([&] {
    EXPECT_CAST_ERROR(files::read_file(d + "/fifo", "config file"),
                      "config file " + d + "/fifo: is a FIFO (named pipe)");
  });
  EXPECT_CAST_ERROR(files::read_file(d + "/folder", "metrics file"), "is a folder, not a regular file");
  EXPECT_CAST_ERROR(files::read_file(d + "/loop", "review"), "a symbolic link loop");
  EXPECT_CAST_ERROR(files::read_file(d + "/zero", "checkpoint"), "checkpoint " + d + "/zero: is a device");
  EXPECT_CAST_ERROR(files::read_file(d + "/missing", "data file"), "no such file or folder");
  put(d + "/big", std::string(100, 'x'));
  EXPECT_CAST_ERROR(files::read_file(d + "/big", "data file", 10), "100 bytes, more than the 10 bytes");
  EXPECT_EQ(files::read_file(d + "/big", "data file").size(), 100u);
  EXPECT_CAST_ERROR(files::require_folder(d + "/big", "data folder"), "is a file, not a folder");
  EXPECT_CAST_ERROR(files::require_folder(d + "/loop", "data folder"), "a symbolic link loop");
  fs::create_symlink(d + "/nowhere", d + "/dangling");  // the link is there, its target is not
  EXPECT_CAST_ERROR(files::require_folder(d + "/dangling", "data folder"),
                    "data folder " + d + "/dangling: a symbolic link to " + d + "/nowhere, which does not exist");
}

TEST(Files, JsonErrorsNameTheFileWithoutLibraryInternals) {
  const std::string d = fresh_dir("json");
  put(d + "/bad.json", "{\"steps\": ");
  try {
    files::read_json(d + "/bad.json", "config file");
    ADD_FAILURE() << "bad JSON accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("config file " + d + "/bad.json: not valid JSON"), std::string::npos) << m;
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
  }
  // the place and what is wrong there, in short (seventh attack: the library's wording at length)
  EXPECT_CAST_ERROR(files::parse_json("{\"steps\": ", "c.json"),
                    "c.json: not valid JSON: at line 1, column 11: the text ends early");
  EXPECT_CAST_ERROR(files::parse_json("{\"steps\": 3} x", "c.json"), "c.json: not valid JSON: at line 1, column 14: ");
  EXPECT_CAST_ERROR(files::parse_json("{\"a\": 1e999}", "c.json"), "not valid JSON: a number out of range: '1e999'");
  EXPECT_CAST_ERROR(files::parse_json(" \n", "c.json"), "c.json: empty, not a JSON text");
  for (const char* text : {"{\"steps\": ", "[1, 2", "{\"a\": tru}"}) {
    try {
      files::parse_json(text, "c.json");
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const char* internal : {"parse error", "syntax error while parsing", "last read"})
        EXPECT_EQ(m.find(internal), std::string::npos) << m;
    }
  }
}

TEST(Files, AKeyGivenTwiceIsRefused) {
  EXPECT_CAST_ERROR(files::parse_json(R"({"steps": 2, "lr": 1e-3, "steps": 3000})", "config file c.json"),
                    "config file c.json: the key 'steps' is given twice");
  EXPECT_CAST_ERROR(files::parse_json(R"({"model": {"dim": 8, "dim": 16}})", "f"), "the key 'dim' is given twice");
  // equal keys in different objects are fine
  EXPECT_EQ(files::parse_json(R"({"a": {"x": 1}, "b": {"x": 2}, "x": [{"x": 3}]})", "f")["b"]["x"], 2);
}

TEST(Files, SameFileComparesDeviceAndInodeNotNames) {
  const std::string d = fresh_dir("same");
  put(d + "/m.st", "x");
  fs::create_symlink(d + "/m.st", d + "/alias.st");
  fs::create_hard_link(d + "/m.st", d + "/hard.st");
  EXPECT_TRUE(files::same_file(d + "/m.st", d + "/./m.st"));
  EXPECT_TRUE(files::same_file(d + "/m.st", d + "/alias.st"));
  EXPECT_TRUE(files::same_file(d + "/m.st", d + "/hard.st"));
  EXPECT_FALSE(files::same_file(d + "/m.st", d + "/missing.st"));
  try {
    files::check_not_an_input(d + "/alias.st", "--out", {d + "/m.st"});
    ADD_FAILURE() << "an output equal to an input was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is the input"), std::string::npos) << e.what();
  }
  files::check_not_an_input(d + "/other.st", "--out", {d + "/m.st"});  // a new file is fine
}

// Whatever holds the temporary file's name (a planted link, a crash's leftover, a user's file
// that may be the command's own input) is neither followed nor removed: the next free name is
// taken, and only the temporary file the write made goes.
TEST(Files, AtomicWritesLeaveWhatHoldsTheTemporaryName) {
  const std::string d = fresh_dir("tmp_link");
  put(d + "/victim", "keep me");
  fs::create_symlink(d + "/victim", d + "/out.json.tmp");  // planted where the temporary file goes
  files::write_atomic(d + "/out.json", "new", "summary");
  EXPECT_EQ(slurp(d + "/out.json"), "new");
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
  EXPECT_TRUE(fs::is_symlink(d + "/out.json.tmp"));
  EXPECT_FALSE(fs::exists(d + "/out.json.1.tmp"));
  fs::remove(d + "/out.json.tmp");
  put(d + "/out.json.tmp", "an input named like a temporary file");
  files::write_atomic(d + "/out.json", "whole", "summary");
  EXPECT_EQ(slurp(d + "/out.json"), "whole");
  EXPECT_EQ(slurp(d + "/out.json.tmp"), "an input named like a temporary file");
}

TEST(Files, OutputLinksFollowTheDocumentedRule) {
  const std::string d = fresh_dir("out_links");
  put(d + "/target", "old");
  fs::create_symlink("target", d + "/link");
  files::write_atomic(d + "/link", "new", "--out");  // a link the user made on purpose: written through
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  EXPECT_EQ(slurp(d + "/target"), "new");
  // a file the engine names itself is never written through a link
  EXPECT_CAST_ERROR(files::write_atomic(d + "/link", "x", "checkpoint", files::Link::refuse), "is a symbolic link");
  EXPECT_EQ(slurp(d + "/target"), "new");
  // a chain and a loop are refused; no link is replaced
  fs::create_symlink("link", d + "/chain");
  EXPECT_CAST_ERROR(files::write_atomic(d + "/chain", "x", "--out"), "a chain or a loop");
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  EXPECT_EQ(slurp(d + "/target"), "new");
  fs::create_symlink("loop", d + "/loop");
  EXPECT_CAST_ERROR(files::write_atomic(d + "/loop", "x", "--out"), "a chain or a loop");
  EXPECT_TRUE(fs::is_symlink(d + "/loop"));
  fs::create_symlink("nothing", d + "/dangling");
  EXPECT_CAST_ERROR(files::write_atomic(d + "/dangling", "x", "--out"), "no such file");
  EXPECT_FALSE(fs::exists(d + "/nothing"));
  // --out /dev/stdout is named as given, not as /proc/self/fd/1.tmp
  try {
    files::write_atomic("/dev/stdout", "x", "--out");
    ADD_FAILURE() << "/dev/stdout written";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--out /dev/stdout:", 0), 0u) << e.what();
  }
}

TEST(Files, OutputsNeverReplaceFoldersFifosOrDevices) {
  const std::string d = fresh_dir("odd_outputs");
  fs::create_directory(d + "/folder");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  within_seconds([&] {
    EXPECT_CAST_ERROR(files::write_atomic(d + "/folder", "x", "--json"), "exists and is a folder; not replacing it");
    EXPECT_CAST_ERROR(files::write_atomic(d + "/fifo", "x", "--out"), "exists and is a FIFO");
    EXPECT_CAST_ERROR(files::write_atomic("/dev/full", "x", "--out"), "exists and is a device");
  });
  EXPECT_TRUE(fs::is_directory(d + "/folder"));
  EXPECT_TRUE(fs::is_fifo(d + "/fifo"));
  EXPECT_CAST_ERROR(files::write_atomic(d + "/no/such/folder/x", "x", "--out"), "no such file or folder");
}

TEST(Files, AReadOnlyFolderIsPermissionDeniedEvenForRoot) {
  const std::string d = fresh_dir("read_only");
  fs::create_directory(d + "/ro");
  fs::permissions(d + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_CAST_ERROR(files::write_atomic(d + "/ro/x.json", "x", "summary"), "is read-only (permission denied)");
  EXPECT_CAST_ERROR(files::make_writable_folder(d + "/ro", "run folder"), "is read-only (permission denied)");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/ro/metrics.jsonl", true, "metrics file"), "read-only");
  EXPECT_TRUE(fs::is_empty(d + "/ro"));
  fs::permissions(d + "/ro", fs::perms::owner_all);
}

TEST(Files, TheWriteProbeNeverFollowsALink) {
  const std::string d = fresh_dir("probe");
  put(d + "/victim", "keep me");
  fs::create_directory(d + "/run");
  fs::create_symlink(d + "/victim", d + "/run/.write_test.tmp");
  files::make_writable_folder(d + "/run", "run folder");  // probes beside the link, never through it
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
  EXPECT_TRUE(fs::is_symlink(d + "/run/.write_test.tmp"));
  fs::remove(d + "/run/.write_test.tmp");
  files::make_writable_folder(d + "/run/new/deeper", "run folder");
  EXPECT_TRUE(fs::is_directory(d + "/run/new/deeper"));
  EXPECT_TRUE(fs::is_empty(d + "/run/new/deeper"));
}

// A '..' out of a folder that does not exist (the eighteenth attack's --run nonexist/../R) was made
// by creating that folder first, and left it behind empty; through one that exists it is a path.
TEST(Files, NoFolderIsMadeOnlyToClimbOutOfIt) {
  const std::string d = fresh_dir("climb");
  EXPECT_CAST_ERROR(files::make_writable_folder(d + "/nonexist/../run", "run folder"),
                    "nonexist' does not exist, so the '..' after it leads nowhere");
  EXPECT_FALSE(fs::exists(d + "/nonexist"));
  EXPECT_FALSE(fs::exists(d + "/run"));
  fs::create_directory(d + "/there");
  files::make_writable_folder(d + "/there/../run", "run folder");
  EXPECT_TRUE(fs::is_directory(d + "/run"));
}

TEST(Files, AppendsNeverFollowALinkNorBlockOnAFifo) {
  const std::string d = fresh_dir("append");
  put(d + "/victim", "keep me");
  fs::create_symlink(d + "/victim", d + "/metrics.jsonl");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/metrics.jsonl", false, "metrics file"),
                    "is a symbolic link; not following it");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/metrics.jsonl", true, "metrics file"), "is a symbolic link");
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
  ASSERT_EQ(::mkfifo((d + "/fifo.jsonl").c_str(), 0644), 0);
  within_seconds(
      [&] { EXPECT_CAST_ERROR(files::AppendFile(d + "/fifo.jsonl", false, "metrics file"), "metrics file"); });
  {
    files::AppendFile a(d + "/m.jsonl", true, "metrics file");
    a.append("1\n");
    a.append("2\n");
  }
  files::AppendFile(d + "/m.jsonl", false, "metrics file").append("3\n");
  EXPECT_EQ(slurp(d + "/m.jsonl"), "1\n2\n3\n");
  // a new file never empties the old one in place: another name for it (a hard link) keeps it
  fs::create_hard_link(d + "/m.jsonl", d + "/elsewhere.jsonl");
  files::AppendFile(d + "/m.jsonl", true, "metrics file").append("new\n");
  EXPECT_EQ(slurp(d + "/m.jsonl"), "new\n");
  EXPECT_EQ(slurp(d + "/elsewhere.jsonl"), "1\n2\n3\n");
  fs::create_directory(d + "/dir.jsonl");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/dir.jsonl", true, "metrics file"), "exists and is not a regular file");
}

// `chattr +i`: even root cannot write; once reported as "No such file or directory".
TEST(Files, AnImmutableFolderIsPermissionDenied) {
  const std::string d = fresh_dir("immutable");
  if (std::system(("chattr +i " + d + " 2> /dev/null").c_str()) != 0)
    GTEST_SKIP() << "chattr +i is not available here (needs root and a file system that supports it)";
  struct Unlock {
    std::string dir;
    ~Unlock() { std::system(("chattr -i " + dir).c_str()); }
  } unlock{d};
  EXPECT_CAST_ERROR(files::make_writable_folder(d, "run folder"),
                    "run folder " + d + ": folder " + d + " is read-only (permission denied)");
  EXPECT_CAST_ERROR(files::write_atomic(d + "/x.svg", "<svg/>", "--out"), "is read-only (permission denied)");
  EXPECT_TRUE(fs::is_empty(d));
}

// A message shows the control bytes and byte-order marks that came from a file: a NUL byte once
// cut the line printed, a BOM was invisible in it.
TEST(Files, MessagesShowControlBytesAndByteOrderMarks) {
  EXPECT_STREQ(Error(std::string("key 'a\0b'", 9)).what(), "key 'a\\x00b'");
  EXPECT_STREQ(Error("header '\xEF\xBB\xBFSource'").what(), "header '\\uFEFFSource'");
  EXPECT_STREQ(UsageError("a\rb\tc").what(), "a\\x0Db\tc");
  // a byte that is no part of UTF-8 text (a binary file's, latin-1's é) is shown too; UTF-8 stays
  EXPECT_STREQ(Error("token '\xE9' or '\x98\x01'").what(), "token '\\xE9' or '\\x98\\x01'");
  EXPECT_STREQ(Error("κ × \xC3").what(), "κ × \\xC3");
  EXPECT_STREQ(Error("csi '\xC2\x9B'").what(), "csi '\\u009B'");  // a C1 control: a terminal's escape
}

// A line that a file-size limit (or a full disk) cuts short is taken back: the file ends with its
// last whole line, so every reader of it still reads it (ninth attack, J6: a torn metrics line).
TEST(Files, AnAppendCutShortIsTakenBack) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("cast_append_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  const pid_t child = fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // as cast's main does: the write fails with EFBIG instead
    const rlimit limit{100, 100};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(4);
    try {
      files::AppendFile file(path, true, "metrics file");
      for (int i = 0; i < 100; ++i) file.append("{\"line\": 1234567890}\n");  // 21 bytes: the fifth crosses 100
    } catch (const Error&) {
      _exit(0);
    }
    _exit(3);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the limit was not reached";
  EXPECT_EQ(std::filesystem::file_size(path), 4u * 21u);
  std::filesystem::remove_all(dir);
}

// A name the file system takes, but whose "<name>.tmp" it does not, is still written atomically,
// through a short temporary name beside it (tenth attack, K9).
TEST(Files, ANameNearTheLimitIsWrittenThroughAShortTemporaryName) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("cast_long_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + std::string(250, 'b') + ".svg";  // 254 bytes: the limit is 255
  files::write_atomic(path, "<svg/>\n", "figure");
  EXPECT_EQ(cast::testing::slurp(path), "<svg/>\n");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1) << "a temporary file was left";
  std::filesystem::remove_all(dir);
}

// A file made read-only by its owner is neither replaced nor appended to, even by root; a
// replaced file keeps its mode.
TEST(Files, AReadOnlyFileIsNotReplacedAndAReplacementKeepsTheMode) {
  const std::string d = fresh_dir("read_only_file");
  put(d + "/mine.json", "{\"mine\": 1}\n");
  fs::permissions(d + "/mine.json", fs::perms::owner_read);
  EXPECT_CAST_ERROR(files::write_atomic(d + "/mine.json", "x", "summary"), "is read-only (mode 0400)");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/mine.json", false, "metrics file"), "is read-only (mode 0400)");
  EXPECT_CAST_ERROR(files::AppendFile(d + "/mine.json", true, "metrics file"), "is read-only (mode 0400)");
  EXPECT_EQ(slurp(d + "/mine.json"), "{\"mine\": 1}\n");
  put(d + "/private.json", "old");
  fs::permissions(d + "/private.json", fs::perms::owner_read | fs::perms::owner_write);
  files::write_atomic(d + "/private.json", "new", "summary");
  EXPECT_EQ(slurp(d + "/private.json"), "new");
  EXPECT_EQ(fs::status(d + "/private.json").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(d + "/mine.json", fs::perms::owner_all);
  fs::remove_all(d);
}

// A file whose size the system does not know (/proc's say 0 bytes) is read to its end, and a
// file is still held to the largest size asked for.
TEST(Files, FilesAreReadToTheirEndNotToTheirStatSize) {
  if (!fs::exists("/proc/self/status")) GTEST_SKIP() << "no /proc here";
  const std::string status = files::read_file("/proc/self/status", "config file");
  EXPECT_NE(status.find("Name:"), std::string::npos) << status;
  const std::string d = fresh_dir("read_to_end");
  put(d + "/ten.txt", "0123456789");
  EXPECT_EQ(files::read_file(d + "/ten.txt", "file", 10), "0123456789");
  EXPECT_CAST_ERROR(files::read_file(d + "/ten.txt", "file", 9), "more than the 9 bytes");
  EXPECT_CAST_ERROR(files::read_file("/proc/self/status", "file", 8), "more than the 8 bytes");
  fs::remove_all(d);
}

TEST(Files, TheRootFolderIsNoOutputFolder) {
  EXPECT_CAST_ERROR(files::check_output_folder("/", "run folder"), "run folder /: is the root folder of the file system");
  EXPECT_CAST_ERROR(files::make_writable_folder("/", "comparison folder"), "is the root folder");
  EXPECT_CAST_ERROR(files::check_output_folder("/.", "run folder"), "is the root folder");
}

// A run's own output changed by hand while the run went on (its summary.json or curves.svg, which
// the run writes again at its end) is moved aside to a free name, not replaced; cast's unchanged
// output, a missing file and anything but a regular file stay where they are (issue 41's attack:
// an edited summary.json was overwritten at the run's end).
TEST(Files, AnOutputChangedWhileACommandRanIsSetAsideNotReplaced) {
  const std::string d = fresh_dir("aside"), out = d + "/summary.json";
  EXPECT_EQ(files::set_aside_if_changed(out, "made by me"), "");  // nothing there
  files::write_stamped(out, "{\"made_by\": \"made by me\", \"digest\": \"" + std::string(files::kDigestSlot) + "\"}\n",
                       "summary");
  const std::string ours = slurp(out);
  EXPECT_EQ(files::set_aside_if_changed(out, "made by me"), "");  // unchanged: the write may replace it
  EXPECT_EQ(slurp(out), ours);
  std::string edited = ours;
  edited[2] = 'M';
  put(d + "/summary.json.kept", "the user's own file of that name");
  for (const std::string& expected : {out + ".kept-2", out + ".kept-3"}) {
    put(out, edited);
    EXPECT_EQ(files::set_aside_if_changed(out, "made by me"), expected);
    EXPECT_FALSE(files::exists(out));
    EXPECT_EQ(slurp(expected), edited);
  }
  EXPECT_EQ(slurp(d + "/summary.json.kept"), "the user's own file of that name");  // never written over
  put(out, "{\"made_by\": \"made by me\"}\n");  // marked, without its digest: may have been changed
  EXPECT_EQ(files::set_aside_if_changed(out, "made by me"), out + ".kept-4");
  std::filesystem::create_directory(out);  // a folder: the write's own rules refuse it
  EXPECT_EQ(files::set_aside_if_changed(out, "made by me"), "");
  EXPECT_TRUE(std::filesystem::is_directory(out));
}

// An output is checked before the command's work and written after it: a file made at its path
// meanwhile, or the one the check saw changed meanwhile, is moved aside and kept, not replaced
// (thirty-first attack: a figure, a trace, a plot and compare's results replaced a user's file
// that appeared while the command ran). The command's own writes, one after another, replace
// each other.
TEST(Files, AFileMadeOrChangedAfterTheCheckIsKeptNotReplaced) {
  const std::string d = fresh_dir("since_check"), out = d + "/fig.svg";
  const std::string figure = std::string(files::kFigureMark) + " " + std::string(files::kDigestSlot);
  files::check_may_replace(out, "figure", "a figure drawn by cast", files::kFigureMark, false);
  put(out, "my notes");  // made while the command ran
  files::write_stamped(out, figure, "figure");
  EXPECT_EQ(slurp(out + ".kept"), "my notes");
  EXPECT_NE(slurp(out).find(files::kFigureMark), std::string::npos);
  files::write_stamped(out, figure + " again", "figure");  // the command's own, written again
  EXPECT_FALSE(files::exists(out + ".kept-2"));
  // checked as cast's figure, then changed by hand before the write
  files::check_may_replace(out, "figure", "a figure drawn by cast", files::kFigureMark, false);
  put(out, "edited meanwhile, a longer text");
  files::write_stamped(out, figure, "figure");
  EXPECT_EQ(slurp(out + ".kept-2"), "edited meanwhile, a longer text");
  // a link made at the path meanwhile: moved aside too, not refused after the work (thirty-second
  // attack: a comparison stopped with exit 2 after writing its results.md)
  const std::string linked = d + "/linked.svg";
  files::check_may_replace(linked, "figure", "a figure drawn by cast", files::kFigureMark, false);
  put(d + "/precious.txt", "precious");
  std::filesystem::create_symlink("precious.txt", linked);
  files::write_stamped(linked, figure, "figure", files::Link::refuse);
  EXPECT_TRUE(std::filesystem::is_symlink(linked + ".kept"));
  EXPECT_EQ(slurp(d + "/precious.txt"), "precious");
  EXPECT_NE(slurp(linked).find(files::kFigureMark), std::string::npos);
  // --overwrite over the user's file the check saw: replaced, as asked
  put(d + "/mine.svg", "mine");
  files::check_may_replace(d + "/mine.svg", "figure", "a figure drawn by cast", files::kFigureMark, true);
  files::write_stamped(d + "/mine.svg", figure, "figure");
  EXPECT_FALSE(files::exists(d + "/mine.svg.kept"));
}

// A cast output carries a digest of itself (files::kDigestSlot, filled by write_stamped): one
// changed by hand after cast wrote it is told from one it wrote, and is not replaced by the same
// kind of output without --overwrite (twenty-fourth attack: a figure, a trace, a cast bench
// --json or a cast layer --out file edited by hand was replaced silently).
TEST(Files, ADigestTellsACastOutputFromOneChangedByHand) {
  const std::string d = fresh_dir("digest"), out = d + "/fig.svg";
  const std::string text = "<svg>\n<!-- made by me -->\n<!-- " + std::string(files::kDigestSlot) + " -->\n</svg>\n";
  files::write_stamped(out, text, "figure");
  const std::string written = slurp(out);
  ASSERT_EQ(written.size(), text.size());
  EXPECT_EQ(written.find(files::kDigestSlot), std::string::npos);  // filled in
  EXPECT_TRUE(files::digest_matches(written));
  EXPECT_EQ(files::with_digest(written), written);  // the filled digest is that of the text with its slot
  EXPECT_EQ(files::with_digest(text), written);
  files::check_may_replace(out, "--out", "a figure", "made by me", false);  // unchanged: replaced
  // one byte changed anywhere, the digest itself included, is seen
  for (const size_t at : {size_t{1}, written.find(files::kDigestTag) + files::kDigestTag.size() + 3,
                          written.size() - 3}) {
    std::string edited = written;
    edited[at] = edited[at] == 'x' ? 'y' : 'x';
    EXPECT_FALSE(files::digest_matches(edited)) << at;
    put(out, edited);
    EXPECT_CAST_ERROR(files::check_may_replace(out, "--out", "a figure", "made by me", false),
                      "--out " + out + ": is a figure, changed since cast wrote it (its digest no longer matches)");
    files::check_may_replace(out, "--out", "a figure", "made by me", true);  // --overwrite
  }
  // a digest cut short is no match; a marked output without a digest (an older cast's, or one
  // whose digest was cut out) may have been changed, unless its kind has none
  put(out, "<svg><!-- made by me --><!-- cast-digest-12ab");
  EXPECT_CAST_ERROR(files::check_may_replace(out, "--out", "a figure", "made by me", false), "changed since cast");
  put(out, "<svg><!-- made by me --></svg>\n");
  EXPECT_CAST_ERROR(files::check_may_replace(out, "--out", "a figure", "made by me", false),
                    "--out " + out + ": is a figure without its digest (written by a cast before digests, or the "
                    "digest was removed)");
  files::check_may_replace(out, "--out", "a figure", "made by me", false, "", files::Digest::none);
  EXPECT_TRUE(files::digest_matches("no digest here"));
  // a tag in a path or a command before the slot is left as it is, and the digest still found
  const std::string named = "{\"command\": \"cast plot --out /tmp/cast-digest-0123456789abcdef/x.svg\", \"digest\": \"" +
                            std::string(files::kDigestSlot) + "\"}";
  const std::string stamped = files::with_digest(named);
  EXPECT_EQ(stamped.substr(0, 60), named.substr(0, 60));
  EXPECT_EQ(stamped.find(files::kDigestSlot), std::string::npos);
  EXPECT_TRUE(files::digest_matches(stamped));
  EXPECT_FALSE(files::digest_matches(stamped.substr(0, stamped.size() - 1) + "]"));
  // write_atomic writes what it is given: a slot is filled only when asked
  files::write_atomic(out, text, "figure");
  EXPECT_EQ(slurp(out), text);
  fs::remove_all(d);
}
