// Base init, inputs and probes from the counter-based generator.
#include "gradflow/initialization.hpp"

#include <immintrin.h>

#include <algorithm>
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
    case InitKind::normal:  // N(0, STD^2) for every matrix: HF's _init_weights with initializer_range
      return config.init_std;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

namespace {
// --bias: every projection's bias, zero at init (HF's _init_weights zeroes nn.Linear biases).
template <typename Scalar>
void zero_biases(const ModelConfig& config, SublayerKind kind, SublayerWeights<Scalar>& weights) {
  const Eigen::Index d = config.width, hidden = config.ffn_hidden(), kv_width = config.kv_width();
  const bool attn = kind == SublayerKind::attn, gated = config.ffn != FfnKind::gelu;
  const auto size = [&](Vec<Scalar>& b, Eigen::Index n, bool used) {
    b.setZero(config.bias && used ? n : 0);
  };
  size(weights.b_q, d, attn);
  size(weights.b_k, kv_width, attn);
  size(weights.b_v, kv_width, attn);
  size(weights.b_o, d, attn);
  size(weights.b_1, hidden, !attn);
  size(weights.b_3, hidden, !attn && gated);
  size(weights.b_2, d, !attn);
}
}  // namespace

template <typename Scalar>
void WeightDraw<Scalar>::plan(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                              std::uint64_t seed, SublayerWeights<Scalar>& weights) {
  matrix_count_ = 0;
  total_chunks_ = 0;
  weights_ = &weights;
  unit_norm_ = arch.unit_norm_weights;
  kind_ = ctx.kind;
  const auto add = [&](Mat<Scalar>& m, Eigen::Index rows, Eigen::Index cols, WeightMatrix which) {
    m.resize(rows, cols);
    const double gain = arch.init_gain ? arch.init_gain(ctx, which) : 1.0;
    const double stddev = base_stddev(config, which, rows, cols) * gain;
    const auto size = static_cast<std::size_t>(m.size());
    matrices_[matrix_count_++] = {
        m.data(), stream_key(seed, RandomUse::weight, ctx.sublayer, static_cast<std::uint64_t>(which)),
        static_cast<Scalar>(stddev), size, total_chunks_};
    total_chunks_ += static_cast<int>((size + kNormalChunk - 1) / kNormalChunk);
  };
  const Eigen::Index d = config.width, hidden = config.ffn_hidden(), kv_width = config.kv_width();
  if (ctx.kind == SublayerKind::attn) {
    add(weights.w_q, d, d, WeightMatrix::q);
    add(weights.w_k, d, kv_width, WeightMatrix::k);
    add(weights.w_v, d, kv_width, WeightMatrix::v);
    add(weights.w_o, d, d, WeightMatrix::o);
  } else {
    add(weights.w_1, d, hidden, WeightMatrix::up);
    // W_3 is drawn like W_1 (its own stream), as HF's _init_weights draws every nn.Linear alike.
    if (config.ffn != FfnKind::gelu) add(weights.w_3, d, hidden, WeightMatrix::gate);
    add(weights.w_2, hidden, d, WeightMatrix::down);
  }
  zero_biases(config, ctx.kind, weights);
  done_.store(0, std::memory_order_relaxed);
  next_.store(0, std::memory_order_release);
}

template <typename Scalar>
bool WeightDraw<Scalar>::step() noexcept {
  if (next_.load(std::memory_order_relaxed) >= total_chunks_) return false;
  const int chunk = next_.fetch_add(1, std::memory_order_acquire);
  if (chunk >= total_chunks_) return false;
  int m = 0;
  while (m + 1 < matrix_count_ && matrices_[m + 1].first_chunk <= chunk) ++m;
  const Matrix& matrix = matrices_[m];
  const std::size_t begin = static_cast<std::size_t>(chunk - matrix.first_chunk) * kNormalChunk;
  const std::size_t end = std::min(matrix.size, begin + kNormalChunk);
  fill_normal_range(matrix.key, matrix.stddev, matrix.data + begin, begin, end);
  done_.fetch_add(1, std::memory_order_release);
  return true;
}

template <typename Scalar>
void WeightDraw<Scalar>::finish() {
  while (step()) {
  }
  while (done_.load(std::memory_order_acquire) < total_chunks_) _mm_pause();
  if (unit_norm_) normalize_along_width(kind_, *weights_);
}

template <typename Scalar>
void normalize_along_width(SublayerKind kind, SublayerWeights<Scalar>& weights) {
  const auto unit_columns = [](Mat<Scalar>& m) {  // (d, n): each column, a vector over the d inputs
    for (Eigen::Index c = 0; c < m.cols(); ++c) {
      m.col(c) *= static_cast<Scalar>(1.0 / m.col(c).template cast<double>().norm());
    }
  };
  const auto unit_rows = [](Mat<Scalar>& m) {  // (n, d): each row, a vector over the d outputs
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
      m.row(r) *= static_cast<Scalar>(1.0 / m.row(r).template cast<double>().norm());
    }
  };
  if (kind == SublayerKind::attn) {
    for (Mat<Scalar>* m : {&weights.w_q, &weights.w_k, &weights.w_v}) unit_columns(*m);
    unit_rows(weights.w_o);
  } else {
    unit_columns(weights.w_1);
    if (weights.w_3.size() > 0) unit_columns(weights.w_3);
    unit_rows(weights.w_2);
  }
}

template <typename Scalar>
void generate_weights(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                      std::uint64_t seed, SublayerWeights<Scalar>& weights) {
  WeightDraw<Scalar> draw;
  draw.plan(config, arch, ctx, seed, weights);
  draw.finish();
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

template class WeightDraw<float>;
template class WeightDraw<double>;
template void normalize_along_width<float>(SublayerKind, SublayerWeights<float>&);
template void normalize_along_width<double>(SublayerKind, SublayerWeights<double>&);
template void generate_weights<float>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                      std::uint64_t, SublayerWeights<float>&);
template void generate_weights<double>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                       std::uint64_t, SublayerWeights<double>&);
template Mat<float> make_input<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_input<double>(const ModelConfig&, std::uint64_t);
template Mat<float> make_probes<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_probes<double>(const ModelConfig&, std::uint64_t);

}  // namespace gradflow
