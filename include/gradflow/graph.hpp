// A sublayer as a short graph of ops, written by an architecture recipe and differentiated by the
// engine: recipes say what is computed, never how its gradient flows.
#pragma once
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "gradflow/branch_op.hpp"
#include "gradflow/depth_attention.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

struct Value {
  int id = -1;
};

enum class NodeOp {
  add,            // a + b
  scale,          // factor * a
  norm,           // N(a): a fresh instance of the configured norm (own gamma = 1)
  unit,           // a / norm(a) per token (nGPT)
  branch,         // F(a): the sublayer's attention or FFN; the only node that is not on the skip path
  attend,         // attention over depth (depth_attention.hpp): a softmax read over the history of input
                  // stream a (its member states among 0 .. l, this sublayer's input last) and then b, with
                  // a pseudo-query that starts as `factor` in every entry (AttnRes: 0)
  history_sum,    // the fixed-weight reads of the history of input stream a (its member states among
  history_mean,   // 0 .. l): their sum, or their mean (DenseFormer's depth-weighted averages)
  mix_fractions,  // a fixed linear map of a's width fractions (ops.hpp; Frac-Connections), weights in
                  // SublayerGraph::fraction_mix(node.mix)
};

struct Node {
  NodeOp op;
  int lhs = -1;
  int rhs = -1;
  double factor = 1.0;
  int mix = -1;  // mix_fractions: the index of its FractionMix
};

// mix_fractions's map: m fractions and the m x m weights, row-major by output fraction.
struct FractionMix {
  int fractions = 1;
  std::vector<double> weights;
};

class SublayerGraph {
 public:
  // Starts a new graph whose inputs are the state's `input_count` streams (values 0..count-1).
  void reset(int input_count);

  Value input(int stream) const;
  Value add(Value a, Value b) { return push({NodeOp::add, a.id, b.id}); }
  Value scale(Value a, double factor) { return push({NodeOp::scale, a.id, -1, factor}); }
  Value norm(Value a) { return push({NodeOp::norm, a.id}); }
  Value unit(Value a) { return push({NodeOp::unit, a.id}); }
  // y_f = sum_g weights[f m + g] a_g over a's m width fractions (ops.hpp, mix_fractions_forward).
  Value mix_fractions(Value a, int fractions, std::vector<double> weights);
  const FractionMix& fraction_mix(int index) const { return mixes_[static_cast<std::size_t>(index)]; }
  // attend(s, b): a read of input stream s's history (its member states among 0 .. l) followed by b,
  // its pseudo-query starting as query_init in every entry. Its earlier sources come from
  // BranchContext::history; the input (state l) is a source when it is a member.
  Value attend(Value stream, Value b, double query_init);
  // history_sum(s), history_mean(s): the sum or the mean of input stream s's member states among
  // 0 .. l (this sublayer's input last, when it is a member); fixed weights, no parameter.
  Value history_sum(Value stream, bool mean);
  // History membership (a placement file's [history]): whether this sublayer's input, state l, of
  // input stream s is one of the sources of s's history, for this sublayer's reads and every later
  // one. Every state is unless set otherwise (Block AttnRes keeps only its block boundaries).
  void set_history_member(int stream, bool member);
  bool history_member(int stream) const;
  // True when some node reads a history (an attend node): the sublayer is not Markov.
  bool reads_history() const;
  // Marks, per input stream, whether an attend node reads its history (history_streams's size is the
  // input count).
  void mark_history_streams(std::vector<bool>& history_streams) const;
  // F(a). Attention options: q/k/v normalisation and, for nGPT, the softmax scale; FFN option:
  // the scale of the hidden pre-activation (nGPT's s_uv). Each applies to its kind of F only.
  Value branch(Value a, QkvNorm qkv_norm = QkvNorm::none, std::optional<double> score_scale = std::nullopt,
               double ffn_hidden_scale = 1.0);

  // The streams of the next state, in order.
  void set_outputs(std::initializer_list<Value> outputs);
  void set_outputs(const std::vector<Value>& outputs);  // the same, for a count known at run time
  // The update this sublayer adds to the stream (after its scaling) and the pre-norm sum it is
  // added into: they define branch_rms and stream_share.
  void mark_update(Value update, Value sum);

