// SublayerGraph construction and its forward/backward interpreter.
#include "gradflow/graph.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "gradflow/errors.hpp"
#include "gradflow/kernels.hpp"

namespace gradflow {

void SublayerGraph::reset(int input_count) {
  input_count_ = input_count;
  nodes_.clear();
  outputs_.clear();
  update_id_ = sum_id_ = branch_id_ = -1;
  qkv_norm_ = QkvNorm::none;
  score_scale_.reset();
  ffn_hidden_scale_ = 1.0;
  non_member_streams_.clear();
  mixes_.clear();
}

Value SublayerGraph::mix_fractions(Value a, int fractions, std::vector<double> weights) {
  if (fractions < 1 ||
      weights.size() != static_cast<std::size_t>(fractions) * static_cast<std::size_t>(fractions))
    throw std::logic_error("mix_fractions needs m x m weights");
  mixes_.push_back({fractions, std::move(weights)});
  Node node{NodeOp::mix_fractions, a.id};
  node.mix = static_cast<int>(mixes_.size()) - 1;
  return push(node);
}

void SublayerGraph::set_history_member(int stream, bool member) {
  if (stream < 0 || stream >= input_count_)
    throw std::logic_error("history membership of a stream not an input");
  const auto at = std::find(non_member_streams_.begin(), non_member_streams_.end(), stream);
  if (!member && at == non_member_streams_.end()) non_member_streams_.push_back(stream);
  if (member && at != non_member_streams_.end()) non_member_streams_.erase(at);
}

bool SublayerGraph::history_member(int stream) const {
  return std::find(non_member_streams_.begin(), non_member_streams_.end(), stream) ==
         non_member_streams_.end();
}

Value SublayerGraph::input(int stream) const {
  if (stream < 0 || stream >= input_count_)
    throw std::logic_error("recipe asked for a stream the state lacks");
  return Value{stream};
}

Value SublayerGraph::push(Node node) {
  nodes_.push_back(node);
  return Value{value_count() - 1};
}

Value SublayerGraph::branch(Value a, QkvNorm qkv_norm, std::optional<double> score_scale,
                            double ffn_hidden_scale) {
  if (branch_id_ >= 0) throw std::logic_error("a sublayer graph has exactly one branch F");
  qkv_norm_ = qkv_norm;
  score_scale_ = score_scale;
  ffn_hidden_scale_ = ffn_hidden_scale;
  const Value out = push({NodeOp::branch, a.id});
  branch_id_ = out.id;
  return out;
}

void SublayerGraph::set_outputs(std::initializer_list<Value> outputs) {
  outputs_.clear();
  for (const Value v : outputs) outputs_.push_back(v.id);
}

void SublayerGraph::set_outputs(const std::vector<Value>& outputs) {
  outputs_.clear();
  for (const Value v : outputs) outputs_.push_back(v.id);
}

Value SublayerGraph::attend(Value stream, Value b, double query_init) {
  if (stream.id < 0 || stream.id >= input_count_)
    throw std::logic_error("attend reads the history of an input stream");
  return push({NodeOp::attend, stream.id, b.id, query_init});
}

Value SublayerGraph::history_sum(Value stream, bool mean) {
  if (stream.id < 0 || stream.id >= input_count_)
    throw std::logic_error("a history read takes the history of an input stream");
  return push({mean ? NodeOp::history_mean : NodeOp::history_sum, stream.id});
}

namespace {
bool is_history_read(NodeOp op) {
  return op == NodeOp::attend || op == NodeOp::history_sum || op == NodeOp::history_mean;
}
}  // namespace

bool SublayerGraph::reads_history() const {
  return std::any_of(nodes_.begin(), nodes_.end(), [](const Node& node) { return is_history_read(node.op); });
}

void SublayerGraph::mark_history_streams(std::vector<bool>& history_streams) const {
  history_streams.resize(static_cast<std::size_t>(input_count_), false);
  for (const Node& node : nodes_)
    if (is_history_read(node.op)) history_streams[static_cast<std::size_t>(node.lhs)] = true;
}

void SublayerGraph::mark_update(Value update, Value sum) {
  update_id_ = update.id;
  sum_id_ = sum.id;
}

template <typename Scalar>
BranchOp<Scalar>& GraphExecutor<Scalar>::branch_op(const BranchContext<Scalar>& context) {
  const auto index = static_cast<std::size_t>(branch_op_index(context.kind, context.ops));
  if (ops_.size() <= index) ops_.resize(index + 1);
  if (!ops_[index]) ops_[index] = branch_ops()[index].template make<Scalar>();
  return *ops_[index];
}

template <typename Scalar>
const BranchOp<Scalar>& GraphExecutor<Scalar>::branch_op(const BranchContext<Scalar>& context) const {
  const auto index = static_cast<std::size_t>(branch_op_index(context.kind, context.ops));
  if (index >= ops_.size() || !ops_[index]) throw std::logic_error("the branch op has not run forward");
  return *ops_[index];
}

bool recompute_can_skip_branch_output(const SublayerGraph& graph, std::vector<char>& after_branch,
                                      std::vector<int>& consumers) {
  const int branch = graph.branch_id();
  if (branch < 0) return false;
  after_branch.assign(graph.value_count(), 0);
  consumers.assign(graph.value_count(), 0);
  after_branch[branch] = 1;
  const auto& nodes = graph.nodes();
  for (std::size_t index = 0; index < nodes.size(); ++index) {
    const Node& node = nodes[index];
    const int id = graph.input_count() + static_cast<int>(index);
    ++consumers[node.lhs];
    if (node.rhs >= 0) ++consumers[node.rhs];
    if (id == branch) continue;
    after_branch[id] = after_branch[node.lhs] || (node.rhs >= 0 && after_branch[node.rhs]);
    if (!after_branch[id]) continue;
    const bool is_output =
        std::find(graph.outputs().begin(), graph.outputs().end(), id) != graph.outputs().end();
    switch (node.op) {
      case NodeOp::add:
      case NodeOp::scale:
      case NodeOp::mix_fractions:  // linear: its backward needs no value
        break;
      case NodeOp::norm:
      case NodeOp::unit:
        if (!is_output) return false;  // its backward needs a value only F can give
        break;
      case NodeOp::branch:
      case NodeOp::attend:  // its backward needs its sources' values
        return false;
      case NodeOp::history_sum:  // reads input streams only, so never after the branch
      case NodeOp::history_mean:
        break;
    }
  }
  const int update = graph.update_id();
  if (update == branch) return true;
  if (update < graph.input_count()) return false;
  const Node& node = nodes[update - graph.input_count()];
  return node.op == NodeOp::scale && node.lhs == branch && consumers[branch] == 1;
}

bool recompute_can_skip_branch_output(const SublayerGraph& graph) {
  std::vector<char> after_branch;
  std::vector<int> consumers;
  return recompute_can_skip_branch_output(graph, after_branch, consumers);
}

template <typename Scalar>
void GraphExecutor<Scalar>::forward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
                                    const BranchContext<Scalar>& context) {
  run_forward(graph, inputs, context, nullptr);
}

