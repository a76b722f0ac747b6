// The analysis of a trained checkpoint (metrics.md, "Trained checkpoints"): one forward pass over
// the model's layers (weights read and dropped sublayer by sublayer, states x_0..x_S stored), the
// loss, the backward from it (weights read again), the per-state and per-sublayer figures, and
// --update's one optimizer step from the trained weights.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>

#include "../science/summary.hpp"
#include "../science/update.hpp"
#include "decoder.hpp"
#include "gradflow/checkpoint.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/representation.hpp"
#include "gradflow/rng.hpp"
#include "sublayer_path.hpp"

namespace gradflow {

namespace {

using checkpoint::SublayerPath;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename Scalar>
double squared(const Mat<Scalar>& m) {
  return m.template cast<double>().squaredNorm();
}

template <typename Scalar>
bool finite(const Mat<Scalar>& m) {
  return m.allFinite();
}

// The probe of --loss probe: U ~ N(0, 1), (T, d), from the seed (as analyze's probe 0).
template <typename Scalar>
Mat<Scalar> probe_matrix(const CheckpointRun& run) {
  Mat<Scalar> probe(static_cast<Eigen::Index>(run.tokens.size()), run.spec.hidden);
  if (run.loss == LossKind::probe)
    fill_normal(stream_key(run.config.seed, RandomUse::probe, 0), Scalar(1), probe.data(),
                static_cast<std::size_t>(probe.size()));
  return probe;
}

// The run's way through each sublayer: the placement graph and the ops where they cover the family.
template <typename Scalar>
std::unique_ptr<SublayerPath<Scalar>> sublayer_path(const CheckpointRun& run, const TensorStore& tensors) {
  if (run.arch != nullptr &&
      checkpoint::graph_path_gap(run.spec, static_cast<int>(run.tokens.size())).empty())
    return checkpoint::make_graph_sublayers<Scalar>(run.spec, run.config, *run.arch, tensors, run.threads);
  return checkpoint::make_decoder_sublayers<Scalar>(run.spec, tensors, static_cast<int>(run.tokens.size()));
}

template <typename Scalar>
class CheckpointAnalysis {
 public:
  CheckpointAnalysis(const CheckpointRun& run, const TensorStore& tensors, SeedResult& result,
                     CheckpointFigures& figures, const ProgressCallback& progress)
      : run_(run),
        spec_(run.spec),
        tensors_(tensors),
        result_(result),
        figures_(figures),
        progress_(progress),
        sublayers_(spec_.sublayers()),
        path_(sublayer_path<Scalar>(run, tensors)),
        probe_(probe_matrix<Scalar>(run)) {}

  void run() {
    const auto start = std::chrono::steady_clock::now();
    forward();
    const auto forward_end = std::chrono::steady_clock::now();
    representation();
    const auto representation_end = std::chrono::steady_clock::now();
    backward();
    const auto backward_end = std::chrono::steady_clock::now();
    if (run_.config.update != UpdateRule::none) update();
    summarize_figures(result_);
    const auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    result_.forward_seconds = seconds(start, forward_end);
    result_.representation_seconds = seconds(forward_end, representation_end);
    result_.backward_seconds = seconds(representation_end, backward_end);
    result_.seconds = seconds(start, std::chrono::steady_clock::now());
  }

 private:
  void tick() {
    ++done_;
    if (progress_) progress_(done_, total_work());
  }
  long long total_work() const { return 2LL * sublayers_ * (run_.config.update != UpdateRule::none ? 2 : 1); }

