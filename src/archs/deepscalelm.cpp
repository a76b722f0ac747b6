// deepscalelm: x <- l x + b F(N(x)), b^2 = 2/S, l^2 + b^2 = 1, final norm: moment control that
// keeps the stream's second moment fixed (Kedia et al. 2024 "Transformers get stable", arXiv
// 2403.09635, Sec. 3; authors' megatron transformer.py: moment_control_lambda / _beta).
// S counted in sublayers, as the authors' code and docs/placements.md say (a third-party port reads 2/B).
#include <fmt/format.h>

#include <cmath>

#include "archs.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::archs {

Architecture deepscalelm() {
  Architecture arch;
  arch.id = "deepscalelm";
  arch.update_rule = "x <- l x + b F(N(x))";
  arch.final_norm = "yes";
  arch.citation = "Kedia et al. 2024 \"Transformers Get Stable\" (DeepScaleLM), arXiv 2403.09635";
  arch.expected_growth = "bounded";  // Var[x_{l+1}] = l^2 Var[x_l] + b^2 Var[F]: a fixed point
  arch.constants = [](const ModelConfig& config) -> Constants {
    const int sublayers = config.sublayers();
    if (sublayers < 2) {
      throw InputError(
          fmt::format("deepscalelm needs at least 2 sublayers (b^2 = 2/S must not exceed 1), not {}; "
                      "try --depth 2",
                      sublayers));
    }
    const double beta_sq = 2.0 / sublayers;
    return {{"beta", std::sqrt(beta_sq), "sqrt(2/S)", "sublayers"},
            {"lambda", std::sqrt(1.0 - beta_sq), "sqrt(1 - b^2)", "sublayers"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    recipes::scaled_pre_norm(g, constant_value(ctx.constants, "lambda"),
                             constant_value(ctx.constants, "beta"));
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  // The skip path is l times the identity.
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    return constant_value(ctx.constants, "lambda");
  };
  return arch;
}

}  // namespace gradflow::archs
