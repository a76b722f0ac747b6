// A Hugging Face config.json read as gradflow's model configuration (issue 19): which key sets
// which field, the norm placement the model's family uses, and where every value came from.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/config.hpp"

namespace gradflow {

// One model field a config.json sets: its key in the documents' config ("width"), the flag that
// sets it instead when given ("--width"), where the value came from ("config.json:hidden_size",
// or the family's rule), the value as the documents write it, and how it lands in a ModelConfig.
struct ConfigFileSetting {
  std::string key;
  std::string flag;
  std::string source;
  nlohmann::ordered_json value;
  std::function<void(ModelConfig&)> apply;
  // Whether it applies to the configuration the settings before it made (empty: always); one that
  // does not is skipped and records no source (a branch op's keys while --ffn names another op).
  std::function<bool(const ModelConfig&)> applies = {};
};

// What a config.json describes, in gradflow's terms.
struct ModelConfigFile {
  std::string model_type;
  std::string placement;         // the placement the family uses ("" when the family is unknown)
  std::string placement_source;  // "config.json:model_type (llama -> pre-ln)"
  std::vector<ConfigFileSetting> settings;
  std::vector<std::string> notes;   // keys mapped with a caveat, one sentence each
  std::vector<std::string> unused;  // top-level keys gradflow does not read, in file order
};

// Reads config.json text (`origin` names it in messages). Pure: text in, resolution out.
// Throws InputError naming the key for a missing required key, a wrong type or an impossible value
// (heads not dividing hidden_size, KV heads not dividing heads, a negative epsilon, ...), and the
// line and column for a JSON syntax error. An unknown model_type is refused unless
// `placement_given` (--arch): the Llama key names and rules are then assumed, and a note says so.
ModelConfigFile read_model_config_file(std::string_view text, std::string_view origin, bool placement_given);

// Sets `model` from the file's settings, except those whose flag `flag_given` reports as given on
// the command line (flags override the file). Returns the source of every key it looked at:
// the file's ("config.json:hidden_size") or the flag ("--depth").
nlohmann::ordered_json apply_model_config_file(const ModelConfigFile& file, ModelConfig& model,
                                               const std::function<bool(std::string_view flag)>& flag_given);

}  // namespace gradflow
