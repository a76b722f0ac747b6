// span-norm, PROVISIONAL: attention h = N1(x + Attn(x)), FFN x <- N2(x + FFN(h)): the skip spans
// the whole block and the aggregate is post-normed (Wang et al. 2026 "SpanNorm", arXiv 2601.22580).
// The equations are not public; this reconstruction rests on the abstract alone, and its
// "principled scaling strategy" is unknown, so no scaling is applied.
#include "archs.hpp"

namespace gradflow::archs {

Architecture span_norm() {
  Architecture arch;
  arch.id = "span-norm";
  arch.update_rule = "h = N1(x + Attn(x)); x <- N2(x + FFN(h))";
  arch.final_norm = "none";
  arch.citation = "Wang et al. 2026 \"SpanNorm\", arXiv 2601.22580 (abstract only)";
  arch.expected_growth = "bounded";  // every block ends in N2
  arch.provisional = true;
  arch.provisional_note =
      "equations not public (arXiv 2601.22580, abstract only): reconstructed from the abstract's 'clean "
      "residual "
      "connection that spans the entire transformer block' and 'PostNorm-style computation that normalizes "
      "the "
      "aggregated output'; the inner N1 is a guess and the paper's scaling strategy is unknown, so it is "
      "omitted; "
      "single-sublayer blocks (--block ffn|attn) reduce to x <- N(x + F(x))";
  // Between the attention and the FFN of a block the state carries x (for the spanning skip) and h.
  arch.streams = {"x", "h"};
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const bool block_opens = ctx.config.block == BlockKind::attn_ffn && ctx.kind == SublayerKind::attn;
    const bool block_closes = ctx.config.block == BlockKind::attn_ffn && ctx.kind == SublayerKind::ffn;
    const Value x = g.input(0);
    const Value update = g.branch(block_closes ? g.input(1) : x);
    const Value sum = g.add(x, update);
    if (block_opens) {
      g.set_outputs({x, g.norm(sum)});
    } else {
      g.set_outputs({g.norm(sum)});
    }
    g.mark_update(update, sum);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  return arch;
}

}  // namespace gradflow::archs