  int input_count() const { return input_count_; }
  int value_count() const { return input_count_ + static_cast<int>(nodes_.size()); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& outputs() const { return outputs_; }
  int update_id() const { return update_id_; }
  int sum_id() const { return sum_id_; }
  int branch_id() const { return branch_id_; }
  QkvNorm qkv_norm() const { return qkv_norm_; }
  std::optional<double> score_scale() const { return score_scale_; }
  double ffn_hidden_scale() const { return ffn_hidden_scale_; }

 private:
  Value push(Node node);

  int input_count_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
  int update_id_ = -1, sum_id_ = -1, branch_id_ = -1;
  QkvNorm qkv_norm_ = QkvNorm::none;
  std::optional<double> score_scale_;
  double ffn_hidden_scale_ = 1.0;
  std::vector<int> non_member_streams_;  // input streams whose state l is not a history source
  std::vector<FractionMix> mixes_;       // the mix_fractions nodes' maps
};

// The history a read (attend, history_sum, history_mean) takes besides its own input: per input
// stream, the stream's values at the earlier member states among 0 .. l-1 (a placement's [history];
// every state by default) with their keys (empty for a stream no node reads), and for the backward
// pass their cotangent accumulators (same shape; each read ADDS its share), so that a state's
// cotangent collects every later read. The input, state l, is a source when it is a member
// (SublayerGraph::history_member). queries, when set, holds per value id a pseudo-query (1, d)
// replacing the node's initial value; d_queries, when set, receives per value id dL/dw (K, d).
//
// The uniform reads' shortcut: a read whose pseudo-query is exactly zero weighs each of its n
// sources a = 1/n exactly (the paper's init), and a fixed-weight read weighs each member state alike.
// When prefix[s] is set (the sum of stream s over the member states before l), such a read is
// a (prefix + input if a member + e) and costs O(T d) instead of O(n T d); its backward adds a g to
// uniform_share[s] once, every earlier member state's share being that same a g, and the stack
// spreads it (StackRun::add_history_cotangent). Without uniform_share those shares are dropped, as
// without d_earlier.
//
// A JVP through the history (--spectrum's forward sweep over a stack that reads one): t_earlier[s]
// holds the tangent of each earlier state (as earlier[s]; empty: the earlier states are held fixed,
// zero tangents), and t_prefix[s] their sum, for the uniform reads.
template <typename Scalar>
struct DepthHistory {
  std::vector<std::vector<DepthSource<Scalar>>> earlier;
  std::vector<std::vector<Mat<Scalar>*>> d_earlier;
  std::vector<const Mat<Scalar>*> prefix;
  std::vector<Mat<Scalar>*> uniform_share;
  std::vector<std::vector<const Mat<Scalar>*>> t_earlier;
  std::vector<const Mat<Scalar>*> t_prefix;
  const std::vector<Mat<Scalar>>* queries = nullptr;
  std::vector<Mat<Scalar>>* d_queries = nullptr;
};

// What the branch node F needs besides its input.
template <typename Scalar>
struct BranchContext {
  SublayerKind kind = SublayerKind::ffn;
  BranchKind branch = BranchKind::model;
  NormKind norm = NormKind::rms;
  int heads = 1;
  const SublayerWeights<Scalar>* weights = nullptr;
  WorkPool* pool = nullptr;  // the branch's pieces run on the pool's threads when set
  BlockOps ops{};
  // A norm node's learned affine, y = gamma * N(x) + beta, per value id ((1, d) each; unset or
  // empty: gamma = 1, beta = 0): a trained model's norm weights (RMSNorm's weight, LayerNorm's weight
  // and bias), or --update-params all's stepped gains. Forward, backward and JVP all take them.
  const std::vector<Mat<Scalar>>* norm_gains = nullptr;
  const std::vector<Mat<Scalar>>* norm_biases = nullptr;
  // attend nodes: the earlier sources they read (and, in the backward, where their shares go).
  // The JVP holds the earlier states fixed (zero tangents) unless the history gives their tangents.
  DepthHistory<Scalar>* history = nullptr;
};

// What the backward pass already knows about a sublayer's outputs when it recomputes the
// sublayer: the stored next state and, for outputs that are norm nodes, their statistics saved by
// the forward pass (GraphExecutor::output_norm_stats).
template <typename Scalar>
struct KnownOutputs {
  const std::vector<Mat<Scalar>>* values = nullptr;  // the next state's streams
  const std::vector<Mat<Scalar>>* norm_stats = nullptr;
};

// True when a recompute for the backward pass may stop at the branch's hidden activations: every
// node after the branch is an add, a scale, or a norm whose value is a graph output (its backward
// needs only its output and statistics, which are known), and the update is F or s F with F used
// once, so that <dL/d update, update> = <dL/dF, F> comes from the branch's backward. Post-norm
// placements (post-ln, keel, deepnorm, ...) qualify; their branch's output projection is skipped.
bool recompute_can_skip_branch_output(const SublayerGraph& graph);
// The same, with caller-owned scratch; after_branch[id] is then 1 for the branch output and every
// value that depends on it (complete when the answer is true).
bool recompute_can_skip_branch_output(const SublayerGraph& graph, std::vector<char>& after_branch,
                                      std::vector<int>& consumers);

// Runs a SublayerGraph forward, keeping what the backward needs, then backward. Buffers are
// reused across sublayers, so the per-sublayer loop does not allocate once shapes have settled.
template <typename Scalar>
class GraphExecutor {
 public:
  void forward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
               const BranchContext<Scalar>& context);
  // The backward pass's recompute: like forward, but when recompute_can_skip_branch_output(graph)
  // the branch output and the nodes after it are not computed; the output norms take their values
  // and statistics from `known` instead (the same bits the forward pass produced). value() of a
  // skipped node is then undefined, and the backward provides branch_output_dots() instead.
  void recompute(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
                 const BranchContext<Scalar>& context, const KnownOutputs<Scalar>& known);
  bool skipped_branch_output() const { return skipped_branch_output_; }
  // After a backward through the branch that followed a recompute with the output skipped:
  // <dL/dF, F> per probe, from the branch's hidden activations.
  const std::vector<double>& branch_output_dots() const { return branch_output_dots_; }
  // After forward: output i's norm statistics ((T, groups); empty if output i is not a norm node).
  void output_norm_stats(const SublayerGraph& graph, std::vector<Mat<Scalar>>& stats) const;

