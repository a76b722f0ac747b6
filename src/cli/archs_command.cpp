// `gradflow archs`: the registry of placements, as a table or JSON.
#include <fmt/format.h>

#include <iostream>

#include "commands.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/report.hpp"

namespace gradflow::cli {

namespace {
struct ArchsOptions {
  std::string arch;
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

int run_archs(const ArchsOptions& options) {
  ModelConfig config;
  config.blocks = options.depth;
  validate(config);
  std::vector<const Architecture*> selected;
  if (options.arch.empty()) {
    for (const Architecture& arch : architectures()) selected.push_back(&arch);
  } else {
    selected = parse_architecture_list(options.arch);
  }
  if (options.format == "json") {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Architecture* arch : selected) list.push_back(architecture_to_json(*arch, config));
    std::cout << nlohmann::ordered_json{{"schema_version", kSchemaVersion}, {"depth_blocks", config.blocks},
                                {"sublayers", config.sublayers()}, {"architectures", list}}
                     .dump(1)
              << '\n';
    return 0;
  }
  const bool detail = !options.arch.empty();
  for (const Architecture* arch : selected) {
    if (detail) {
      fmt::print("{}{}\n  update:      {}\n  final norm:  {}\n  constants:   {}  (at depth B = {}, S = {})\n  streams:     {}\n"
                 "  growth:      {} at init\n  source:      {}\n",
                 arch->id, arch->provisional ? "  [PROVISIONAL]" : "", arch->update_rule, arch->final_norm,
                 constants_text(*arch, config), config.blocks, config.sublayers(), fmt::join(arch->streams, ", "),
                 arch->expected_growth, arch->citation);
      if (arch->provisional) fmt::print("  provisional: {}\n", arch->provisional_note);
      if (arch->skip_gain_theory) {
        const Constants constants = resolve_constants(*arch, config);
        const int last = config.sublayers() - 1;
        const SublayerContext ctx{config, constants, last, config.block_of(last), config.sublayer_kind(last), 1.0};
        if (const auto theory = arch->skip_gain_theory(ctx)) {
          fmt::print("  skip factor: {:.6g} per sublayer under the idealised branch (last sublayer)\n", *theory);
        }
      }
      fmt::print("\n");
    } else {
      fmt::print("{:<16} {:<34} {:<10} {}{}\n", arch->id, arch->update_rule, arch->final_norm, arch->citation,
                 arch->provisional ? " [PROVISIONAL]" : "");
    }
  }
  if (!detail) fmt::print("\n{} placements. 'gradflow archs --arch ID' for one in detail; --format json for machines.\n", selected.size());
  return 0;
}
}  // namespace

Command setup_archs(CLI::App& app) {
  auto options = std::make_shared<ArchsOptions>();
  CLI::App* sub = app.add_subcommand("archs", "List the placements: update rule, constants with their depth unit, source");
  sub->option_defaults()->always_capture_default();
  sub->add_option("--arch", options->arch, "Show these placements in detail (comma-separated)")->default_str("all, one line each");
  sub->add_option("--depth", options->depth, "Depth in blocks at which to evaluate the constants");
  sub->add_option("--format", options->format, "table or json")->check(CLI::IsMember({"table", "json"}));
  return {sub, [options] { return run_archs(*options); }};
}

}  // namespace gradflow::cli
