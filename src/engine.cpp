// The engine: builds each sublayer from its recipe, runs the forward pass, then back-propagates
// the probes with the gradient renormalised at every state and the log of each step's scale
// accumulated in double (metrics.md, "The probe"). Activations are recomputed per sublayer during
// the backward pass, so memory is the residual states plus one sublayer's working set. With two
// cores every op runs as two fixed shards (shards.hpp) and the next sublayer's weights are drawn
// by whichever core would otherwise wait; neither changes a number.
#include <fmt/format.h>
#include <omp.h>

#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <Eigen/SVD>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <numeric>
#include <type_traits>

#include "gradflow/analysis.hpp"
#include "gradflow/graph.hpp"
#include "gradflow/initialization.hpp"
#include "gradflow/lane_sum.hpp"
#include "gradflow/representation.hpp"
#include "gradflow/rng.hpp"

namespace gradflow {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLn10 = 2.302585092994046;
// --spectrum's subspace iteration stops when the top-k log singular values move less than this
// between iterations (float32 arithmetic cannot resolve 1e-11), or after kSpectrumMaxIterations.
constexpr double kSpectrumToleranceF64 = 1e-11;
constexpr double kSpectrumToleranceF32 = 1e-5;
constexpr int kSpectrumMaxIterations = 200;

template <typename Scalar>
using State = std::vector<Mat<Scalar>>;  // one (T, d) matrix per stream

// The test-only weight nudge (AnalysisHooks::weight_nudge), applied when it targets this sublayer.
template <typename Scalar>
void nudge_weights(const AnalysisHooks& hooks, int sublayer, SublayerWeights<Scalar>& weights) {
  if (!hooks.weight_nudge || hooks.weight_nudge->sublayer != sublayer) return;
  const auto& nudge = *hooks.weight_nudge;
  Mat<Scalar>* matrices[] = {&weights.w_q, &weights.w_k, &weights.w_v,
                             &weights.w_o, &weights.w_1, &weights.w_2};  // WeightMatrix's order
  matrices[static_cast<int>(nudge.matrix)]->data()[nudge.entry] += static_cast<Scalar>(nudge.delta);
}

template <typename Scalar>
double squared_norm(const Scalar* data, Eigen::Index count) {
  return lane_sum(
      count, [data](Eigen::Index i) { return static_cast<double>(data[i]) * static_cast<double>(data[i]); });
}
// sum_i (a_i - b_i)^2 in double (the difference in Scalar).
template <typename Scalar>
double squared_distance(const Scalar* a, const Scalar* b, Eigen::Index count) {
  return lane_sum(count, [a, b](Eigen::Index i) {
    const auto difference = static_cast<double>(a[i] - b[i]);
    return difference * difference;
  });
}
template <typename Scalar>
double squared_norm(const Mat<Scalar>& m) {
  return squared_norm(m.data(), m.size());
}
// Population variance (ddof 0) over every entry of m, in double: numpy's np.var of the flattened
// tensor, as Admin's profiling takes it.
template <typename Scalar>
double population_variance(const Mat<Scalar>& m) {
  const double mean = m.template cast<double>().mean();
  return squared_norm(m) / static_cast<double>(m.size()) - mean * mean;
}
// Whether every entry of the state is finite, given each stream's sum of squares in double.
template <typename Scalar>
bool all_finite(const State<Scalar>& state, const std::vector<double>& stream_squares) {
  if constexpr (std::is_same_v<Scalar, float>) {
    // A float's square cannot overflow a double (< 2^256), so the sum of squares is finite exactly
    // when every entry is: no second pass (Eigen's allFinite costs about 1 ns an entry).
    return std::all_of(stream_squares.begin(), stream_squares.end(),
                       [](double v) { return std::isfinite(v); });
  } else {  // a double's square can overflow: look at the entries
    return std::all_of(state.begin(), state.end(), [](const Mat<Scalar>& m) { return m.allFinite(); });
  }
}
// Squared norm of probe k's rows (k*T .. k*T+T) of one cotangent.
template <typename Scalar>
double probe_squared_norm(const Mat<Scalar>& cotangent, int probe, int tokens) {
  return squared_norm(cotangent.data() + static_cast<Eigen::Index>(probe) * tokens * cotangent.cols(),
                      static_cast<Eigen::Index>(tokens) * cotangent.cols());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// log(sqrt(mean_k exp(2 a_k))): the log of a probe-RMS from per-probe logs, without overflow.
double log_rms(const std::vector<double>& log_values) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : log_values) top = std::max(top, v);
  if (!std::isfinite(top)) return top;
  double sum = 0;
  for (double v : log_values) sum += std::exp(2.0 * (v - top));
  return top + 0.5 * std::log(sum / static_cast<double>(log_values.size()));
}

template <typename Scalar>
class Analysis {
 public:
  Analysis(const ModelConfig& config, const Architecture& arch, const Constants& constants,
           std::uint64_t seed, const ProgressCallback& progress, const AnalysisHooks& hooks,
           const Mat<Scalar>* input = nullptr)
      : config_(config),
        arch_(arch),
        constants_(constants),
        seed_(seed),
        progress_(progress),
        hooks_(hooks),
        sublayers_(config.sublayers()),
        skip_weights_(sublayers_ + 1, 1.0),
        input_(input) {}

  // After run(): probe 0's loss and true (unnormalised) gradient with respect to x_0.
  double loss() const { return loss_; }
  Mat<Scalar> input_gradient() const {
    Mat<Scalar> sum = Mat<Scalar>::Zero(config_.seq, config_.width);
    for (const auto& stream : gradient_) sum += stream.topRows(config_.seq);
    return sum * static_cast<Scalar>(std::exp(log_scale_[0]));
  }

