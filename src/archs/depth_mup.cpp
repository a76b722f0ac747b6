// depth-mup: x <- x + (a / sqrt(S)) F(N(x)), a = 1, final norm: the 1/sqrt(depth) branch scale of
// Depth-muP (Yang et al. 2023, arXiv 2310.02244; Bordelon et al. 2023, arXiv 2309.16620). Depth is
// read as sublayers (every residual branch), as architectures.md says; 1/sqrt(B) is the other reading.
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

Architecture depth_mup() {
  Architecture arch;
  arch.id = "depth-mup";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + (a / sqrt(S)) F(N(x))";
  arch.final_norm = "yes";
  arch.citation =
      "Yang et al. 2023 \"Tensor Programs VI\", arXiv 2310.02244; Bordelon et al. 2023, arXiv 2309.16620";
  arch.expected_growth = "bounded";  // E norm(x_S)^2 <= (1 + a^2 Var[F]) d whatever S
  arch.constants = [](const ModelConfig& config) -> Constants {
    constexpr double kBranchMultiplier = 1.0;  // a: the depth-independent multiplier, 1 at init
    return {{"branch_scale", kBranchMultiplier / std::sqrt(static_cast<double>(config.sublayers())),
             "a / sqrt(S), a = 1", "sublayers"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    recipes::scaled_pre_norm(g, 1.0, constant_value(ctx.constants, "branch_scale"));
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
