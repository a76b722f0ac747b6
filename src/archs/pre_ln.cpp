// pre-ln: x <- x + F(N(x)), final norm (Xiong et al. 2020, arXiv 2002.04745; GPT-2; LLaMA).
#include "archs.hpp"

namespace gradflow::archs {

Architecture pre_ln() {
  Architecture arch;
  arch.id = "pre-ln";
  arch.update_rule = "x <- x + F(N(x))";
  arch.final_norm = "yes";
  arch.citation = "Xiong et al. 2020, arXiv 2002.04745; GPT-2; LLaMA";
  // sqrt under constant-std init (E norm(x_S)^2 in [(1+S/2)d, (1+3S/2)d], Xiong et al. Lemma 2).
  arch.expected_growth = "sqrt";
  arch.additive_stream = true;
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) { recipes::pre_norm(g); };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