  SeedResult run() {
    const auto start = std::chrono::steady_clock::now();
    result_.seed = seed_;
    allocate_figures();
    start_second_core();
    const Mat<Scalar> seed_input = make_input<Scalar>(config_, seed_);
    // Admin's profiled w is part of the init: it is profiled on the seed's own input and held
    // fixed for a replacement input (finite differences perturb x_0, not the init).
    const bool profile_separately = input_ && arch_.profiles_skip_weight;
    if (profile_separately) {
      forward(seed_input, true);
      result_.diverged.reset();
    }
    const bool forward_ok = forward(input_ ? *input_ : seed_input, !profile_separately);
    if (forward_ok && config_.angles_all) angles_matrix();
    if (forward_ok) {
      const auto backward_start = std::chrono::steady_clock::now();
      backward();
      result_.backward_seconds = seconds_since(backward_start);
    }
    const bool complete = forward_ok && !result_.diverged;
    if (complete && config_.exact_jacobian) exact_jacobian();
    if (complete && config_.spectrum > 0) spectrum();
    shards_.reset();
    summarize();
    result_.seconds = seconds_since(start);
    return std::move(result_);
  }

 private:
  SublayerContext context(int sublayer) const {
    const bool head = sublayer == sublayers_;
    return SublayerContext{config_,
                           constants_,
                           sublayer,
                           head ? config_.blocks : config_.block_of(sublayer),
                           head ? SublayerKind::ffn : config_.sublayer_kind(sublayer),
                           skip_weights_[sublayer]};
  }

  BranchContext<Scalar> branch_context(const SublayerContext& ctx) const {
    return BranchContext<Scalar>{ctx.kind,      config_.branch, config_.norm,
                                 config_.heads, nullptr,        shards_.get()};
  }

  // Builds sublayer l's graph with its weights in weight_buffers_[l % 2], and starts drawing
  // sublayer `next`'s weights (the one the pass needs after l) into the other buffer.
  BranchContext<Scalar> prepare_sublayer(int l, int next = -1) {
    ensure_weights(l, next);
    const SublayerContext ctx = context(l);
    graph_.reset(static_cast<int>(states_[l].size()));
    arch_.build_sublayer(graph_, ctx);
    BranchContext<Scalar> branch = branch_context(ctx);
    branch.weights = &weight_buffers_[l % 2];
    return branch;
  }

  // Sublayer l's weights live in buffer l % 2. While sublayer l is worked on, the next one's are
  // drawn into the other buffer by whichever core would otherwise wait (WeightDraw as the
  // ShardPair's idle work); with one core they are drawn here when needed. Same values either way.
  void ensure_weights(int l, int next) {
    if (config_.branch != BranchKind::model) return;
    const int buffer = l % 2;
    if (loaded_[buffer] != l) {
      if (drawing_[buffer] != l) start_draw(l);
      draws_[buffer].finish();
      nudge_weights(hooks_, l, weight_buffers_[buffer]);
      loaded_[buffer] = l;
      drawing_[buffer] = -1;
    }
    if (next >= 0 && next < sublayers_ && loaded_[next % 2] != next && drawing_[next % 2] != next) {
      start_draw(next);
    }
  }

  void start_draw(int l) {
    const int buffer = l % 2;
    if (shards_) shards_->clear_idle_work();  // the second core lets go of the old draw first
    loaded_[buffer] = -1;
    drawing_[buffer] = l;
    draws_[buffer].plan(config_, arch_, context(l), seed_, weight_buffers_[buffer]);
    if (shards_) shards_->set_idle_work(&draws_[buffer]);
  }

  // Both cores work on every sublayer: each op splits its work in two fixed shards (shards.hpp),
  // so the thread count changes no number. The second core is used only when this run is alone:
  // inside a parallel loop over runs the cores are already busy.
  void start_second_core() {
    if (config_.branch != BranchKind::model || omp_get_max_threads() < 2 || omp_in_parallel()) return;
    shards_ = std::make_unique<ShardPair>(true);
  }

  void allocate_figures() {
    const std::size_t states = sublayers_ + 1, subs = sublayers_;
    for (const char* name : {"rms", "log10_grad", "log10_grad_rel", "log10_grad_se", "token_cos", "erank"}) {
      result_.states.add(name, states);
    }
    for (int i = 1; i <= config_.spectrum; ++i)
      result_.states.add(fmt::format("log10_singular_value_{}", i), states);
    if (config_.exact_jacobian) {
      result_.states.add("log10_jacobian_fro_exact", states);
      result_.states.add("log10_jacobian_spectral_exact", states);
      for (int i = 1; i <= config_.spectrum; ++i) {
        result_.states.add(fmt::format("log10_singular_value_{}_exact", i), states);
      }
    }
    for (const char* name : {"gain", "skip_gain", "branch_gain", "skip_gain_theory", "branch_rms",
                             "stream_share", "output_share", "output_share_se", "stream_decomposition",
                             "angle", "block_influence", "log10_param_grad"}) {
      result_.sublayers.add(name, subs);
    }
    log_contribution_.assign(static_cast<std::size_t>(sublayers_) * config_.probes,
                             kNaN);  // NaN: not reached
    for (const auto name : arch_.streams) {
      StreamFigures stream{std::string(name), {}, {}};
      stream.states.add("rms", states);
      stream.states.add("log10_grad", states);
      result_.streams.push_back(std::move(stream));
    }
    for (int l = 0; l < sublayers_; ++l) {
      result_.kinds.push_back(config_.sublayer_kind(l));
      result_.blocks.push_back(config_.block_of(l));
      if (arch_.skip_gain_theory) {
        const auto theory = arch_.skip_gain_theory(context(l));
        result_.sublayers.at("skip_gain_theory")[l] = theory.value_or(kNaN);
      }
    }
  }