template <typename Scalar>
void GraphExecutor<Scalar>::recompute(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
                                      const BranchContext<Scalar>& context,
                                      const KnownOutputs<Scalar>& known) {
  // The check fills after_branch_, which run_forward then follows; the scratch keeps the
  // per-sublayer loop free of allocation. A learned norm affine needs N(x) before it, which the known
  // outputs do not give: such a sublayer is recomputed in full.
  const bool skip = context.branch == BranchKind::model && known.values != nullptr &&
                    known.norm_stats != nullptr && context.norm_gains == nullptr &&
                    context.norm_biases == nullptr &&
                    recompute_can_skip_branch_output(graph, after_branch_, consumers_);
  run_forward(graph, inputs, context, skip ? &known : nullptr);
}

template <typename Scalar>
void GraphExecutor<Scalar>::output_norm_stats(const SublayerGraph& graph,
                                              std::vector<Mat<Scalar>>& stats) const {
  stats.resize(graph.outputs().size());
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) {
    const int id = graph.outputs()[i];
    const bool norm =
        id >= graph.input_count() && (graph.nodes()[id - graph.input_count()].op == NodeOp::norm ||
                                      graph.nodes()[id - graph.input_count()].op == NodeOp::unit);
    if (norm) {
      stats[i] = norm_stats_[id];
    } else {
      stats[i].resize(0, 0);
    }
  }
}

