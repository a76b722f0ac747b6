// resi-dual: two streams a (post-ln) and d (pre-ln-like accumulator), both starting at x_0:
// o = F(a); a <- N(a + o); d <- d + o; output a_S + N(d_S) (Xie et al. 2023 "ResiDual", arXiv
// 2304.14802, Sec. 3; microsoft/ResiDual resi_dual_layers.py, dec_alpha = 1).
#include "archs.hpp"

namespace gradflow::archs {

Architecture resi_dual() {
  Architecture arch;
  arch.id = "resi-dual";
  arch.update_rule = "o = F(a); a <- N(a + o); d <- d + o";
  arch.final_norm = "a_S + N(d_S)";
  arch.citation = "Xie et al. 2023 \"ResiDual\", arXiv 2304.14802";
  arch.expected_growth = "sqrt";  // d grows like sqrt(l), a stays at RMS 1
  arch.streams = {"a", "d"};
  arch.initial_streams = 2;
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext&) {
    const Value a = g.input(0), d = g.input(1);
    const Value update = g.branch(a);
    const Value sum = g.add(a, update);
    g.set_outputs({g.norm(sum), g.add(d, update)});
    g.mark_update(update, sum);  // stream_share on the a stream, the one F reads
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) {
    g.set_outputs({g.add(g.input(0), g.norm(g.input(1)))});
  };
  return arch;
}

}  // namespace gradflow::archs
