// The model update (metrics.md, "The model update"; issue 18): one optimizer step on probe 0's
// loss L = sum(U * y) for every weight matrix (and, with --bias, every bias), then the forward pass again
// from the same input. DeepNet's argument (Wang et al. 2022, arXiv 2203.00555, Sec. 3 Fig. 3 and Sec. 4) is
// about the size of this move, ||F(x, theta + Delta theta) - F(x, theta)||, not about the gradient at init.
//
// Weights are drawn from the seed, never stored, and so are the stepped ones: the probe backward
// kept probe 0's cotangent of every state (as the forward kept the states), so the stepped forward
// pass recomputes sublayer l from x_l, back-propagates the cotangent of x_{l+1} to sublayer l's
// weight gradient, forms Delta theta_l, and runs sublayer l with theta_l + Delta theta_l on the
// stepped state. The gradient is transient: memory is the states and the cotangents.
//
// A stack that reads a history (attend; docs/placement-files.md, "Reading a history") is stepped the
// same way, with two additions. Stepped sublayer l reads the stepped states 0 .. l, so each learning
// rate's pass keeps its own history (SteppedHistory). And with --update-params all the reads'
// pseudo-queries w are parameters too (Kimi Team 2026, arXiv 2603.15031, Sec. 3.1: learned, zero at
// init): dL/dw comes from the same backward as the gains, with every read taken in full (the
// zero-query running sum has no keys' path), and w + Delta w is read in the stepped pass. Its
// <g, Delta w> is in update_loss. It has no step_rel: like a bias, w starts at zero in the paper, where
// a relative step has no scale (a file may start it at another constant q; its step is then still
// only in update_loss).
#include "update.hpp"

#include "gradflow/depth_attention.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// A stepped pass's history (a stack that reads one): the stepped member states so far (copies, since
// the stepped state is overwritten) with their keys and running sums, the view the stepped reads
// take, and the stepped pseudo-queries.
template <typename Scalar>
struct SteppedHistory {
  DepthHistoryStore<Scalar> store;
  DepthHistory<Scalar> view;
  std::vector<Mat<Scalar>> queries;  // --update-params all: w + Delta w per value id of the sublayer
};

// The view stepped sublayer l reads: the member stepped states among 0 .. l-1 of each history stream
// (the input is its own source), their running sum, and the stepped pseudo-queries; no cotangents (a
// forward pass).
template <typename Scalar>
DepthHistory<Scalar>* point_at(SteppedHistory<Scalar>& history, int l, bool stepped_queries) {
  DepthHistory<Scalar>& view = history.view;
  history.store.point(view, l, true);
  view.d_earlier.assign(view.earlier.size(), {});
  view.uniform_share.assign(view.earlier.size(), nullptr);
  view.queries = stepped_queries ? &history.queries : nullptr;
  view.d_queries = nullptr;
  return &view;
}

// One learning rate's pass in progress: the stepped state and its sums.
template <typename Scalar>
struct SteppedPass {
  State<Scalar> state;
  SteppedHistory<Scalar> history;  // empty unless the stack reads a history
  double step_squares[kMatrixKindCount] = {};
  double gain_step_squares = 0;  // --update-params all: sum of Delta gamma^2 over every norm
  bool finite = true;
};

// update_rms and log10_update_rel of stepped state l; false when it has a non-finite entry.
template <typename Scalar>
bool record_moved_state(SeedResult& result, int i, int l, const State<Scalar>& stepped,
                        const State<Scalar>& original) {
  double moved = 0, norm = 0, count = 0;
  for (std::size_t s = 0; s < stepped.size(); ++s) {
    moved += squared_distance(stepped[s].data(), original[s].data(), stepped[s].size());
    norm += squared_norm(original[s]);
    count += static_cast<double>(stepped[s].size());
  }
  if (!std::isfinite(moved)) return false;
  result.states.at({Figure::update_rms, i + 1})[l] = std::sqrt(moved / count);
  result.states.at({Figure::log10_update_rel, i + 1})[l] = 0.5 * std::log10(moved / norm);
  return true;
}

