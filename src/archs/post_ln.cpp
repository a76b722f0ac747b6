// post-ln: x <- N(x + F(x)) (Vaswani et al. 2017, arXiv 1706.03762, Sec. 5.4).
#include "archs.hpp"

namespace gradflow::archs {

Architecture post_ln() {
  Architecture arch;
  arch.id = "post-ln";
  arch.update_rule = "x <- N(x + F(x))";
  arch.final_norm = "none";
  arch.citation = "Vaswani et al. 2017, arXiv 1706.03762";
  arch.expected_growth = "bounded";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) { recipes::post_norm(g, 1.0); };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  // 1/sqrt(2) per sublayer, so 2^(-S/2) over the stack (Keel, arXiv 2601.19895, Eq. 15).
  arch.skip_gain_theory = [](const SublayerContext&) -> std::optional<double> {
    return recipes::post_norm_skip_theory(1.0);
  };
  return arch;
}

}  // namespace gradflow::archs