  // Vector-Jacobian product: d_outputs (one (K*T, d) cotangent per output stream) to d_inputs.
  // through_branch = false cuts every path through F: the result is the skip path's share.
  void backward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_outputs, bool through_branch,
                const BranchContext<Scalar>& context, std::vector<Mat<Scalar>>& d_inputs,
                ParamGradSquares* param_grads = nullptr);

  // Jacobian-vector product after forward: tangents of the inputs (one (P*T, d) block per input
  // stream, P tangents stacked) to tangents of the outputs.
  // d_weights, when given, is a tangent of the branch's weights as well (one tangent, P = 1), and
  // d_gains one of the norm nodes' gains (per value id, (1, d) or empty), at gamma = 1.
  void jvp(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_inputs,
           const BranchContext<Scalar>& context, std::vector<Mat<Scalar>>& d_outputs,
           const SublayerWeights<Scalar>* d_weights = nullptr,
           const std::vector<Mat<Scalar>>* d_gains = nullptr);
  // The part of backward() that weight_gradients() reads (--update): the cotangents after the
  // branch and inside it, then it stops. The branch input's cotangent (a third of attention's
  // backward products) and everything before the branch are not formed, so norm_gain_gradients()
  // holds only for norms after the branch.
  void backward_to_branch_weights(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_outputs,
                                  const BranchContext<Scalar>& context);
  // After a forward and a backward through the branch of one probe's cotangent (T rows): dL/dW
  // of the branch's matrices in full (--update). A model branch only.
  void weight_gradients(const SublayerGraph& graph, const BranchContext<Scalar>& context,
                        SublayerWeights<Scalar>& gradients) const;
  // After a forward and a backward of one probe's cotangent (T rows): dL/dgamma of every norm node,
  // per value id ((1, d); empty for other values), sum_t dL/dy * N(x).
  void norm_gain_gradients(const SublayerGraph& graph, std::vector<Mat<Scalar>>& gradients) const;

  const Mat<Scalar>& value(int id) const { return values_[id]; }
  // After backward: dL/d(value id), one (K*T, d) block per probe.
  const Mat<Scalar>& cotangent(int id) const { return cotangents_[id]; }

 private:
  // The op of the context's sublayer (branch_op.hpp), made on first use, and what it reads.
  BranchOp<Scalar>& branch_op(const BranchContext<Scalar>& context);
  const BranchOp<Scalar>& branch_op(const BranchContext<Scalar>& context) const;
  static BranchSettings branch_settings(const SublayerGraph& graph, const BranchContext<Scalar>& context) {
    return {context.heads, context.ops, graph.qkv_norm(), graph.score_scale(), graph.ffn_hidden_scale()};
  }

  void run_forward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
                   const BranchContext<Scalar>& context, const KnownOutputs<Scalar>* known);
  // How far backward goes past the branch: not into it (the skip path's share), through it, or
  // into it as far as its weights, then stop.
  enum class BranchPath { cut, through, to_weights };
  void run_backward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_outputs, BranchPath path,
                    const BranchContext<Scalar>& context, ParamGradSquares* param_grads);

  std::vector<Mat<Scalar>> values_, cotangents_, norm_stats_;
  // Norm nodes with a learned affine (BranchContext::norm_gains, norm_biases): N(x) before it,
  // which their backward, JVP and gain gradient read, valid where affine_[id] is set; every other
  // norm's values_ entry is N(x) itself. The buffers are kept across sublayers.
  std::vector<Mat<Scalar>> normed_;
  std::vector<char> affine_;
  Mat<Scalar> scaled_cotangent_;  // gamma * dL/dy, a norm backward's scratch
  // The learned gain and bias of norm node `id`, or null (gamma = 1, beta = 0).
  static const Mat<Scalar>* norm_gain(const BranchContext<Scalar>& context, int id);
  static const Mat<Scalar>* norm_bias(const BranchContext<Scalar>& context, int id);
  // A norm node's forward, backward and JVP with its learned affine (graph.cpp).
  void norm_node_forward(int id, const Mat<Scalar>& a, const BranchContext<Scalar>& context,
                         Mat<Scalar>& out);
  void norm_node_backward(int id, const Mat<Scalar>& d_out, const BranchContext<Scalar>& context,
                          Mat<Scalar>& d_a);
  void norm_node_jvp(int id, const Mat<Scalar>& d_a, const BranchContext<Scalar>& context,
                     const std::vector<Mat<Scalar>>* d_gains, Mat<Scalar>& d_out);
  // N(x) of norm node `id`.
  const Mat<Scalar>& normed(int id) const { return affine_[id] ? normed_[id] : values_[id]; }
  std::vector<char> after_branch_;  // per value id: depends on the branch output (recompute)
  std::vector<int> consumers_;      // recompute's scratch: uses of each value
  bool skipped_branch_output_ = false;
  std::vector<double> branch_output_dots_;
  std::vector<std::unique_ptr<BranchOp<Scalar>>> ops_;  // by row of branch_ops(), with their caches
  // attend nodes, per value id: the read's forward values, the keys of its input and extra source,
  // its pseudo-query, and scratch lists of its sources and their cotangents
  std::vector<DepthRead<Scalar>> reads_;
  std::vector<char> uniform_;  // per value id: the attend node read its sources' running sum
  std::vector<DepthKey<Scalar>> input_keys_, extra_keys_;
  std::vector<Mat<Scalar>> queries_;
  std::vector<DepthSource<Scalar>> sources_;
  std::vector<Mat<Scalar>*> d_sources_;
  std::vector<const Mat<Scalar>*> tangents_;
  Mat<Scalar> zero_tangent_, discard_;
  // The sources of attend node `id`: the earlier states of its stream, its input, its extra value.
  void gather_sources(const SublayerGraph& graph, const Node& node, int id,
                      const BranchContext<Scalar>& context);
  const Mat<Scalar>& query(const Node& node, int id, const BranchContext<Scalar>& context);
  static Scalar uniform_weight(const SublayerGraph& graph, const Node& node,
                               const BranchContext<Scalar>& context);
  static Scalar history_weight(const SublayerGraph& graph, const Node& node,
                               const BranchContext<Scalar>& context);
};

}  // namespace gradflow
