// The engine's entry points: one seed's analysis is its forward pass (src/science/forward.cpp) and
// then the families of figures of src/science/families.cpp, in that table's order, all reading the
// seed's stored states (src/science/stack_run.hpp); also the tensors a run uses (--export-weights).
#include <fmt/format.h>

#include <chrono>

#include "gradflow/analysis.hpp"
#include "gradflow/initialization.hpp"
#include "science/seed_analysis.hpp"
#include "science/sums.hpp"

namespace gradflow {

namespace {
// Every column this configuration reports, NaN until computed; the sublayers' kinds and blocks.
SeedResult empty_result(const ModelConfig& config, const Architecture& arch, std::uint64_t seed) {
  const std::size_t states = config.sublayers() + 1, subs = config.sublayers();
  SeedResult result;
  result.seed = seed;
  result.states = allocate_figures(config, FigureAxis::state, states);
  result.sublayers = allocate_figures(config, FigureAxis::sublayer, subs);
  for (const auto name : arch.streams) {
    StreamFigures stream{std::string(name), {}, {}};
    stream.states.add(Figure::rms, states);
    stream.states.add(Figure::log10_grad, states);
    result.streams.push_back(std::move(stream));
  }
  for (int l = 0; l < config.sublayers(); ++l) {
    result.kinds.push_back(config.sublayer_kind(l));
    result.blocks.push_back(config.block_of(l));
  }
  return result;
}

// One seed: the forward pass from `input` (the seed's own when null), then every family of figures
// that applies. Admin's profiled w is part of the init: it is profiled on the seed's own input and
// held fixed for a replacement input (finite differences perturb x_0, not the init).
template <typename Scalar>
void analyze(SeedAnalysis<Scalar>& analysis, const Mat<Scalar>* input) {
  const auto start = std::chrono::steady_clock::now();
  const StackRun<Scalar>& run = analysis.run;
  const Mat<Scalar> seed_input = make_input<Scalar>(run.config(), run.seed());
  const bool profile_separately = input && run.arch().profiles_skip_weight;
  if (profile_separately) {
    run_forward(analysis, seed_input, true);
    analysis.result.diverged.reset();
  }
  run_forward(analysis, input ? *input : seed_input, !profile_separately);
  for (const FigureFamily<Scalar>& family : figure_families<Scalar>()) {
    if (family.applies(analysis)) family.compute(analysis);
  }
  analysis.run.release_pool();
  analysis.result.seconds = seconds_since(start);
}

template <typename Scalar>
SeedResult analyze_one(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                       std::uint64_t seed, const ExecutionOptions& execution,
                       const ProgressCallback& progress, const AnalysisHooks& hooks) {
  SeedAnalysis<Scalar> analysis(config, arch, constants, seed, hooks, execution.threads,
                                empty_result(config, arch, seed), progress);
  analyze<Scalar>(analysis, nullptr);
  return std::move(analysis.result);
}

template <typename Scalar>
void append_tensor(std::vector<NamedTensor>& out, std::string name, const Mat<Scalar>& m,
                   std::vector<std::int64_t> shape) {
  NamedTensor tensor{std::move(name), std::move(shape), std::vector<double>(m.data(), m.data() + m.size())};
  out.push_back(std::move(tensor));
}

template <typename Scalar>
void append_bias(std::vector<NamedTensor>& out, std::string name, const Vec<Scalar>& b) {
  out.push_back({std::move(name), {b.size()}, std::vector<double>(b.data(), b.data() + b.size())});
}

template <typename Scalar>
std::vector<NamedTensor> collect_tensors(const ModelConfig& config, const Architecture& arch,
                                         const Constants& constants, std::uint64_t seed) {
  std::vector<NamedTensor> tensors;
  const std::int64_t t = config.seq, d = config.width, k = config.probes;
  append_tensor(tensors, "input", make_input<Scalar>(config, seed), {t, d});
  append_tensor(tensors, "probe", make_probes<Scalar>(config, seed), {k, t, d});
  if (config.branch != BranchKind::model) return tensors;
  SublayerWeights<Scalar> weights;
  for (int l = 0; l < config.sublayers(); ++l) {
    const SublayerContext ctx{config, constants, l, config.block_of(l), config.sublayer_kind(l), 1.0};
    generate_weights(config, arch, ctx, seed, weights);
    const std::string prefix = fmt::format("sublayer.{:04d}.", l);
    const auto specs = branch_op(config, ctx.kind).weights(config);
    for (std::size_t m = 0; m < specs.size(); ++m) {
      append_tensor(tensors, prefix + specs[m].name, weights.matrices[m], {specs[m].rows, specs[m].cols});
    }
    // --bias: each projection's bias (zero at init), named after its matrix.
    for (std::size_t m = 0; m < specs.size(); ++m) {
      if (weights.biases[m].size() > 0)
        append_bias(tensors, prefix + "b_" + specs[m].name.substr(2), weights.biases[m]);
    }
  }
  return tensors;
}
}  // namespace

Constants resolve_constants(const Architecture& arch, const ModelConfig& config) {
  return arch.constants ? arch.constants(config) : Constants{};
}

long long analysis_work_units(const ModelConfig& config) {
  const long long sublayers = config.sublayers();
  const long long spectrum = config.spectrum > 0 ? (sublayers + 1) * (sublayers + 2) / 2 : 0;
  return 2 * sublayers + spectrum;
}

SeedResult analyze_seed(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                        std::uint64_t seed, const ExecutionOptions& execution,
                        const ProgressCallback& progress, const AnalysisHooks& hooks) {
  if (config.precision == Precision::f32)
    return analyze_one<float>(config, arch, constants, seed, execution, progress, hooks);
  return analyze_one<double>(config, arch, constants, seed, execution, progress, hooks);
}

InputGradient loss_and_input_gradient(const ModelConfig& config, const Architecture& arch,
                                      const Constants& constants, std::uint64_t seed,
                                      const Eigen::MatrixXd* input, const AnalysisHooks& hooks) {
  ModelConfig f64 = config;
  f64.precision = Precision::f64;
  const Mat<double> row_major_input = input ? Mat<double>(*input) : make_input<double>(f64, seed);
  SeedAnalysis<double> analysis(f64, arch, constants, seed, hooks, 1, empty_result(f64, arch, seed));
  analyze(analysis, &row_major_input);
  if (analysis.result.diverged)
    throw std::runtime_error("loss_and_input_gradient: " + analysis.result.diverged->reason);
  // The true gradient: probe 0's renormalised dL/dx_0, summed over the streams, times its scale.
  Mat<double> gradient = Mat<double>::Zero(f64.seq, f64.width);
  for (const auto& stream : analysis.probes.gradient) gradient += stream.topRows(f64.seq);
  return {analysis.probes.loss, gradient * std::exp(analysis.probes.log_scale[0])};
}

std::vector<NamedTensor> run_tensors(const ModelConfig& config, const Architecture& arch,
                                     const Constants& constants, std::uint64_t seed) {
  if (config.precision == Precision::f32) return collect_tensors<float>(config, arch, constants, seed);
  return collect_tensors<double>(config, arch, constants, seed);
}

}  // namespace gradflow
