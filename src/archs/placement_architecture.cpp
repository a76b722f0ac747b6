// The Architecture a checked placement file defines: its recipe functions evaluate the file's
// rules (placement_rules.cpp); its constants() also checks every sublayer at the run's depth, so
// a rule selection or a constant that fails there stops the run before any work.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <variant>

#include "gradflow/errors.hpp"
#include "placement_rules.hpp"

namespace gradflow {

namespace {
using placement::ExprError;
using placement::PlacementDefinition;

template <typename Body>
auto reporting_position(Body body) {
  try {
    return body();
  } catch (const ExprError& error) {
    throw InputError(fmt::format(
        "{}: {}", error.origin ? error.origin->where(error.offset) : "placement file", error.what()));
  }
}

double init_gain(const PlacementDefinition& def, const SublayerContext& ctx, WeightMatrix matrix) {
  // A gated FFN's W_3 is drawn like W_1 (WeightMatrix::gate), so it takes up's gain.
  const WeightMatrix drawn_like = matrix == WeightMatrix::gate ? WeightMatrix::up : matrix;
  const auto& gain = def.init_gains.at(static_cast<std::size_t>(drawn_like));
  if (!gain) return 1.0;
  placement::ConstantEvaluator values(def, placement::position_of(ctx.config, ctx.sublayer));
  const double value = values.value(*gain);
  if (value < 0.0)
    throw ExprError(gain->origin, gain->offset, fmt::format("an init gain must be >= 0, not {}", value));
  return value;
}

// The file's [learning_rate_scale] for `rule` at sublayer ctx.sublayer: finite and > 0; 1 when the
// file states none for the rule.
double learning_rate_scale(const PlacementDefinition& def, const SublayerContext& ctx, UpdateRule rule) {
  const auto& scale = def.learning_rate_scales.at(rule == UpdateRule::sgd ? 0 : 1);
  if (!scale) return 1.0;
  placement::ConstantEvaluator values(def, placement::position_of(ctx.config, ctx.sublayer));
  const double value = values.value(*scale);
  if (!(value > 0.0))
    throw ExprError(
        scale->origin, scale->offset,
        fmt::format("[learning_rate_scale] {} must be > 0, not {}, at sublayer l = {} (block b = {}) of "
                    "S = {}; write an expression that is positive at every sublayer",
                    rule == UpdateRule::sgd ? "sgd" : "adam", value, ctx.sublayer, ctx.block,
                    ctx.config.sublayers()));
  return value;
}

// The streams whose history some read in the file takes (attend, history_sum, history_mean: the
// first argument, a stream name).
void attended_streams(const placement::Expr& e, std::set<std::string>& streams) {
  if (e.kind == placement::ExprKind::call && placement::is_history_read(e.text) && !e.args.empty())
    streams.insert(e.args[0].text);
  for (const placement::Expr& a : e.args) attended_streams(a, streams);
}

int history_stream_count(const PlacementDefinition& def) {
  std::set<std::string> streams;
  for (const placement::SublayerEntry& entry : def.sublayers)
    for (const placement::Statement& statement : entry.rule)
      for (const placement::Expr& value : statement.values) attended_streams(value, streams);
  return static_cast<int>(streams.size());
}

// Builds every sublayer's graph and evaluates every gain and option at this depth: a file's error
// that depends on S surfaces here, before any work.
void check_every_sublayer(const PlacementDefinition& def, const ModelConfig& config) {
  SublayerGraph scratch;
  const int streams = static_cast<int>(def.streams.size());
  for (int l = 0; l < config.sublayers(); ++l) {
    const placement::Position at = placement::position_of(config, l);
    scratch.reset(streams);
    placement::build_sublayer_graph(def, scratch, at);
    const Constants none;
    const SublayerContext ctx{config, none, l, at.block, at.kind};
    for (int m = 0; m < 6; ++m) init_gain(def, ctx, static_cast<WeightMatrix>(m));
    for (const UpdateRule rule : {UpdateRule::sgd, UpdateRule::adam}) learning_rate_scale(def, ctx, rule);
    placement::ConstantEvaluator values(def, at);
    const placement::SublayerEntry& entry = placement::select_entry(def, values, at);
    for (const auto* option : {&entry.score_scale, &entry.ffn_hidden_scale}) {
      if (*option && !(values.value(**option) > 0.0))
        throw ExprError((*option)->origin, (*option)->offset, "expected a value > 0");
    }
    if (entry.skip_gain) values.value(*entry.skip_gain);
  }
  scratch.reset(streams);
  placement::build_output_graph(def, scratch, placement::position_of(config, config.sublayers()));
}

// The file's options given on the command line, as "--flag value", for a refusal to name them.
std::string given_options(const PlacementDefinition& def, const ModelConfig& config) {
  std::vector<std::string> given;
  for (const placement::OptionDeclaration& option : def.options) {
    const auto value = config.options.find(option.key);
    if (value == config.options.end()) continue;
    given.push_back(
        std::visit([&](const auto& v) { return fmt::format("{} {}", option.flag, v); }, value->second));
  }
  return given.empty() ? "" : fmt::format(" (given: {})", fmt::join(given, ", "));
}

// [[requires]]: a size the placement cannot take is refused before its formulas are evaluated.
void check_requirements(const PlacementDefinition& def, const ModelConfig& config) {
  placement::ConstantEvaluator values(def, placement::position_of(config, config.sublayers()));
  for (const placement::Requirement& requirement : def.requirements) {
    if (!values.holds(requirement.condition))
      throw InputError(fmt::format("--arch {} at S = {}, B = {}{}: {}", def.id, config.sublayers(),
                                   config.blocks, given_options(def, config), requirement.message));
  }
}

Constants file_constants(const PlacementDefinition& def, const ModelConfig& config) {
  check_requirements(def, config);
  check_every_sublayer(def, config);
  placement::ConstantEvaluator values(def, placement::position_of(config, config.sublayers()));
  Constants out;
  for (const auto& [name, e] : def.constants) {
    const placement::ConstantRecord& record = def.constant_records.at(name);
    const placement::OptionDeclaration* option = placement::find_option(def, record.option);
    const std::optional<double> given = option ? config.number_option(record.option) : std::nullopt;
    out.push_back(
        {name, given ? *given : values.value(e), given ? option->flag : record.formula, record.unit});
  }
  return out;
}

// Whether `e` is a name standing for option `key`'s value whenever the option is given: the key
// itself, or a constant the option feeds ({ option = "KEY" } in [constants]).
bool names_option(const PlacementDefinition& def, const placement::Expr& e, const std::string& key) {
  if (e.kind != placement::ExprKind::name) return false;
  if (e.text == key) return true;
  const auto record = def.constant_records.find(e.text);
  return record != def.constant_records.end() && record->second.option == key;
}

// Whether condition `c` is false for every fraction of option `key`: floor(X) == X (either way
// round), X the key or a constant it feeds, or a conjunction (and) with such a term.
bool refuses_fractions(const PlacementDefinition& def, const placement::Expr& c, const std::string& key) {
  if (c.kind == placement::ExprKind::logical_and)
    return std::any_of(c.args.begin(), c.args.end(),
                       [&](const placement::Expr& term) { return refuses_fractions(def, term, key); });
  if (c.kind != placement::ExprKind::compare || c.text != "==" || c.args.size() != 2) return false;
  for (std::size_t side = 0; side < 2; ++side) {
    const placement::Expr &floor = c.args[side], &plain = c.args[1 - side];
    if (floor.kind == placement::ExprKind::call && floor.text == "floor" && floor.args.size() == 1 &&
        names_option(def, plain, key) && floor.args[0].kind == placement::ExprKind::name &&
        floor.args[0].text == plain.text)
      return true;
  }
  return false;
}

// Whether a [[requires]] of the file refuses every fraction of option `key`. Another way of saying
// so is not recognised: the option is then taken as any number (and the rule still refuses).
bool required_whole(const PlacementDefinition& def, const std::string& key) {
  return std::any_of(def.requirements.begin(), def.requirements.end(), [&](const placement::Requirement& r) {
    return refuses_fractions(def, r.condition, key);
  });
}

PlacementOption declared_option(const PlacementDefinition& def, const placement::OptionDeclaration& d) {
  PlacementOption option;
  option.key = d.key;
  option.flag = d.flag;
  option.help = d.help;
  option.default_value = d.default_value;
  option.default_text = d.default_text;
  for (const std::string& choice : d.choices) option.choices.push_back(choice);
  option.range = d.range;
  option.fix = d.fix;
  option.defined_at = d.at;
  option.when_unused = d.when_unused;
  option.sets = d.sets;
  option.in_run_config = d.in_run_config;
  option.in_sweep_model = d.in_sweep_model;
  option.whole = !d.is_word() && required_whole(def, d.key);
  return option;
}
}  // namespace

Architecture placement_architecture(const PlacementDefinition& def) {
  Architecture arch;
  arch.id = def.id;
  for (const std::string& alias : def.aliases) arch.aliases.push_back(alias);
  arch.update_rule = def.update_rule;
  arch.final_norm = def.final_norm.empty() ? def.output_text : def.final_norm;
  arch.citation = def.citation;
  arch.expected_growth = def.expected_growth;
  arch.provisional = !def.provisional_note.empty();
  arch.provisional_note = def.provisional_note;
  arch.streams.clear();
  for (const std::string& name : def.streams) arch.streams.push_back(name);
  arch.initial_streams = static_cast<int>(def.streams.size());
  arch.additive_stream = def.additive;
  arch.history_streams = history_stream_count(def);
  arch.unit_norm_weights = def.unit_norm_weights;
  if (!def.built_in) {  // a built-in's definition is the binary's; a file's travels with each run
    arch.source = def.path;
    arch.file_text = def.text;
    arch.file_hash = def.hash;
  }
  arch.defined_at = def.id_at;
  for (const placement::OptionDeclaration& option : def.options)
    arch.options.push_back(declared_option(def, option));
  const PlacementDefinition* d = &def;
  arch.constants = [d](const ModelConfig& config) {
    return reporting_position([&] { return file_constants(*d, config); });
  };
  arch.build_sublayer = [d](SublayerGraph& g, const SublayerContext& ctx) {
    reporting_position(
        [&] { placement::build_sublayer_graph(*d, g, placement::position_of(ctx.config, ctx.sublayer)); });
  };
  arch.build_output = [d](SublayerGraph& g, const SublayerContext& ctx) {
    reporting_position(
        [&] { placement::build_output_graph(*d, g, placement::position_of(ctx.config, ctx.sublayer)); });
  };
  const bool has_skip_gain = std::any_of(def.sublayers.begin(), def.sublayers.end(),
                                         [](const auto& e) { return e.skip_gain.has_value(); });
  if (has_skip_gain) {
    arch.skip_gain_theory = [d](const SublayerContext& ctx) -> std::optional<double> {
      return reporting_position([&]() -> std::optional<double> {
        const placement::Position at = placement::position_of(ctx.config, ctx.sublayer);
        placement::ConstantEvaluator values(*d, at);
        const placement::SublayerEntry& entry = placement::select_entry(*d, values, at);
        if (!entry.skip_gain) return std::nullopt;
        return values.value(*entry.skip_gain);
      });
    };
  }
  const bool has_gains =
      std::any_of(def.init_gains.begin(), def.init_gains.end(), [](const auto& g) { return g.has_value(); });
  if (has_gains) {
    arch.init_gain = [d](const SublayerContext& ctx, WeightMatrix matrix) {
      return reporting_position([&] { return init_gain(*d, ctx, matrix); });
    };
  }
  const bool has_learning_rate_scale =
      std::any_of(def.learning_rate_scales.begin(), def.learning_rate_scales.end(),
                  [](const auto& s) { return s.has_value(); });
  if (has_learning_rate_scale) {
    arch.learning_rate_scale = [d](const SublayerContext& ctx, UpdateRule rule) {
      return reporting_position([&] { return learning_rate_scale(*d, ctx, rule); });
    };
  }
  return arch;
}

}  // namespace gradflow