template <typename Scalar>
void GraphExecutor<Scalar>::run_forward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& inputs,
                                        const BranchContext<Scalar>& context,
                                        const KnownOutputs<Scalar>* known) {
  const int count = graph.value_count();
  if (static_cast<int>(values_.size()) < count) {
    values_.resize(count);
    cotangents_.resize(count);
    norm_stats_.resize(count);
    normed_.resize(count);
    affine_.resize(count);
    reads_.resize(count);
    uniform_.resize(count);
    input_keys_.resize(count);
    extra_keys_.resize(count);
    queries_.resize(count);
  }
  skipped_branch_output_ = known != nullptr;  // then after_branch_ is recompute's analysis
  for (int i = 0; i < graph.input_count(); ++i) values_[i] = inputs[i];
  int id = graph.input_count();
  for (const Node& node : graph.nodes()) {
    Mat<Scalar>& out = values_[id];
    const Mat<Scalar>& a = values_[node.lhs];
    if (known && after_branch_[id]) {
      if (node.op == NodeOp::branch) {  // the hidden activations only: no output projection
        branch_op(context).forward(a, *context.weights, branch_settings(graph, context), out, context.pool,
                                   false);
      } else if (node.op == NodeOp::norm || node.op == NodeOp::unit) {  // an output: known
        const auto& outputs = graph.outputs();
        const auto index =
            static_cast<std::size_t>(std::find(outputs.begin(), outputs.end(), id) - outputs.begin());
        out = (*known->values)[index];
        norm_stats_[id] = (*known->norm_stats)[index];
        affine_[id] = 0;  // recompute() skips only when no norm has an affine
      }
      // Skipped values keep the shape the backward's buffers need: (T, d) like the input.
      if (out.rows() != a.rows() || out.cols() != a.cols()) out.resize(a.rows(), a.cols());
      ++id;
      continue;
    }
    switch (node.op) {
      case NodeOp::add:
        out = a + values_[node.rhs];
        break;
      case NodeOp::scale:
        out = static_cast<Scalar>(node.factor) * a;
        break;
      case NodeOp::mix_fractions: {
        const FractionMix& mix = graph.fraction_mix(node.mix);
        mix_fractions_forward(mix.fractions, mix.weights, a, out);
        break;
      }
      case NodeOp::norm:
        norm_node_forward(id, a, context, out);
        break;
      case NodeOp::unit:
        unit_rows_forward(1, a, out, norm_stats_[id]);
        break;
      case NodeOp::attend: {
        if (context.history == nullptr) throw std::logic_error("an attend node needs the stack's history");
        const auto& prefix = context.history->prefix;
        const Mat<Scalar>* earlier_sum =
            static_cast<std::size_t>(node.lhs) < prefix.size() ? prefix[node.lhs] : nullptr;
        uniform_[id] = earlier_sum != nullptr && is_zero_query(query(node, id, context));
        if (uniform_[id]) {  // every source weighs 1/n exactly: the running sum, scaled once
          if (graph.history_member(node.lhs)) {
            out = *earlier_sum + a;
            out += values_[node.rhs];
          } else {
            out = *earlier_sum + values_[node.rhs];
          }
          out *= uniform_weight(graph, node, context);
          break;
        }
        if (graph.history_member(node.lhs)) depth_key(a, context.ops.norm_eps, input_keys_[id]);
        depth_key(values_[node.rhs], context.ops.norm_eps, extra_keys_[id]);
        gather_sources(graph, node, id, context);
        depth_attention_forward<Scalar>(sources_, query(node, id, context), reads_[id]);
        out = reads_[id].out;
        break;
      }
      case NodeOp::history_sum:
      case NodeOp::history_mean: {  // fixed weights: the member states' running sum, or their mean
        const auto stream = static_cast<std::size_t>(node.lhs);
        if (context.history == nullptr) throw std::logic_error("a history read needs the stack's history");
        const auto& history = *context.history;
        if (stream < history.prefix.size() && history.prefix[stream] != nullptr) {
          out = *history.prefix[stream];
        } else {
          out.setZero(a.rows(), a.cols());
          if (stream < history.earlier.size())
            for (const DepthSource<Scalar>& source : history.earlier[stream]) out += *source.value;
        }
        if (graph.history_member(node.lhs)) out += a;
        if (node.op == NodeOp::history_mean) out *= history_weight(graph, node, context);
        break;
      }
      case NodeOp::branch:
        if (context.branch == BranchKind::rotation) {
          rotation_forward(a, out);
        } else {
          branch_op(context).forward(a, *context.weights, branch_settings(graph, context), out, context.pool,
                                     true);
        }
        break;
    }
    ++id;
  }
}