// The output head on the stepped final state: output_update_rel and the measured Delta L, formed
// as sum(U * (y' - y)) so that no digits cancel in L' - L.
template <typename Scalar>
void record_output(StackRun<Scalar>& run, const State<Scalar>& stepped,
                   const std::vector<Mat<Scalar>>* head_gains, UpdateStep& step) {
  auto head = run.prepare_head();
  run.executor().forward(run.graph(), run.state(run.sublayers()), head);
  const Mat<double> y = run.executor().value(run.graph().outputs().front()).template cast<double>();
  head.norm_gains = head_gains;  // the output norm's stepped gain (--update-params all)
  run.executor().forward(run.graph(), stepped, head);
  const Mat<double> moved = run.executor().value(run.graph().outputs().front()).template cast<double>() - y;
  const Mat<double> probe =
      make_probes<Scalar>(run.config(), run.seed()).topRows(run.config().seq).template cast<double>();
  step.output_update_rel = moved.norm() / y.norm();
  step.delta_loss = (moved.array() * probe.array()).sum();
}

// gamma + Delta gamma with gamma = 1, per value id (empty where there is no norm).
template <typename Scalar>
void stepped_gains(const std::vector<Mat<Scalar>>& step, std::vector<Mat<Scalar>>& stepped) {
  stepped.resize(step.size());
  for (std::size_t id = 0; id < step.size(); ++id) stepped[id] = (step[id].array() + Scalar(1)).matrix();
}

// The number of gain entries, ||gamma||^2 at gamma = 1.
template <typename Scalar>
double gain_count(const std::vector<Mat<Scalar>>& gains) {
  double count = 0;
  for (const auto& gain : gains) count += static_cast<double>(gain.size());
  return count;
}

// The output head's norm gains (--update-params all): their gradient from probe 0's U, their step
// at each learning rate (part of delta_loss_first_order, in no sublayer's update_loss), and the
// head run with gamma + Delta gamma.
template <typename Scalar>
struct HeadGains {
  std::vector<Mat<Scalar>> gradient, step, stepped;
};

template <typename Scalar>
void head_gain_gradient(StackRun<Scalar>& run, std::vector<Mat<Scalar>>& gradient) {
  const auto head = run.prepare_head();
  run.executor().forward(run.graph(), run.state(run.sublayers()), head);
  const State<Scalar> probe0 = {
      Mat<Scalar>(make_probes<Scalar>(run.config(), run.seed()).topRows(run.config().seq))};
  State<Scalar> d_input;
  run.executor().backward(run.graph(), probe0, true, head, d_input);
  run.executor().norm_gain_gradients(run.graph(), gradient);
}

// After the last sublayer: the head's gain step, the output figures, update_loss_share and the
// step sizes per kind.
template <typename Scalar>
void finish_update(StackRun<Scalar>& run, SteppedPass<Scalar>& pass, HeadGains<Scalar>* head,
                   const std::vector<double>& weight_squares, double gain_squares, SeedResult& result,
                   int i) {
  UpdateStep& step = result.updates[i];
  if (!pass.finite) return;
  if (head) {
    const double loss =
        gain_step(run.config().update, run.config().learning_rates[i], head->gradient, 0.0, head->step);
    step.delta_loss_first_order += loss;
    for (const auto& delta : head->step) pass.gain_step_squares += squared_norm(delta);
    stepped_gains(head->step, head->stepped);
    gain_squares += gain_count(head->stepped);
  }
  record_output(run, pass.state, head ? &head->stepped : nullptr, step);
  auto& share = result.sublayers.at({Figure::update_loss_share, i + 1});
  const auto& loss = result.sublayers.at({Figure::update_loss, i + 1});
  for (std::size_t l = 0; l < share.size(); ++l) share[l] = loss[l] / step.delta_loss_first_order;
  for (int m = 0; m < kMatrixKindCount; ++m) {
    if (weight_squares[m] > 0) step.step_rel[m] = std::sqrt(pass.step_squares[m] / weight_squares[m]);
  }
  if (gain_squares > 0) step.step_rel_norm_gain = std::sqrt(pass.gain_step_squares / gain_squares);
}
}  // namespace