  // x_0, then x_{l+1} = x_l + update_l for every sublayer; rms, branch_rms and stream_share.
  void forward() {
    states_.resize(sublayers_ + 1);
    states_[0] = checkpoint::embed<Scalar>(spec_, tensors_, run_.tokens);
    auto& rms = result_.states.at(Figure::rms);
    auto& stream_rms = result_.streams.front().states.at(Figure::rms);
    auto& branch_rms = result_.sublayers.at(Figure::branch_rms);
    auto& stream_share = result_.sublayers.at(Figure::stream_share);
    const double count = static_cast<double>(states_[0].size());
    rms[0] = stream_rms[0] = std::sqrt(squared(states_[0]) / count);
    updates_.resize(sublayers_);
    for (int l = 0; l < sublayers_; ++l) {
      path_->load(l);
      path_->forward(states_[l], states_[l + 1], updates_[l]);
      if (!finite(states_[l + 1])) {
        result_.diverged = Divergence{l, "forward", "a non-finite value in the residual stream"};
        throw InputError(
            fmt::format("the checkpoint's forward pass overflows at sublayer {} (layer {}'s {}): "
                        "try --precision f64",
                        l, l / 2, l % 2 == 0 ? "attention" : "MLP"));
      }
      rms[l + 1] = stream_rms[l + 1] = std::sqrt(squared(states_[l + 1]) / count);
      branch_rms[l] = std::sqrt(squared(updates_[l]) / count);
      stream_share[l] = std::sqrt(squared(updates_[l]) / squared(states_[l + 1]));
      tick();
    }
    Mat<Scalar> d_top;
    figures_.loss = checkpoint::head_loss<Scalar>(spec_, tensors_, run_.loss, probe_, run_.tokens,
                                                  states_.back(), &d_top, &output_);
    gradients_.resize(sublayers_ + 1);
    gradients_[sublayers_] = std::move(d_top);
  }

  // token_cos, erank, angle and block_influence of the stored states; the layers' angular distance
  // at the last token (Gromov et al. 2024, arXiv 2403.17887, Eq. 7).
  void representation() {
    auto& token_cos = result_.states.at(Figure::token_cos);
    auto& erank = result_.states.at(Figure::erank);
    auto& angle = result_.sublayers.at(Figure::angle);
    auto& influence = result_.sublayers.at(Figure::block_influence);
    // Unit rows of three consecutive states at a time (l - 2, l - 1, l): enough for the angle of
    // sublayer l - 1 and the angular distance of the layer ending at state l.
    std::array<Eigen::MatrixXd, 3> units;
    const Eigen::Index last = states_[0].rows() - 1;
    figures_.angular_distance.assign(spec_.layers, 0.0);
    for (int l = 0; l <= sublayers_; ++l) {
      const Eigen::MatrixXd rows = states_[l].template cast<double>();
      Eigen::MatrixXd& unit = units[l % 3];
      unit = unit_rows(rows);
      token_cos[l] = mean_token_cosine(unit);
      erank[l] = effective_rank(rows);
      if (l == 0) continue;
      const Eigen::MatrixXd& previous = units[(l - 1) % 3];
      angle[l - 1] = mean_angular_distance(previous, unit);
      influence[l - 1] = 1.0 - (previous.array() * unit.array()).rowwise().sum().mean();
      if (l % 2 == 0) {  // layer l/2 - 1 maps state l - 2 to state l
        const double cosine = std::clamp(units[(l - 2) % 3].row(last).dot(unit.row(last)), -1.0, 1.0);
        figures_.angular_distance[l / 2 - 1] = std::acos(cosine) / std::numbers::pi;
      }
    }
  }

