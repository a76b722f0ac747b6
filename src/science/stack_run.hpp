// One seed's stack with its stored states: the per-sublayer states x_0..x_S (weights regenerated
// from the seed when needed, never stored) and the operations every figure module is built on:
// forward, recompute, VJP and JVP of sublayer i (i == S: the output head). With several threads
// every op runs its pieces on a WorkPool (work_pool.hpp) and the next sublayer's weights are drawn
// by whichever thread would otherwise wait; neither changes a number.
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <vector>

#include "depth_history_store.hpp"
#include "gradflow/analysis.hpp"
#include "gradflow/graph.hpp"
#include "gradflow/initialization.hpp"
#include "gradflow/work_pool.hpp"

namespace gradflow {

template <typename Scalar>
using State = std::vector<Mat<Scalar>>;  // one (T, d) matrix per stream (K*T or P*T rows when stacked)

template <typename Scalar>
class StackRun {
 public:
  // threads: the ops' pieces run on that many threads (a model branch only; 1: on this thread).
  StackRun(const ModelConfig& config, const Architecture& arch, const Constants& constants,
           std::uint64_t seed, const AnalysisHooks& hooks, int threads);

  const ModelConfig& config() const { return config_; }
  const Architecture& arch() const { return arch_; }
  std::uint64_t seed() const { return seed_; }
  const AnalysisHooks& hooks() const { return hooks_; }
  int sublayers() const { return sublayers_; }
  SublayerContext context(int sublayer) const;
  double skip_weight(int sublayer) const { return skip_weights_[sublayer]; }
  void set_skip_weight(int sublayer, double weight) { skip_weights_[sublayer] = weight; }
  WorkPool* pool() const { return pool_.get(); }
  void release_pool() { pool_.reset(); }

  // The stored states: x_0 set by start(), x_{l+1} by forward(l).
  const std::vector<State<Scalar>>& states() const { return states_; }
  const State<Scalar>& state(int l) const { return states_[l]; }
  void start(const Mat<Scalar>& input);
  // Sublayer l forward from the stored x_l; stores x_{l+1} and its output norms' statistics, and
  // starts drawing sublayer l+1's weights. graph() and executor() then hold sublayer l's values.
  void forward(int l);

  // Builds sublayer l's graph with its weights, and starts drawing sublayer `next`'s weights
  // (the one the pass needs after l) into the other buffer.
  BranchContext<Scalar> prepare_sublayer(int l, int next = -1);
  // The output head's graph (i == S), built on the final state.
  BranchContext<Scalar> prepare_head();
  // Recomputes sublayer i's activations from its stored input (i == S: the output head).
  BranchContext<Scalar> recompute(int i);
  // The backward pass's recompute of sublayer l: post-norm placements stop before the branch's
  // output projection, since the stored x_{l+1} and its norm statistics are known; in full when
  // `in_full` (or the branch output is needed otherwise). Sublayer `next`'s weights are drawn
  // meanwhile: l - 1 for the backward pass, l + 1 for --update's pass up the stack.
  BranchContext<Scalar> recompute_for_backward(int l, bool in_full, int next);
  // Vector-Jacobian product of sublayer i (recomputed first): cotangents of x_{i+1} (of y for
  // i == S) to cotangents of x_i. For a stack that reads a history, sublayer i's VJP is only defined
  // inside begin_history_backward .. end_history_backward (below), where it also adds state i's
  // history cotangent: d_inputs is then the whole dL/dx_i.
  void vjp(int i, const State<Scalar>& d_outputs, State<Scalar>& d_inputs);
  // Jacobian-vector product of sublayer i (recomputed first): tangents of x_i to those of x_{i+1}.
  void jvp(int i, const State<Scalar>& d_inputs, State<Scalar>& d_outputs);

