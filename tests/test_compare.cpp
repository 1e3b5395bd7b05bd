// `cast compare`: the table says what the runs' own summaries say; an interrupted comparison
// resumes its unfinished run instead of restarting it; a run with equal settings is reused;
// a folder holding a run with other settings is refused.
#include <unistd.h>  // getpid: the plain and the emulated test process run side by side

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tensor/files.h"
#include "tests/test_util.h"
#include "train/compare.h"
#include "train/stop.h"
#include "train/trainer.h"

using cast::testing::slurp;

using namespace cast;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("cast_compare_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// Short ListOps (depth 2, length under 20) and a model of a few thousand parameters.
train::CompareSpec tiny_spec(const std::string& data_dir, const std::string& out_dir) {
  if (!fs::exists(data_dir + "/basic_train.tsv")) {
    data::ListOpsSpec s = data::ListOpsSpec::short_cpu();
    s.max_depth = 2, s.max_args = 3, s.min_length = 4, s.max_length = 20;
    s.train = 200, s.val = 40, s.test = 40;
    data::generate_listops(data_dir, s, 5);
  }
  train::CompareSpec spec;
  spec.task = "listops-short";
  spec.out_dir = out_dir;
  spec.variants = {{"full", {{"attention", "full"}}}, {"cast", {{"attention", "cast"}}}};
  spec.seeds = {1, 2};
  spec.settings = {{"data", data_dir}, {"steps", 12},     {"batch", 8},
                   {"dim", 16},        {"heads", 2},      {"mlp-dim", 32},
                   {"layers", 1},      {"log-every", 4},  {"checkpoint-every", 4},
                   {"eval-every", 6},  {"device", "cpu"}, {"warmup", 2}};
  return spec;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

}  // namespace

TEST(Compare, InterruptedComparisonResumesAndItsTableMatchesTheRuns) {
  const std::string data = fresh_dir("data"), out = fresh_dir("out");
  const train::CompareSpec spec = tiny_spec(data, out);

  // A process that dies 7 steps into the first run leaves its checkpoint and no summary.
  train::CompareResult first = train::run_comparison(spec, 7, true);
  ASSERT_FALSE(first.complete);
  ASSERT_EQ(first.runs.size(), 1u);
  EXPECT_EQ(first.runs[0].steps_this_process, 7);
  EXPECT_TRUE(fs::exists(out + "/full-seed1/checkpoint.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/full-seed1/summary.json"));
  EXPECT_FALSE(fs::exists(out + "/results.md"));

  // The same comparison again: the first run goes on from step 7, the rest run whole.
  train::CompareResult second = train::run_comparison(spec, 0, true);
  ASSERT_TRUE(second.complete);
  ASSERT_EQ(second.runs.size(), 4u);
  EXPECT_TRUE(second.runs[0].resumed);
  EXPECT_EQ(second.runs[0].steps_this_process, 12 - 7);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(second.runs[i].steps_this_process, 12) << i;

  // Each logged step appears once in the resumed run's metrics.
  std::multiset<int64_t> steps;
  std::ifstream metrics(out + "/full-seed1/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json j = json::parse(line);
    if (j["split"] == "train") steps.insert(j["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::multiset<int64_t>{4, 8, 12}));

  // The resumed run ends where an uninterrupted one with the same settings ends.
  train::TrainConfig straight = train::preset("listops-short");
  train::apply_overrides(straight, spec.settings);
  train::apply_overrides(straight, {{"attention", "full"}, {"seed", 1}});
  straight.run_dir = fresh_dir("straight");
  const train::TrainResult reference = train::run_training(straight, "", 0, true);
  const json resumed = read_json(out + "/full-seed1/summary.json");
  EXPECT_EQ(resumed["test_accuracy"].get<double>(), reference.test.accuracy);
  EXPECT_EQ(resumed["val_accuracy"].get<double>(), reference.val.accuracy);
  EXPECT_EQ(resumed["steps"].get<int64_t>(), 12);
  EXPECT_GT(resumed["seconds"].get<double>(), 0.0);
  EXPECT_GT(resumed["peak_bytes"].get<int64_t>(), 0);

  // The table: every figure is the runs' own summaries, averaged over the seeds.
  const json results = read_json(out + "/results.json");
  ASSERT_EQ(results["variants"].size(), 2u);
  const std::string md = slurp(out + "/results.md");
  for (const json& variant : results["variants"]) {
    const std::string label = variant["variant"];
    double test_sum = 0, val_sum = 0;
    std::vector<double> tests;
    for (uint64_t seed : {1, 2}) {
      const json s = read_json(out + "/" + train::compare_run_name(label, seed) + "/summary.json");
      tests.push_back(s["test_accuracy"].get<double>());
      test_sum += s["test_accuracy"].get<double>();
      val_sum += s["val_accuracy"].get<double>();
      // each run's row in the Markdown table
      EXPECT_NE(
          md.find(fmt::format("| {} | {} | {} | {:.2f} | {:.2f} |", label, seed, train::compare_run_name(label, seed),
                              100 * s["test_accuracy"].get<double>(), 100 * s["val_accuracy"].get<double>())),
          std::string::npos)
          << label << " seed " << seed << "\n"
          << md;
    }
    const double mean = test_sum / 2,
                 sd = std::sqrt((tests[0] - mean) * (tests[0] - mean) + (tests[1] - mean) * (tests[1] - mean));
    EXPECT_DOUBLE_EQ(variant["test_accuracy"]["mean"].get<double>(), mean) << label;
    EXPECT_NEAR(variant["test_accuracy"]["sd"].get<double>(), sd, 1e-12) << label;
    EXPECT_DOUBLE_EQ(variant["val_accuracy"]["mean"].get<double>(), val_sum / 2) << label;
    EXPECT_EQ(variant["steps"].get<int64_t>(), 12);
    EXPECT_NE(md.find(fmt::format("| {} | 2 | {:.2f} ± {:.2f} |", label, 100 * mean, 100 * sd)), std::string::npos)
        << label << "\n"
        << md;
  }
  // The figure names every variant and says it averages seeds.
  const std::string svg = slurp(out + "/comparison.svg");
  EXPECT_NE(svg.find("full (mean of 2 seeds)"), std::string::npos);
  EXPECT_NE(svg.find("cast (mean of 2 seeds)"), std::string::npos);

  // A third invocation finds everything finished and trains nothing.
  train::CompareResult third = train::run_comparison(spec, 0, true);
  ASSERT_TRUE(third.complete);
  for (const auto& r : third.runs) EXPECT_EQ(r.steps_this_process, 0) << r.dir;

  // An ablation in the same folder reuses the run whose settings equal its baseline's.
  train::CompareSpec ablation = spec;
  ablation.variants = {{"clustering=topk", {{"attention", "cast"}, {"clustering", "topk"}}},
                       {"clustering=satopk", {{"attention", "cast"}, {"clustering", "satopk"}}}};
  ablation.seeds = {1};
  ablation.name = "clustering";
  train::CompareResult ab = train::run_comparison(ablation, 0, true);
  ASSERT_TRUE(ab.complete);
  EXPECT_EQ(ab.runs[0].dir, out + "/cast-seed1");
  EXPECT_EQ(ab.runs[0].steps_this_process, 0);
  EXPECT_EQ(ab.runs[1].steps_this_process, 12);
  EXPECT_TRUE(fs::exists(out + "/results-clustering.md"));
  EXPECT_TRUE(fs::exists(out + "/comparison-clustering.svg"));
  EXPECT_TRUE(fs::exists(out + "/results.md"));  // the mechanism table stays
}

TEST(Compare, AFolderHoldingARunWithOtherSettingsIsRefused) {
  const std::string data = fresh_dir("data2"), out = fresh_dir("other");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.variants.erase(spec.variants.begin());  // CAST: it reads the clustering settings
  spec.seeds = {1};
  ASSERT_FALSE(train::run_comparison(spec, 5, true).complete);  // leaves full-seed1 unfinished
  spec.settings["dim"] = 24;
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "this run was started with setting 'dim' = 16, but "
                    "this comparison asks for 24");
  spec.settings["dim"] = 16;
  spec.settings["lr"] = 0.5;
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true), "this run was started with setting 'lr'");
  spec.settings.erase("lr");
  // an attention option the mechanism reads is named itself, with both values (tenth attack, K1)
  spec.settings["clusters"] = 16;
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "this run was started with setting 'clusters' = 0, but this comparison asks for 16");
  spec.settings.erase("clusters");
  // --recompute computes the same run: the comparison goes on with it (tenth attack, K2)
  spec.settings["recompute"] = true;
  EXPECT_TRUE(train::run_comparison(spec, 0, true).complete);
  spec.settings.erase("recompute");
  spec.settings["seed"] = 3;
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true), "use --out and --seeds instead");
}

