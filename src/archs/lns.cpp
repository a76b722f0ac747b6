// lns (LayerNorm Scaling): x <- x + F(N(x) / sqrt(b+1)), final norm (Sun et al. 2025 "The Curse of
// Depth", arXiv 2502.05795). DEVIATION from architectures.md (which writes sqrt(l+1) with l
// the sublayer): b is the 0-based BLOCK index, as the authors' code does (lmsdss/LayerNorm-Scaling,
// modeling_llama.py: scale_factor = 1 / math.sqrt(self.layer_index + 1) for both norms of a layer).
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

namespace {
double input_scale(int block) {
  return 1.0 / std::sqrt(block + 1.0);
}
}  // namespace

Architecture lns() {
  Architecture arch;
  arch.id = "lns";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + F(N(x) / sqrt(b+1)), b = block";
  arch.final_norm = "yes";
  arch.citation =
      "Sun et al. 2025 \"The Curse of Depth\" (LayerNorm Scaling), arXiv 2502.05795; b per authors' code";
  // F's input shrinks as 1/sqrt(b+1), so Var[F] ~ 1/(b+1) and E norm(x)^2 grows only like log B
  // (exponent about 0.1 at B = 256).
  arch.expected_growth = "bounded";
  arch.constants = [](const ModelConfig& config) -> Constants {
    return {{"input_scale", input_scale(config.blocks - 1),
             "1/sqrt(b+1), b = 0-based block; value at b = B-1", "blocks"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const Value x = g.input(0);
    const Value update = g.branch(g.scale(g.norm(x), input_scale(ctx.block)));
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