template <typename Scalar>
BranchContext<Scalar> sublayer_weight_gradient(SeedAnalysis<Scalar>& analysis, int l,
                                               SublayerWeights<Scalar>& gradient,
                                               std::vector<Mat<Scalar>>* gain_gradient) {
  StackRun<Scalar>& run = analysis.run;
  // The weight gradients need the branch's activations, not its output: post-norm placements
  // skip the output projection, as the backward pass does.
  const auto branch = run.recompute_for_backward(l, false, l + 1);
  const State<Scalar>& d_output = analysis.probes.probe0_cotangent[l + 1];
  if (gain_gradient) {  // a norm before the branch needs the cotangent of the branch's input
    State<Scalar> d_input;
    run.executor().backward(run.graph(), d_output, true, branch, d_input);
    run.executor().norm_gain_gradients(run.graph(), *gain_gradient);
  } else {
    run.executor().backward_to_branch_weights(run.graph(), d_output, branch);
  }
  run.executor().weight_gradients(run.graph(), branch, gradient);
  return branch;
}

// Adam's first step (Kingma & Ba 2014, arXiv 1412.6980, Alg. 1): m = (1 - b1) g and v = (1 - b2) g^2,
// bias-corrected m^ = g and v^ = g^2, so Delta theta = -eta g / (|g| + eps), eps = 1e-8; with
// g = exp(log_scale) * scaled, -eta scaled / (|scaled| + eps exp(-log_scale)). SGD: -eta g.
template <typename Dense>
void rule_step(UpdateRule rule, double lr, const Dense& g, double log_scale, Dense& delta) {
  using Scalar = typename Dense::Scalar;
  if (rule == UpdateRule::sgd) {
    delta = static_cast<Scalar>(-lr * std::exp(log_scale)) * g;
  } else {
    const auto eps = static_cast<Scalar>(kAdamEpsilon * std::exp(-log_scale));
    delta = (static_cast<Scalar>(-lr) * g.array() / (g.array().abs() + eps)).matrix();
  }
}

template <typename Scalar>
double optimizer_step(UpdateRule rule, double lr, const SublayerWeights<Scalar>& scaled, double log_scale,
                      SublayerWeights<Scalar>& step, WorkPool* pool) {
  const std::size_t count = scaled.matrices.size();
  step.resize(count);
  std::vector<double> inners(count, 0.0);
  for_each_weight(count, pool, [&](int m) {
    rule_step(rule, lr, scaled.matrices[m], log_scale, step.matrices[m]);
    inners[m] = lane_dot(scaled.matrices[m].data(), step.matrices[m].data(), scaled.matrices[m].size());
    rule_step(rule, lr, scaled.biases[m], log_scale, step.biases[m]);  // empty without --bias
    inners[m] += lane_dot(scaled.biases[m].data(), step.biases[m].data(), scaled.biases[m].size());
  });
  double inner = 0;  // <g / exp(log_scale), Delta theta>
  for (const double part : inners) inner += part;
  return inner * std::exp(log_scale);  // update_loss = <g, Delta theta>
}

template <typename Scalar>
double gain_step(UpdateRule rule, double lr, const std::vector<Mat<Scalar>>& scaled, double log_scale,
                 std::vector<Mat<Scalar>>& step) {
  step.resize(scaled.size());
  double inner = 0;
  for (std::size_t id = 0; id < scaled.size(); ++id) {
    if (scaled[id].size() == 0) {
      step[id].resize(0, 0);
      continue;
    }
    rule_step(rule, lr, scaled[id], log_scale, step[id]);
    inner += lane_dot(scaled[id].data(), step[id].data(), scaled[id].size());
  }
  return inner * std::exp(log_scale);
}