template <typename Scalar>
void GraphExecutor<Scalar>::backward(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_outputs,
                                     bool through_branch, const BranchContext<Scalar>& context,
                                     std::vector<Mat<Scalar>>& d_inputs, ParamGradSquares* param_grads) {
  run_backward(graph, d_outputs, through_branch ? BranchPath::through : BranchPath::cut, context,
               param_grads);
  d_inputs.resize(graph.input_count());
  for (int i = 0; i < graph.input_count(); ++i) d_inputs[i] = cotangents_[i];
}

template <typename Scalar>
void GraphExecutor<Scalar>::backward_to_branch_weights(const SublayerGraph& graph,
                                                       const std::vector<Mat<Scalar>>& d_outputs,
                                                       const BranchContext<Scalar>& context) {
  run_backward(graph, d_outputs, BranchPath::to_weights, context, nullptr);
}

template <typename Scalar>
void GraphExecutor<Scalar>::run_backward(const SublayerGraph& graph,
                                         const std::vector<Mat<Scalar>>& d_outputs, BranchPath path,
                                         const BranchContext<Scalar>& context,
                                         ParamGradSquares* param_grads) {
  // Single entries of a renormalised cotangent can be subnormal (Post-LN damps some tokens' gradient
  // far faster than others; a history stack's cotangents, never renormalised, as well); flushed to
  // zero they cost nothing and change no figure (kernels.hpp).
  const SubnormalsFlushed flushed;
  const Eigen::Index rows = d_outputs.front().rows();
  for (int id = 0; id < graph.value_count(); ++id) cotangents_[id].setZero(rows, values_[id].cols());
  if (context.history != nullptr &&
      context.history->d_queries != nullptr)  // this sublayer's attend nodes only
    context.history->d_queries->assign(static_cast<std::size_t>(graph.value_count()), Mat<Scalar>());
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) cotangents_[graph.outputs()[i]] += d_outputs[i];

  const auto& nodes = graph.nodes();
  for (int index = static_cast<int>(nodes.size()) - 1; index >= 0; --index) {
    const Node& node = nodes[index];
    const int id = graph.input_count() + index;
    const Mat<Scalar>& d_out = cotangents_[id];
    Mat<Scalar>& d_a = cotangents_[node.lhs];
    switch (node.op) {
      case NodeOp::add:
        d_a += d_out;
        cotangents_[node.rhs] += d_out;
        break;
      case NodeOp::scale:
        d_a += static_cast<Scalar>(node.factor) * d_out;
        break;
      case NodeOp::mix_fractions: {
        const FractionMix& mix = graph.fraction_mix(node.mix);
        mix_fractions_backward(mix.fractions, mix.weights, d_out, d_a);
        break;
      }
      case NodeOp::norm:
        norm_node_backward(id, d_out, context, d_a);
        break;
      case NodeOp::unit:
        unit_rows_backward(1, values_[id], norm_stats_[id], d_out, d_a);
        break;
      case NodeOp::attend: {
        const bool input_member = graph.history_member(node.lhs);
        if (uniform_[id]) {  // a g to the input (a member), to e, and once for all the earlier states
          const Scalar weight = uniform_weight(graph, node, context);
          if (input_member) d_a += weight * d_out;
          cotangents_[node.rhs] += weight * d_out;
          const auto& shares = context.history->uniform_share;
          if (static_cast<std::size_t>(node.lhs) < shares.size() && shares[node.lhs] != nullptr)
            *shares[node.lhs] += weight * d_out;
          if (context.history->d_queries != nullptr)
            throw std::logic_error(
                "the pseudo-query's gradient needs the read in full (DepthHistory::prefix unset)");
          break;
        }
        gather_sources(graph, node, id, context);
        const std::size_t earlier = sources_.size() - (input_member ? 2 : 1);
        const auto& d_earlier = context.history->d_earlier;
        const bool kept =
            static_cast<std::size_t>(node.lhs) < d_earlier.size() && !d_earlier[node.lhs].empty();
        if (kept && d_earlier[node.lhs].size() != earlier)
          throw std::logic_error("an attend node's history cotangents do not match its earlier states");
        d_sources_.clear();
        if (kept) {
          d_sources_.assign(d_earlier[node.lhs].begin(), d_earlier[node.lhs].end());
        } else {  // no accumulators given: the earlier states' shares are not wanted
          discard_.setZero(rows, d_out.cols());
          d_sources_.assign(earlier, &discard_);
        }
        if (input_member) d_sources_.push_back(&d_a);
        d_sources_.push_back(&cotangents_[node.rhs]);
        Mat<Scalar>* d_query = nullptr;
        if (auto* d_queries = context.history->d_queries) {
          d_query = &(*d_queries)[id];
          d_query->setZero(rows / values_[id].rows(), d_out.cols());
        }
        depth_attention_backward<Scalar>(sources_, query(node, id, context), reads_[id], d_out, d_sources_,
                                         d_query);
        break;
      }
      case NodeOp::history_sum:
      case NodeOp::history_mean: {  // weight * g to every member state: the input now, the earlier
        // ones once, spread by the stack (StackRun::add_history_cotangent; unset: not wanted)
        const auto stream = static_cast<std::size_t>(node.lhs);
        const Scalar weight = history_weight(graph, node, context);
        if (graph.history_member(node.lhs)) d_a += weight * d_out;
        const auto& shares = context.history->uniform_share;
        if (stream < shares.size() && shares[stream] != nullptr) *shares[stream] += weight * d_out;
        break;
      }
      case NodeOp::branch: {
        if (path == BranchPath::cut) break;
        // Nodes come in topological order, so none before the branch reads it: to_weights stops.
        const bool to_weights = path == BranchPath::to_weights;
        Mat<Scalar>* d_input = to_weights ? nullptr : &d_a;
        // <dL/dF, F> only for the probe backward (to_weights, like dx = nullptr, wants neither).
        std::vector<double>* output_dots =
            skipped_branch_output_ && !to_weights ? &branch_output_dots_ : nullptr;
        if (context.branch == BranchKind::rotation) {
          if (!to_weights) rotation_backward(d_out, d_a);
        } else {
          branch_op(context).backward(values_[node.lhs], *context.weights, branch_settings(graph, context),
                                      d_out, d_input, param_grads, context.pool, output_dots);
        }
        if (to_weights) return;
        break;
      }
    }
  }
}