  // Placements that read a history (attend; found in this run's sublayer graphs): the sublayers are not
  // Markov, since sublayer l reads the history streams' values at every state 0 .. l. A backward
  // pass over such a stack brackets its VJPs, from sublayer S-1 down to 0 and each once, with
  // begin_history_backward and end_history_backward: between them every VJP also adds its shares
  // to the earlier states' history cotangents, and add_history_cotangent(l, d_state) adds state l's
  // (complete once sublayer l's VJP has run) into the cotangent of x_l. Outside them those shares
  // are dropped (the earlier states are held fixed, as in the JVP).
  bool reads_history() const { return reads_history_; }
  // The forward counterpart, for a JVP sweep up the stack from state `from` (--spectrum's forward
  // sweep): between begin_history_forward and end_history_forward, jvp(i) for i = from, from+1, ..
  // in turn also reads the earlier states' tangents (zero below `from`) and keeps its input's for
  // the later reads. Outside them a history stack's sublayer JVP is refused.
  void begin_history_forward(int from);
  void end_history_forward();
  void begin_history_backward(Eigen::Index rows);
  void add_history_cotangent(int l, State<Scalar>& d_state);
  void end_history_backward();
  // The history's pseudo-queries: per sublayer, per value id of its graph (1, d) (empty: the
  // node's initial value); dL/dw of the last VJP's attend nodes per value id ((K, d); empty for
  // other values) when keep_query_gradients(true).
  void keep_query_gradients(bool keep) { history_.d_queries = keep ? &query_gradients_ : nullptr; }
  // Every read takes all its sources, never the zero-query running sum: the pseudo-query's
  // gradient (keep_query_gradients) needs the keys' path, which the running sum skips.
  void read_history_in_full(bool full) { full_reads_ = full; }
  // Per stream: some sublayer of this run reads its history (all false without a history).
  const std::vector<bool>& history_streams() const { return history_streams_; }
  // Whether state j of history stream s is a source of its later reads (SublayerGraph::
  // history_member of sublayer j's graph; state S never is: no read follows it).
  const std::vector<std::vector<char>>& history_members() const { return history_members_; }
  bool history_member(std::size_t s, int j) const {
    return history_members_[s][static_cast<std::size_t>(j)] != 0;
  }
  const std::vector<Mat<Scalar>>& query_gradients() const { return query_gradients_; }

  const SublayerGraph& graph() const { return graph_; }
  GraphExecutor<Scalar>& executor() { return executor_; }
  const GraphExecutor<Scalar>& executor() const { return executor_; }

  // Blocks of P columns are stacked like probes, P blocks of T rows per stream; flatten turns
  // them into (n, P) matrices with n = streams * T * d, unflatten back.
  Eigen::Index entries_per_stream() const { return static_cast<Eigen::Index>(config_.seq) * config_.width; }
  Eigen::MatrixXd flatten(const State<Scalar>& block, Eigen::Index columns) const;
  void unflatten(const Eigen::MatrixXd& columns, std::size_t streams, State<Scalar>& block) const;

 private:
  BranchContext<Scalar> branch_context(const SublayerContext& ctx) const;
  void point_history_at(int l);  // history_ lists the member states among 0 .. l-1
  void ensure_weights(int l, int next);
  void start_draw(int l);

  const ModelConfig& config_;
  const Architecture& arch_;
  const Constants& constants_;
  const std::uint64_t seed_;
  const AnalysisHooks hooks_;  // a copy: callers may pass a temporary
  const int sublayers_;
  std::vector<double> skip_weights_;

  std::vector<State<Scalar>> states_;
  std::vector<State<Scalar>> output_norm_stats_;  // per sublayer: its output norms' statistics
  SublayerGraph graph_;
  GraphExecutor<Scalar> executor_;
  SublayerWeights<Scalar> weight_buffers_[2];
  int loaded_[2] = {-1, -1};   // which sublayer's weights each buffer holds, complete
  int drawing_[2] = {-1, -1};  // which sublayer's weights each buffer is being drawn for
  WeightDraw<Scalar> draws_[2];
  std::unique_ptr<WorkPool> pool_;  // null: one thread

  // The history (reads_history()): the member states of every stream some read takes
  // (history_store_), the view sublayer l's reads take, and the backward's cotangents.
  bool reads_history_ = false;
  std::vector<bool> history_streams_;               // per stream: some sublayer of this run reads its history
  std::vector<std::vector<char>> history_members_;  // per stream, per state 0 .. S: history_member
  DepthHistoryStore<Scalar> history_store_;         // the member states' values, keys and running sums
  DepthHistory<Scalar> history_;
  std::vector<std::vector<Mat<Scalar>>> history_cotangents_;
  // The uniform reads' backward (their forward takes history_store_'s running sums): per history
  // stream, the shares of the current sublayer's uniform reads and the sum of every later one's.
  std::vector<Mat<Scalar>> uniform_share_, uniform_later_;
  bool history_backward_ = false;
  bool full_reads_ = false;
  // The history JVP sweep: from which state, each history stream's tangent at every state reached
  // (a shared zero below `from`), and their running sum for the uniform reads.
  int history_forward_from_ = -1;
  std::vector<std::vector<Mat<Scalar>>> history_tangents_;
  std::vector<Mat<Scalar>> tangent_sum_;
  Mat<Scalar> zero_tangent_;
  std::vector<Mat<Scalar>> query_gradients_;
};

extern template class StackRun<float>;
extern template class StackRun<double>;

}  // namespace gradflow
