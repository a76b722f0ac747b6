// The engine: builds each sublayer from its recipe, runs the forward pass, then back-propagates
// the probes with the gradient renormalised at every state and the log of each step's scale
// accumulated in double (metrics.md, "The probe"). Activations are recomputed per sublayer during
// the backward pass, so memory is the residual states plus one sublayer's working set.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <omp.h>
#include <thread>

#include "gradflow/analysis.hpp"
#include "gradflow/graph.hpp"
#include "gradflow/rng.hpp"

namespace gradflow {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLn10 = 2.302585092994046;

template <typename Scalar>
using State = std::vector<Mat<Scalar>>;  // one (T, d) matrix per stream

template <typename Scalar>
double squared_norm(const Scalar* data, Eigen::Index count) {
  double sum = 0;
  for (Eigen::Index i = 0; i < count; ++i) sum += static_cast<double>(data[i]) * static_cast<double>(data[i]);
  return sum;
}
template <typename Scalar>
double squared_norm(const Mat<Scalar>& m) {
  return squared_norm(m.data(), m.size());
}
template <typename Scalar>
double state_rms(const State<Scalar>& state) {
  double sum = 0, count = 0;
  for (const auto& stream : state) sum += squared_norm(stream), count += static_cast<double>(stream.size());
  return std::sqrt(sum / count);
}
template <typename Scalar>
bool all_finite(const State<Scalar>& state) {
  return std::all_of(state.begin(), state.end(), [](const Mat<Scalar>& m) { return m.allFinite(); });
}
// Squared norm of probe k's rows (k*T .. k*T+T) of one cotangent.
template <typename Scalar>
double probe_squared_norm(const Mat<Scalar>& cotangent, int probe, int tokens) {
  return squared_norm(cotangent.data() + static_cast<Eigen::Index>(probe) * tokens * cotangent.cols(),
                      static_cast<Eigen::Index>(tokens) * cotangent.cols());
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

// Base init (architectures.md "Base initialisation"): the standard deviation of one matrix.
double base_stddev(const ModelConfig& config, WeightMatrix matrix, Eigen::Index fan_in, Eigen::Index fan_out) {
  const bool output_projection = matrix == WeightMatrix::o || matrix == WeightMatrix::down;
  const double depth_scale = output_projection ? 1.0 / std::sqrt(2.0 * config.blocks) : 1.0;
  switch (config.init) {
    case InitKind::xavier:  // Glorot & Bengio 2010, normal form
      return std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
    case InitKind::gpt2:  // Radford et al. 2019: N(0, 0.02^2), residual projections / sqrt(2B)
      return 0.02 * depth_scale;
    case InitKind::small:  // Nguyen & Salazar 2019 "small init" sqrt(2/(5d)), as OLMo / HybridNorm use it
      return std::sqrt(2.0 / (5.0 * config.width)) * depth_scale;
  }
  return kNaN;
}

template <typename Scalar>
void generate_weights(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                      std::uint64_t seed, SublayerWeights<Scalar>& weights) {
  const auto fill = [&](Mat<Scalar>& m, Eigen::Index rows, Eigen::Index cols, WeightMatrix which) {
    m.resize(rows, cols);
    const double gain = arch.init_gain ? arch.init_gain(ctx, which) : 1.0;
    const double stddev = base_stddev(config, which, rows, cols) * gain;
    fill_normal(stream_key(seed, RandomUse::weight, ctx.sublayer, static_cast<std::uint64_t>(which)),
                static_cast<Scalar>(stddev), m.data(), static_cast<std::size_t>(m.size()));
  };
  const Eigen::Index d = config.width, hidden = config.ffn_hidden();
  if (ctx.kind == SublayerKind::attn) {
    fill(weights.w_q, d, d, WeightMatrix::q);
    fill(weights.w_k, d, d, WeightMatrix::k);
    fill(weights.w_v, d, d, WeightMatrix::v);
    fill(weights.w_o, d, d, WeightMatrix::o);
  } else {
    fill(weights.w_1, d, hidden, WeightMatrix::up);
    fill(weights.w_2, hidden, d, WeightMatrix::down);
  }
}

// x_0[t] = sqrt(r) c + sqrt(1 - r) e_t with c, e_t i.i.d. N(0, I) rows (architectures.md "Inputs").
template <typename Scalar>
Mat<Scalar> make_input(const ModelConfig& config, std::uint64_t seed) {
  Mat<Scalar> x(config.seq, config.width);
  fill_normal(stream_key(seed, RandomUse::input, 0), Scalar(1), x.data(), static_cast<std::size_t>(x.size()));
  if (config.input_corr > 0.0) {
    Mat<Scalar> shared(1, config.width);
    fill_normal(stream_key(seed, RandomUse::input, 1), Scalar(1), shared.data(), static_cast<std::size_t>(shared.size()));
    x *= static_cast<Scalar>(std::sqrt(1.0 - config.input_corr));
    x.rowwise() += static_cast<Scalar>(std::sqrt(config.input_corr)) * shared.row(0);
  }
  return x;
}

// The probes U_k stacked as K blocks of T rows.
template <typename Scalar>
Mat<Scalar> make_probes(const ModelConfig& config, std::uint64_t seed) {
  Mat<Scalar> probes(static_cast<Eigen::Index>(config.probes) * config.seq, config.width);
  const Eigen::Index block = static_cast<Eigen::Index>(config.seq) * config.width;
  for (int k = 0; k < config.probes; ++k) {
    fill_normal(stream_key(seed, RandomUse::probe, k), Scalar(1), probes.data() + k * block,
                static_cast<std::size_t>(block));
  }
  return probes;
}

template <typename Scalar>
class Analysis {
 public:
  Analysis(const ModelConfig& config, const Architecture& arch, const Constants& constants, std::uint64_t seed,
           const ProgressCallback& progress, const Mat<Scalar>* input = nullptr)
      : config_(config), arch_(arch), constants_(constants), seed_(seed), progress_(progress),
        sublayers_(config.sublayers()), skip_weights_(sublayers_ + 1, 1.0), input_(input) {}

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
    start_prefetch_thread();
    const Mat<Scalar> seed_input = make_input<Scalar>(config_, seed_);
    // Admin's profiled w is part of the init: it is profiled on the seed's own input and held
    // fixed for a replacement input (finite differences perturb x_0, not the init).
    const bool profile_separately = input_ && arch_.profiles_skip_weight;
    if (profile_separately) {
      forward(seed_input, true);
      result_.diverged.reset();
    }
    const bool forward_ok = forward(input_ ? *input_ : seed_input, !profile_separately);
    if (forward_ok) backward();
    stop_prefetch_thread();
    summarize();
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(result_);
  }

 private:
  SublayerContext context(int sublayer) const {
    const bool head = sublayer == sublayers_;
    return SublayerContext{config_, constants_, sublayer, head ? config_.blocks : config_.block_of(sublayer),
                           head ? SublayerKind::ffn : config_.sublayer_kind(sublayer), skip_weights_[sublayer]};
  }

  BranchContext<Scalar> branch_context(const SublayerContext& ctx) const {
    return BranchContext<Scalar>{ctx.kind, config_.branch, config_.norm, config_.heads, nullptr};
  }

  // Builds sublayer l's graph; its weights must be in weight_buffers_[l % 2] (ensure_weights).
  BranchContext<Scalar> prepare_sublayer(int l) {
    const SublayerContext ctx = context(l);
    graph_.reset(static_cast<int>(states_[l].size()));
    arch_.build_sublayer(graph_, ctx);
    BranchContext<Scalar> branch = branch_context(ctx);
    branch.weights = &weight_buffers_[l % 2];
    return branch;
  }

  // Sublayer l's weights live in buffer l % 2, so the neighbour being prefetched (l + 1 in the
  // forward pass, l - 1 in the backward pass) always goes to the other buffer.
  void ensure_weights(int l) {
    if (config_.branch != BranchKind::model || l < 0 || l >= sublayers_ || loaded_[l % 2] == l) return;
    generate_weights(config_, arch_, context(l), seed_, weight_buffers_[l % 2]);
    loaded_[l % 2] = l;
  }

  // Runs `work` while the prefetch thread generates sublayer `next`'s weights. Weights are pure
  // functions of (seed, sublayer, matrix), so the overlap cannot change any number.
  template <typename Work>
  void with_prefetch(int next, Work&& work) {
    if (!prefetch_thread_.joinable()) {
      work();
      return ensure_weights(next);
    }
    {
      std::lock_guard lock(prefetch_mutex_);
      prefetch_request_ = next;
    }
    prefetch_wakeup_.notify_one();
    work();
    std::unique_lock lock(prefetch_mutex_);
    prefetch_wakeup_.wait(lock, [&] { return prefetch_request_ == kNoRequest; });
  }

  static constexpr int kNoRequest = -2, kStop = -3;
  void prefetch_loop() {
    std::unique_lock lock(prefetch_mutex_);
    for (;;) {
      prefetch_wakeup_.wait(lock, [&] { return prefetch_request_ != kNoRequest; });
      if (prefetch_request_ == kStop) return;
      lock.unlock();
      ensure_weights(prefetch_request_);
      lock.lock();
      prefetch_request_ = kNoRequest;
      prefetch_wakeup_.notify_one();
    }
  }
  void start_prefetch_thread() {
    // A second core is used only when this run is alone: inside a parallel loop over runs the
    // cores are already busy.
    if (config_.branch != BranchKind::model || omp_get_max_threads() < 2 || omp_in_parallel()) return;
    prefetch_thread_ = std::thread([this] { prefetch_loop(); });
  }
  void stop_prefetch_thread() {
    if (!prefetch_thread_.joinable()) return;
    {
      std::lock_guard lock(prefetch_mutex_);
      prefetch_request_ = kStop;
    }
    prefetch_wakeup_.notify_all();
    prefetch_thread_.join();
  }

  void allocate_figures() {
    const std::size_t states = sublayers_ + 1, subs = sublayers_;
    for (const char* name : {"rms", "log10_grad", "log10_grad_rel"}) result_.states.add(name, states);
    for (const char* name : {"gain", "skip_gain", "branch_gain", "skip_gain_theory", "branch_rms", "stream_share"}) {
      result_.sublayers.add(name, subs);
    }
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

  void record_state_rms(int l) {
    result_.states.at("rms")[l] = state_rms(states_[l]);
    for (std::size_t s = 0; s < states_[l].size(); ++s) {
      result_.streams[s].states.at("rms")[l] = std::sqrt(squared_norm(states_[l][s]) / states_[l][s].size());
    }
  }

  long long total_work() const { return 2LL * sublayers_; }
  void report_progress(long long done) const {
    if (progress_) progress_(done, total_work());
  }

  // profile: update the profiled skip weights (Admin) from this pass.
  bool forward(const Mat<Scalar>& input, bool profile) {
    states_.assign(sublayers_ + 1, {});
    states_[0].assign(arch_.initial_streams, input);
    record_state_rms(0);
    auto& branch_rms = result_.sublayers.at("branch_rms");
    auto& stream_share = result_.sublayers.at("stream_share");
    auto& skip_gain_theory = result_.sublayers.at("skip_gain_theory");
    ensure_weights(0);
    for (int l = 0; l < sublayers_; ++l) {
      const auto branch = prepare_sublayer(l);
      if (arch_.profiles_skip_weight && arch_.skip_gain_theory) {  // w_l is known from here on
        skip_gain_theory[l] = arch_.skip_gain_theory(context(l)).value_or(kNaN);
      }
      with_prefetch(l + 1, [&] { executor_.forward(graph_, states_[l], branch); });
      State<Scalar>& next = states_[l + 1];
      next.resize(graph_.outputs().size());
      for (std::size_t s = 0; s < next.size(); ++s) next[s] = executor_.value(graph_.outputs()[s]);
      const double update_sq = squared_norm(executor_.value(graph_.update_id()));
      branch_rms[l] = std::sqrt(update_sq / executor_.value(graph_.update_id()).size());
      stream_share[l] = std::sqrt(update_sq / squared_norm(executor_.value(graph_.sum_id())));
      if (profile && arch_.profiles_skip_weight) {  // Admin: w_{l+1}^2 = w_l^2 + Var[F_l] (Liu et al. 2020, Alg. 1)
        const auto& f = executor_.value(graph_.branch_id());
        const double mean = f.template cast<double>().mean();
        const double variance = squared_norm(f) / f.size() - mean * mean;
        skip_weights_[l + 1] = std::sqrt(skip_weights_[l] * skip_weights_[l] + variance);
      }
      if (!all_finite(next)) {
        result_.diverged = Divergence{
            l, "forward",
            fmt::format("state x_{} has non-finite entries (overflow in {}); figures after sublayer {} are null",
                        l + 1, to_string(config_.precision), l)};
        return false;
      }
      record_state_rms(l + 1);
      report_progress(l + 1);
    }
    return true;
  }

  // Renormalises each probe's cotangent to unit norm and returns log(norm) per probe, or false
  // when a probe's norm is zero or not finite.
  bool renormalise(State<Scalar>& cotangent, std::vector<double>& log_norms, std::vector<double>& stream_norms) {
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
        cotangent[s].middleRows(static_cast<Eigen::Index>(k) * tokens, tokens) *= static_cast<Scalar>(1.0 / norm);
      }
    }
    return true;
  }