template <typename Scalar>
void GraphExecutor<Scalar>::jvp(const SublayerGraph& graph, const std::vector<Mat<Scalar>>& d_inputs,
                                const BranchContext<Scalar>& context, std::vector<Mat<Scalar>>& d_outputs,
                                const SublayerWeights<Scalar>* d_weights,
                                const std::vector<Mat<Scalar>>* d_gains) {
  const Eigen::Index rows = d_inputs.front().rows();
  for (int i = 0; i < graph.input_count(); ++i) cotangents_[i] = d_inputs[i];  // reused as tangents
  int id = graph.input_count();
  for (const Node& node : graph.nodes()) {
    Mat<Scalar>& d_out = cotangents_[id];
    const Mat<Scalar>& d_a = cotangents_[node.lhs];
    switch (node.op) {
      case NodeOp::add:
        d_out = d_a + cotangents_[node.rhs];
        break;
      case NodeOp::scale:
        d_out = static_cast<Scalar>(node.factor) * d_a;
        break;
      case NodeOp::mix_fractions: {  // linear: the map applied to the tangent
        const FractionMix& mix = graph.fraction_mix(node.mix);
        mix_fractions_forward(mix.fractions, mix.weights, d_a, d_out);
        break;
      }
      case NodeOp::norm:
        norm_node_jvp(id, d_a, context, d_gains, d_out);
        break;
      case NodeOp::unit:
        d_out.setZero(rows, values_[id].cols());
        unit_rows_backward(1, values_[id], norm_stats_[id], d_a, d_out);
        break;
      case NodeOp::attend: {  // the earlier states' tangents if the history has them, else zero
        const auto lhs = static_cast<std::size_t>(node.lhs);
        const auto& t_prefix = context.history->t_prefix;
        const auto& t_earlier = context.history->t_earlier;
        const bool input_member = graph.history_member(node.lhs);
        if (uniform_[id]) {
          if (input_member) {
            d_out = d_a + cotangents_[node.rhs];
          } else {
            d_out = cotangents_[node.rhs];
          }
          if (lhs < t_prefix.size() && t_prefix[lhs] != nullptr) d_out += *t_prefix[lhs];
          d_out *= uniform_weight(graph, node, context);
          break;
        }
        gather_sources(graph, node, id, context);
        const std::size_t earlier = sources_.size() - (input_member ? 2 : 1);
        if (lhs < t_earlier.size() && !t_earlier[lhs].empty()) {
          if (t_earlier[lhs].size() != earlier)
            throw std::logic_error("an attend node's history tangents do not match its earlier states");
          tangents_.assign(t_earlier[lhs].begin(), t_earlier[lhs].end());
        } else {
          zero_tangent_.setZero(rows, values_[id].cols());
          tangents_.assign(earlier, &zero_tangent_);
        }
        if (input_member) tangents_.push_back(&d_a);
        tangents_.push_back(&cotangents_[node.rhs]);
        depth_attention_jvp<Scalar>(sources_, query(node, id, context), reads_[id], tangents_, nullptr,
                                    d_out);
        break;
      }
      case NodeOp::history_sum:
      case NodeOp::history_mean: {  // the earlier member states' tangents if the history has them
        const auto stream = static_cast<std::size_t>(node.lhs);
        const auto& t_prefix = context.history->t_prefix;
        const auto& t_earlier = context.history->t_earlier;
        if (stream < t_prefix.size() && t_prefix[stream] != nullptr) {
          d_out = *t_prefix[stream];
        } else {
          d_out.setZero(rows, values_[id].cols());
          if (stream < t_earlier.size())
            for (const Mat<Scalar>* tangent : t_earlier[stream]) d_out += *tangent;
        }
        if (graph.history_member(node.lhs)) d_out += d_a;
        d_out *= history_weight(graph, node, context);
        break;
      }
      case NodeOp::branch:
        if (context.branch == BranchKind::rotation) {
          rotation_forward(d_a, d_out);
        } else {
          branch_op(context).jvp(values_[node.lhs], *context.weights, branch_settings(graph, context), d_a,
                                 d_out, d_weights);
        }
        break;
    }
    ++id;
  }
  d_outputs.resize(graph.outputs().size());
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) d_outputs[i] = cotangents_[graph.outputs()[i]];
}

