// rezero: x <- x + a F(x), no norm anywhere, a = 0 at init (Bachlechner et al. 2020 "ReZero is
// all you need", arXiv 2003.04887, Sec. 3 / Table 1). With a = 0 the stack is the identity.
#include <fmt/format.h>

#include <cmath>

#include "archs.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::archs {

namespace {
constexpr double kInitialAlpha = 0.0;  // a = 0 at init (ReZero, Sec. 3)
}  // namespace

Architecture rezero() {
  Architecture arch;
  arch.id = "rezero";
  arch.additive_stream = true;  // x <- x + update only
  arch.update_rule = "x <- x + a F(x), no norm";
  arch.final_norm = "none";
  arch.citation = "Bachlechner et al. 2020 \"ReZero\", arXiv 2003.04887";
  arch.expected_growth = "bounded";  // exactly 0 at init: every update is 0
  PlacementOption branch_weight;
  branch_weight.key = "rezero_alpha";
  branch_weight.flag = "--rezero-alpha";
  branch_weight.help = "rezero: the branch weight a (default 0, as at init)";
  branch_weight.default_value = kInitialAlpha;
  branch_weight.check_number = [](double a) {
    if (!std::isfinite(a))
      throw InputError(
          fmt::format("--rezero-alpha {} must be finite; omit it for rezero's a = 0 at init", a));
  };
  branch_weight.in_sweep_model = true;  // a resumed sweep must not mix branch weights
  arch.options = {branch_weight};
  arch.constants = [](const ModelConfig& config) -> Constants {
    const std::optional<double> alpha = config.number_option("rezero_alpha");
    return {{"alpha", alpha.value_or(kInitialAlpha), alpha ? "--rezero-alpha" : "0 at init", "-"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    const Value x = g.input(0);
    const Value update = g.scale(g.branch(x), constant_value(ctx.constants, "alpha"));
    recipes::residual_add(g, x, update);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  arch.skip_gain_theory = recipes::identity_skip_theory;
  return arch;
}

}  // namespace gradflow::archs
