// siamese-norm: two streams X, Y, both starting at x_0. Per sublayer of block b:
//   X' = N_X(X); O = F(N_in(X' + N_Y(Y))); X <- X' + O / c; Y <- Y + O;  c = sqrt(2(b+1));
// output N_f(N_a(X) + N_b(Y)) (Li et al. 2026 "SiameseNorm", arXiv 2602.08064). DEVIATION from
// architectures.md (X <- N_X(X + O/c)): this is the official code's form (Qwen-Applications/
// SiameseNorm, Block.forward: x = post_norm(x) runs BEFORE the add), so x_0 is normalised by the
// first sublayer and the recorded X states are the un-normalised sums, as in the code.
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

namespace {
double branch_divisor(int block) {
  return std::sqrt(2.0 * (block + 1));
}  // c = ((index+1)*2)**0.5
}  // namespace

Architecture siamese_norm() {
  Architecture arch;
  arch.id = "siamese-norm";
  arch.update_rule = "X' = N_X(X); O = F(N_in(X' + N_Y(Y))); X <- X' + O/c; Y <- Y + O";
  arch.final_norm = "N_f(N_a(X) + N_b(Y))";
  arch.citation = "Li et al. 2026 \"SiameseNorm\", arXiv 2602.08064 (official code form)";
  arch.expected_growth = "sqrt";  // Y accumulates every O unscaled
  arch.streams = {"X", "Y"};
  arch.initial_streams = 2;
  arch.constants = [](const ModelConfig& config) -> Constants {
    return {{"c", branch_divisor(config.blocks - 1), "sqrt(2(b+1)), b = 0-based block; value at b = B-1",
             "blocks"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const Value x = g.norm(g.input(0)), y = g.input(1);
    const Value branch = g.branch(g.norm(g.add(x, g.norm(y))));
    const Value update = g.scale(branch, 1.0 / branch_divisor(ctx.block));
    const Value sum = g.add(x, update);
    g.set_outputs({sum, g.add(y, branch)});
    g.mark_update(update, sum);  // stream_share on the X stream, where O/c is added
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) {
    g.set_outputs({g.norm(g.add(g.norm(g.input(0)), g.norm(g.input(1))))});
  };
  return arch;
}

}  // namespace gradflow::archs