template <typename Scalar>
void GraphExecutor<Scalar>::weight_gradients(const SublayerGraph& graph, const BranchContext<Scalar>& context,
                                             SublayerWeights<Scalar>& gradients) const {
  const int branch = graph.branch_id();
  const Mat<Scalar>& input = values_[graph.nodes()[branch - graph.input_count()].lhs];
  branch_op(context).weight_gradients(input, branch_settings(graph, context), cotangents_[branch], gradients,
                                      context.weights->has_bias(), context.pool);
}

template <typename Scalar>
void GraphExecutor<Scalar>::norm_gain_gradients(const SublayerGraph& graph,
                                                std::vector<Mat<Scalar>>& gradients) const {
  gradients.resize(graph.value_count());
  for (int id = 0; id < graph.value_count(); ++id) {
    const bool norm = id >= graph.input_count() && graph.nodes()[id - graph.input_count()].op == NodeOp::norm;
    if (!norm) {
      gradients[id].resize(0, 0);
      continue;
    }
    // y = gamma * N(x) + beta: dL/dgamma = sum over tokens of dL/dy * N(x).
    gradients[id] = (cotangents_[id].array() * normed(id).array()).colwise().sum().matrix();
  }
}

// y = gamma * N(x) + beta; N(x) kept in normed_ when there is an affine.
template <typename Scalar>
void GraphExecutor<Scalar>::norm_node_forward(int id, const Mat<Scalar>& a,
                                              const BranchContext<Scalar>& context, Mat<Scalar>& out) {
  const Mat<Scalar>* gain = norm_gain(context, id);
  const Mat<Scalar>* bias = norm_bias(context, id);
  affine_[id] = gain != nullptr || bias != nullptr;
  if (!affine_[id]) return norm_forward(context.norm, 1, a, out, norm_stats_[id], context.ops.norm_eps);
  norm_forward(context.norm, 1, a, normed_[id], norm_stats_[id], context.ops.norm_eps);
  out = normed_[id];
  if (gain != nullptr) out.array().rowwise() *= gain->array().row(0);
  if (bias != nullptr) out.rowwise() += bias->row(0);
}