  // Records log10_grad at state l from the accumulated per-probe logs and per-stream shares.
  void record_state_gradient(int l, const std::vector<double>& stream_norms) {
    result_.states.at("log10_grad")[l] = log_rms(log_scale_) / kLn10;
    const std::size_t streams = states_[l].size();
    for (std::size_t s = 0; s < streams; ++s) {
      std::vector<double> logs(config_.probes);
      for (int k = 0; k < config_.probes; ++k) logs[k] = log_scale_[k] + std::log(stream_norms[k * streams + s]);
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
             cotangent_out_[0].topRows(config_.seq).template cast<double>().array()).sum();
    executor_.backward(graph_, cotangent_out_, true, branch_context(head), gradient_);
    std::vector<double> log_norms, stream_norms;
    if (!renormalise(gradient_, log_norms, stream_norms)) {
      result_.diverged = Divergence{sublayers_, "backward", "the output gradient dL/dx_S is zero or not finite"};
      return;
    }
    log_scale_ = log_norms;
    record_state_gradient(sublayers_, stream_norms);

    auto& gain = result_.sublayers.at("gain");
    auto& skip_gain = result_.sublayers.at("skip_gain");
    auto& branch_gain = result_.sublayers.at("branch_gain");
    std::vector<double> weight(probes);
    ensure_weights(sublayers_ - 1);
    for (int l = sublayers_ - 1; l >= 0; --l) {
      const auto branch = prepare_sublayer(l);
      with_prefetch(l - 1, [&] {
        executor_.forward(graph_, states_[l], branch);  // recompute the activations
        executor_.backward(graph_, gradient_, false, branch, skip_part_);
        executor_.backward(graph_, gradient_, true, branch, previous_);
      });
      // Probe-RMS gains: each probe weighted by its true squared norm at state l+1.
      const double top = *std::max_element(log_scale_.begin(), log_scale_.end());
      double total = 0, total_skip = 0, total_branch = 0, weights = 0;
      for (int k = 0; k < probes; ++k) {
        weight[k] = std::exp(2.0 * (log_scale_[k] - top));
        double full = 0, skip = 0, through_branch = 0;
        for (std::size_t s = 0; s < previous_.size(); ++s) {
          full += probe_squared_norm(previous_[s], k, tokens);
          skip += probe_squared_norm(skip_part_[s], k, tokens);
          const auto rows = previous_[s].middleRows(static_cast<Eigen::Index>(k) * tokens, tokens);
          const auto skip_rows = skip_part_[s].middleRows(static_cast<Eigen::Index>(k) * tokens, tokens);
          through_branch += (rows - skip_rows).template cast<double>().squaredNorm();
        }
        total += weight[k] * full, total_skip += weight[k] * skip, total_branch += weight[k] * through_branch;
        weights += weight[k];
      }
      gain[l] = std::sqrt(total / weights);
      skip_gain[l] = std::sqrt(total_skip / weights);
      branch_gain[l] = std::sqrt(total_branch / weights);
      if (!renormalise(previous_, log_norms, stream_norms)) {
        result_.diverged = Divergence{
            l, "backward",
            fmt::format("the gradient through sublayer {} became zero or non-finite; states below {} are null", l, l)};
        return;
      }
      for (int k = 0; k < probes; ++k) log_scale_[k] += log_norms[k];
      std::swap(gradient_, previous_);
      record_state_gradient(l, stream_norms);
      report_progress(2LL * sublayers_ - l);
    }
  }

