// `gradflow archs`: the registry of placements, as a table or JSON.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <iostream>

#include "commands.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/architecture.hpp"

namespace gradflow::cli {

namespace {
struct ArchsOptions {
  std::string arch;
  std::string checkpoint;
  int depth = 64;
  std::string format = "table";
};

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
  const PlacementsReport report{.architectures = selected, .config = config, .detail = !options.arch.empty()};
  find_format(options.format, OutputKind::placements).placements(report, std::cout);
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
  add_format_option(sub, options->format, OutputKind::placements, format_list_help(OutputKind::placements));
  sub->add_option("--checkpoint", options->checkpoint,
                  "Show what a Hugging Face checkpoint directory holds (config.json and .safetensors): "
                  "model_type, layers, widths, tensors and dtypes, the placement")
      ->default_str("off")
      ->excludes("--arch")
      ->excludes("--depth");
  return {sub, [options] { return run_archs(*options); }, {{"--arch", ListItems::text}}};
}

}  // namespace gradflow::cli