// d_a += N'(x)^T (gamma * dL/dy).
template <typename Scalar>
void GraphExecutor<Scalar>::norm_node_backward(int id, const Mat<Scalar>& d_out,
                                               const BranchContext<Scalar>& context, Mat<Scalar>& d_a) {
  const Mat<Scalar>* gain = norm_gain(context, id);
  if (gain == nullptr) return norm_backward(context.norm, 1, normed(id), norm_stats_[id], d_out, d_a);
  scaled_cotangent_ = d_out;
  scaled_cotangent_.array().rowwise() *= gain->array().row(0);
  norm_backward(context.norm, 1, normed(id), norm_stats_[id], scaled_cotangent_, d_a);
}

// dy = gamma * N'(x) dx + dgamma * N(x) (product rule); N's Jacobian is symmetric, so its
// backward is its JVP.
template <typename Scalar>
void GraphExecutor<Scalar>::norm_node_jvp(int id, const Mat<Scalar>& d_a,
                                          const BranchContext<Scalar>& context,
                                          const std::vector<Mat<Scalar>>* d_gains, Mat<Scalar>& d_out) {
  d_out.setZero(d_a.rows(), values_[id].cols());
  norm_backward(context.norm, 1, normed(id), norm_stats_[id], d_a, d_out);
  if (const Mat<Scalar>* gain = norm_gain(context, id)) d_out.array().rowwise() *= gain->array().row(0);
  if (d_gains && (*d_gains)[id].size() != 0)
    d_out.array() += normed(id).array().rowwise() * (*d_gains)[id].array().row(0);
}