  // g_l = dL/dx_l from the top down; gain, skip_gain (1: the residual path is the identity),
  // branch_gain, log10_param_grad and the contributions <g_{l+1}, update_l> of output_share.
  void backward() {
    auto& log10_grad = result_.states.at(Figure::log10_grad);
    auto& stream_grad = result_.streams.front().states.at(Figure::log10_grad);
    auto& gain = result_.sublayers.at(Figure::gain);
    auto& skip_gain = result_.sublayers.at(Figure::skip_gain);
    auto& branch_gain = result_.sublayers.at(Figure::branch_gain);
    auto& param_grad = result_.sublayers.at(Figure::log10_param_grad);
    std::vector<double> norms(sublayers_ + 1), contribution(sublayers_);
    norms[sublayers_] = std::sqrt(squared(gradients_[sublayers_]));
    Mat<Scalar> scratch, update, d_branch;
    for (int l = sublayers_ - 1; l >= 0; --l) {
      path_->load(l);
      path_->forward(states_[l], scratch, update);
      const double param_squares = path_->backward(gradients_[l + 1], gradients_[l], d_branch);
      if (!finite(gradients_[l])) {
        result_.diverged = Divergence{l, "backward", "a non-finite value in the gradient"};
        throw InputError(
            fmt::format("the checkpoint's backward pass overflows at sublayer {}: try --precision f64", l));
      }
      norms[l] = std::sqrt(squared(gradients_[l]));
      gain[l] = norms[l] / norms[l + 1];
      skip_gain[l] = 1.0;
      branch_gain[l] = std::sqrt(squared(d_branch)) / norms[l + 1];
      param_grad[l] = 0.5 * std::log10(param_squares);
      contribution[l] =
          (gradients_[l + 1].template cast<double>().array() * updates_[l].template cast<double>().array())
              .sum();
      tick();
    }
    for (int l = 0; l <= sublayers_; ++l) log10_grad[l] = stream_grad[l] = std::log10(norms[l]);
    // output_share: |c_l| / sum |c| (one "probe": the loss itself); effective_depth = 1 / sum share^2
    double total = 0, sum_sq = 0;
    for (const double c : contribution) total += std::abs(c);
    auto& share = result_.sublayers.at(Figure::output_share);
    for (int l = 0; l < sublayers_; ++l) {
      share[l] = std::abs(contribution[l]) / total;
      sum_sq += share[l] * share[l];
    }
    result_.effective_depth = 1.0 / sum_sq;
    // x_S = x_0 + sum_l update_l (every family's stream is additive): each part's share
    // <part, x_S> / ||x_S||^2 of the final state; the shares sum to 1
    const Mat<double> top = states_.back().template cast<double>();
    const double top_squared = top.squaredNorm();
    result_.stream_decomposition_input =
        (states_[0].template cast<double>().array() * top.array()).sum() / top_squared;
    auto& decomposition = result_.sublayers.at(Figure::stream_decomposition);
    for (int l = 0; l < sublayers_; ++l)
      decomposition[l] = (updates_[l].template cast<double>().array() * top.array()).sum() / top_squared;
  }

