// olmo2: x <- x + N(F(x)) with QK-norm over the full q and k, final norm (OLMo 2, arXiv
// 2501.00656, Sec. 3.3 "reordered norm and QK-norm"; HF modeling_olmo2.py).
#include "archs.hpp"

namespace gradflow::archs {

Architecture olmo2() {
  Architecture arch;
  arch.id = "olmo2";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + N(F(x)), QK-norm over full q and k";
  arch.final_norm = "yes";
  arch.citation = "OLMo et al. 2024 \"2 OLMo 2 Furious\", arXiv 2501.00656";
  arch.expected_growth = "sqrt";  // unit-RMS updates, as peri-ln (architectures.md)
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) {
    const Value x = g.input(0);
    const Value update = g.norm(g.branch(x, QkvNorm::full_qk));
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
