// Base init, inputs and probes from the counter-based generator.
#include "gradflow/initialization.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gradflow/branch_op.hpp"
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

template <typename Scalar>
void WeightDraw<Scalar>::plan(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                              std::uint64_t seed, SublayerWeights<Scalar>& weights) {
  total_chunks_ = 0;
  weights_ = &weights;
  unit_norm_ = arch.unit_norm_weights;
  specs_ = branch_op(config, ctx.kind).weights(config);
  weights.resize(specs_.size());
  matrices_.resize(specs_.size());
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const WeightSpec& spec = specs_[i];
    Mat<Scalar>& m = weights.matrices[i];
    m.resize(spec.rows, spec.cols);
    const double gain = arch.init_gain ? arch.init_gain(ctx, spec.role) : 1.0;
    const double stddev = base_stddev(config, spec.role, spec.rows, spec.cols) * gain;
    const auto size = static_cast<std::size_t>(m.size());
    matrices_[i] = {m.data(), stream_key(seed, RandomUse::weight, ctx.sublayer, spec.stream),
                    static_cast<Scalar>(stddev), size, total_chunks_};
    total_chunks_ += static_cast<int>((size + kNormalChunk - 1) / kNormalChunk);
    // --bias: every projection's bias, zero at init (HF's _init_weights zeroes nn.Linear biases).
    weights.biases[i].setZero(config.bias ? spec.cols : 0);
  }
  done_.store(0, std::memory_order_relaxed);
  next_.store(0, std::memory_order_release);
}

template <typename Scalar>
bool WeightDraw<Scalar>::step() noexcept {
  if (next_.load(std::memory_order_relaxed) >= total_chunks_) return false;
  const int chunk = next_.fetch_add(1, std::memory_order_acquire);
  if (chunk >= total_chunks_) return false;
  std::size_t m = 0;
  while (m + 1 < matrices_.size() && matrices_[m + 1].first_chunk <= chunk) ++m;
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
  if (unit_norm_) normalize_along_width(specs_, *weights_, column_squares_);
}

template <typename Scalar>
void normalize_along_width(const std::vector<WeightSpec>& specs, SublayerWeights<Scalar>& weights,
                           std::vector<double>& scratch) {
  // (d, n): each column, a vector over the d inputs. The matrices are row-major, so the squares are
  // summed a row at a time into one double per column (scratch), in the same order (rows 0 .. d-1)
  // as a norm taken down each column; the column-at-a-time walk strided through the whole matrix
  // once per column and took over 40% of nGPT's run. Each sum is then replaced by its column's
  // factor, already rounded to Scalar (exact in double).
  const auto unit_columns = [&scratch](Mat<Scalar>& m) {
    scratch.assign(static_cast<std::size_t>(m.cols()), 0.0);
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
      const Scalar* row = m.data() + r * m.cols();
      for (Eigen::Index c = 0; c < m.cols(); ++c) {
        const double x = static_cast<double>(row[c]);
        scratch[c] += x * x;
      }
    }
    for (double& s : scratch) s = static_cast<double>(static_cast<Scalar>(1.0 / std::sqrt(s)));
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
      Scalar* row = m.data() + r * m.cols();
      for (Eigen::Index c = 0; c < m.cols(); ++c) row[c] *= static_cast<Scalar>(scratch[c]);
    }
  };
  const auto unit_rows = [](Mat<Scalar>& m) {  // (n, d): each row, a vector over the d outputs
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
      m.row(r) *= static_cast<Scalar>(1.0 / m.row(r).template cast<double>().norm());
    }
  };
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const bool output_projection = specs[i].role == WeightMatrix::o || specs[i].role == WeightMatrix::down;
    if (output_projection) {
      unit_rows(weights.matrices[i]);
    } else {
      unit_columns(weights.matrices[i]);
    }
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
template void normalize_along_width<float>(const std::vector<WeightSpec>&, SublayerWeights<float>&,
                                           std::vector<double>&);
template void normalize_along_width<double>(const std::vector<WeightSpec>&, SublayerWeights<double>&,
                                            std::vector<double>&);
template void generate_weights<float>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                      std::uint64_t, SublayerWeights<float>&);
template void generate_weights<double>(const ModelConfig&, const Architecture&, const SublayerContext&,
                                       std::uint64_t, SublayerWeights<double>&);
template Mat<float> make_input<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_input<double>(const ModelConfig&, std::uint64_t);
template Mat<float> make_probes<float>(const ModelConfig&, std::uint64_t);
template Mat<double> make_probes<double>(const ModelConfig&, std::uint64_t);

}  // namespace gradflow