TEST(Compare, AStopRequestEndsTheComparisonResumablyAndRerunningFinishesIt) {
  const std::string data = fresh_dir("data3"), out = fresh_dir("stopped");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.command = "cast compare --out " + out;
  // Ctrl-C during the first run: its step is finished and saved, and nothing else is touched
  train::request_stop(SIGINT);
  try {
    train::run_comparison(spec, 0, true);
    ADD_FAILURE() << "the comparison did not stop";
  } catch (const train::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_NE(std::string(e.what()).find("stopped by SIGINT after step 1 of 12: checkpoint " + out +
                                         "/full-seed1/checkpoint.safetensors written; resume with: " + spec.command),
              std::string::npos)
        << e.what();
  }
  train::clear_stop();
  EXPECT_EQ(train::read_checkpoint_header(out + "/full-seed1/checkpoint.safetensors").step, 1);
  EXPECT_FALSE(fs::exists(out + "/full-seed1/summary.json"));
  EXPECT_FALSE(fs::exists(out + "/cast-seed1"));
  // the same comparison again resumes that run and ends as an uninterrupted one
  train::CompareResult again = train::run_comparison(spec, 0, true);
  ASSERT_TRUE(again.complete);
  EXPECT_TRUE(again.runs[0].resumed);
  EXPECT_EQ(again.runs[0].steps_this_process, 11);
  train::TrainConfig straight = train::preset("listops-short");
  train::apply_overrides(straight, spec.settings);
  train::apply_overrides(straight, {{"attention", "full"}, {"seed", 1}});
  straight.run_dir = fresh_dir("stopped_straight");
  const train::TrainResult reference = train::run_training(straight, "", 0, true);
  const json resumed = read_json(out + "/full-seed1/summary.json");
  EXPECT_EQ(resumed["test_accuracy"].get<double>(), reference.test.accuracy);
  EXPECT_EQ(resumed["val_accuracy"].get<double>(), reference.val.accuracy);
}

