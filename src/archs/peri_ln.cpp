// peri-ln (alias sandwich-ln): x <- x + N_out(F(N_in(x))), final norm. Sandwich-LN of CogView
// (Ding et al. 2021, arXiv 2105.13290); Peri-LN (Kim et al. 2025, arXiv 2502.02732); Gemma 2/3.
#include "archs.hpp"

namespace gradflow::archs {

Architecture peri_ln() {
  Architecture arch;
  arch.id = "peri-ln";
  arch.aliases = {"sandwich-ln"};
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + N_out(F(N_in(x)))";
  arch.final_norm = "yes";
  arch.citation =
      "Kim et al. 2025 \"Peri-LN\", arXiv 2502.02732; Ding et al. 2021 (CogView), arXiv 2105.13290";
  // Every update has unit RMS (N_out), so E norm(x_l)^2 grows linearly in l: sqrt growth.
  arch.expected_growth = "sqrt";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) {
    const Value x = g.input(0);
    const Value update = g.norm(g.branch(g.norm(x)));
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