  void summarize() {
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
  const ProgressCallback& progress_;
  const int sublayers_;
  std::vector<double> skip_weights_;

  SeedResult result_;
  std::vector<State<Scalar>> states_;
  SublayerGraph graph_;
  GraphExecutor<Scalar> executor_;
  SublayerWeights<Scalar> weight_buffers_[2];
  int loaded_[2] = {-1, -1};  // which sublayer's weights each buffer holds
  std::thread prefetch_thread_;
  std::mutex prefetch_mutex_;
  std::condition_variable prefetch_wakeup_;
  int prefetch_request_ = kNoRequest;
  State<Scalar> cotangent_out_, gradient_, previous_, skip_part_;
  std::vector<double> log_scale_;  // per probe: log of the true norm of the current gradient
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
std::vector<NamedTensor> collect_tensors(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                                         std::uint64_t seed) {
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

SeedResult analyze_seed(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                        std::uint64_t seed, const ProgressCallback& progress) {
  if (config.precision == Precision::f32) return Analysis<float>(config, arch, constants, seed, progress).run();
  return Analysis<double>(config, arch, constants, seed, progress).run();
}

InputGradient loss_and_input_gradient(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                                      std::uint64_t seed, const Eigen::MatrixXd* input) {
  ModelConfig f64 = config;
  f64.precision = Precision::f64;
  const Mat<double> row_major_input = input ? Mat<double>(*input) : make_input<double>(f64, seed);
  Analysis<double> analysis(f64, arch, constants, seed, {}, &row_major_input);
  const SeedResult result = analysis.run();
  if (result.diverged) throw std::runtime_error("loss_and_input_gradient: " + result.diverged->reason);
  return {analysis.loss(), analysis.input_gradient()};
}

std::vector<NamedTensor> run_tensors(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                                     std::uint64_t seed) {
  if (config.precision == Precision::f32) return collect_tensors<float>(config, arch, constants, seed);
  return collect_tensors<double>(config, arch, constants, seed);
}

}  // namespace gradflow
