// The model configuration as the documents record it: the one field list that analyze's per-run
// "config", a sweep's "model", the manifest check and `check`'s comparison all loop over.
#include <cmath>
#include <set>

#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/branch_op.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {
bool updating(const ModelConfig& config) {
  return config.update != UpdateRule::none;
}
}  // namespace

const std::vector<ConfigField>& config_fields() {
  // In document order. Depth and width (and what derives from them) vary per sweep cell; the
  // optional analyses are analyze's only; the derived sizes and norm_eps are not compared. The
  // optimizer step (--update, --lr) is part of a sweep's model, so that a sweep directory resumed
  // with another step or learning rate is refused instead of reusing its cells.
  static const std::vector<ConfigField> fields = {
      {"blocks", "--depth", [](const ModelConfig& c) { return json(c.blocks); }, false, true},
      {"sublayers", "--depth/--block", [](const ModelConfig& c) { return json(c.sublayers()); }, false, true},
      {"block", "--block", [](const ModelConfig& c) { return json(to_string(c.block)); }, true, true},
      {"width", "--width", [](const ModelConfig& c) { return json(c.width); }, false, true},
      {"heads", "--heads", [](const ModelConfig& c) { return json(c.heads); }, true, true},
      {"head_dim", "--width/--heads", [](const ModelConfig& c) { return json(c.head_dim()); }, false, false},
      {"ffn_hidden", "--ffn-hidden", [](const ModelConfig& c) { return json(c.ffn_hidden()); }, false, true},
      {"seq", "--seq", [](const ModelConfig& c) { return json(c.seq); }, true, true},
      {"norm", "--norm", [](const ModelConfig& c) { return json(to_string(c.norm)); }, true, true},
      {"norm_eps", "--norm-eps", [](const ModelConfig& c) { return json(c.norm_eps); }, true, true},
      {"init", "--init", [](const ModelConfig& c) { return json(init_text(c)); }, true, true},
      {"precision", "--precision", [](const ModelConfig& c) { return json(to_string(c.precision)); }, true,
       true},
      {"branch", "--ideal-branch", [](const ModelConfig& c) { return json(to_string(c.branch)); }, true,
       true},
      {"probes", "--probes", [](const ModelConfig& c) { return json(c.probes); }, true, true},
      {"input_corr", "--input-corr", [](const ModelConfig& c) { return json(c.input_corr); }, true, true},
      // Issue 19's block ops, after the fields older documents have: absent there means the default.
      {"ffn", "--ffn", [](const ModelConfig& c) { return json(c.ffn); }, true, true},
      {"kv_heads", "--kv-heads", [](const ModelConfig& c) { return json(c.kv_head_count()); }, true, true},
      {"rope_theta", "--rope-theta", [](const ModelConfig& c) { return json(c.rope_theta); }, true, true},
      {"rope_fraction", "--rope-fraction", [](const ModelConfig& c) { return json(c.rope_fraction); }, true,
       true},
      {"bias", "--bias", [](const ModelConfig& c) { return json(c.bias); }, true, true},
      {"angles", "--angles", [](const ModelConfig& c) { return json(c.angles_all ? "all" : "consecutive"); },
       false, false},
      {"spectrum", "--spectrum", [](const ModelConfig& c) { return json(c.spectrum); }, false, false},
      {"exact_jacobian", "--exact-jacobian", [](const ModelConfig& c) { return json(c.exact_jacobian); },
       false, false},
      {"update_step", "--update", [](const ModelConfig& c) { return json(to_string(c.update)); }, true, true,
       updating},
      {"learning_rates", "--lr", [](const ModelConfig& c) { return json(c.learning_rates); }, true, true,
       updating},
      {"update_params", "--update-params",
       [](const ModelConfig& c) { return json(c.update_norm_gains ? "all" : "matrices"); }, true, true,
       updating},
  };
  return fields;
}

