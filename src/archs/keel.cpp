// keel: x <- N1(a x + F(N2(x))), a = S in sublayers, no final norm
// (Chen & Wei 2026 "Post-LayerNorm Is Back", arXiv 2601.19895).
#include <cmath>

#include "archs.hpp"

namespace gradflow::archs {

namespace {
constexpr const char* kDefaultVariant = "v2";

// The paper's first sublayers: in v2 the first attention sublayer is plain pre-ln and the first FFN
// keeps the outer norm with a = 1; in v1 both are plain pre-ln.
enum class FirstSublayer { none, plain_pre_norm, unit_alpha };

FirstSublayer first_sublayer_rule(const SublayerContext& ctx) {
  const int first_attn = ctx.config.block == BlockKind::ffn ? -1 : 0;
  const int first_ffn =
      ctx.config.block == BlockKind::attn_ffn ? 1 : (ctx.config.block == BlockKind::ffn ? 0 : -1);
  if (ctx.sublayer == first_attn) return FirstSublayer::plain_pre_norm;
  if (ctx.sublayer == first_ffn) {
    const bool v1 = ctx.config.word_option("keel_variant").value_or(kDefaultVariant) == "v1";
    return v1 ? FirstSublayer::plain_pre_norm : FirstSublayer::unit_alpha;
  }
  return FirstSublayer::none;
}

double skip_weight(const SublayerContext& ctx) {
  return first_sublayer_rule(ctx) == FirstSublayer::unit_alpha ? 1.0 : constant_value(ctx.constants, "alpha");
}
}  // namespace

Architecture keel() {
  Architecture arch;
  arch.id = "keel";
  arch.update_rule = "x <- N1(a x + F(N2(x)))";
  arch.final_norm = "none";
  arch.citation = "Chen & Wei 2026 \"Post-LayerNorm Is Back\", arXiv 2601.19895";
  arch.expected_growth = "bounded";
  PlacementOption variant;
  variant.key = "keel_variant";
  variant.flag = "--keel-variant";
  variant.help = "Keel's first sublayers: v2 (paper v2) or v1";
  variant.default_value = kDefaultVariant;
  variant.choices = {"v1", "v2"};
  variant.when_unused = UnusedOption::ignore;
  variant.in_run_config = true;
  variant.in_sweep_model = true;
  arch.options = {recipes::skip_weight_option(), variant};
  arch.constants = [](const ModelConfig& config) -> Constants {
    const std::optional<double> alpha = config.number_option("alpha");
    return {{"alpha", alpha.value_or(static_cast<double>(config.sublayers())), alpha ? "--alpha" : "S",
             "sublayers"}};
  };
  arch.build_sublayer = [](SublayerGraph& g, const SublayerContext& ctx) {
    if (first_sublayer_rule(ctx) == FirstSublayer::plain_pre_norm) return recipes::pre_norm(g);
    const Value x = g.input(0);
    const Value update = g.branch(g.norm(x));
    const Value sum = g.add(g.scale(x, skip_weight(ctx)), update);
    g.set_outputs({g.norm(sum)});
    g.mark_update(update, sum);
  };
  arch.build_output = [](SublayerGraph& g, const SublayerContext&) { recipes::identity_output(g); };
  // a / sqrt(a^2 + 1) per sublayer; with a = S the product is (1 + 1/S^2)^(-S/2) (Keel Eq. 19).
  arch.skip_gain_theory = [](const SublayerContext& ctx) -> std::optional<double> {
    if (first_sublayer_rule(ctx) == FirstSublayer::plain_pre_norm) return 1.0;
    return recipes::post_norm_skip_theory(skip_weight(ctx));
  };
  return arch;
}

}  // namespace gradflow::archs
