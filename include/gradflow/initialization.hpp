// The stack's random initial values: base init of every weight matrix (architectures.md "Base
// initialisation", with the architecture's mandated gains), the input tokens and the probes, all
// drawn from the counter-based generator, so they are regenerated rather than stored.
#pragma once
#include <cstdint>

#include "gradflow/architecture.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

// The standard deviation of one matrix under the configuration's base init.
double base_stddev(const ModelConfig& config, WeightMatrix matrix, Eigen::Index fan_in, Eigen::Index fan_out);

// Sublayer ctx.sublayer's weights, keyed by (seed, sublayer, matrix).
template <typename Scalar>
void generate_weights(const ModelConfig& config, const Architecture& arch, const SublayerContext& ctx,
                      std::uint64_t seed, SublayerWeights<Scalar>& weights);

// x_0 (T, d): rows sqrt(r) c + sqrt(1 - r) e_t (architectures.md "Inputs").
template <typename Scalar>
Mat<Scalar> make_input(const ModelConfig& config, std::uint64_t seed);

// The probes U_k (K*T, d): K blocks of T rows.
template <typename Scalar>
Mat<Scalar> make_probes(const ModelConfig& config, std::uint64_t seed);

}  // namespace gradflow
