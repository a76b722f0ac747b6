// Base init, inputs and probes from the counter-based generator.
#include "gradflow/initialization.hpp"

#include <cmath>
#include <limits>

#include "gradflow/rng.hpp"

namespace gradflow {

// Base init (architectures.md "Base initialisation"): the standard deviation of one matrix.
double base_stddev(const ModelConfig& config, WeightMatrix matrix, Eigen::Index fan_in,
                   Eigen::Index fan_out) {
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
  return std::numeric_limits<double>::quiet_NaN();
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
  if (config.weight_nudge && config.weight_nudge->sublayer == ctx.sublayer) {  // test-only hook
    const auto& nudge = *config.weight_nudge;
    Mat<Scalar>* matrices[] = {&weights.w_q, &weights.w_k, &weights.w_v,
                               &weights.w_o, &weights.w_1, &weights.w_2};
    matrices[nudge.matrix]->data()[nudge.entry] += static_cast<Scalar>(nudge.delta);
  }
}

// x_0[t] = sqrt(r) c + sqrt(1 - r) e_t with c, e_t i.i.d. N(0, I) rows (architectures.md "Inputs").
template <typename Scalar>
Mat<Scalar> make_input(const ModelConfig& config, std::uint64_t seed) {
  Mat<Scalar> x(config.seq, config.width);
  fill_normal(stream_key(seed, RandomUse::input, 0), Scalar(1), x.data(), static_cast<std::size_t>(x.size()));
  if (config.input_corr > 0.0) {
    Mat<Scalar> shared(1, config.width);
    fill_normal(stream_key(seed, RandomUse::input, 1), Scalar(1), shared.data(),
                static_cast<std::size_t>(shared.size()));
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

template void generate_weights<float>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                      std::uint64_t, SublayerWeights<float>&);
template void generate_weights<double>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                       std::uint64_t, SublayerWeights<double>&);
template Mat<float> make_input<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_input<double>(const ModelConfig&, std::uint64_t);
template Mat<float> make_probes<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_probes<double>(const ModelConfig&, std::uint64_t);

}  // namespace gradflow
