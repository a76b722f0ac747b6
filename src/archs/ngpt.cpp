// ngpt: h <- U(U(h) + a (U(F(h)) - U(h))), U(v) = v / norm(v) per token, a = 0.05; q and k
// unit-normalised per head, softmax scale sqrt(d_h); the FFN's hidden pre-activation scaled by
// s_uv = sqrt(d); no final norm (Loshchilov et al. 2024 "nGPT", arXiv 2410.01131, Sec. 2; NVIDIA/ngpt
// model.py: justnorm, attn_alpha_init_value = 0.05, Block.forward `uv = suv * uv` with
// suv = suv_init_value * sqrt(n_embd) = sqrt(d) at init, applied to both halves u and v before
// the activation). Every weight matrix is normalised along the embedding dimension at init
// (train.py L394-411: normalize_matrices(), called before the first step; justnorm of query, key,
// value and c_fc along n_embd = dim 1, of att_c_proj and mlp_c_proj along n_embd = dim 0).
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

Architecture ngpt() {
  Architecture arch;
  arch.id = "ngpt";
  arch.update_rule = "h <- U(U(h) + a (U(F(h)) - U(h)))";
  arch.final_norm = "none";
  arch.citation = "Loshchilov et al. 2024 \"nGPT\", arXiv 2410.01131";
  arch.expected_growth = "bounded";  // every state after the first sublayer lies on the unit sphere
  arch.unit_norm_weights = true;
  arch.constants = [](const ModelConfig& config) -> Constants {
    return {{"alpha", 0.05, "0.05 (alpha_A, alpha_M at init)", "-"},
            {"s_uv", std::sqrt(static_cast<double>(config.width)),
             "sqrt(d) (FFN hidden pre-activation scale at init)", "-"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const Value h = g.input(0);
    const std::optional<double> score_scale = std::sqrt(static_cast<double>(ctx.config.head_dim()));
    const double hidden_scale = constant_value(ctx.constants, "s_uv");
    const Value branch = g.unit(g.branch(h, QkvNorm::per_head_qk_unit, score_scale, hidden_scale));
    const Value h_unit = g.unit(h);
    const Value update =
        g.scale(g.add(branch, g.scale(h_unit, -1.0)), constant_value(ctx.constants, "alpha"));
    const Value sum = g.add(h_unit, update);
    g.set_outputs({g.unit(sum)});
    g.mark_update(update, sum);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  return arch;
}

}  // namespace gradflow::archs
