// config.json -> ModelConfig (model_config_file.hpp): each family's key names, placement, norm and
// FFN, and the checks that name the key at fault. No I/O: the CLI reads the file and prints.
#include "gradflow/app/model_config_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <optional>
#include <set>

#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------------------------
// The families

// The key names a family's config.json uses; GPT-2's predate the names later models share.
struct KeyNames {
  std::string_view width, blocks, heads, ffn_hidden, activation, norm_eps;
};
constexpr KeyNames kSharedKeys{"hidden_size",       "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "hidden_act",        "rms_norm_eps"};
constexpr KeyNames kGpt2Keys{
    "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "layer_norm_epsilon"};

// A model family: the placement and norm its block uses, whether its FFN is gated (SwiGLU or
// GeGLU, Shazeer 2020, arXiv 2002.05202) or GELU, whether its projections carry biases when the
// file has no attention_bias, and the rope_theta its Transformers config class defaults to.
struct Family {
  std::string_view model_type;
  std::string_view placement;
  NormKind norm;
  bool gated;
  bool bias;
  double rope_theta;  // 0: the family has no rotary embedding
  const KeyNames* keys;
};
// Placements: Llama (Touvron et al. 2023, arXiv 2302.13971), Mistral (arXiv 2310.06825) and Qwen
// (arXiv 2407.10671, 2505.09388) normalise before each sublayer; OLMo 2 normalises the branch's
// output (arXiv 2501.00656, Sec. 3.2); Gemma 2 and 3 normalise both (arXiv 2408.00118, Sec. 2);
// GPT-2 is pre-LN with LayerNorm, a GELU MLP and biases (Radford et al. 2019). Qwen2 has q/k/v biases.
constexpr std::array kFamilies{
    Family{"gpt2", "pre-ln", NormKind::layer, false, true, 0.0, &kGpt2Keys},
    Family{"llama", "pre-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"mistral", "pre-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"qwen2", "pre-ln", NormKind::rms, true, true, 10000.0, &kSharedKeys},
    Family{"qwen3", "pre-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"olmo2", "olmo2", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"gemma", "pre-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"gemma2", "peri-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"gemma3", "peri-ln", NormKind::rms, true, false, 1000000.0, &kSharedKeys},
    Family{"gemma3_text", "peri-ln", NormKind::rms, true, false, 1000000.0, &kSharedKeys},
    // Mixture-of-experts families: the FFN is the MoE op, chosen by num_local_experts / num_experts
    // (the op's config_json keys, src/ops/moe.cpp). Mixtral is Mistral's block with sparse experts;
    // OLMoE is pre-norm with q/k norms (not modelled: see the note); Qwen2-MoE is Qwen2's block.
    Family{"mixtral", "pre-ln", NormKind::rms, true, false, 1000000.0, &kSharedKeys},
    Family{"olmoe", "pre-ln", NormKind::rms, true, false, 10000.0, &kSharedKeys},
    Family{"qwen2_moe", "pre-ln", NormKind::rms, true, true, 10000.0, &kSharedKeys},
};
// An unknown model_type with --arch: the shared key names and a gated FFN, as most current decoders.
constexpr Family kAssumedFamily{"", "", NormKind::rms, true, false, 10000.0, &kSharedKeys};

std::string family_names() {
  std::string names;
  for (const Family& family : kFamilies)
    names += (names.empty() ? "" : ", ") + std::string(family.model_type);
  return names;
}

// Transformers' default initializer_range for every family here.
constexpr double kDefaultInitializerRange = 0.02;
// The bounds of the file's numbers: an epsilon below 1 (as --norm-eps), the others finite.
constexpr double kMaxNormEps = 0.9999999999;
constexpr double kHuge = 1e300;

// ---------------------------------------------------------------------------------------------
// Reading keys: every lookup marks the key used; every failure names it.

class KeyReader {
 public:
  KeyReader(const json& doc, std::string_view origin) : doc_(doc), origin_(origin) {}

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const {
    throw InputError(fmt::format("{}: {} {}", origin_, key, problem));
  }
  // The value, or nullptr when absent or null.
  const json* find(std::string_view key) {
    const auto found = doc_.find(std::string(key));
    if (found == doc_.end()) return nullptr;
    used_.insert(std::string(key));
    return found->is_null() ? nullptr : &*found;
  }
  const json& required(std::string_view key, std::string_view meaning) {
    const json* value = find(key);
    if (!value) fail(key, fmt::format("is missing; a config.json gives {} there", meaning));
    return *value;
  }
  int integer(std::string_view key, const json& value, int largest) const {
    if (!value.is_number_integer() || value.get<long long>() < 1 || value.get<long long>() > largest)
      fail(key, fmt::format("must be an integer in [1, {}], not {}", largest, value.dump()));
    return static_cast<int>(value.get<long long>());
  }
  // A number in (low, high], `what` in words ("a positive number").
  double number(std::string_view key, const json& value, double low, double high,
                std::string_view what) const {
    if (!value.is_number() || !(value.get<double>() > low && value.get<double>() <= high))
      fail(key, fmt::format("must be {}, not {}", what, value.dump()));
    return value.get<double>();
  }
  std::optional<bool> boolean(std::string_view key) {
    const json* value = find(key);
    if (value && !value->is_boolean()) fail(key, fmt::format("must be true or false, not {}", value->dump()));
    return value ? std::optional<bool>(value->get<bool>()) : std::nullopt;
  }
  std::string text(std::string_view key, const json& value) const {
    if (!value.is_string()) fail(key, fmt::format("must be a string, not {}", value.dump()));
    return value.get<std::string>();
  }
  std::vector<std::string> unused() const {
    std::vector<std::string> keys;
    for (const auto& [key, value] : doc_.items()) {
      if (!used_.count(key)) keys.push_back(key);
    }
    return keys;
  }

 private:
  const json& doc_;
  std::string_view origin_;
  std::set<std::string> used_;
};

std::string from_file(std::string_view key) {
  return fmt::format("config.json:{}", key);
}

void add(ModelConfigFile& file, std::string key, std::string flag, std::string source, json value,
         std::function<void(ModelConfig&)> apply) {
  file.settings.push_back(
      {std::move(key), std::move(flag), std::move(source), std::move(value), std::move(apply)});
}

// ---------------------------------------------------------------------------------------------
// The mapping, one part of the block at a time

struct Shape {
  int width, heads;
};

Shape read_shape(KeyReader& keys, const KeyNames& names, ModelConfigFile& file) {
  const int width = keys.integer(names.width, keys.required(names.width, "the model width"), kMaxWidth);
  const int blocks =
      keys.integer(names.blocks, keys.required(names.blocks, "the number of blocks"), kMaxBlocks);
  const int heads = keys.integer(names.heads, keys.required(names.heads, "the attention heads"), width);
  if (width % heads != 0)
    keys.fail(names.heads, fmt::format("{} does not divide {} {}", heads, names.width, width));
  add(file, "width", "--width", from_file(names.width), width, [width](ModelConfig& m) { m.width = width; });
  add(file, "blocks", "--depth", from_file(names.blocks), blocks,
      [blocks](ModelConfig& m) { m.blocks = blocks; });
  add(file, "heads", "--heads", from_file(names.heads), heads, [heads](ModelConfig& m) { m.heads = heads; });
  return {width, heads};
}

void read_attention(KeyReader& keys, const KeyNames& names, const Family& family, Shape shape,
                    ModelConfigFile& file) {
  if (&names == &kSharedKeys) {
    int kv_heads = shape.heads;
    std::string source = "default (= num_attention_heads)";
    if (const json* value = keys.find("num_key_value_heads")) {
      kv_heads = keys.integer("num_key_value_heads", *value, shape.heads);
      if (shape.heads % kv_heads != 0)
        keys.fail("num_key_value_heads",
                  fmt::format("{} does not divide num_attention_heads {}", kv_heads, shape.heads));
      source = from_file("num_key_value_heads");
    }
    add(file, "kv_heads", "--kv-heads", source, kv_heads,
        [kv_heads](ModelConfig& m) { m.kv_heads = kv_heads; });
    if (const json* value = keys.find("head_dim")) {
      const int head_dim = keys.integer("head_dim", *value, kMaxWidth);
      if (head_dim != shape.width / shape.heads) {
        file.notes.push_back(fmt::format(
            "head_dim {} differs from hidden_size / num_attention_heads = {}: gradflow's heads are "
            "hidden_size / num_attention_heads wide (q, k, v and the output projection are d x d), so "
            "attention's inner width is {}, not {} x {} = {}",
            head_dim, shape.width / shape.heads, shape.width, shape.heads, head_dim, shape.heads * head_dim));
      }
    }
  }
  const std::optional<bool> attention_bias = keys.boolean("attention_bias");
  const std::optional<bool> mlp_bias = keys.boolean("mlp_bias");
  const bool bias =
      attention_bias || mlp_bias ? attention_bias.value_or(false) || mlp_bias.value_or(false) : family.bias;
  const std::string source = attention_bias ? from_file("attention_bias")
                             : mlp_bias     ? from_file("mlp_bias")
                                            : fmt::format("model_type {}", file.model_type);
  add(file, "bias", "--bias", source, bias, [bias](ModelConfig& m) { m.bias = bias; });
}

FfnKind ffn_kind(const KeyReader& keys, std::string_view key, const std::string& activation, bool gated) {
  const bool silu = activation == "silu" || activation == "swish";
  const bool gelu = activation.rfind("gelu", 0) == 0, tanh = is_tanh_gelu_name(activation);
  if (gated && silu) return FfnKind::swiglu;
  if (gated && gelu) return tanh ? FfnKind::geglu_tanh : FfnKind::geglu;
  if (!gated && gelu) return tanh ? FfnKind::gelu_tanh : FfnKind::gelu;
  keys.fail(key, fmt::format("{:?} has no gradflow FFN for this family; gradflow has {}", activation,
                             gated ? "silu (SwiGLU) and gelu* (GeGLU)" : "gelu* (the GELU MLP)"));
}

void read_ffn(KeyReader& keys, const KeyNames& names, const Family& family, Shape shape,
              ModelConfigFile& file) {
  // Gemma 2 and 3 read hidden_activation first (Transformers' Gemma2Config).
  std::string_view act_key = names.activation;
  if (family.model_type.rfind("gemma", 0) == 0 && keys.find("hidden_activation"))
    act_key = "hidden_activation";
  const json* act_value = keys.find(act_key);
  if (!act_value && family.gated) keys.required(act_key, "the FFN's activation (silu: SwiGLU; gelu: GeGLU)");
  const std::string activation =
      act_value ? keys.text(act_key, *act_value) : "gelu_new";  // GPT2Config's default
  const FfnKind ffn = ffn_kind(keys, act_key, activation, family.gated);
  add(file, "ffn", "--ffn", act_value ? from_file(act_key) : "default of model_type gpt2 (gelu_new)",
      std::string(to_string(ffn)), [ffn](ModelConfig& m) { m.ffn = to_string(ffn); });
  const json* hidden =
      family.gated ? &keys.required(names.ffn_hidden, "the FFN's hidden width") : keys.find(names.ffn_hidden);
  if (!hidden) {  // GPT2Config: n_inner None is 4 * hidden_size, the run's width (--width included)
    add(file, "ffn_hidden", "--ffn-hidden", "default of model_type gpt2 (4 d)", kFfnMultiple * shape.width,
        [](ModelConfig& m) { m.ffn_hidden_width = 0; });
    return;
  }
  const int ffn_hidden = keys.integer(names.ffn_hidden, *hidden, kMaxWidth);
  add(file, "ffn_hidden", "--ffn-hidden", from_file(names.ffn_hidden), ffn_hidden,
      [ffn_hidden](ModelConfig& m) { m.ffn_hidden_width = ffn_hidden; });
}

// Replaces the setting of `key` read earlier (a branch op's own key for the FFN width).
void replace(ModelConfigFile& file, const std::string& key, std::string flag, std::string source, json value,
             std::function<void(ModelConfig&)> apply) {
  std::erase_if(file.settings, [&key](const ConfigFileSetting& setting) { return setting.key == key; });
  add(file, key, std::move(flag), std::move(source), std::move(value), std::move(apply));
}

// A branch op the file chooses by its keys (BranchOpRow::config_json, e.g. the mixture of experts
// by num_local_experts): --ffn becomes the op's word, and its keys set its options. The options
// apply only while --ffn names the op, so that --ffn given on the command line wins whole.
void read_ffn_op(KeyReader& keys, ModelConfigFile& file) {
  for (const BranchOpRow& row : branch_ops()) {
    if (row.config_json.empty() || row.ffn_words.empty()) continue;
    const auto present = [&keys](const ConfigJsonKey& entry) -> std::pair<std::string_view, const json*> {
      for (const std::string_view name : entry.names) {
        if (const json* value = keys.find(name)) return {name, value};
      }
      return {{}, nullptr};
    };
    const auto [marker, marked] = present(row.config_json.front());
    if (!marked) continue;
    const FfnWord& ffn = row.ffn_words.front();
    const auto dense = std::find_if(file.settings.begin(), file.settings.end(),
                                    [](const ConfigFileSetting& setting) { return setting.key == "ffn"; });
    if (dense != file.settings.end() && dense->value != std::string(to_string(ffn.activation)))
      file.notes.push_back(fmt::format("{} gives {}; the experts of --ffn {} are {} whatever it says",
                                       dense->source, dense->value.dump(), ffn.word,
                                       to_string(ffn.activation)));
    const std::string word(row.ffn_words.front().word);
    replace(file, "ffn", "--ffn", from_file(marker), word, [word](ModelConfig& m) { m.ffn = word; });
    const BranchOpRow* chosen = &row;
    const auto in_use = [chosen](const ModelConfig& m) { return ffn_op_by_word(m.ffn) == chosen; };
    for (const ConfigJsonKey& entry : row.config_json) {
      const auto [name, value] = present(entry);
      if (!value) continue;
      if (entry.option == "ffn_hidden") {  // after the dense width, which --ffn naming another FFN keeps
        const int hidden = keys.integer(name, *value, kMaxWidth);
        add(file, "ffn_hidden", "--ffn-hidden", from_file(name), hidden,
            [hidden](ModelConfig& m) { m.ffn_hidden_width = hidden; });
        file.settings.back().applies = in_use;
        continue;
      }
      const auto [owner, option] = op_option(entry.option);
      if (owner != chosen) throw std::logic_error("a config_json entry names another op's option");
      OptionValue read;
      if (option->is_word()) {
        if (!value->is_boolean())
          keys.fail(name, fmt::format("must be true or false, not {}", value->dump()));
        read = std::string(value->get<bool>() ? entry.if_true : entry.if_false);
      } else {
        const double number = keys.number(name, *value, -kHuge, kHuge, "a number");
        if (!option->range.contains(number))
          keys.fail(name, fmt::format("must {} (it sets {}), not {}", option->range.requirement(),
                                      option->flag, value->dump()));
        read = number;
      }
      const std::string key(entry.option);
      add(file, key, std::string(option->flag), from_file(name),
          std::visit([](const auto& v) { return json(v); }, read),
          [key, read](ModelConfig& m) { m.op_options[key] = read; });
      file.settings.back().applies = in_use;
    }
    return;
  }
}

void read_norm(KeyReader& keys, const KeyNames& names, const Family& family, ModelConfigFile& file) {
  std::string_view eps_key = names.norm_eps;
  if (&names == &kSharedKeys && !keys.find(eps_key) && keys.find("layer_norm_eps"))
    eps_key = "layer_norm_eps";
  const NormKind norm = family.norm;
  add(file, "norm", "--norm", fmt::format("model_type {}", file.model_type), std::string(to_string(norm)),
      [norm](ModelConfig& m) { m.norm = norm; });
  if (const json* value = keys.find(eps_key)) {
    const double eps = keys.number(eps_key, *value, 0.0, kMaxNormEps, "a number in (0, 1)");
    add(file, "norm_eps", "--norm-eps", from_file(eps_key), eps, [eps](ModelConfig& m) { m.norm_eps = eps; });
  }
}

void read_positions(KeyReader& keys, const Family& family, ModelConfigFile& file) {
  if (family.rope_theta == 0) {
    add(file, "rope_theta", "--rope-theta", "model_type gpt2 (learned positions: no rotary embedding)", 0.0,
        [](ModelConfig& m) { m.rope_theta = 0; });
    return;
  }
  // Transformers 5 moves rope_theta into rope_parameters.
  const json* parameters = keys.find("rope_parameters");
  const json* value = keys.find("rope_theta");
  std::string source = from_file("rope_theta");
  if (!value && parameters && parameters->is_object() && parameters->contains("rope_theta")) {
    value = &(*parameters)["rope_theta"];
    source = from_file("rope_parameters.rope_theta");
  }
  const double theta =
      value ? keys.number("rope_theta", *value, 1.0, kHuge, "a number above 1") : family.rope_theta;
  if (!value) source = fmt::format("default of model_type {} ({:g})", file.model_type, family.rope_theta);
  add(file, "rope_theta", "--rope-theta", source, theta, [theta](ModelConfig& m) { m.rope_theta = theta; });
  if (const json* fraction = keys.find("partial_rotary_factor")) {
    const double f = keys.number("partial_rotary_factor", *fraction, 0.0, 1.0, "a number in (0, 1]");
    add(file, "rope_fraction", "--rope-fraction", from_file("partial_rotary_factor"), f,
        [f](ModelConfig& m) { m.rope_fraction = f; });
  }
  if (const json* scaling = keys.find("rope_scaling")) {
    file.notes.push_back(
        fmt::format("rope_scaling {} is not applied: gradflow rotates by rope_theta's unscaled "
                    "frequencies (at T far below the original context the scaled and unscaled "
                    "rotations of the high frequencies agree)",
                    scaling->dump()));
  }
}

void read_init(KeyReader& keys, ModelConfigFile& file) {
  const json* value = keys.find("initializer_range");
  const double init_std = value ? keys.number("initializer_range", *value, 0.0, kHuge, "a positive number")
                                : kDefaultInitializerRange;
  const std::string source = value ? from_file("initializer_range") : "default (0.02, as Transformers)";
  // GPT-2 also scales the output projections by 1/sqrt(2 n_layer): gradflow's gpt2 init at 0.02.
  if (file.model_type == "gpt2" && init_std == kDefaultInitializerRange) {
    add(file, "init", "--init", source + " (model_type gpt2: out-proj / sqrt(2B))", "gpt2",
        [](ModelConfig& m) { m.init = InitKind::gpt2; });
    return;
  }
  add(file, "init", "--init", source, fmt::format("normal:{:g}", init_std), [init_std](ModelConfig& m) {
    m.init = InitKind::normal;
    m.init_std = init_std;
  });
}

// Multimodal configs (Gemma 3 4B and up) hold the language model's keys under text_config.
const json& text_model(const json& doc, ModelConfigFile& file) {
  const auto inner = doc.find("text_config");
  if (inner == doc.end() || !inner->is_object()) return doc;
  file.notes.push_back("read the language model's keys under text_config");
  return *inner;
}

json parse(std::string_view text, std::string_view origin) {
  try {
    return json::parse(text);
  } catch (const json::parse_error&
               error) {  // "[json.exception.parse_error.101] parse error at line L, column C: ..."
    const std::string what = error.what();
    const auto start = what.find("] ");
    throw InputError(fmt::format("{}: not valid JSON: {}", origin,
                                 start == std::string::npos ? what : what.substr(start + 2)));
  } catch (const json::exception& error) {  // numbers out of range (1e400)
    throw InputError(fmt::format("{}: not valid JSON: {}", origin, error.what()));
  }
}

}  // namespace

ModelConfigFile read_model_config_file(std::string_view text, std::string_view origin, bool placement_given) {
  const json outer = parse(text, origin);
  if (!outer.is_object())
    throw InputError(
        fmt::format("{}: a config.json holds one JSON object, not {}", origin, outer.type_name()));
  ModelConfigFile file;
  const json& doc = text_model(outer, file);
  KeyReader keys(doc, origin);
  const json* type = keys.find("model_type");
  if (const auto found = outer.find("model_type"); !type && &doc != &outer && found != outer.end())
    type = &*found;
  if (!type) keys.required("model_type", "the model's family (llama, qwen2, gemma2, ...)");
  file.model_type = keys.text("model_type", *type);
  const Family* family = &kAssumedFamily;
  for (const Family& known : kFamilies) {
    if (known.model_type == file.model_type) family = &known;
  }
  if (family == &kAssumedFamily) {
    if (!placement_given)
      keys.fail("model_type",
                fmt::format("{:?} is not a family gradflow knows ({}); give --arch to read it with "
                            "Llama's key names",
                            file.model_type, family_names()));
    file.notes.push_back(
        fmt::format("model_type {} is not a known family: read with Llama's key names and a "
                    "gated FFN",
                    file.model_type));
  } else {
    file.placement = family->placement;
    file.placement_source =
        fmt::format("config.json:model_type ({} -> {})", file.model_type, family->placement);
  }
  const Shape shape = read_shape(keys, *family->keys, file);
  read_attention(keys, *family->keys, *family, shape, file);
  read_ffn(keys, *family->keys, *family, shape, file);
  read_ffn_op(keys, file);
  if (file.model_type == "olmoe")
    file.notes.push_back(
        "OLMoE normalises q and k over the full width (q_norm, k_norm); gradflow's pre-ln has no q/k "
        "norm, so its attention is OLMoE's without them");
  read_norm(keys, *family->keys, *family, file);
  read_positions(keys, *family, file);
  read_init(keys, file);
  file.unused = keys.unused();
  return file;
}

json apply_model_config_file(const ModelConfigFile& file, ModelConfig& model,
                             const std::function<bool(std::string_view flag)>& flag_given) {
  json sources = json::object();
  for (const ConfigFileSetting& setting : file.settings) {
    if (flag_given(setting.flag)) {
      sources[setting.key] = setting.flag;
      continue;
    }
    if (setting.applies && !setting.applies(model)) continue;
    setting.apply(model);
    sources[setting.key] = setting.source;
  }
  return sources;
}

}  // namespace gradflow