  // rms of state l and of each of its streams, from one squared-norm pass per stream; records
  // nothing and returns false when the state has a non-finite entry.
  bool record_state_rms(int l) {
    const State<Scalar>& state = states_[l];
    stream_squares_.resize(state.size());
    double sum = 0, count = 0;
    for (std::size_t s = 0; s < state.size(); ++s) {
      stream_squares_[s] = squared_norm(state[s]);
      sum += stream_squares_[s], count += static_cast<double>(state[s].size());
    }
    if (!all_finite(state, stream_squares_)) return false;
    result_.states.at("rms")[l] = std::sqrt(sum / count);
    for (std::size_t s = 0; s < state.size(); ++s) {
      result_.streams[s].states.at("rms")[l] = std::sqrt(stream_squares_[s] / state[s].size());
    }
    return true;
  }

  long long total_work() const { return analysis_work_units(config_); }
  void report_progress(long long done) const {
    if (progress_) progress_(done, total_work());
  }

  // profile: update the profiled skip weights (Admin) from this pass.
  bool forward(const Mat<Scalar>& input, bool profile) {
    const auto start = std::chrono::steady_clock::now();
    states_.assign(sublayers_ + 1, {});
    output_norm_stats_.resize(sublayers_);
    states_[0].assign(arch_.initial_streams, input);
    record_state_rms(0);
    auto& branch_rms = result_.sublayers.at("branch_rms");
    auto& stream_share = result_.sublayers.at("stream_share");
    auto& skip_gain_theory = result_.sublayers.at("skip_gain_theory");
    for (int l = 0; l < sublayers_; ++l) {
      const auto branch = prepare_sublayer(l, l + 1);
      if (arch_.profiles_skip_weight && arch_.skip_gain_theory) {  // w_l is known from here on
        skip_gain_theory[l] = arch_.skip_gain_theory(context(l)).value_or(kNaN);
      }
      executor_.forward(graph_, states_[l], branch);
      State<Scalar>& next = states_[l + 1];
      next.resize(graph_.outputs().size());
      for (std::size_t s = 0; s < next.size(); ++s) next[s] = executor_.value(graph_.outputs()[s]);
      executor_.output_norm_stats(graph_, output_norm_stats_[l]);  // for the backward's recompute
      const double update_sq = squared_norm(executor_.value(graph_.update_id()));
      branch_rms[l] = std::sqrt(update_sq / executor_.value(graph_.update_id()).size());
      stream_share[l] = std::sqrt(update_sq / squared_norm(executor_.value(graph_.sum_id())));
      if (profile && arch_.profiles_skip_weight) {
        // Admin: w_{l+1}^2 = Var[w_l x_l] + Var[F_l] = w_l^2 Var[x_l] + Var[F_l], both measured
        // (LiyuanLucasLiu/Transformer-Clinic fairseq/fairseq/modules/transformer_layer.py L193-195
        // and L258-260: `np.sqrt(np.var(residual * ratio) + np.var(x))`); Var[x_0] of the sampled
        // input is not 1, nor exactly is that of a normed state (np.var centres on the mean).
        const double w = skip_weights_[l];
        const double stream_variance = population_variance(states_[l][0]);
        const double branch_variance = population_variance(executor_.value(graph_.branch_id()));
        skip_weights_[l + 1] = std::sqrt(w * w * stream_variance + branch_variance);
      }
      if (!record_state_rms(l + 1)) {
        result_.diverged = Divergence{
            l, "forward",
            fmt::format(
                "state x_{} has non-finite entries (overflow in {}); figures after sublayer {} are null",
                l + 1, to_string(config_.precision), l)};
        result_.forward_seconds += seconds_since(start);
        representation_figures(l);
        return false;
      }
      // A state below the precision's smallest normal has lost its digits (plain stacks collapse to
      // exact zeros): reported like an overflow, though the pass goes on with the numbers it has.
      const double rms = result_.states.at("rms")[l + 1];
      if (!result_.diverged && rms < static_cast<double>(std::numeric_limits<Scalar>::min())) {
        result_.diverged = Divergence{
            l, "underflow",
            fmt::format(
                "state x_{} underflowed (rms {:.3g}, below the smallest normal {} number, {:.3g}); the "
                "stream has collapsed and figures after sublayer {} describe zeros",
                l + 1, rms, to_string(config_.precision), std::numeric_limits<Scalar>::min(), l)};
      }
      report_progress(l + 1);
    }
    result_.forward_seconds += seconds_since(start);
    representation_figures(sublayers_);
    return true;
  }

  // token_cos and erank of states 0..last and the angles of the sublayers between them: pure
  // functions of the stored states, so computed after the forward pass, on both shards (two
  // contiguous halves of the states). Each shard walks up its half so that every state's unit
  // rows are computed once and serve both angles that touch it.
  void representation_figures(int last) {
    const auto start = std::chrono::steady_clock::now();
    auto& token_cos = result_.states.at("token_cos");
    auto& erank = result_.states.at("erank");
    run_shards(shards_.get(), [&](int shard) {
      const ShardRange range = shard_range(last + 1, shard);
      Eigen::MatrixXd unit_below;
      if (range.begin > 0 && range.size() > 0) {
        unit_below = unit_rows(token_rows(states_[range.begin - 1], states_[range.begin - 1].size()));
      }
      for (auto l = static_cast<int>(range.begin); l < range.end; ++l) {
        const Eigen::MatrixXd rows = token_rows(states_[l], states_[l].size());
        Eigen::MatrixXd unit = unit_rows(rows);
        token_cos[l] = mean_token_cosine(unit);
        erank[l] = effective_rank(rows);
        if (l > 0) {
          if (states_[l - 1].size() == states_[l].size()) {
            record_angle(l - 1, unit_below, unit);
          } else {  // rare: the stream count changes; compare the streams both states have
            record_angle(l - 1);
          }
        }
        unit_below = std::move(unit);
      }
    });
    result_.representation_seconds += seconds_since(start);
  }

