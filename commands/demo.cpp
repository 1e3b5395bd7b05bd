// `cast demo [walk]`: lists the walks, or runs one (demo/walk.h: one attention layer, or one op,
// step by step on a tiny input, forward and backward, with every intermediate printed).
#include <omp.h>

#include "train/cli.h"
#include "commands/commands.h"
#include "demo/walk.h"
#include "ops/ops.h"

namespace cast {

namespace {

struct Walk {
  const char* name;
  const char* summary;
  int (*run)();
  bool layer;  // an attention layer (one thread, the plain-loop matmul)
};

const std::vector<Walk>& walks() {
  static const std::vector<Walk> list = {
      {"cast", "CAST: surrogate scores, gated affinity, Top-K clusters, intra-cluster attention, summaries",
       demo::walk_cast, true},
      {"clustered", "clustered attention: LSH hashes, Hamming k-means, centroids, centroid attention",
       demo::walk_clustered, true},
      {"iclustered", "improved clustered attention: clustered, plus each cluster's top keys and two terms",
       demo::walk_iclustered, true},
      {"full", "full softmax attention: scores, probabilities with the padded key masked, output", demo::walk_full,
       true},
      {"softmax", "one op: softmax with a mask, then layernorm, with their gradient checks", demo::walk_softmax, false},
  };
  return list;
}

std::string walk_names() {
  std::string names;
  for (const Walk& w : walks()) names += std::string(names.empty() ? "" : ", ") + w.name;
  return names;
}

}  // namespace

int command_demo(const std::vector<std::string>& argv) {
  cli::Args args("demo",
                 "Walk one attention layer (or one op) step by step on a tiny f64 input: every intermediate of\n"
                 "the forward, the backward one step at a time, and a finite-difference gradient check.\n"
                 "walks: " +
                     walk_names() + " (no walk: the list)");
  args.usage("cast demo [walk]");
  args.example("cast demo cast");
  args.example("cast demo full");
  args.example("cast demo");
  std::vector<std::string> rest = argv;
  std::string name;
  bool named = false;
  if (!rest.empty() && rest[0].rfind("-", 0) != 0) {  // the walk, before any option
    name = rest[0], named = true;
    rest.erase(rest.begin());
  }
  if (!args.parse(rest)) return 0;
  CAST_CHECK_USAGE(!named || !name.empty(), "cast demo '': an empty walk name (cast demo lists the walks)");
  if (name.empty()) {
    fmt::print("cast demo <walk>: one attention layer (or one op) step by step, forward and backward\n");
    for (const Walk& w : walks()) fmt::print("  {:<11} {}\n", w.name, w.summary);
    return 0;
  }
  for (const Walk& w : walks()) {
    if (name != w.name) continue;
    if (w.layer) {
      // One thread and the plain-loop matmul: every sum in one fixed order, whatever the machine's
      // cores and BLAS, so the printout is the same text everywhere.
      omp_set_num_threads(1);
      ops::set_cpu_gemm(ops::CpuGemm::loops);
    }
    return w.run();
  }
  throw UsageError(fmt::format("unknown walk '{}' (the walks: {})", name, walk_names()));
}

}  // namespace cast
