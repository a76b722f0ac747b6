#include "stack_run.hpp"

#include <stdexcept>

namespace gradflow {

namespace {
// The test-only weight nudge (AnalysisHooks::weight_nudge), applied when it targets this sublayer.
template <typename Scalar>
void nudge_weights(const ModelConfig& config, const AnalysisHooks& hooks, int sublayer,
                   SublayerWeights<Scalar>& weights) {
  if (!hooks.weight_nudge || hooks.weight_nudge->sublayer != sublayer) return;
  const auto& nudge = *hooks.weight_nudge;
  const auto specs = branch_op(config, config.sublayer_kind(sublayer)).weights(config);
  for (std::size_t m = 0; m < specs.size(); ++m) {
    if (specs[m].role == nudge.matrix)
      weights.matrices[m].data()[nudge.entry] += static_cast<Scalar>(nudge.delta);
  }
}
}  // namespace

// Every thread works on every sublayer: each op splits its work into pieces fixed by the shapes
// (work_pool.hpp), so the thread count changes no number. The caller decides: inside a parallel
// loop over runs the cores are already busy, and it asks for one.
template <typename Scalar>
StackRun<Scalar>::StackRun(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                           std::uint64_t seed, const AnalysisHooks& hooks, int threads)
    : config_(config),
      arch_(arch),
      constants_(constants),
      seed_(seed),
      hooks_(hooks),
      sublayers_(config.sublayers()),
      skip_weights_(sublayers_ + 1, 1.0) {
  if (config_.branch == BranchKind::model && threads >= 2) pool_ = std::make_unique<WorkPool>(threads);
  // Which streams' histories this run's sublayers read (attend nodes), from their graphs: a
  // placement's `when` may leave some entries unused at these sizes.
  // Which of their states are sources (a placement's [history] membership), from the same graphs.
  history_members_.assign(static_cast<std::size_t>(arch_.initial_streams),
                          std::vector<char>(static_cast<std::size_t>(sublayers_) + 1, 0));
  for (int l = 0; arch_.history_streams > 0 && l < sublayers_; ++l) {
    graph_.reset(arch_.initial_streams);
    arch_.build_sublayer(graph_, context(l));
    graph_.mark_history_streams(history_streams_);
    for (int s = 0; s < arch_.initial_streams; ++s)
      history_members_[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)] = graph_.history_member(s);
  }
  reads_history_ =
      std::find(history_streams_.begin(), history_streams_.end(), true) != history_streams_.end();
}

template <typename Scalar>
SublayerContext StackRun<Scalar>::context(int sublayer) const {
  const bool head = sublayer == sublayers_;
  return SublayerContext{config_,
                         constants_,
                         sublayer,
                         head ? config_.blocks : config_.block_of(sublayer),
                         head ? SublayerKind::ffn : config_.sublayer_kind(sublayer),
                         skip_weights_[sublayer]};
}

template <typename Scalar>
BranchContext<Scalar> StackRun<Scalar>::branch_context(const SublayerContext& ctx) const {
  return BranchContext<Scalar>{ctx.kind, config_.branch, config_.norm,      config_.heads,
                               nullptr,  pool_.get(),    block_ops(config_)};
}

template <typename Scalar>
void StackRun<Scalar>::start(const Mat<Scalar>& input) {
  states_.assign(sublayers_ + 1, {});
  output_norm_stats_.resize(sublayers_);
  states_[0].assign(arch_.initial_streams, input);
  if (reads_history()) {
    history_store_.reset(history_streams_, history_members_, sublayers_ + 1, !hooks_.attend_in_full,
                         config_.norm_eps);
    history_store_.store(0, states_[0], false);
  }
}

// The view sublayer l's reads take (DepthHistoryStore::point, the running sums unless every read is
// taken in full) with, in a history backward, the member states' cotangent accumulators and the
// uniform shares, and in a history JVP sweep their tangents.
template <typename Scalar>
void StackRun<Scalar>::point_history_at(int l) {
  history_store_.point(history_, l, !full_reads_);
  const std::size_t streams = history_streams_.size();
  history_.d_earlier.resize(streams);
  history_.uniform_share.assign(streams, nullptr);
  history_.t_earlier.resize(streams);
  history_.t_prefix.assign(streams, nullptr);
  const bool history_forward = history_forward_from_ >= 0;
  for (std::size_t s = 0; s < streams; ++s) {
    auto& d_earlier = history_.d_earlier[s];
    auto& t_earlier = history_.t_earlier[s];
    d_earlier.clear();
    t_earlier.clear();
    if (!history_store_.reads(s)) continue;
    if (history_backward_) history_.uniform_share[s] = &uniform_share_[s];
    if (history_forward) history_.t_prefix[s] = &tangent_sum_[s];
    for (int j = 0; j < l; ++j) {
      if (!history_member(s, j)) continue;
      if (history_backward_) d_earlier.push_back(&history_cotangents_[s][j]);
      if (history_forward)
        t_earlier.push_back(j < history_forward_from_ ? &zero_tangent_ : &history_tangents_[s][j]);
    }
  }
}

