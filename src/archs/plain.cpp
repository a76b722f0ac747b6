// plain: x <- F(x), no residual and no norm: the rank-collapse baseline
// (Dong, Cordonnier & Loukas 2021, "Attention is not all you need", arXiv 2103.03404).
#include "archs.hpp"

namespace gradflow::archs {

Architecture plain() {
  Architecture arch;
  arch.id = "plain";
  arch.update_rule = "x <- F(x)";
  arch.final_norm = "none";
  arch.citation = "Dong et al. 2021, arXiv 2103.03404";
  arch.expected_growth = "other";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) {
    const Value update = g.branch(g.input(0));
    g.set_outputs({update});
    g.mark_update(update, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  return arch;
}

}  // namespace gradflow::archs
