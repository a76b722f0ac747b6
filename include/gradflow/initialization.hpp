// The stack's random initial values: base init of every weight matrix (architectures.md "Base
// initialisation", with the architecture's mandated gains), the input tokens and the probes, all
// drawn from the counter-based generator, so they are regenerated rather than stored.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "gradflow/architecture.hpp"
#include "gradflow/branch_op.hpp"
#include "gradflow/ops.hpp"
#include "gradflow/work_pool.hpp"

namespace gradflow {

// The standard deviation of one matrix under the configuration's base init.
double base_stddev(const ModelConfig& config, WeightMatrix matrix, Eigen::Index fan_in, Eigen::Index fan_out);

// Sublayer ctx.sublayer's weights, keyed by (seed, sublayer, matrix).
template <typename Scalar>
void generate_weights(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                      std::uint64_t seed, SublayerWeights<Scalar>& weights);

// The same weights drawn a chunk of kNormalChunk values at a time by whichever thread is free
// (IdleWork): every chunk's values are fixed by (seed, sublayer, matrix, index), so which thread
// draws it changes nothing. plan() sizes the matrices; then any thread may step() while one
// thread finish()es; plan() again only after finish() and after no other thread can step().
template <typename Scalar>
class WeightDraw final : public IdleWork {
 public:
  void plan(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
            std::uint64_t seed, SublayerWeights<Scalar>& weights);
  bool step() noexcept override;  // draws one unclaimed chunk; false when none is left
  void finish();                  // draws what is left, then waits for the chunks other threads claimed

 private:
  struct Matrix {
    Scalar* data;
    std::uint64_t key;
    Scalar stddev;
    std::size_t size;
    int first_chunk;
  };
  SublayerWeights<Scalar>* weights_ = nullptr;
  bool unit_norm_ = false;              // Architecture::unit_norm_weights: finish() normalises along d
  std::vector<WeightSpec> specs_;       // the sublayer's branch op's weights (branch_op.hpp)
  std::vector<double> column_squares_;  // normalize_along_width's scratch, kept across sublayers
  std::vector<Matrix> matrices_;
  int total_chunks_ = 0;
  std::atomic<int> next_{0}, done_{0};  // the next chunk to claim; chunks drawn
};

// nGPT's normalize_matrices() at init (NVIDIA/ngpt train.py L394-411): every vector along the
// width-d (embedding) dimension gets unit norm, i.e. with y = x W the columns of W_Q, W_K, W_V
// (d, d) and W_1 (d, 4d) and the rows of W_O (d, d) and W_2 (4d, d): the rows of an output
// projection (WeightMatrix o or down), the columns of every other weight of `specs`. Norms in double;
// `scratch` holds one double per column (reused, so the per-sublayer loop does not allocate).
template <typename Scalar>
void normalize_along_width(const std::vector<WeightSpec>& specs, SublayerWeights<Scalar>& weights,
                           std::vector<double>& scratch);

// x_0 (T, d): rows sqrt(r) c + sqrt(1 - r) e_t (architectures.md "Inputs").
template <typename Scalar>
Mat<Scalar> make_input(const ModelConfig& config, std::uint64_t seed);

// The probes U_k (K*T, d): K blocks of T rows.
template <typename Scalar>
Mat<Scalar> make_probes(const ModelConfig& config, std::uint64_t seed);

}  // namespace gradflow