namespace {
// The placement's multiplier on --lr for sublayer l's parameters (1 when it declares none).
template <typename Scalar>
double learning_rate_scale(const StackRun<Scalar>& run, int l) {
  if (!run.arch().learning_rate_scale) return 1.0;
  return run.arch().learning_rate_scale(run.context(l), run.config().update);
}

// Sublayer l's stepped forward at learning rate i: theta_l + Delta theta_l (and gamma + Delta
// gamma with --update-params all) on the stepped state; update_loss and the step sizes.
template <typename Scalar>
struct SublayerStep {
  SublayerWeights<Scalar> gradient, step, stepped;
  std::vector<Mat<Scalar>> gain_gradient, gain_step, gain_stepped;
  // --update-params all on a history: dL/dw of the sublayer's reads and w at init, per value id
  // (empty for other values), and this learning rate's Delta w.
  std::vector<Mat<Scalar>> query_gradient, query_init, query_step;
};

// The pseudo-queries' gradients of the sublayer whose backward just ran, and their values at init
// (the attend node's constant in every entry).
template <typename Scalar>
void collect_query_gradients(const StackRun<Scalar>& run, SublayerStep<Scalar>& work) {
  const SublayerGraph& graph = run.graph();
  work.query_gradient = run.query_gradients();
  work.query_gradient.resize(static_cast<std::size_t>(graph.value_count()));
  work.query_init.assign(static_cast<std::size_t>(graph.value_count()), Mat<Scalar>());
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    const Node& node = graph.nodes()[n];
    const std::size_t id = static_cast<std::size_t>(graph.input_count()) + n;
    if (node.op == NodeOp::attend && work.query_gradient[id].size() != 0)
      work.query_init[id].setConstant(1, work.query_gradient[id].cols(), static_cast<Scalar>(node.factor));
  }
}

template <typename Scalar>
void step_sublayer(SeedAnalysis<Scalar>& analysis, int l, int i, const std::vector<WeightSpec>& specs,
                   BranchContext<Scalar>& branch, SublayerStep<Scalar>& work, SteppedPass<Scalar>& pass) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  SeedResult& result = analysis.result;
  const double log_scale = analysis.probes.probe0_log_scale[l + 1];
  const SublayerWeights<Scalar>& weights = *branch.weights;
  // A placement may scale the learning rate with depth (CompleteP, depth-muP): every parameter of
  // the sublayer takes --lr times its learning_rate_scale; the output head keeps --lr.
  const double lr = config.learning_rates[i] * learning_rate_scale(run, l);
  double loss = optimizer_step(config.update, lr, work.gradient, log_scale, work.step, branch.pool);
  // step_rel is over the matrices, by kind: the biases start at zero, so their relative step has no scale.
  work.stepped.resize(specs.size());
  std::vector<double> step_squares(specs.size());
  for_each_weight(specs.size(), branch.pool, [&](int m) {
    step_squares[m] = squared_norm(work.step.matrices[m]);
    work.stepped.matrices[m] = weights.matrices[m] + work.step.matrices[m];
    work.stepped.biases[m] = weights.biases[m] + work.step.biases[m];
  });
  for (std::size_t m = 0; m < specs.size(); ++m)
    pass.step_squares[static_cast<int>(specs[m].role)] += step_squares[m];
  if (config.update_norm_gains) {
    loss += gain_step(config.update, lr, work.gain_gradient, log_scale, work.gain_step);
    for (const auto& delta : work.gain_step) pass.gain_step_squares += squared_norm(delta);
    stepped_gains(work.gain_step, work.gain_stepped);
    branch.norm_gains = &work.gain_stepped;
  }
  const bool stepped_queries = config.update_norm_gains && !work.query_gradient.empty();
  if (stepped_queries) {  // w + Delta w for every read of the sublayer (empty elsewhere: its init)
    loss += gain_step(config.update, lr, work.query_gradient, log_scale, work.query_step);
    pass.history.queries.resize(work.query_step.size());
    for (std::size_t id = 0; id < work.query_step.size(); ++id)
      pass.history.queries[id] = work.query_step[id].size() != 0
                                     ? Mat<Scalar>(work.query_init[id] + work.query_step[id])
                                     : Mat<Scalar>();
  }
  result.sublayers.at({Figure::update_loss, i + 1})[l] = loss;
  result.updates[i].delta_loss_first_order += loss;
  branch.weights = &work.stepped;
  DepthHistory<Scalar>* const history = branch.history;
  if (run.reads_history()) branch.history = point_at(pass.history, l, stepped_queries);
  run.executor().forward(run.graph(), pass.state, branch);
  branch.weights = &weights;
  branch.norm_gains = nullptr;
  branch.history = history;
  pass.state.resize(run.graph().outputs().size());
  for (std::size_t s = 0; s < pass.state.size(); ++s)
    pass.state[s] = run.executor().value(run.graph().outputs()[s]);
  if (run.reads_history()) pass.history.store.store(l + 1, pass.state, true);
  pass.finite = record_moved_state(result, i, l + 1, pass.state, run.state(l + 1));
  if (!pass.finite) result.updates[i].diverged_state = l + 1;
}
}  // namespace

