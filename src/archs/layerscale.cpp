// layerscale: x <- x + diag(lambda) F(N(x)), final norm, lambda by depth in blocks (Touvron et
// al. 2021 "Going deeper with Image Transformers" (CaiT), arXiv 2103.17239, Sec. 2).
#include "archs.hpp"

namespace gradflow::archs {

namespace {
// CaiT Sec. 2: "epsilon = 0.1 until depth 18, 1e-5 for depth 24 and 1e-6 for deeper networks";
// depths 19-23 take the depth-24 value (architectures.md's interpolation).
double layerscale_init(int blocks) {
  if (blocks <= 18) return 0.1;
  if (blocks <= 24) return 1e-5;
  return 1e-6;
}
}  // namespace

Architecture layerscale() {
  Architecture arch;
  arch.id = "layerscale";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + diag(lambda) F(N(x))";
  arch.final_norm = "yes";
  arch.citation = "Touvron et al. 2021 \"Going deeper with Image Transformers\" (CaiT), arXiv 2103.17239";
  arch.expected_growth = "bounded";  // updates of size lambda <= 0.1 barely move the stream
  arch.constants = [](const ModelConfig& config) -> Constants {
    return {
        {"lambda", layerscale_init(config.blocks), "0.1 if B <= 18, 1e-5 if B <= 24, else 1e-6", "blocks"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    recipes::scaled_pre_norm(g, 1.0,
                             constant_value(ctx.constants, "lambda"));  // diag(lambda) = lambda I at init
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
