// hybridnorm: attention x <- x + Attn(x) with per-head RMSNorm on Q, K, V and no input norm; FFN
// h = N(x), x <- h + FFN(h); final norm (Zhuo et al. 2025 "HybridNorm", arXiv 2503.04598, Sec. 3;
// BryceZhuo/HybridNorm config: attn_norm false, q/k/v norm per head, ffn_residual_after_norm).
#include "archs.hpp"

namespace gradflow::archs {

Architecture hybridnorm() {
  Architecture arch;
  arch.id = "hybridnorm";
  arch.update_rule = "attn: x <- x + Attn_QKVnorm(x); ffn: h = N(x), x <- h + FFN(h)";
  arch.final_norm = "yes";
  arch.citation = "Zhuo et al. 2025 \"HybridNorm\", arXiv 2503.04598";
  arch.expected_growth = "bounded";
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    recipes::hybrid_norm(g, ctx.kind);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  // The attention's skip is the identity; the FFN's runs through N (no closed form).
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    if (ctx.kind == SublayerKind::attn) return 1.0;
    return std::nullopt;
  };
  return arch;
}

}  // namespace gradflow::archs
