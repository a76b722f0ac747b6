// mix-ln: blocks b < floor(r B) are post-ln, later blocks pre-ln, final norm, r = 0.25 (Li, Yin,
// Liu 2024 "Mix-LN", arXiv 2412.13795; authors' code: layer_index < max_post_norm_layer is post-LN).
#include <fmt/format.h>

#include <cmath>

#include "archs.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::archs {

namespace {
constexpr double kDefaultMixRatio = 0.25;

bool is_post_ln_block(const SublayerContext& ctx) {
  return ctx.block < constant_value(ctx.constants, "post_ln_blocks");
}
}  // namespace

Architecture mix_ln() {
  Architecture arch;
  arch.id = "mix-ln";
  arch.update_rule = "blocks b < floor(r B): post-ln; later: pre-ln";
  arch.final_norm = "yes";
  arch.citation = "Li, Yin, Liu 2024 \"Mix-LN\", arXiv 2412.13795";
  // Flat (post-ln) up to block floor(r B), then sqrt growth from there: fitted over l >= S/8
  // (metrics.md) the onset makes the slope steeper than 0.65 (about 1.5 at B = 256, r = 0.25).
  arch.expected_growth = "other";
  PlacementOption ratio;
  ratio.key = "mix_ratio";
  ratio.flag = "--mix-ratio";
  ratio.help = "mix-ln: fraction r of blocks (the first floor(r B)) that are post-ln";
  ratio.default_value = kDefaultMixRatio;
  ratio.check_number = [](double r) {
    if (!(r >= 0.0 && r <= 1.0))  // as !(inside), so that NaN is refused too
      throw InputError(fmt::format("--mix-ratio {} must lie in [0, 1]; try --mix-ratio 0.25", r));
  };
  ratio.in_sweep_model = true;  // a resumed sweep must not mix ratios
  arch.options = {ratio};
  arch.constants = [](const ModelConfig& config) -> Constants {
    const double ratio = config.number_option("mix_ratio").value_or(kDefaultMixRatio);
    return {{"mix_ratio", ratio, "r (--mix-ratio)", "fraction of blocks"},
            {"post_ln_blocks", std::floor(ratio * config.blocks), "floor(r B)", "blocks"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    if (is_post_ln_block(ctx)) return recipes::post_norm(g, 1.0);
    recipes::pre_norm(g);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::final_norm(g); };
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    return is_post_ln_block(ctx) ? recipes::post_norm_skip_theory(1.0) : 1.0;
  };
  return arch;
}

}  // namespace gradflow::archs
