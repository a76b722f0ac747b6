// deepnorm-glm: DeepNorm with GLM-130B's constants, x <- N(a x + F(x)), a = (2B)^(1/2), Xavier
// gain b = (2B)^(-1/2) on W_V, W_O, W_1, W_2 (Zeng et al. 2022 "GLM-130B", arXiv 2210.02414,
// Sec. 2.1). Not DeepNet's table (see deepnorm.cpp).
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

Architecture deepnorm_glm() {
  Architecture arch;
  arch.id = "deepnorm-glm";
  arch.update_rule = "x <- N(a x + F(x))";
  arch.final_norm = "none";
  arch.citation = "Zeng et al. 2022 \"GLM-130B\", arXiv 2210.02414 (DeepNorm variant)";
  arch.expected_growth = "bounded";
  arch.constants = [](const ModelConfig& config) -> Constants {
    const double blocks = config.blocks;
    const std::optional<double> alpha = config.number_option("alpha");
    return {{"alpha", alpha.value_or(std::sqrt(2.0 * blocks)), alpha ? "--alpha" : "(2B)^(1/2)", "blocks"},
            {"beta", 1.0 / std::sqrt(2.0 * blocks), "(2B)^(-1/2)", "blocks"}};
  };
  // x <- N(a x + F(x)); Xavier-normal with gain beta on W_V, W_O, W_1, W_2, gain 1 on W_Q, W_K (DeepNet Fig.
  // 2).
  recipes::deepnet_post_norm(arch);
  return arch;
}

}  // namespace gradflow::archs
