// log10_param_grad against central differences of the loss with respect to every weight
// (float64; issue 4, acceptance 4), through the test-only weight nudge.
#include <doctest/doctest.h>

#include <cmath>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "support/small_model.hpp"

using namespace gradflow;

namespace {
// The loss of probe 0 with one weight entry shifted by delta.
double nudged_loss(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                   int sublayer, WeightMatrix matrix, long long entry, double delta) {
  AnalysisHooks hooks;
  hooks.weight_nudge = AnalysisHooks::WeightNudge{sublayer, matrix, entry, delta};
  return loss_and_input_gradient(config, arch, constants, 5, nullptr, hooks).loss;
}
}  // namespace

TEST_CASE("log10_param_grad equals log10 of the central-difference norm of dL/dW (float64)") {
  const ModelConfig config = testing::small_model(2, 4, 2, 3);
  for (const char* id : {"pre-ln", "post-ln", "deepnorm", "keel"}) {
    const Architecture& arch = find_architecture(id);
    const Constants constants = resolve_constants(arch, config);
    const SeedResult run = analyze_seed(config, arch, constants, 5);
    const double h = 1e-5;
    for (int l = 0; l < config.sublayers(); ++l) {
      const bool attention = config.sublayer_kind(l) == SublayerKind::attn;
      const std::vector<std::pair<WeightMatrix, long long>> matrices =
          attention ? std::vector<std::pair<WeightMatrix, long long>>{{WeightMatrix::q, 16},
                                                                      {WeightMatrix::k, 16},
                                                                      {WeightMatrix::v, 16},
                                                                      {WeightMatrix::o, 16}}
                    : std::vector<std::pair<WeightMatrix, long long>>{{WeightMatrix::up, 64},
                                                                      {WeightMatrix::down, 64}};
      double squared = 0;
      for (const auto& [matrix, entries] : matrices) {
        for (long long e = 0; e < entries; ++e) {
          const double slope = (nudged_loss(config, arch, constants, l, matrix, e, h) -
                                nudged_loss(config, arch, constants, l, matrix, e, -h)) /
                               (2 * h);
          squared += slope * slope;
        }
      }
      CAPTURE(id);
      CAPTURE(l);
      CHECK(run.sublayers.at(Figure::log10_param_grad)[l] ==
            doctest::Approx(0.5 * std::log10(squared)).epsilon(1e-7));
    }
  }
}
