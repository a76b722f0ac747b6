// rezero: x <- x + a F(x), no norm anywhere, a = 0 at init (Bachlechner et al. 2020 "ReZero is
// all you need", arXiv 2003.04887, Sec. 3 / Table 1). With a = 0 the stack is the identity.
#include "archs.hpp"

namespace gradflow::archs {

Architecture rezero() {
  Architecture arch;
  arch.id = "rezero";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + a F(x), no norm";
  arch.final_norm = "none";
  arch.citation = "Bachlechner et al. 2020 \"ReZero\", arXiv 2003.04887";
  arch.expected_growth = "bounded";  // exactly 0 at init: every update is 0
  arch.constants = [](const ModelConfig& config) -> Constants {
    return {{"alpha", config.rezero_alpha.value_or(0.0), config.rezero_alpha ? "--rezero-alpha" : "0 at init",
             "-"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const Value x = g.input(0);
    const Value update = g.scale(g.branch(x), constant_value(ctx.constants, "alpha"));
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