template <typename Scalar>
void StackRun<Scalar>::begin_history_forward(int from) {
  history_forward_from_ = from;
  history_tangents_.assign(history_streams_.size(), {});
  tangent_sum_.assign(history_streams_.size(), {});
}

template <typename Scalar>
void StackRun<Scalar>::end_history_forward() {
  history_forward_from_ = -1;
  history_tangents_.clear();
  tangent_sum_.clear();
  zero_tangent_.resize(0, 0);
}

template <typename Scalar>
void StackRun<Scalar>::begin_history_backward(Eigen::Index rows) {
  history_cotangents_.assign(history_streams_.size(), {});
  uniform_share_.assign(history_streams_.size(), {});
  uniform_later_.assign(history_streams_.size(), {});
  for (std::size_t s = 0; s < history_streams_.size(); ++s) {
    if (!history_store_.reads(s)) continue;
    history_cotangents_[s].resize(sublayers_ + 1);
    for (auto& cotangent : history_cotangents_[s]) cotangent.setZero(rows, config_.width);
    uniform_share_[s].setZero(rows, config_.width);
    uniform_later_[s].setZero(rows, config_.width);
  }
  history_backward_ = true;
}

// State l's history cotangent: the shares full reads added to it, and those of every later uniform
// read (all alike, kept once in uniform_later_; none unless state l is a member); then sublayer l's
// own uniform shares, which reach the states below l only, join the later ones.
template <typename Scalar>
void StackRun<Scalar>::add_history_cotangent(int l, State<Scalar>& d_state) {
  for (std::size_t s = 0; s < history_cotangents_.size(); ++s) {
    if (history_cotangents_[s].empty()) continue;
    d_state[s] += history_cotangents_[s][l];
    if (history_member(s, l)) d_state[s] += uniform_later_[s];
    uniform_later_[s] += uniform_share_[s];
    uniform_share_[s].setZero();
  }
}

template <typename Scalar>
void StackRun<Scalar>::end_history_backward() {
  history_backward_ = false;
  history_cotangents_.clear();
  uniform_share_.clear();
  uniform_later_.clear();
}

template <typename Scalar>
void StackRun<Scalar>::forward(int l) {
  const auto branch = prepare_sublayer(l, l + 1);
  executor_.forward(graph_, states_[l], branch);
  State<Scalar>& next = states_[l + 1];
  next.resize(graph_.outputs().size());
  for (std::size_t s = 0; s < next.size(); ++s) next[s] = executor_.value(graph_.outputs()[s]);
  executor_.output_norm_stats(graph_, output_norm_stats_[l]);  // for the backward's recompute
  if (reads_history()) history_store_.store(l + 1, states_[l + 1], false);
}

template <typename Scalar>
BranchContext<Scalar> StackRun<Scalar>::prepare_sublayer(int l, int next) {
  ensure_weights(l, next);
  const SublayerContext ctx = context(l);
  graph_.reset(static_cast<int>(states_[l].size()));
  arch_.build_sublayer(graph_, ctx);
  BranchContext<Scalar> branch = branch_context(ctx);
  branch.weights = &weight_buffers_[l % 2];
  if (reads_history()) {
    point_history_at(l);
    branch.history = &history_;
  }
  return branch;
}

template <typename Scalar>
BranchContext<Scalar> StackRun<Scalar>::prepare_head() {
  const SublayerContext head = context(sublayers_);
  graph_.reset(static_cast<int>(states_[sublayers_].size()));
  arch_.build_output(graph_, head);
  return branch_context(head);
}

template <typename Scalar>
BranchContext<Scalar> StackRun<Scalar>::recompute(int i) {
  const auto branch = i < sublayers_ ? prepare_sublayer(i) : prepare_head();
  executor_.forward(graph_, states_[i], branch);
  return branch;
}

template <typename Scalar>
BranchContext<Scalar> StackRun<Scalar>::recompute_for_backward(int l, bool in_full, int next) {
  const auto branch = prepare_sublayer(l, next);
  if (in_full) {
    executor_.forward(graph_, states_[l], branch);
  } else {
    executor_.recompute(graph_, states_[l], branch,
                        KnownOutputs<Scalar>{&states_[l + 1], &output_norm_stats_[l]});
  }
  return branch;
}

