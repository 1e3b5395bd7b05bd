#pragma once
// What the walks of `cast demo` share (demo/walk.cpp): printing tables of a tiny layer's tensors,
// the layer itself (its fixed input, weights and mask), the backward helpers and the checks
// against nn::Attention and finite differences. One walk per mechanism: demo/full.cpp,
// demo/cast.cpp, demo/clustered.cpp (clustered and improved clustered), demo/softmax.cpp.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/attention.h"
#include "tensor/tensor.h"

namespace cast::demo {

// ================================================================ printing
constexpr size_t kColumns = 100;  // no line is wider, so the walks read in a terminal and a doc

// One labelled group of columns in a table (one head of one tensor, say): cells[row][column].
struct Group {
  std::string label;
  std::vector<std::vector<std::string>> cells;
};

using CellFormat = std::string (*)(double);

// ================================================================ the tiny layer
constexpr int64_t kTokens = 8, kDim = 8, kHeads = 2, kWidth = kDim / kHeads;
constexpr int64_t kClusters = 2, kClusterSize = 4;  // CAST: C·κ = N
constexpr int64_t kPadded = kTokens - 1;            // the last token is padding
constexpr int64_t kOriginal = 2, kTwin = 5;         // token 5 repeats token 2: equal affinities, a tie
constexpr uint64_t kWeightSeed = 1, kInputSeed = 3, kGradSeed = 7;

struct Weights {
  Tensor wq, wk, wv, wo, s, gate_w, gate_b;  // s, gate_w, gate_b: CAST only
};

struct Projections {
  Tensor q, k, v;  // (1, H, N, d)
};

// ================================================================ the backward, one step at a time
using StepFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Gradients by name: "x" and the layer's parameter names, as nn::Attention calls them.
using Grads = std::map<std::string, Tensor>;
// The layer as nn::Attention runs it (reference steps): one forward and one backward of the whole
// composition, for the walk to compare with.
struct LayerRun {
  nn::AttentionOutput result;
  Grads grads;
};

// ================================================================ printing
size_t columns(const std::string& s);
std::string pad_right(const std::string& s, size_t width);
std::string pad_left(const std::string& s, size_t width);
void say(const std::string& line);
std::string num(double v);
std::string integer(double v);
void heading(const std::string& number, const std::string& function, const std::string& formula);
void note(const std::string& text);
size_t cell_width(const Group& g, size_t c);
std::string group_row(const Group& g, size_t r);
size_t group_width(const Group& g);
void print_groups(const std::vector<std::string>& rows, const std::vector<Group>& groups, size_t label_width);
void table(const std::vector<std::string>& rows, const std::vector<Group>& groups);
std::vector<std::string> labels(const std::string& prefix, int64_t n);
std::vector<Group> heads(const std::string& name, const Tensor& t, CellFormat format = num);
std::vector<Group> operator+(std::vector<Group> a, const std::vector<Group>& b);

// ================================================================ the tiny layer
nn::AttentionConfig demo_config(nn::Mechanism mechanism);
Tensor demo_input();
Tensor demo_mask();
Tensor demo_dout();
Weights layer_weights(const nn::AttentionConfig& config);
std::vector<Tensor> as_inputs(const Tensor& x, const Weights& w);
Weights from_inputs(const std::vector<Tensor>& v);
Tensor split_heads(const Tensor& t);
Tensor merge_heads(const Tensor& t);
Projections project(const Tensor& x, const Weights& w);
Tensor output(const Tensor& heads_out, const Tensor& wo, const Tensor& mask);

// ================================================================ the backward, one step at a time
std::vector<Tensor> step_grads(const Tensor& d_output, const std::vector<Tensor>& inputs, const StepFn& step);
void back_projections(const Tensor& x, const Weights& w, const Projections& d, const Tensor& dx_more, Grads& grads);
Tensor back_output(const Tensor& heads_out, const Weights& w, const Tensor& mask, const Tensor& d_out, Grads& grads);

// ================================================================ the checks
double difference(const Tensor& a, const Tensor& b);
bool check(const std::string& what, double diff);
LayerRun run_layer(const nn::AttentionConfig& config, const Tensor& x, const Tensor& mask, const Tensor& d_out);
bool check_chain(const Grads& chain, const LayerRun& layer);
bool check_finite_differences(const std::vector<Tensor>& values, const std::string& names,
                              const autograd::TensorFn& layer);

// ================================================================ what every walk shows first
void intro(const std::string& walk, const std::string& what, const std::vector<std::string>& settings);
void show_input(const Tensor& x, const Tensor& mask);
void show_projections(const Projections& p);
void show_output(const Tensor& out);
void show_dout(const Tensor& d_out);

// ================================================================ ties
std::string token_list(const std::vector<int64_t>& ids, const char* separator);
std::string boundary_tie(const std::vector<double>& values, const std::vector<bool>& eligible,
                         const std::vector<int64_t>& chosen, size_t k, bool& lower_wins);
bool show_cluster_ties(const Tensor& values, const Tensor& picks, const Tensor& mask, const std::string& none);

// ================================================================ the walks
int walk_full();
int walk_cast();
int walk_clustered();
int walk_iclustered();
int walk_softmax();

}  // namespace cast::demo
