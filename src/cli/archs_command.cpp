// `gradflow archs`: the registry of placements, as a table or JSON.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/architecture.hpp"

namespace gradflow::cli {

namespace {
// "path:line:column" -> "path".
std::string_view file_of(std::string_view defined_at) {
  for (int part = 0; part < 2; ++part) defined_at = defined_at.substr(0, defined_at.rfind(':'));
  return defined_at;
}

struct ArchsOptions {
  std::string arch;
  std::string checkpoint;
  int depth = 64;
  std::string format = "table";
};

std::string constants_text(const Architecture& arch, const ModelConfig& config) {
  std::string text;
  for (const Constant& c : resolve_constants(arch, config)) {
    if (!text.empty()) text += "; ";
    text += fmt::format("{} = {} = {:.6g} ({})", c.name, c.formula, c.value, c.unit);
  }
  return text.empty() ? "-" : text;
}

// The placement's options (PlacementOption) with their defaults, e.g. "--alpha (paper's constant)".
std::string options_text(const Architecture& arch) {
  std::string text;
  for (const PlacementOption& option : arch.options) {
    if (!text.empty()) text += "; ";
    text += fmt::format("{} (default {}): {}", option.flag, option.shown_default(), option.help);
  }
  return text;
}

// The closed-form skip factors (architectures.md "Closed forms") under the idealised branch:
// per sublayer and their product over the stack, in log10 (2^(-S/2) underflows at large S).
void print_closed_forms(const Architecture& arch, const ModelConfig& config) {
  if (!arch.skip_gain_theory) {
    fmt::print(std::cout, "  skip factor: no closed form\n");
    return;
  }
  if (arch.profiles_skip_weight) {
    fmt::print(std::cout,
               "  skip factor: w_l / sqrt(w_l^2 + 1) with w_l profiled at run time (see skip_gain_theory)\n");
    return;
  }
  const Constants constants = resolve_constants(arch, config);
  double log10_product = 0.0;
  int known = 0;
  for (int l = 0; l < config.sublayers(); ++l) {
    const SublayerContext ctx{config, constants, l, config.block_of(l), config.sublayer_kind(l), 1.0};
    if (const auto theory = arch.skip_gain_theory(ctx)) log10_product += std::log10(*theory), ++known;
  }
  const int last = config.sublayers() - 1;
  const SublayerContext ctx{config, constants, last, config.block_of(last), config.sublayer_kind(last), 1.0};
  if (const auto theory = arch.skip_gain_theory(ctx)) {
    fmt::print(std::cout, "  skip factor: {:.6g} per sublayer under the idealised branch (last sublayer)\n",
               *theory);
  }
  if (known == config.sublayers()) {
    fmt::print(std::cout, "  skip path:   product over all {} sublayers = 10^{:.6g} = {:.6g}\n", known,
               log10_product, std::pow(10.0, log10_product));
  } else {
    fmt::print(std::cout, "  skip path:   closed form for {} of {} sublayers only\n", known,
               config.sublayers());
  }
}

int run_archs(const ArchsOptions& options) {
  if (!options.checkpoint.empty()) {
    print_checkpoint(options.checkpoint, options.format);
    return 0;
  }
  ModelConfig config;
  config.blocks = options.depth;
  validate(config);
  std::vector<const Architecture*> selected;
  if (options.arch.empty()) {
    selected = architectures();
  } else {
    selected = parse_architecture_list(options.arch);
  }
  if (options.format == "json") {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Architecture* arch : selected) list.push_back(architecture_to_json(*arch, config));
    std::cout << nlohmann::ordered_json{{"schema_version", kSchemaVersion},
                                        {"depth_blocks", config.blocks},
                                        {"sublayers", config.sublayers()},
                                        {"architectures", list}}
                     .dump(1)
              << '\n';
    return 0;
  }
  const bool detail = !options.arch.empty();
  for (const Architecture* arch : selected) {
    if (detail) {
      fmt::print(
          std::cout,
          "{}{}\n  update:      {}\n  final norm:  {}\n  constants:   {}  (at depth B = {}, S = {})\n  "
          "streams:     {}\n"
          "  growth:      {} at init (growth class of the residual stream, docs/metrics.md)\n  source:      "
          "{}\n",
          arch->id, arch->provisional ? "  [PROVISIONAL]" : "", arch->update_rule, arch->final_norm,
          constants_text(*arch, config), config.blocks, config.sublayers(), fmt::join(arch->streams, ", "),
          arch->expected_growth, arch->citation);
      if (arch->provisional) fmt::print(std::cout, "  provisional: {}\n", arch->provisional_note);
      if (arch->source != "built-in")
        fmt::print(std::cout, "  file:        {} ({})\n", arch->source, arch->file_hash);
      if (arch->source == "built-in" && !arch->defined_at.empty())  // a built-in's own file, compiled in
        fmt::print(std::cout, "  file:        {} (compiled in)\n", file_of(arch->defined_at));
      if (!arch->options.empty()) fmt::print(std::cout, "  options:     {}\n", options_text(*arch));
      print_closed_forms(*arch, config);
      fmt::print(std::cout, "\n");
    } else {
      fmt::print(std::cout, "{:<16} {}{}\n  final norm: {}\n  constants:  {}\n  source:     {}\n", arch->id,
                 arch->update_rule, arch->provisional ? "  [PROVISIONAL: see --arch for why]" : "",
                 arch->final_norm, constants_text(*arch, config), arch->citation);
      if (arch->source != "built-in") fmt::print(std::cout, "  file:       {}\n", arch->source);
    }
  }
  if (!detail)
    fmt::print(std::cout,
               "\n{} placements. 'gradflow archs --arch ID' for one in detail; --format json for machines.\n",
               selected.size());
  return 0;
}
}  // namespace

Command setup_archs(CLI::App& app) {
  auto options = std::make_shared<ArchsOptions>();
  CLI::App* sub = app.add_subcommand(
      "archs", "List the placements: update rule, constants with their depth unit, source");
  sub->option_defaults()->always_capture_default();
  sub->add_option("--arch", options->arch,
                  "Show these placements (ids or placement files PATH.toml, comma-separated) in detail")
      ->default_str("all, one line each");
  sub->add_option("--depth", options->depth, "Depth in blocks at which to evaluate the constants");
  sub->add_option("--format", options->format, "table or json")->check(CLI::IsMember({"table", "json"}));
  sub->add_option("--checkpoint", options->checkpoint,
                  "Show what a Hugging Face checkpoint directory holds (config.json and .safetensors): "
                  "model_type, layers, widths, tensors and dtypes, the placement")
      ->default_str("off")
      ->excludes("--arch")
      ->excludes("--depth");
  return {sub, [options] { return run_archs(*options); }};
}

}  // namespace gradflow::cli