template <typename Scalar>
void StackRun<Scalar>::vjp(int i, const State<Scalar>& d_outputs, State<Scalar>& d_inputs) {
  // A history stack's sublayer: outside a history backward its VJP would hold the earlier states
  // fixed, which is not the stack's; inside one it adds their shares and completes x_i's cotangent.
  const bool sublayer_of_history = reads_history() && i < sublayers_;
  if (sublayer_of_history && !history_backward_)
    throw std::logic_error("StackRun::vjp of a history stack's sublayer outside begin_history_backward");
  const auto branch = recompute(i);
  executor_.backward(graph_, d_outputs, true, branch, d_inputs);
  if (sublayer_of_history) add_history_cotangent(i, d_inputs);
}

template <typename Scalar>
void StackRun<Scalar>::jvp(int i, const State<Scalar>& d_inputs, State<Scalar>& d_outputs) {
  // A history stack's sublayer: its JVP reads the earlier states' tangents, which only a history
  // forward sweep keeps; state i's tangent is kept before (the reads see states below i) and added
  // to the running sum after.
  const bool sublayer_of_history = reads_history() && i < sublayers_;
  if (sublayer_of_history && history_forward_from_ < 0)
    throw std::logic_error("StackRun::jvp of a history stack's sublayer outside begin_history_forward");
  if (sublayer_of_history) {
    if (i < history_forward_from_) throw std::logic_error("StackRun::jvp below the history sweep's start");
    for (std::size_t s = 0; s < history_streams_.size(); ++s) {
      if (!history_store_.reads(s)) continue;
      if (i == history_forward_from_) {
        history_tangents_[s].resize(sublayers_ + 1);
        tangent_sum_[s].setZero(d_inputs[s].rows(), d_inputs[s].cols());
        zero_tangent_.setZero(d_inputs[s].rows(), d_inputs[s].cols());
      }
      history_tangents_[s][i] = d_inputs[s];
    }
  }
  const auto branch = recompute(i);
  executor_.jvp(graph_, d_inputs, branch, d_outputs);
  if (sublayer_of_history) {
    for (std::size_t s = 0; s < history_streams_.size(); ++s)
      if (history_store_.reads(s) && history_member(s, i)) tangent_sum_[s] += d_inputs[s];
  }
}

// Sublayer l's weights live in buffer l % 2. While sublayer l is worked on, the next one's are
// drawn into the other buffer by whichever thread would otherwise wait (WeightDraw as the
// WorkPool's idle work); with one thread they are drawn here when needed. Same values either way.
template <typename Scalar>
void StackRun<Scalar>::ensure_weights(int l, int next) {
  if (config_.branch != BranchKind::model) return;
  const int buffer = l % 2;
  if (loaded_[buffer] != l) {
    if (drawing_[buffer] != l) start_draw(l);
    draws_[buffer].finish();
    nudge_weights(config_, hooks_, l, weight_buffers_[buffer]);
    loaded_[buffer] = l;
    drawing_[buffer] = -1;
  }
  if (next >= 0 && next < sublayers_ && loaded_[next % 2] != next && drawing_[next % 2] != next) {
    start_draw(next);
  }
}

template <typename Scalar>
void StackRun<Scalar>::start_draw(int l) {
  const int buffer = l % 2;
  if (pool_) pool_->clear_idle_work();  // the workers let go of the old draw first
  loaded_[buffer] = -1;
  drawing_[buffer] = l;
  draws_[buffer].plan(config_, arch_, context(l), seed_, weight_buffers_[buffer]);
  if (pool_) pool_->set_idle_work(&draws_[buffer]);
}

template <typename Scalar>
Eigen::MatrixXd StackRun<Scalar>::flatten(const State<Scalar>& block, Eigen::Index columns) const {
  const Eigen::Index per = entries_per_stream();
  Eigen::MatrixXd out(static_cast<Eigen::Index>(block.size()) * per, columns);
  for (std::size_t s = 0; s < block.size(); ++s) {
    for (Eigen::Index j = 0; j < columns; ++j) {
      out.block(static_cast<Eigen::Index>(s) * per, j, per, 1) =
          Eigen::Map<const Vec<Scalar>>(block[s].data() + j * per, per).template cast<double>();
    }
  }
  return out;
}

template <typename Scalar>
void StackRun<Scalar>::unflatten(const Eigen::MatrixXd& columns, std::size_t streams,
                                 State<Scalar>& block) const {
  const Eigen::Index per = entries_per_stream(), count = columns.cols();
  block.resize(streams);
  for (std::size_t s = 0; s < streams; ++s) {
    block[s].resize(count * config_.seq, config_.width);
    for (Eigen::Index j = 0; j < count; ++j) {
      Eigen::Map<Vec<Scalar>>(block[s].data() + j * per, per) =
          columns.block(static_cast<Eigen::Index>(s) * per, j, per, 1).template cast<Scalar>();
    }
  }
}

template class StackRun<float>;
template class StackRun<double>;

}  // namespace gradflow