  // angle and block influence of sublayer l, over the streams both states have: angular distance
  // as in Gromov et al. 2024 (arXiv 2403.17887), block influence as in ShortGPT (Men et al. 2024,
  // arXiv 2403.03853).
  void record_angle(int l) {
    const std::size_t streams = std::min(states_[l].size(), states_[l + 1].size());
    record_angle(l, unit_rows(token_rows(states_[l], streams)),
                 unit_rows(token_rows(states_[l + 1], streams)));
  }
  void record_angle(int l, const Eigen::MatrixXd& before, const Eigen::MatrixXd& after) {
    result_.sublayers.at("angle")[l] = mean_angular_distance(before, after);
    result_.sublayers.at("block_influence")[l] = 1.0 - (before.cwiseProduct(after).rowwise().sum()).mean();
  }

  // --angles all: every pair of states, over the streams both have.
  void angles_matrix() {
    const int states = sublayers_ + 1;
    std::size_t min_streams = states_[0].size(), max_streams = states_[0].size();
    for (const auto& state : states_) {
      min_streams = std::min(min_streams, state.size());
      max_streams = std::max(max_streams, state.size());
    }
    auto& matrix = result_.angles_matrix;
    matrix.assign(states, std::vector<double>(states, 0.0));
    std::vector<Eigen::MatrixXd> unit(states);
    for (int i = 0; i < states; ++i) unit[i] = unit_rows(token_rows(states_[i], min_streams));
    for (int i = 0; i < states; ++i) {
      for (int j = i + 1; j < states; ++j) {
        double value;
        if (min_streams == max_streams) {
          value = mean_angular_distance(unit[i], unit[j]);
        } else {  // rare: the state widths differ; compare the streams both states have
          const std::size_t common = std::min(states_[i].size(), states_[j].size());
          value = mean_angular_distance(unit_rows(token_rows(states_[i], common)),
                                        unit_rows(token_rows(states_[j], common)));
        }
        matrix[i][j] = matrix[j][i] = value;
      }
    }
  }

  // Renormalises each probe's cotangent to unit norm and returns log(norm) per probe, or false
  // when a probe's norm is zero or not finite.
  bool renormalise(State<Scalar>& cotangent, std::vector<double>& log_norms,
                   std::vector<double>& stream_norms) {
    const int probes = config_.probes, tokens = config_.seq;
    const std::size_t streams = cotangent.size();
    log_norms.assign(probes, 0.0);
    stream_norms.assign(probes * streams, 0.0);
    for (int k = 0; k < probes; ++k) {
      double total = 0;
      for (std::size_t s = 0; s < streams; ++s) {
        stream_norms[k * streams + s] = probe_squared_norm(cotangent[s], k, tokens);
        total += stream_norms[k * streams + s];
      }
      if (!(total > 0) || !std::isfinite(total)) return false;
      const double norm = std::sqrt(total);
      log_norms[k] = std::log(norm);
      for (std::size_t s = 0; s < streams; ++s) {
        stream_norms[k * streams + s] = std::sqrt(stream_norms[k * streams + s]) / norm;
        cotangent[s].middleRows(static_cast<Eigen::Index>(k) * tokens, tokens) *=
            static_cast<Scalar>(1.0 / norm);
      }
    }
    return true;
  }

  // Records log10_grad at state l from the accumulated per-probe logs and per-stream shares.
  void record_state_gradient(int l, const std::vector<double>& stream_norms) {
    result_.states.at("log10_grad")[l] = log_rms(log_scale_) / kLn10;
    // Standard error of log10_grad by the delta method on q_k = norm(g_l,k)^2 (relative scale):
    // se(log10 sqrt(mean q)) = sd(q) / (sqrt(K) * 2 mean(q) ln 10). NaN for one probe.
    const int probes = config_.probes;
    if (probes > 1) {
      const double top = *std::max_element(log_scale_.begin(), log_scale_.end());
      double sum = 0, sum_sq = 0;
      for (int k = 0; k < probes; ++k) {
        const double q = std::exp(2.0 * (log_scale_[k] - top));
        sum += q, sum_sq += q * q;
      }
      const double mean = sum / probes;
      const double variance = std::max(0.0, (sum_sq - probes * mean * mean) / (probes - 1));
      result_.states.at("log10_grad_se")[l] = std::sqrt(variance / probes) / (2.0 * mean * kLn10);
    }
    const std::size_t streams = states_[l].size();
    for (std::size_t s = 0; s < streams; ++s) {
      std::vector<double> logs(config_.probes);
      for (int k = 0; k < config_.probes; ++k)
        logs[k] = log_scale_[k] + std::log(stream_norms[k * streams + s]);
      result_.streams[s].states.at("log10_grad")[l] = log_rms(logs) / kLn10;
    }
  }

