// `cast demo <walk>`: each attention walk prints exactly its golden file (tests/golden/), and
// docs/attention.md shows exactly the same text, so the code, the golden files and the docs cannot
// drift apart. After an intended change of a walk, scripts/update_golden.sh rewrites both.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "demo/walk.h"
#include "tests/test_util.h"

using cast::testing::slurp;

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kWalks = {"cast", "clustered", "iclustered", "full"};

fs::path source_dir() { return fs::path(CAST_TEST_DATA_DIR).parent_path().parent_path(); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

struct DemoRun {
  int code;
  std::string out, err;
};

// The binary with `args`; stdout and stderr through files of this process's own.
DemoRun run_cast(const std::string& args) {
  static int calls = 0;
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(calls++);
  const fs::path out = fs::temp_directory_path() / ("cast_demo_out_" + tag);
  const fs::path err = fs::temp_directory_path() / ("cast_demo_err_" + tag);
  const std::string cmd =
      std::string(CAST_BINARY) + " " + args + " > " + out.string() + " 2> " + err.string() + " < /dev/null";
  const int status = std::system(cmd.c_str());
  DemoRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

// "" when the texts are equal, else where they first differ.
std::string first_difference(const std::string& got, const std::string& want) {
  const auto g = lines_of(got), w = lines_of(want);
  for (size_t i = 0; i < std::min(g.size(), w.size()); ++i)
    if (g[i] != w[i]) return "line " + std::to_string(i + 1) + ":\n  got:  " + g[i] + "\n  want: " + w[i];
  if (g.size() != w.size())
    return "got " + std::to_string(g.size()) + " lines, want " + std::to_string(w.size()) + " lines";
  if (got != want) return "the same lines, but the line endings differ";
  return "";
}

// The text of docs/attention.md's block for a walk: between "```text" and "```" after
// "<summary>cast demo WALK</summary>". Empty when the doc has no such block.
std::string doc_block(const std::string& doc, const std::string& walk) {
  const std::string summary = "<summary>cast demo " + walk + "</summary>";
  const size_t at = doc.find(summary);
  if (at == std::string::npos) return "";
  const size_t open = doc.find("```text\n", at);
  const size_t details_end = doc.find("</details>", at);
  if (open == std::string::npos || open > details_end) return "";
  const size_t begin = open + 8;
  const size_t close = doc.find("\n```\n", begin);
  if (close == std::string::npos || close > details_end) return "";
  return doc.substr(begin, close + 1 - begin);
}

std::string golden(const std::string& walk) {
  return slurp(source_dir() / "tests" / "golden" / ("demo_" + walk + ".txt"));
}

void expect_golden(const std::string& walk) {
  const std::string want = golden(walk);
  ASSERT_FALSE(want.empty()) << "tests/golden/demo_" << walk << ".txt is missing or empty";
  const DemoRun r = run_cast("demo " + walk);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  const std::string diff = first_difference(r.out, want);
  EXPECT_TRUE(diff.empty()) << "cast demo " << walk << " differs from tests/golden/demo_" << walk << ".txt at " << diff
                            << "\n(after an intended change: scripts/update_golden.sh)";
}

}  // namespace

TEST(Demo, CastWalkPrintsItsGoldenFile) { expect_golden("cast"); }
TEST(Demo, ClusteredWalkPrintsItsGoldenFile) { expect_golden("clustered"); }
TEST(Demo, IclusteredWalkPrintsItsGoldenFile) { expect_golden("iclustered"); }
TEST(Demo, FullWalkPrintsItsGoldenFile) { expect_golden("full"); }

TEST(Demo, DocsShowEachGoldenFile) {
  const std::string doc = slurp(source_dir() / "docs" / "attention.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& walk : kWalks) {
    const std::string block = doc_block(doc, walk);
    ASSERT_FALSE(block.empty()) << "docs/attention.md has no <summary>cast demo " << walk << "</summary> block";
    const std::string diff = first_difference(block, golden(walk));
    EXPECT_TRUE(diff.empty()) << "docs/attention.md's cast demo " << walk << " block (got) differs from "
                              << "tests/golden/demo_" << walk << ".txt (want) at " << diff
                              << "\n(scripts/update_golden.sh rewrites the doc blocks)";
  }
}

// What the golden files must show, whatever their numbers: every check passed, the tie and the
// padding spelled out, lines that fit a terminal.
TEST(Demo, GoldenFilesPassTheirChecksAndStayReadable) {
  for (const auto& walk : kWalks) {
    const auto lines = lines_of(golden(walk));
    ASSERT_GE(lines.size(), 80u) << walk;
    int checks = 0, gradient_ok = 0;
    for (const auto& line : lines) {
      EXPECT_LE(cast::demo::columns(line), 100u) << walk << ": " << line;
      EXPECT_EQ(line.find("FAIL"), std::string::npos) << walk << ": " << line;
      EXPECT_EQ(line.find("WRONG"), std::string::npos) << walk << ": " << line;
      EXPECT_EQ(line.find("-0.0000"), std::string::npos) << walk << ": " << line;
      if (line.rfind("check  ", 0) == 0) {
        ++checks;
        EXPECT_NE(line.find(": ok (difference < 1e-12)"), std::string::npos) << walk << ": " << line;
      }
      if (line == "gradient check: ok, max relative error < 1e-6") ++gradient_ok;
    }
    EXPECT_GE(checks, 2) << walk << ": the forward and the chain of steps against nn::Attention";
    EXPECT_EQ(gradient_ok, 1) << walk;
  }
  const std::string cast = golden("cast");
  EXPECT_NE(cast.find("  tie: head "), std::string::npos) << "the CAST input must make the clustering break a tie";
  EXPECT_NE(cast.find("t7 (padding) is in no cluster of either head"), std::string::npos);
  for (const char* walk : {"clustered", "iclustered"})
    EXPECT_NE(golden(walk).find("t7 (padding) is in no cluster (−1) in either head"), std::string::npos) << walk;
}

TEST(Demo, ListsItsWalksAndRefusesAnUnknownOne) {
  const DemoRun list = run_cast("demo");
  EXPECT_EQ(list.code, 0) << list.err;
  for (const char* walk : {"cast", "clustered", "iclustered", "full", "softmax"})
    EXPECT_NE(list.out.find("\n  " + std::string(walk) + " "), std::string::npos) << walk << ":\n" << list.out;
  const DemoRun unknown = run_cast("demo flash");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(unknown.out, "");
  EXPECT_EQ(unknown.err,
            "cast demo: error: unknown walk 'flash' (the walks: cast, clustered, iclustered, full, softmax)\n");
  const DemoRun extra = run_cast("demo cast more");
  EXPECT_EQ(extra.code, 2);
  EXPECT_NE(extra.err.find("unexpected argument 'more'"), std::string::npos) << extra.err;
  const DemoRun help = run_cast("demo --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("usage: cast demo [walk]"), std::string::npos) << help.out;
}