  // One optimizer step on the loss from the trained weights, per learning rate: each sublayer's
  // matrices' gradient (recomputed from the stored x_l and g_{l+1}), the step, and the stepped
  // forward pass up the stack (metrics.md, "One optimizer step").
  void update() {
    const int rates = run_.config.update_count();
    std::vector<Mat<Scalar>> stepped(rates, states_[0]);
    std::vector<UpdateStep> steps(rates);
    std::vector<std::array<double, kMatrixKindCount>> step_squares(rates), weight_squares(rates);
    for (auto& s : step_squares) s.fill(0.0);
    for (auto& s : weight_squares) s.fill(0.0);
    // NaN where a learning rate's stepped stream had diverged (metrics.md: its later figures are null)
    std::vector<std::vector<double>> update_loss(rates, std::vector<double>(sublayers_, kNaN));
    std::vector<bool> alive(rates, true);
    Mat<Scalar> scratch, update;
    std::array<Mat<Scalar>, kMatrixKindCount> deltas;
    for (int i = 0; i < rates; ++i) {
      steps[i].learning_rate = run_.config.learning_rates[i];
      record_moved(i, 0, stepped[i]);
    }
    for (int l = 0; l < sublayers_; ++l) {
      path_->load(l);
      path_->forward(states_[l], scratch, update);
      path_->matrix_gradients(gradients_[l + 1]);
      const auto weights = path_->matrices();
      const auto gradient = path_->gradients();
      for (int i = 0; i < rates; ++i) {
        if (!alive[i]) continue;
        std::array<const Mat<Scalar>*, kMatrixKindCount> step{};
        const Scalar eta = static_cast<Scalar>(steps[i].learning_rate);
        update_loss[i][l] = 0.0;
        for (int m = 0; m < kMatrixKindCount; ++m) {
          if (!weights[m] || weights[m]->size() == 0) continue;
          const Mat<Scalar>& g = *gradient[m];
          Mat<Scalar>& delta = deltas[m];
          if (run_.config.update == UpdateRule::adam) {
            delta = (-eta * g.array() / (g.array().abs() + static_cast<Scalar>(kAdamEpsilon))).matrix();
          } else {
            delta = -eta * g;
          }
          update_loss[i][l] +=
              (g.template cast<double>().array() * delta.template cast<double>().array()).sum();
          step_squares[i][m] += squared(delta);
          weight_squares[i][m] += squared(*weights[m]);
          step[m] = &delta;
        }
        path_->stepped_forward(step, stepped[i], scratch);
        stepped[i] = scratch;
        if (!record_moved(i, l + 1, stepped[i])) {
          alive[i] = false;
          steps[i].diverged_state = l + 1;
        }
      }
      tick();
    }
    for (int i = 0; i < rates; ++i) {
      UpdateStep& step = steps[i];
      auto& loss_column = result_.sublayers.at({Figure::update_loss, i + 1});
      for (int l = 0; l < sublayers_; ++l) loss_column[l] = update_loss[i][l];
      // A diverged rate reports where it diverged and the states before it; its run figures
      // (sums over the whole stack) stay null, as analyze's do.
      if (!alive[i]) continue;
      double first_order = 0;
      for (const double u : update_loss[i]) first_order += u;
      step.delta_loss_first_order = first_order;
      auto& share = result_.sublayers.at({Figure::update_loss_share, i + 1});
      for (int l = 0; l < sublayers_; ++l) share[l] = update_loss[i][l] / first_order;
      for (int m = 0; m < kMatrixKindCount; ++m)
        if (weight_squares[i][m] > 0) step.step_rel[m] = std::sqrt(step_squares[i][m] / weight_squares[i][m]);
      Mat<Scalar> y;
      const double loss = checkpoint::head_loss<Scalar>(spec_, tensors_, run_.loss, probe_, run_.tokens,
                                                        stepped[i], nullptr, &y);
      const Mat<double> moved = y.template cast<double>() - output_.template cast<double>();
      step.output_update_rel = std::sqrt(moved.squaredNorm() / squared(output_));
      // The probe loss is linear in y: its change is sum(U * (y' - y)), formed so that no digits
      // cancel (as analyze's); the LM loss's change is L' - L, each summed in double.
      step.delta_loss = run_.loss == LossKind::probe
                            ? (probe_.template cast<double>().array() * moved.array()).sum()
                            : loss - figures_.loss;
    }
    result_.updates = std::move(steps);
  }

  // update_rms and log10_update_rel of stepped state l at learning rate i; false when not finite.
  bool record_moved(int i, int l, const Mat<Scalar>& stepped) {
    const double moved = squared(Mat<Scalar>(stepped - states_[l]));
    if (!std::isfinite(moved)) return false;
    result_.states.at({Figure::update_rms, i + 1})[l] =
        std::sqrt(moved / static_cast<double>(stepped.size()));
    result_.states.at({Figure::log10_update_rel, i + 1})[l] = 0.5 * std::log10(moved / squared(states_[l]));
    return true;
  }