template <typename Scalar>
void compute_update(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  SeedResult& result = analysis.result;
  const int count = config.update_count();
  std::vector<SteppedPass<Scalar>> passes(count);
  std::vector<double> weight_squares(kMatrixKindCount, 0.0);
  double gain_squares = 0;  // ||gamma||^2 over the sublayers' norms
  result.updates.assign(count, {});
  for (int i = 0; i < count; ++i) {
    passes[i].state = run.state(0);
    result.updates[i].learning_rate = config.learning_rates[i];
    result.updates[i].delta_loss_first_order = 0.0;
    record_moved_state(result, i, 0, passes[i].state, run.state(0));
    if (run.reads_history()) {  // the stepped states' own history, copied (the state is overwritten)
      passes[i].history.store.reset(run.history_streams(), run.history_members(), run.sublayers() + 1,
                                    !run.hooks().attend_in_full, config.norm_eps);
      passes[i].history.store.store(0, passes[i].state, true);
    }
  }
  // --update-params all on a history: the backward below also gives dL/dw of every read.
  const bool query_gradients = run.reads_history() && config.update_norm_gains;
  run.read_history_in_full(query_gradients);
  run.keep_query_gradients(query_gradients);
  // One set of buffers per branch op, so that attention's and the FFN's are each sized once.
  std::vector<SublayerStep<Scalar>> work_by_op(branch_ops().size());
  for (int l = 0; l < run.sublayers(); ++l) {
    const SublayerKind kind = config.sublayer_kind(l);
    const BlockOps ops = block_ops(config);
    SublayerStep<Scalar>& work = work_by_op[static_cast<std::size_t>(branch_op_index(kind, ops))];
    const std::vector<WeightSpec> specs = branch_op(kind, ops).weights(config);
    auto branch = sublayer_weight_gradient(analysis, l, work.gradient,
                                           config.update_norm_gains ? &work.gain_gradient : nullptr);
    std::vector<double> squares(specs.size());
    for_each_weight(specs.size(), branch.pool,
                    [&](int m) { squares[m] = squared_norm(branch.weights->matrices[m]); });
    for (std::size_t m = 0; m < specs.size(); ++m)
      weight_squares[static_cast<int>(specs[m].role)] += squares[m];
    if (config.update_norm_gains) gain_squares += gain_count(work.gain_gradient);
    if (query_gradients) collect_query_gradients(run, work);
    for (int i = 0; i < count; ++i) {
      if (passes[i].finite) step_sublayer(analysis, l, i, specs, branch, work, passes[i]);
    }
  }
  run.read_history_in_full(false);
  run.keep_query_gradients(false);
  HeadGains<Scalar> head;
  if (config.update_norm_gains) head_gain_gradient(run, head.gradient);
  for (int i = 0; i < count; ++i) {
    finish_update(run, passes[i], config.update_norm_gains ? &head : nullptr, weight_squares, gain_squares,
                  result, i);
  }
}

template void compute_update(SeedAnalysis<float>&);
template void compute_update(SeedAnalysis<double>&);
template BranchContext<float> sublayer_weight_gradient(SeedAnalysis<float>&, int, SublayerWeights<float>&,
                                                       std::vector<Mat<float>>*);
template BranchContext<double> sublayer_weight_gradient(SeedAnalysis<double>&, int, SublayerWeights<double>&,
                                                        std::vector<Mat<double>>*);
template double gain_step(UpdateRule, double, const std::vector<Mat<float>>&, double,
                          std::vector<Mat<float>>&);
template double gain_step(UpdateRule, double, const std::vector<Mat<double>>&, double,
                          std::vector<Mat<double>>&);
template double optimizer_step(UpdateRule, double, const SublayerWeights<float>&, double,
                               SublayerWeights<float>&, WorkPool*);
template double optimizer_step(UpdateRule, double, const SublayerWeights<double>&, double,
                               SublayerWeights<double>&, WorkPool*);

}  // namespace gradflow