namespace {
// Entry `id` of a per-value-id list of (1, d) parameters, or null where the list or the entry is empty.
template <typename Scalar>
const Mat<Scalar>* entry_of(const std::vector<Mat<Scalar>>* list, int id) {
  return list != nullptr && static_cast<std::size_t>(id) < list->size() && (*list)[id].size() != 0
             ? &(*list)[id]
             : nullptr;
}
}  // namespace

template <typename Scalar>
const Mat<Scalar>* GraphExecutor<Scalar>::norm_gain(const BranchContext<Scalar>& context, int id) {
  return entry_of(context.norm_gains, id);
}

template <typename Scalar>
const Mat<Scalar>* GraphExecutor<Scalar>::norm_bias(const BranchContext<Scalar>& context, int id) {
  return entry_of(context.norm_biases, id);
}

template <typename Scalar>
void GraphExecutor<Scalar>::gather_sources(const SublayerGraph& graph, const Node& node, int id,
                                           const BranchContext<Scalar>& context) {
  if (context.history == nullptr) throw std::logic_error("an attend node needs the stack's history");
  const auto& earlier = context.history->earlier;
  sources_.clear();
  if (static_cast<std::size_t>(node.lhs) < earlier.size())
    sources_.assign(earlier[node.lhs].begin(), earlier[node.lhs].end());
  if (graph.history_member(node.lhs)) sources_.push_back({&values_[node.lhs], &input_keys_[id]});
  sources_.push_back({&values_[node.rhs], &extra_keys_[id]});
}

// 1/n for the n sources of sublayer l's read: the earlier member states, the input when it is a
// member, and e (n = l + 2 when every state is); the same correctly rounded weight the full read's
// softmax gives each source at a zero query.
template <typename Scalar>
Scalar GraphExecutor<Scalar>::uniform_weight(const SublayerGraph& graph, const Node& node,
                                             const BranchContext<Scalar>& context) {
  const auto& earlier = context.history->earlier;
  const std::size_t count =
      (static_cast<std::size_t>(node.lhs) < earlier.size() ? earlier[node.lhs].size() : 0) +
      (graph.history_member(node.lhs) ? 2 : 1);
  return Scalar(1) / static_cast<Scalar>(count);
}

// A fixed-weight read's weight on each of its member states: 1 for history_sum, 1/n for the n of
// history_mean (the earlier member states and the input when it is a member; at least one).
template <typename Scalar>
Scalar GraphExecutor<Scalar>::history_weight(const SublayerGraph& graph, const Node& node,
                                             const BranchContext<Scalar>& context) {
  if (node.op != NodeOp::history_mean) return Scalar(1);
  const auto& earlier = context.history->earlier;
  const std::size_t count =
      (static_cast<std::size_t>(node.lhs) < earlier.size() ? earlier[node.lhs].size() : 0) +
      (graph.history_member(node.lhs) ? 1 : 0);
  if (count == 0)
    throw InputError(
        "history_mean(...) reads a stream's history before any of its states is a member: its "
        "[history] condition must hold at some state at or before the read (e.g. l == 0)");
  return Scalar(1) / static_cast<Scalar>(count);
}

template <typename Scalar>
const Mat<Scalar>& GraphExecutor<Scalar>::query(const Node& node, int id,
                                                const BranchContext<Scalar>& context) {
  const auto* given = context.history != nullptr ? context.history->queries : nullptr;
  if (given != nullptr && static_cast<std::size_t>(id) < given->size() && (*given)[id].size() != 0)
    return (*given)[id];
  queries_[id].setConstant(1, values_[node.lhs].cols(), static_cast<Scalar>(node.factor));
  return queries_[id];
}

template class GraphExecutor<float>;
template class GraphExecutor<double>;

}  // namespace gradflow