  const CheckpointRun& run_;
  const HfModelSpec& spec_;
  const TensorStore& tensors_;
  SeedResult& result_;
  CheckpointFigures& figures_;
  const ProgressCallback& progress_;
  const int sublayers_;
  const std::unique_ptr<SublayerPath<Scalar>> path_;
  const Mat<Scalar> probe_;
  long long done_ = 0;
  std::vector<Mat<Scalar>> states_, gradients_, updates_;
  Mat<Scalar> output_;  // y = final_norm(x_S)
};

SeedResult empty_result(const CheckpointRun& run) {
  const ModelConfig& config = run.config;
  const std::size_t states = config.sublayers() + 1, subs = config.sublayers();
  SeedResult result;
  result.seed = config.seed;
  result.states = allocate_figures(config, FigureAxis::state, states);
  result.sublayers = allocate_figures(config, FigureAxis::sublayer, subs);
  StreamFigures stream{"x", {}, {}};
  stream.states.add(Figure::rms, states);
  stream.states.add(Figure::log10_grad, states);
  result.streams.push_back(std::move(stream));
  for (int l = 0; l < config.sublayers(); ++l) {
    result.kinds.push_back(config.sublayer_kind(l));
    result.blocks.push_back(config.block_of(l));
  }
  return result;
}

}  // namespace

std::string checkpoint_graph_gap(const HfModelSpec& spec, int tokens) {
  return checkpoint::graph_path_gap(spec, tokens);
}

SeedResult analyze_checkpoint(const CheckpointRun& run, const TensorStore& tensors,
                              const ProgressCallback& progress) {
  SeedResult result = empty_result(run);
  CheckpointFigures& figures = result.checkpoint.emplace();
  figures.loss_kind = run.loss;
  figures.tokens = run.tokens;
  figures.random_tokens = run.random_tokens;
  if (run.config.precision == Precision::f64) {
    CheckpointAnalysis<double>(run, tensors, result, figures, progress).run();
  } else {
    CheckpointAnalysis<float>(run, tensors, result, figures, progress).run();
  }
  return result;
}

InputGradient checkpoint_loss_and_input_gradient(const CheckpointRun& run, const TensorStore& tensors,
                                                 const Eigen::MatrixXd* x0) {
  const HfModelSpec& spec = run.spec;
  const auto path = sublayer_path<double>(run, tensors);
  std::vector<Mat<double>> states(spec.sublayers() + 1);
  states[0] = x0 ? Mat<double>(*x0) : checkpoint::embed<double>(spec, tensors, run.tokens);
  Mat<double> update;
  for (int l = 0; l < spec.sublayers(); ++l) {
    path->load(l);
    path->forward(states[l], states[l + 1], update);
  }
  const Mat<double> probe = probe_matrix<double>(run);
  Mat<double> gradient, scratch, below, d_branch;
  InputGradient out;
  out.loss = checkpoint::head_loss<double>(spec, tensors, run.loss, probe, run.tokens, states.back(),
                                           &gradient, nullptr);
  for (int l = spec.sublayers() - 1; l >= 0; --l) {
    path->load(l);
    path->forward(states[l], scratch, update);
    path->backward(gradient, below, d_branch);
    gradient = std::move(below);
  }
  out.gradient = gradient;
  return out;
}

double checkpoint_memory_bytes(const HfModelSpec& spec, const ModelConfig& config, LossKind loss,
                               double largest_tensor_file_bytes) {
  const double scalar = config.precision == Precision::f64 ? 8.0 : 4.0;
  const double T = config.seq, d = spec.hidden, S = spec.sublayers();
  const double attention = d * (2.0 * spec.q_width() + 2.0 * spec.kv_width());
  const double mlp = d * spec.intermediate * (spec.gated ? 3.0 : 2.0);
  const double weights = std::max(attention, mlp) * scalar;
  const double stored = 3.0 * (S + 1) * T * d * scalar;  // states, gradients, updates
  const double representation =
      4.0 * T * d * 8.0 + 3.0 * T * T * 8.0;  // three states' unit rows, erank's Gram
  // a sublayer's cache (projections, hidden units, one T x T matrix per head, soft-capped twice)
  const double cache =
      T * (6.0 * std::max<double>(spec.q_width(), spec.intermediate) + spec.heads * 2.0 * T) * scalar;
  const double logits = loss == LossKind::lm ? 3.0 * T * spec.vocab * scalar + 4.0 * 1048576.0 * scalar : 0.0;
  // --update: the gradients, a stepped copy of the weights and a stepped state per learning rate,
  // and the stepped pass's own cache
  const int rates = config.update_count();
  const double update = rates > 0 ? (1.0 + rates) * weights + rates * T * d * scalar + cache : 0.0;
  // the mapped pages of the largest tensor being converted (its bytes in the file)
  return stored + representation + weights + cache + logits + update + largest_tensor_file_bytes +
         64.0 * 1048576.0;
}

}  // namespace gradflow
