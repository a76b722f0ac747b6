// deepnorm: x <- N(a x + F(x)), decoder-only constants a = (2B)^(1/4), b = (8B)^(-1/4)
// (Wang et al. 2022 "DeepNet", arXiv 2203.00555, Table 1 / Fig. 2), B in blocks.
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

Architecture deepnorm() {
  Architecture arch;
  arch.id = "deepnorm";
  arch.update_rule = "x <- N(a x + F(x))";
  arch.final_norm = "none";
  arch.citation = "Wang et al. 2022 \"DeepNet\", arXiv 2203.00555";
  arch.expected_growth = "bounded";
  arch.constants = [](const ModelConfig& config) -> Constants {
    const double blocks = config.blocks;
    const std::optional<double> alpha = config.number_option("alpha");
    return {
        {"alpha", alpha.value_or(std::pow(2.0 * blocks, 0.25)), alpha ? "--alpha" : "(2B)^(1/4)", "blocks"},
        {"beta", std::pow(8.0 * blocks, -0.25), "(8B)^(-1/4)", "blocks"}};
  };
  // x <- N(a x + F(x)); Xavier-normal with gain beta on W_V, W_O, W_1, W_2, gain 1 on W_Q, W_K (DeepNet Fig.
  // 2).
  recipes::deepnet_post_norm(arch);
  return arch;
}

}  // namespace gradflow::archs
