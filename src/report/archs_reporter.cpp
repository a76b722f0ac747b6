// `gradflow archs`'s reporters: the registry of placements as JSON, or for people as a table.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <cmath>

#include "gradflow/app/report.hpp"

namespace gradflow {

namespace {
// "path:line:column" -> "path".
std::string_view file_of(std::string_view defined_at) {
  for (int part = 0; part < 2; ++part) defined_at = defined_at.substr(0, defined_at.rfind(':'));
  return defined_at;
}

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
void print_closed_forms(const Architecture& arch, const ModelConfig& config, std::ostream& out) {
  if (!arch.skip_gain_theory) {
    fmt::print(out, "  skip factor: no closed form\n");
    return;
  }
  if (arch.profiles_skip_weight) {
    fmt::print(out,
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
    fmt::print(out, "  skip factor: {:.6g} per sublayer under the idealised branch (last sublayer)\n",
               *theory);
  }
  if (known == config.sublayers()) {
    fmt::print(out, "  skip path:   product over all {} sublayers = 10^{:.6g} = {:.6g}\n", known,
               log10_product, std::pow(10.0, log10_product));
  } else {
    fmt::print(out, "  skip path:   closed form for {} of {} sublayers only\n", known, config.sublayers());
  }
}

}  // namespace

nlohmann::ordered_json architecture_to_json(const Architecture& arch, const ModelConfig& config) {
  nlohmann::ordered_json constants = nlohmann::ordered_json::array();
  for (const Constant& k : resolve_constants(arch, config)) {
    constants.push_back({{"name", k.name}, {"value", k.value}, {"formula", k.formula}, {"unit", k.unit}});
  }
  nlohmann::ordered_json aliases = nlohmann::ordered_json::array();
  for (const auto alias : arch.aliases) aliases.push_back(std::string(alias));
  nlohmann::ordered_json streams = nlohmann::ordered_json::array();
  for (const auto name : arch.streams) streams.push_back(std::string(name));
  nlohmann::ordered_json out = {{"id", std::string(arch.id)},
                                {"aliases", aliases},
                                {"update_rule", std::string(arch.update_rule)},
                                {"final_norm", std::string(arch.final_norm)},
                                {"constants", constants},
                                {"citation", std::string(arch.citation)},
                                {"provisional", arch.provisional},
                                {"streams", streams},
                                {"additive_stream", arch.additive_stream},
                                {"expected_growth_class", std::string(arch.expected_growth)},
                                {"source", std::string(arch.source)}};
  if (arch.provisional) out["provisional_note"] = std::string(arch.provisional_note);
  return out;
}

void write_placements_json(const PlacementsReport& report, std::ostream& out) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const Architecture* arch : report.architectures)
    list.push_back(architecture_to_json(*arch, report.config));
  out << nlohmann::ordered_json{{"schema_version", kSchemaVersion},
                                {"depth_blocks", report.config.blocks},
                                {"sublayers", report.config.sublayers()},
                                {"architectures", list}}
             .dump(1)
      << '\n';
}

void write_placements_table(const PlacementsReport& report, std::ostream& out) {
  const ModelConfig& config = report.config;
  for (const Architecture* arch : report.architectures) {
    if (report.detail) {
      fmt::print(
          out,
          "{}{}\n  update:      {}\n  final norm:  {}\n  constants:   {}  (at depth B = {}, S = {})\n  "
          "streams:     {}\n"
          "  growth:      {} at init (growth class of the residual stream, docs/metrics.md)\n  source:      "
          "{}\n",
          arch->id, arch->provisional ? "  [PROVISIONAL]" : "", arch->update_rule, arch->final_norm,
          constants_text(*arch, config), config.blocks, config.sublayers(), fmt::join(arch->streams, ", "),
          arch->expected_growth, arch->citation);
      if (arch->provisional) fmt::print(out, "  provisional: {}\n", arch->provisional_note);
      if (arch->source != "built-in")
        fmt::print(out, "  file:        {} ({})\n", arch->source, arch->file_hash);
      if (arch->source == "built-in" && !arch->defined_at.empty())  // a built-in's own file, compiled in
        fmt::print(out, "  file:        {} (compiled in)\n", file_of(arch->defined_at));
      if (!arch->options.empty()) fmt::print(out, "  options:     {}\n", options_text(*arch));
      print_closed_forms(*arch, config, out);
      fmt::print(out, "\n");
    } else {
      fmt::print(out, "{:<16} {}{}\n  final norm: {}\n  constants:  {}\n  source:     {}\n", arch->id,
                 arch->update_rule, arch->provisional ? "  [PROVISIONAL: see --arch for why]" : "",
                 arch->final_norm, constants_text(*arch, config), arch->citation);
      if (arch->source != "built-in") fmt::print(out, "  file:       {}\n", arch->source);
    }
  }
  if (!report.detail)
    fmt::print(out,
               "\n{} placements. 'gradflow archs --arch ID' for one in detail; --format json for machines.\n",
               report.architectures.size());
}

}  // namespace gradflow