// A run kept from an earlier invocation trained on the set its data folder holds now: after the
// set is made again with another seed, the comparison is refused, not averaged over two sets
// (tenth attack, K3).
TEST(Compare, ARunOfAnotherDataSetIsRefused) {
  const std::string data = fresh_dir("data_regenerated"), out = fresh_dir("other_set");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.variants.resize(1);
  spec.seeds = {1};
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  data::ListOpsSpec s = data::ListOpsSpec::short_cpu();
  s.max_depth = 2, s.max_args = 3, s.min_length = 4, s.max_length = 20;
  s.train = 200, s.val = 40, s.test = 40;
  data::generate_listops(data, s, 6, true);
  spec.seeds = {1, 2};
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    out + "/full-seed1/checkpoint.safetensors: this run trained on another set than data folder " + data);
  EXPECT_FALSE(fs::exists(out + "/full-seed2"));
}

// A results.md, figure or results.json changed by hand after the comparison wrote them (their
// digests no longer match) is the user's: the same comparison again refuses to replace it unless
// told (twenty-third attack: notes added to results.md were lost on a rerun).
TEST(Compare, ResultsChangedByHandAreNotReplacedWithoutOverwrite) {
  const std::string data = fresh_dir("data_hand"), out = fresh_dir("hand_edited");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.variants.resize(1);
  spec.seeds = {1};
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  EXPECT_FALSE(files::modified_after(out + "/results.md", out + "/results.json", 0.0));  // the json is the newest
  EXPECT_FALSE(files::modified_after(out + "/comparison.svg", out + "/results.json", 0.0));
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);  // untouched: rewritten
  std::ofstream(out + "/results.md", std::ios::app) << "MY NOTES\n";
  fs::last_write_time(out + "/results.md", fs::last_write_time(out + "/results.json") + std::chrono::seconds(10));
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "comparison output " + out + "/results.md: is the results of cast compare, changed since cast "
                    "wrote it");
  EXPECT_NE(slurp(out + "/results.md").find("MY NOTES"), std::string::npos);
  spec.overwrite = true;
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  EXPECT_EQ(slurp(out + "/results.md").find("MY NOTES"), std::string::npos);
  // a results.md without its digest (an older cast's, or the digest cut out) may have been
  // changed: refused (twenty-sixth attack); one only touched is not changed
  spec.overwrite = false;
  fs::last_write_time(out + "/results.md", fs::last_write_time(out + "/results.json") + std::chrono::seconds(10));
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  std::string md = slurp(out + "/results.md");
  md.erase(md.find("<!-- cast-digest-"), md.find("-->\n") + 4 - md.find("<!-- cast-digest-"));
  std::ofstream(out + "/results.md", std::ios::binary | std::ios::trunc) << md << "MY NOTES\n";
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "comparison output " + out + "/results.md: is the results of cast compare without its digest");
  fs::remove(out + "/results.md");
  // results.json itself edited, so the newest of the three: its digest no longer matches
  // (twenty-fourth attack)
  std::string results = slurp(out + "/results.json");
  results.replace(results.find("\"task\""), 6, "\"Task\"");
  std::ofstream(out + "/results.json", std::ios::binary | std::ios::trunc) << results;
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "comparison output " + out + "/results.json: is the results of cast compare, changed since cast "
                    "wrote it");
  EXPECT_EQ(slurp(out + "/results.json"), results);
}