  void backward() {
    const int probes = config_.probes, tokens = config_.seq;
    // The output head: y from the final state, L = sum(U * y).
    const SublayerContext head = context(sublayers_);
    graph_.reset(static_cast<int>(states_[sublayers_].size()));
    arch_.build_output(graph_, head);
    executor_.forward(graph_, states_[sublayers_], branch_context(head));
    cotangent_out_.assign(1, make_probes<Scalar>(config_, seed_));
    const auto& output = executor_.value(graph_.outputs().front());
    loss_ = (output.template cast<double>().array() *
             cotangent_out_[0].topRows(config_.seq).template cast<double>().array())
                .sum();
    executor_.backward(graph_, cotangent_out_, true, branch_context(head), gradient_);
    std::vector<double> log_norms, stream_norms;
    if (!renormalise(gradient_, log_norms, stream_norms)) {
      if (!result_.diverged)  // an underflow in the forward pass is the cause; keep it
        result_.diverged =
            Divergence{sublayers_, "backward", "the output gradient dL/dx_S is zero or not finite"};
      return;
    }
    log_scale_ = log_norms;
    record_state_gradient(sublayers_, stream_norms);

    auto& gain = result_.sublayers.at("gain");
    auto& skip_gain = result_.sublayers.at("skip_gain");
    auto& branch_gain = result_.sublayers.at("branch_gain");
    std::vector<double> weight(probes);
    for (int l = sublayers_ - 1; l >= 0; --l) {
      // Recompute the activations from the stored state; post-norm placements stop before the
      // branch's output projection, since the stored x_{l+1} and its norm statistics are known.
      const auto branch = prepare_sublayer(l, l - 1);
      if (hooks_.recompute_in_full || arch_.additive_stream) {  // additive: stream_decomposition needs F
        executor_.forward(graph_, states_[l], branch);
      } else {
        executor_.recompute(graph_, states_[l], branch,
                            KnownOutputs<Scalar>{&states_[l + 1], &output_norm_stats_[l]});
      }
      executor_.backward(graph_, gradient_, false, branch, skip_part_);
      executor_.backward(graph_, gradient_, true, branch, previous_,
                         config_.branch == BranchKind::model ? &param_grads_ : nullptr);
      record_contribution(l);
      // Probe-RMS gains: each probe weighted by its true squared norm at state l+1.
      const double top = *std::max_element(log_scale_.begin(), log_scale_.end());
      double total = 0, total_skip = 0, total_branch = 0, weights = 0;
      for (int k = 0; k < probes; ++k) {
        weight[k] = std::exp(2.0 * (log_scale_[k] - top));
        double full = 0, skip = 0, through_branch = 0;
        for (std::size_t s = 0; s < previous_.size(); ++s) {
          full += probe_squared_norm(previous_[s], k, tokens);
          skip += probe_squared_norm(skip_part_[s], k, tokens);
          const Eigen::Index offset = static_cast<Eigen::Index>(k) * tokens * previous_[s].cols();
          through_branch += squared_distance(previous_[s].data() + offset, skip_part_[s].data() + offset,
                                             static_cast<Eigen::Index>(tokens) * previous_[s].cols());
        }
        total += weight[k] * full, total_skip += weight[k] * skip, total_branch += weight[k] * through_branch;
        weights += weight[k];
      }
      gain[l] = std::sqrt(total / weights);
      skip_gain[l] = std::sqrt(total_skip / weights);
      branch_gain[l] = std::sqrt(total_branch / weights);
      if (!renormalise(previous_, log_norms, stream_norms)) {
        if (!result_.diverged) {  // an underflow in the forward pass is the cause; keep it
          result_.diverged = Divergence{
              l, "backward",
              fmt::format(
                  "the gradient through sublayer {} became zero or non-finite; states below {} are null", l,
                  l)};
        }
        return;
      }
      for (int k = 0; k < probes; ++k) log_scale_[k] += log_norms[k];
      std::swap(gradient_, previous_);
      record_state_gradient(l, stream_norms);
      report_progress(2LL * sublayers_ - l);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Jacobian products J_{l->out} = dy/dx_l (--exact-jacobian, --spectrum). Blocks of P columns are
  // stacked like probes, P blocks of T rows per stream; `flatten` turns them into (n, P) matrices
  // with n = streams * T * d.

  // Recomputes sublayer i's activations from its stored input (i == S: the output head).
  BranchContext<Scalar> recompute(int i) {
    if (i < sublayers_) {
      const auto branch = prepare_sublayer(i);
      executor_.forward(graph_, states_[i], branch);
      return branch;
    }
    const SublayerContext head = context(sublayers_);
    graph_.reset(static_cast<int>(states_[sublayers_].size()));
    arch_.build_output(graph_, head);
    const auto branch = branch_context(head);
    executor_.forward(graph_, states_[sublayers_], branch);
    return branch;
  }

  Eigen::Index entries_per_stream() const { return static_cast<Eigen::Index>(config_.seq) * config_.width; }

  Eigen::MatrixXd flatten(const State<Scalar>& block, Eigen::Index columns) const {
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

  void unflatten(const Eigen::MatrixXd& columns, std::size_t streams, State<Scalar>& block) const {
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

  // --exact-jacobian: J_{l->out}^T for every output coordinate at once (m = T d one-hot cotangents),
  // one backward sweep; exact Frobenius and spectral norms per state. A common scale per state,
  // accumulated in log, keeps deep products finite.
  void exact_jacobian() {
    const Eigen::Index outputs = entries_per_stream();
    State<Scalar> cotangent(1, Mat<Scalar>::Zero(outputs * config_.seq, config_.width));
    for (Eigen::Index c = 0; c < outputs; ++c)
      cotangent[0](c * config_.seq + c / config_.width, c % config_.width) = 1;
    auto& fro = result_.states.at("log10_jacobian_fro_exact");
    auto& spectral = result_.states.at("log10_jacobian_spectral_exact");
    double log_scale = 0;
    State<Scalar> next;
    for (int l = sublayers_; l >= 0; --l) {
      const auto branch = recompute(l);
      executor_.backward(graph_, cotangent, true, branch, next);
      const Eigen::MatrixXd transposed = flatten(next, outputs);  // (n_l, m): J_{l->out}^T / exp(log_scale)
      const double norm = transposed.norm();
      fro[l] = (log_scale + std::log(norm)) / kLn10;
      const Eigen::VectorXd singular = Eigen::BDCSVD<Eigen::MatrixXd>(transposed).singularValues();
      spectral[l] = (log_scale + std::log(singular[0])) / kLn10;
      for (int i = 0; i < config_.spectrum && i < singular.size(); ++i) {
        result_.states.at(fmt::format("log10_singular_value_{}_exact", i + 1))[l] =
            (log_scale + std::log(singular[i])) / kLn10;
      }
      if (!(norm > 0) || !std::isfinite(norm)) return;
      for (auto& stream : next) stream *= static_cast<Scalar>(1.0 / norm);
      log_scale += std::log(norm);
      std::swap(cotangent, next);
    }
  }

  static Eigen::MatrixXd orthonormal_columns(const Eigen::MatrixXd& m) {
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
    return qr.householderQ() * Eigen::MatrixXd::Identity(m.rows(), m.cols());
  }

  // J_{l->out} V for orthonormal V (n_l, P): forward-mode sweep with QR at every state,
  // J V = Q R_total. R_total is kept at unit Frobenius norm, its scale accumulated in log.
  struct ForwardSweep {
    Eigen::MatrixXd q;        // (m, P)
    Eigen::MatrixXd r_total;  // (P, P) upper triangular
    double log_scale = 0;
  };
  ForwardSweep forward_sweep(int l, const Eigen::MatrixXd& v) {
    const Eigen::Index columns = v.cols();
    ForwardSweep sweep{{}, Eigen::MatrixXd::Identity(columns, columns), 0.0};
    State<Scalar> tangent, next;
    unflatten(v, states_[l].size(), tangent);
    for (int i = l; i <= sublayers_; ++i) {
      const auto branch = recompute(i);
      executor_.jvp(graph_, tangent, branch, next);
      const Eigen::MatrixXd m = flatten(next, columns);
      Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
      sweep.q = qr.householderQ() * Eigen::MatrixXd::Identity(m.rows(), columns);
      const Eigen::MatrixXd r = qr.matrixQR().topRows(columns).template triangularView<Eigen::Upper>();
      sweep.r_total = r * sweep.r_total;
      const double scale = sweep.r_total.norm();
      if (!(scale > 0) || !std::isfinite(scale)) break;
      sweep.r_total /= scale;
      sweep.log_scale += std::log(scale);
      unflatten(sweep.q, next.size(), tangent);
    }
    return sweep;
  }

  // orth(J_{l->out}^T U) for U (m, P): backward sweep with QR at every state (only the span matters).
  Eigen::MatrixXd backward_sweep(int l, const Eigen::MatrixXd& u) {
    State<Scalar> cotangent, next;
    unflatten(u, 1, cotangent);
    Eigen::MatrixXd q;
    for (int i = sublayers_; i >= l; --i) {
      const auto branch = recompute(i);
      executor_.backward(graph_, cotangent, true, branch, next);
      q = orthonormal_columns(flatten(next, u.cols()));
      unflatten(q, next.size(), cotangent);
    }
    return q;
  }

  // --spectrum k: top-k singular values of J_{l->out} at every state by subspace iteration on
  // J^T J (orthogonal iteration with Rayleigh-Ritz; Golub & Van Loan, Matrix Computations, Sec. 8.2).
  // Each iteration is one forward sweep J V (QR at every state, logs of R accumulated) and one
  // backward sweep orth(J^T U); the Ritz values are the singular values of R_total. A single
  // backward sweep from a random start would give only lower bounds. With P = 2k columns the error
  // falls like (s_{P+1} / s_i)^(2 * iterations); states are processed from the top down, each
  // warm-started from the previous state's top-k output directions plus fresh random columns.
  // Cost: O(S^2 * iterations * P) sublayer evaluations, against O(S) for the probes.
  void spectrum() {
    const int wanted = config_.spectrum;
    const Eigen::Index outputs = entries_per_stream();
    Eigen::Index columns = std::min<Eigen::Index>(2 * wanted, outputs);
    for (const auto& state : states_) {
      columns = std::min<Eigen::Index>(columns, static_cast<Eigen::Index>(state.size()) * outputs);
    }
    const Eigen::Index kept = std::min<Eigen::Index>(wanted, columns);
    Eigen::MatrixXd u = Eigen::MatrixXd::Zero(outputs, columns);
    long long spectrum_done = 0;  // progress units (analysis_work_units)
    const double tolerance =
        config_.precision == Precision::f64 ? kSpectrumToleranceF64 : kSpectrumToleranceF32;
    for (int l = sublayers_; l >= 0; --l) {
      // Start: the previous state's top-k output directions plus fresh random columns. The random
      // part matters: a warm start alone can have exact zeros along a direction (e.g. the final
      // norm's block-diagonal Jacobian), which no number of iterations would then recover.
      Eigen::MatrixXd fresh(outputs, columns - (l == sublayers_ ? 0 : kept));
      fill_normal(stream_key(seed_, RandomUse::spectrum, static_cast<std::uint64_t>(l)), 1.0, fresh.data(),
                  static_cast<std::size_t>(fresh.size()));
      u.rightCols(fresh.cols()) = fresh;
      u = orthonormal_columns(u);
      Eigen::VectorXd log_singular;
      Eigen::MatrixXd v = backward_sweep(l, u);
      for (int iteration = 0; iteration < kSpectrumMaxIterations; ++iteration) {
        const ForwardSweep sweep = forward_sweep(l, v);
        const Eigen::JacobiSVD<Eigen::MatrixXd> svd(sweep.r_total, Eigen::ComputeFullU);
        const Eigen::VectorXd estimate = svd.singularValues().array().log() + sweep.log_scale;
        u = sweep.q * svd.matrixU();
        bool converged = log_singular.size() == estimate.size();
        for (Eigen::Index i = 0; converged && i < std::min<Eigen::Index>(wanted, estimate.size()); ++i) {
          const double change =
              estimate[i] == log_singular[i] ? 0.0 : std::abs(estimate[i] - log_singular[i]);
          converged = change < tolerance;
        }
        log_singular = estimate;
        if (converged) break;
        v = backward_sweep(l, u);
      }
      for (int i = 0; i < wanted && i < log_singular.size(); ++i) {
        result_.states.at(fmt::format("log10_singular_value_{}", i + 1))[l] = log_singular[i] / kLn10;
      }
      spectrum_done += sublayers_ - l + 1;
      report_progress(2LL * sublayers_ + spectrum_done);
    }
  }

  // At sublayer l after the full backward, while log_scale_ still holds state l+1's scales:
  // the output contribution <dL/d update, update> per probe, log10_param_grad, and (additive
  // placements) the update's share of the exact decomposition of x_S.
  void record_contribution(int l) {
    const int probes = config_.probes, tokens = config_.seq;
    const auto& update = executor_.value(graph_.update_id());
    const auto& d_update = executor_.cotangent(graph_.update_id());
    for (int k = 0; k < probes; ++k) {
      // The cotangent is probe k's dL/d update divided by exp(log_scale_[k]): keep the log. When the
      // recompute skipped F's output projection, <dL/dF, F> (= <dL/d update, update>, see
      // recompute_can_skip_branch_output) came from the branch's backward.
      const double contribution =
          executor_.skipped_branch_output()
              ? executor_.branch_output_dots()[k]
              : lane_dot(d_update.data() + static_cast<Eigen::Index>(k) * tokens * update.cols(),
                         update.data(), update.size());
      log_contribution_[static_cast<std::size_t>(l) * probes + k] =
          std::log(std::abs(contribution)) + log_scale_[k];
    }
    if (config_.branch == BranchKind::model) {
      std::vector<double> logs(probes);
      for (int k = 0; k < probes; ++k) logs[k] = log_scale_[k] + 0.5 * std::log(param_grads_[k]);
      result_.sublayers.at("log10_param_grad")[l] = log_rms(logs) / kLn10;
    }
    if (arch_.additive_stream) {
      const Mat<Scalar>& top = states_[sublayers_].front();
      result_.sublayers.at("stream_decomposition")[l] =
          lane_dot(update.data(), top.data(), top.size()) / squared_norm(top);
    }
  }

  // output_share from the per-probe contributions c_{l,k} (kept as logs of |c|):
  //   output_share_l = R_l / sum_m R_m,  R_l = sqrt(mean_k c_{l,k}^2)  (probe-RMS),
  //   output_share_se_l = delete-one-probe jackknife standard error of output_share_l:
  //     sqrt((K-1)/K * sum_k (share_l^(-k) - mean_j share_l^(-j))^2), share^(-k) computed without
  //     probe k (Efron & Stein 1981); null for K = 1.
  // A common reference scale (the largest |c|) cancels in the ratios, so nothing overflows.
  void output_shares() {
    const int probes = config_.probes;
    if (log_contribution_.size() != static_cast<std::size_t>(sublayers_) * probes) return;
    double top = -std::numeric_limits<double>::infinity();
    for (const double v : log_contribution_) {
      if (std::isnan(v)) return;
      top = std::max(top, v);
    }
    if (!std::isfinite(top)) return;
    // squares[l][k] = (c_{l,k} / reference)^2
    std::vector<double> squares(log_contribution_.size()), row_sum(sublayers_, 0.0);
    for (std::size_t i = 0; i < squares.size(); ++i)
      squares[i] = std::exp(2.0 * (log_contribution_[i] - top));
    for (int l = 0; l < sublayers_; ++l) {
      for (int k = 0; k < probes; ++k) row_sum[l] += squares[static_cast<std::size_t>(l) * probes + k];
    }
    const auto shares = [&](int left_out, std::vector<double>& out) {
      const double count = left_out < 0 ? probes : probes - 1;
      double total = 0;
      out.resize(sublayers_);
      for (int l = 0; l < sublayers_; ++l) {
        const double sum =
            row_sum[l] - (left_out < 0 ? 0.0 : squares[static_cast<std::size_t>(l) * probes + left_out]);
        out[l] = std::sqrt(std::max(0.0, sum) / count);
        total += out[l];
      }
      for (double& v : out) v /= total;
      return total;
    };
    std::vector<double> share;
    shares(-1, share);
    auto& output_share = result_.sublayers.at("output_share");
    double sum_sq = 0;
    for (int l = 0; l < sublayers_; ++l) output_share[l] = share[l], sum_sq += share[l] * share[l];
    result_.effective_depth = 1.0 / sum_sq;  // (sum c)^2 / sum c^2 with c normalised to sum 1
    if (probes < 2) return;
    std::vector<double> mean(sublayers_, 0.0), mean_sq(sublayers_, 0.0), left;
    for (int k = 0; k < probes; ++k) {
      shares(k, left);
      for (int l = 0; l < sublayers_; ++l)
        mean[l] += left[l] / probes, mean_sq[l] += left[l] * left[l] / probes;
    }
    auto& se = result_.sublayers.at("output_share_se");
    for (int l = 0; l < sublayers_; ++l) {
      se[l] = std::sqrt(std::max(0.0, (probes - 1.0) * (mean_sq[l] - mean[l] * mean[l])));
    }
  }

  void summarize() {
    output_shares();
    if (arch_.additive_stream && !result_.diverged) {
      const Mat<Scalar>& top = states_[sublayers_].front();
      result_.stream_decomposition_input =
          states_[0].front().template cast<double>().cwiseProduct(top.template cast<double>()).sum() /
          squared_norm(top);
    }
    const auto& log10_grad = result_.states.at("log10_grad");
    auto& relative = result_.states.at("log10_grad_rel");
    for (int l = 0; l <= sublayers_; ++l) relative[l] = log10_grad[l] - log10_grad[sublayers_];
    result_.log10_grad_ratio = relative[0];
    const auto& gain = result_.sublayers.at("gain");
    result_.gain_min = {kNaN, -1};
    result_.gain_max = {kNaN, -1};
    for (int l = 0; l < sublayers_; ++l) {
      if (!std::isfinite(gain[l])) continue;
      if (result_.gain_min.sublayer < 0 || gain[l] < result_.gain_min.value) result_.gain_min = {gain[l], l};
      if (result_.gain_max.sublayer < 0 || gain[l] > result_.gain_max.value) result_.gain_max = {gain[l], l};
    }
    result_.growth = fit_growth(result_.states.at("rms"));
    for (auto& stream : result_.streams) stream.growth = fit_growth(stream.states.at("rms"));
  }

  const ModelConfig& config_;
  const Architecture& arch_;
  const Constants& constants_;
  const std::uint64_t seed_;
  const ProgressCallback progress_;  // a copy: callers may pass a temporary
  const AnalysisHooks hooks_;        // a copy, likewise
  const int sublayers_;
  std::vector<double> skip_weights_;

  SeedResult result_;
  std::vector<State<Scalar>> states_;
  std::vector<State<Scalar>> output_norm_stats_;  // per sublayer: its output norms' statistics
  SublayerGraph graph_;
  GraphExecutor<Scalar> executor_;
  SublayerWeights<Scalar> weight_buffers_[2];
  int loaded_[2] = {-1, -1};   // which sublayer's weights each buffer holds, complete
  int drawing_[2] = {-1, -1};  // which sublayer's weights each buffer is being drawn for
  WeightDraw<Scalar> draws_[2];
  std::unique_ptr<ShardPair> shards_;  // null: one core
  State<Scalar> cotangent_out_, gradient_, previous_, skip_part_;
  std::vector<double> log_scale_;       // per probe: log of the true norm of the current gradient
  std::vector<double> stream_squares_;  // record_state_rms's per-stream sums of squares
  ParamGradSquares param_grads_;
  std::vector<double> log_contribution_;  // (S, K): log |<dL/d update_l, update_l>| per probe
  const Mat<Scalar>* input_;
  double loss_ = 0.0;
};

template <typename Scalar>
void append_tensor(std::vector<NamedTensor>& out, std::string name, const Mat<Scalar>& m,
                   std::vector<std::int64_t> shape) {
  NamedTensor tensor{std::move(name), std::move(shape), std::vector<double>(m.data(), m.data() + m.size())};
  out.push_back(std::move(tensor));
}

template <typename Scalar>
std::vector<NamedTensor> collect_tensors(const ModelConfig& config, const Architecture& arch,
                                         const Constants& constants, std::uint64_t seed) {
  std::vector<NamedTensor> tensors;
  const std::int64_t t = config.seq, d = config.width, k = config.probes, hidden = config.ffn_hidden();
  append_tensor(tensors, "input", make_input<Scalar>(config, seed), {t, d});
  append_tensor(tensors, "probe", make_probes<Scalar>(config, seed), {k, t, d});
  if (config.branch != BranchKind::model) return tensors;
  SublayerWeights<Scalar> weights;
  for (int l = 0; l < config.sublayers(); ++l) {
    const SublayerContext ctx{config, constants, l, config.block_of(l), config.sublayer_kind(l), 1.0};
    generate_weights(config, arch, ctx, seed, weights);
    const std::string prefix = fmt::format("sublayer.{:04d}.", l);
    if (ctx.kind == SublayerKind::attn) {
      append_tensor(tensors, prefix + "W_Q", weights.w_q, {d, d});
      append_tensor(tensors, prefix + "W_K", weights.w_k, {d, d});
      append_tensor(tensors, prefix + "W_V", weights.w_v, {d, d});
      append_tensor(tensors, prefix + "W_O", weights.w_o, {d, d});
    } else {
      append_tensor(tensors, prefix + "W_1", weights.w_1, {d, hidden});
      append_tensor(tensors, prefix + "W_2", weights.w_2, {hidden, d});
    }
  }
  return tensors;
}
}  // namespace

std::vector<double>& FigureColumns::add(std::string name, std::size_t length) {
  names.push_back(std::move(name));
  values.emplace_back(length, kNaN);
  return values.back();
}

const std::vector<double>* FigureColumns::find(std::string_view name) const {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return &values[i];
  }
  return nullptr;
}

const std::vector<double>& FigureColumns::at(std::string_view name) const {
  if (const auto* column = find(name)) return *column;
  throw std::logic_error(fmt::format("figure column {} missing", name));
}

std::vector<double>& FigureColumns::at(std::string_view name) {
  return const_cast<std::vector<double>&>(static_cast<const FigureColumns&>(*this).at(name));
}

Constants resolve_constants(const Architecture& arch, const ModelConfig& config) {
  return arch.constants ? arch.constants(config) : Constants{};
}

long long analysis_work_units(const ModelConfig& config) {
  const long long sublayers = config.sublayers();
  const long long spectrum = config.spectrum > 0 ? (sublayers + 1) * (sublayers + 2) / 2 : 0;
  return 2 * sublayers + spectrum;
}

SeedResult analyze_seed(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                        std::uint64_t seed, const ProgressCallback& progress, const AnalysisHooks& hooks) {
  if (config.precision == Precision::f32)
    return Analysis<float>(config, arch, constants, seed, progress, hooks).run();
  return Analysis<double>(config, arch, constants, seed, progress, hooks).run();
}

InputGradient loss_and_input_gradient(const ModelConfig& config, const Architecture& arch,
                                      const Constants& constants, std::uint64_t seed,
                                      const Eigen::MatrixXd* input, const AnalysisHooks& hooks) {
  ModelConfig f64 = config;
  f64.precision = Precision::f64;
  const Mat<double> row_major_input = input ? Mat<double>(*input) : make_input<double>(f64, seed);
  Analysis<double> analysis(f64, arch, constants, seed, {}, hooks, &row_major_input);
  const SeedResult result = analysis.run();
  if (result.diverged) throw std::runtime_error("loss_and_input_gradient: " + result.diverged->reason);
  return {analysis.loss(), analysis.input_gradient()};
}

std::vector<NamedTensor> run_tensors(const ModelConfig& config, const Architecture& arch,
                                     const Constants& constants, std::uint64_t seed) {
  if (config.precision == Precision::f32) return collect_tensors<float>(config, arch, constants, seed);
  return collect_tensors<double>(config, arch, constants, seed);
}

}  // namespace gradflow
