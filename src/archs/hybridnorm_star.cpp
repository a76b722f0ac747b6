// hybridnorm-star: HybridNorm* = block 0 pre-ln (attention keeps its per-head QKV norm), later
// blocks hybridnorm; final norm (Zhuo et al. 2025, arXiv 2503.04598, Sec. 3; README:
// norm_pos_special_config {0: attn_norm True, ffn_residual False}).
#include "archs.hpp"

namespace gradflow::archs {

Architecture hybridnorm_star() {
  Architecture arch;
  arch.id = "hybridnorm-star";
  arch.update_rule = "block 0: pre-ln with QKV norm; later blocks: hybridnorm";
  arch.final_norm = "yes";
  arch.citation = "Zhuo et al. 2025 \"HybridNorm\" (HybridNorm*), arXiv 2503.04598";
  arch.expected_growth = "bounded";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    if (ctx.block > 0) return recipes::hybrid_norm(g, ctx.kind);
    const Value x = g.input(0);
    const QkvNorm qkv_norm = ctx.kind == SublayerKind::attn ? QkvNorm::per_head_qkv : QkvNorm::none;
    const Value update = g.branch(g.norm(x), qkv_norm);
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    if (ctx.block == 0 || ctx.kind == SublayerKind::attn) return 1.0;
    return std::nullopt;
  };
  return arch;
}

}  // namespace gradflow::archs
