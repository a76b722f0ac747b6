// admin: x <- N(w x + F(x)) with w profiled in one forward pass at init: w_0 = 1,
// w_{l+1}^2 = w_l^2 Var[x_l] + Var[F_l], Var the measured population variance over all entries
// (Liu et al. 2020 "Understanding the Difficulty of Training Transformers", arXiv 2004.08249,
// Alg. 1, as its authors' code computes it: LiyuanLucasLiu/Transformer-Clinic
// fairseq/fairseq/modules/transformer_layer.py L193-195, `np.sqrt(np.var(residual * ratio) +
// np.var(x))`). The engine profiles (profiles_skip_weight) on the seed's own input and hands w_l
// to the recipe as ctx.profiled_skip_weight.
#include "archs.hpp"

namespace gradflow::archs {

Architecture admin() {
  Architecture arch;
  arch.id = "admin";
  arch.update_rule = "x <- N(w x + F(x)), w profiled";
  arch.final_norm = "none";
  arch.citation = "Liu et al. 2020 \"Admin\", arXiv 2004.08249";
  arch.expected_growth = "bounded";
  arch.profiles_skip_weight = true;
  arch.constants = [](const ModelConfig&) -> Constants {
    return {{"w_0", 1.0, "1 (then w_{l+1}^2 = w_l^2 Var[x_l] + Var[F_l], profiled)", "sublayers"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    recipes::post_norm(g, ctx.profiled_skip_weight);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  // Post-norm with skip weight w_l (Keel, arXiv 2601.19895, Eq. 18 with alpha = w_l).
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    return recipes::post_norm_skip_theory(ctx.profiled_skip_weight);
  };
  return arch;
}

}  // namespace gradflow::archs
