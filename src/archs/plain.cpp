// plain: x <- F(x), no residual and no norm: the baseline that shows why both exist (pure
// attention loses rank doubly exponentially: Dong et al. 2021, arXiv 2103.03404).
#include "archs.hpp"

namespace gradflow::archs {

Architecture plain() {
  Architecture arch;
  arch.id = "plain";
  arch.update_rule = "x <- F(x): no residual, no norm";
  arch.final_norm = "none";
  arch.citation = "Dong et al. 2021 \"Attention is not all you need\", arXiv 2103.03404";
  // No skip: the RMS decays geometrically (exponent about -27 at B = 64, -60 at B = 256), and the
  // state underflows to exact zeros in float32 after about 220 sublayers: a collapsing stream.
  arch.expected_growth = "vanishing";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) {
    const Value update = g.branch(g.input(0));
    g.set_outputs({update});
    g.mark_update(update, update);  // the branch writes the whole new state: stream_share = 1
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  // There is no skip path: with F held constant the gradient is 0.
  arch.skip_gain_theory = [](const SublayerContext&) -> std::optional<double> { return 0.0; };
  return arch;
}

}  // namespace gradflow::archs