namespace {
// Fields that documents written before issue 19 lack; reading one, absent means the default.
const std::set<std::string, std::less<>> kFieldsAddedLater = {"ffn", "kv_heads", "rope_theta",
                                                              "rope_fraction", "bias"};

json option_to_json(const OptionValue& value) {
  return std::visit([](const auto& v) { return json(v); }, value);
}

// The option's value in `config`: as given, else its default (or, when the default depends on
// the placement, the text saying so).
json option_value(const PlacementOption& option, const ModelConfig& config) {
  if (const auto given = config.options.find(option.key); given != config.options.end())
    return option_to_json(given->second);
  if (option.default_value) return option_to_json(*option.default_value);
  return json(std::string(option.default_text));
}

// The options of the FFN op in use (BranchOpRow::options, e.g. --experts), each as given or its
// default, after the fields: absent in a document of another op.
void add_op_options(json& out, const ModelConfig& config) {
  const BranchOpRow* row = ffn_op_by_word(config.ffn);
  if (!row) return;
  const BlockOps ops = block_ops(config);
  for (const PlacementOption& option : row->options) {
    const auto value = ops.options.find(option.key);
    if (value == ops.options.end()) continue;
    const auto* number = std::get_if<double>(&value->second);
    // A count (experts, a width) as an integer, so that pandas reads an integer column.
    const bool whole = number && std::abs(*number) < 1e15 && *number == std::floor(*number);
    out[std::string(option.key)] =
        whole ? json(static_cast<long long>(*number)) : option_to_json(value->second);
  }
}

// Constants of the norm that only some norms have (DyT's alpha), last in both documents.
void add_norm_constants(json& out, const ModelConfig& config) {
  if (config.norm == NormKind::dyt) out["dyt_alpha"] = kDytAlpha;
}
}  // namespace

json run_config_fields(const ModelConfig& config) {
  json out = json::object();
  for (const ConfigField& field : config_fields()) {
    if (!field.present || field.present(config)) out[std::string(field.key)] = field.value(config);
  }
  add_op_options(out, config);
  return out;
}

void add_run_config_options(json& out, const Architecture& arch, const ModelConfig& config) {
  for (const PlacementOption& option : arch.options) {
    if (option.in_run_config) out[std::string(option.key)] = option_value(option, config);
  }
  add_norm_constants(out, config);
}

json sweep_model_to_json(const ModelConfig& config) {
  json model = json::object();
  for (const ConfigField& field : config_fields()) {
    if (field.in_sweep_model && (!field.present || field.present(config)))
      model[std::string(field.key)] = field.value(config);
    // The FFN width varies with each cell's width (4 d) unless set (--ffn-hidden, a config.json's
    // intermediate_size): then it is the same in every cell, recorded so that a resumed sweep with
    // another one is refused. Absent means 4 d, as in manifests written before.
    if (field.key == "ffn_hidden" && config.ffn_hidden_width > 0)
      model[std::string(field.key)] = config.ffn_hidden_width;
  }
  add_op_options(model, config);
  for (const PlacementOption* option : placement_options()) {
    if (option->in_sweep_model) model[std::string(option->key)] = option_value(*option, config);
  }
  add_norm_constants(model, config);
  return model;
}

std::vector<std::string> compared_config_keys() {
  std::vector<std::string> keys;
  for (const ConfigField& field : config_fields()) {
    if (field.compared) keys.emplace_back(field.key);
  }
  for (const PlacementOption* option : op_options()) keys.emplace_back(option->key);
  for (const PlacementOption* option : placement_options()) {
    if (option->in_run_config) keys.emplace_back(option->key);
  }
  return keys;
}

json recorded_config_value(const json& config, std::string_view key) {
  const std::string name(key);
  if (config.contains(name)) return config.at(name);
  if (!kFieldsAddedLater.count(name)) return json();
  // The default block of the document's own shape: kv_heads absent means its own heads.
  ModelConfig defaults;
  if (config.contains("heads") && config.at("heads").is_number_integer()) defaults.heads = config.at("heads");
  for (const ConfigField& field : config_fields()) {
    if (field.key == key) return field.value(defaults);
  }
  return json();
}

std::string config_flag(std::string_view key) {
  for (const ConfigField& field : config_fields()) {
    if (field.key == key) return std::string(field.flag.empty() ? key : field.flag);
  }
  for (const PlacementOption* option : op_options()) {
    if (option->key == key) return std::string(option->flag);
  }
  for (const PlacementOption* option : placement_options()) {
    if (option->key == key) return std::string(option->flag);
  }
  return std::string(key);
}

}  // namespace gradflow