// Full attention reads no clustering setting: its finished run serves a comparison with other
// --clusters or --topk, and its unfinished one goes on (twenty-fourth attack: refused as a run
// "started with setting 'clusters' = 0").
TEST(Compare, AFullAttentionRunServesAnyClusteringSetting) {
  const std::string data = fresh_dir("data_full_any"), out = fresh_dir("full_any");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.variants.resize(1);
  spec.seeds = {1};
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  const std::string finished = slurp(out + "/full-seed1/checkpoint.safetensors");
  spec.settings["clusters"] = 16, spec.settings["topk"] = 4, spec.settings["cluster-size"] = 3;
  spec.seeds = {1, 2};
  ASSERT_FALSE(train::run_comparison(spec, 5, true).complete);  // full-seed1 taken, full-seed2 stopped
  EXPECT_EQ(slurp(out + "/full-seed1/checkpoint.safetensors"), finished);  // not trained again
  spec.settings["clusters"] = 24;
  const train::CompareResult result = train::run_comparison(spec, 0, true);
  ASSERT_TRUE(result.complete);
  ASSERT_EQ(result.runs.size(), 2u);
  EXPECT_TRUE(result.runs[1].resumed);
  EXPECT_EQ(result.runs[1].steps_this_process, 12 - 5);
  EXPECT_EQ(slurp(out + "/full-seed1/checkpoint.safetensors"), finished);
  // another mechanism under the same label is named as such, not by a setting only one reads
  spec.variants = {{"full", {{"attention", "clustered"}}}};
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "this run was started with setting 'attention' = \"full\", but this comparison asks for "
                    "\"clustered\"");
  EXPECT_FALSE(train::mechanism_reads(nn::Mechanism::full, "clusters"));
  EXPECT_TRUE(train::mechanism_reads(nn::Mechanism::iclustered, "topk"));
  EXPECT_FALSE(train::mechanism_reads(nn::Mechanism::clustered, "topk"));
  EXPECT_TRUE(train::mechanism_reads(nn::Mechanism::cast, "surrogates"));
  EXPECT_TRUE(train::mechanism_reads(nn::Mechanism::full, "attention"));
}

// `--vary recompute` compares exactly the runs' time and memory: each value trains its own run
// (eleventh attack, L2: the second took the first's). A file where a later run's folder goes is
// refused before the first run trains (L3).
TEST(Compare, VaryingRecomputeTrainsEachRunAndABadRunFolderIsRefusedFirst) {
  const std::string data = fresh_dir("data_vary_recompute"), out = fresh_dir("vary_recompute");
  train::CompareSpec spec = tiny_spec(data, out);
  spec.variants = {{"recompute=false", {{"attention", "full"}, {"recompute", false}}},
                   {"recompute=true", {{"attention", "full"}, {"recompute", true}}}};
  spec.seeds = {1};
  fs::create_directories(out);
  std::ofstream(out + "/recompute-true-seed1") << "mine\n";
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true), "run folder " + out + "/recompute-true-seed1: is a file");
  EXPECT_FALSE(fs::exists(out + "/recompute-false-seed1"));
  fs::remove(out + "/recompute-true-seed1");
  const train::CompareResult r = train::run_comparison(spec, 0, true);
  ASSERT_TRUE(r.complete);
  ASSERT_EQ(r.runs.size(), 2u);
  EXPECT_NE(r.runs[0].dir, r.runs[1].dir);
  EXPECT_EQ(r.runs[1].steps_this_process, 12);
}
