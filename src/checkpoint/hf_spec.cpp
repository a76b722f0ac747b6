// config.json -> HfModelSpec: each family's conventions as its Hugging Face implementation reads
// its config (transformers/models/<family>/configuration_*.py and modeling_*.py), and the tensor
// names and shapes its state_dict has.
#include <fmt/format.h>

#include <array>
#include <cmath>

#include "gradflow/checkpoint.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

std::string_view to_string(HfFamily value) {
  constexpr std::array names{"llama", "mistral", "qwen2", "olmo2", "gpt2", "gemma2"};
  return names[static_cast<int>(value)];
}
std::string_view to_string(LossKind value) {
  return value == LossKind::lm ? "lm" : "probe";
}
LossKind parse_loss_kind(std::string_view name) {
  if (name == "lm") return LossKind::lm;
  if (name == "probe") return LossKind::probe;
  throw InputError(
      fmt::format("--loss {} is not a loss; try --loss lm (the language-model loss) or --loss probe", name));
}

std::string_view family_placement(HfFamily family) {
  switch (family) {
    case HfFamily::olmo2:
      return "olmo2";  // the branch's output normalised before the add (arXiv 2501.00656, Sec. 3.2)
    case HfFamily::gemma2:
      return "peri-ln";  // sandwich norms (arXiv 2408.00118, Sec. 2)
    default:
      return "pre-ln";
  }
}

namespace {

constexpr std::array<std::pair<std::string_view, HfFamily>, 6> kModelTypes{{{"llama", HfFamily::llama},
                                                                            {"mistral", HfFamily::mistral},
                                                                            {"qwen2", HfFamily::qwen2},
                                                                            {"olmo2", HfFamily::olmo2},
                                                                            {"gpt2", HfFamily::gpt2},
                                                                            {"gemma2", HfFamily::gemma2}}};
constexpr int kMaxSize = 1 << 20;  // widths, heads, vocabulary: far beyond any model, inside int
constexpr int kMaxLayers = 1 << 16;

class Keys {
 public:
  Keys(const json& config, std::string_view origin) : config_(config), origin_(origin) {}
  [[noreturn]] void fail(std::string_view key, const std::string& problem) const {
    throw InputError(fmt::format("{}: {} {}", origin_, key, problem));
  }
  const json* find(std::string_view key) const {
    const auto found = config_.find(std::string(key));
    return found == config_.end() || found->is_null() ? nullptr : &*found;
  }
  // Present with null: Gemma-2 writes null to switch a soft-cap or the sliding window off, where
  // an absent key takes Gemma2Config's default.
  bool is_null(std::string_view key) const {
    const auto found = config_.find(std::string(key));
    return found != config_.end() && found->is_null();
  }
  int integer(std::string_view key, int largest, std::optional<int> fallback = std::nullopt) const {
    const json* value = find(key);
    if (!value) {
      if (fallback) return *fallback;
      fail(key, "is missing; the model's config.json gives it");
    }
    if (!value->is_number_integer() || value->get<long long>() < 1 || value->get<long long>() > largest)
      fail(key, fmt::format("must be an integer in [1, {}], not {}", largest, value->dump()));
    return static_cast<int>(value->get<long long>());
  }
  double number(std::string_view key, double fallback, double low, double high) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_number() || !(value->get<double>() > low && value->get<double>() <= high))
      fail(key, fmt::format("must be a number in ({}, {}], not {}", low, high, value->dump()));
    return value->get<double>();
  }
  bool boolean(std::string_view key, bool fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean()) fail(key, fmt::format("must be true or false, not {}", value->dump()));
    return value->get<bool>();
  }
  std::string text(std::string_view key, std::string_view fallback) const {
    const json* value = find(key);
    if (!value) return std::string(fallback);
    if (!value->is_string()) fail(key, fmt::format("must be a string, not {}", value->dump()));
    return value->get<std::string>();
  }

 private:
  const json& config_;
  std::string_view origin_;
};

HfActivation activation_of(const Keys& keys, std::string_view key, std::string_view fallback) {
  const std::string name = keys.text(key, fallback);
  if (name == "silu" || name == "swish") return HfActivation::silu;
  if (name == "gelu") return HfActivation::gelu;
  if (is_tanh_gelu_name(name)) return HfActivation::gelu_tanh;
  keys.fail(key, fmt::format("\"{}\" is not an activation gradflow computes (silu, gelu, gelu_new, "
                             "gelu_pytorch_tanh, gelu_fast, gelu_accurate)",
                             name));
}

// rope_scaling (transformers/modeling_rope_utils.py): default, linear and llama3 are computed;
// the others change with the sequence length or need attention factors, and are refused.
// Transformers 5 writes rope_parameters {rope_theta, rope_type, factor, ...} in place of rope_theta
// and rope_scaling (configuration_llama.py); it is read first, and the two forms must agree.
void read_rope_scaling(const json& config, const Keys& keys, HfModelSpec& spec) {
  const char* key = keys.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json* scaling = keys.find(key);
  if (!scaling) return;
  if (!scaling->is_object()) keys.fail(key, fmt::format("must be an object, not {}", scaling->dump()));
  if (std::string_view(key) == "rope_parameters") {
    if (scaling->contains("full_attention") || scaling->contains("sliding_attention"))
      keys.fail(
          key, "holds one set per layer type, which gradflow does not read; give one rope_parameters object");
    if (const auto theta = scaling->find("rope_theta"); theta != scaling->end()) {
      if (!theta->is_number() || !(theta->get<double>() > 0))
        keys.fail("rope_parameters.rope_theta",
                  fmt::format("must be a positive number, not {}", theta->dump()));
      if (keys.find("rope_theta") && keys.find("rope_theta")->get<double>() != theta->get<double>())
        keys.fail("rope_theta", "disagrees with rope_parameters.rope_theta; keep one of them");
      spec.rope_theta = theta->get<double>();
    }
  }
  const std::string origin = fmt::format("config.json:{}", key);
  const Keys inner(*scaling, origin);
  const std::string type =
      inner.find("rope_type") ? inner.text("rope_type", "") : inner.text("type", "default");
  if (type == "default") return;
  spec.rope_factor = inner.number("factor", 0.0, 0.0, 1e6);
  if (spec.rope_factor <= 0) inner.fail("factor", "is missing; rope_scaling gives it");
  if (type == "linear") {
    spec.rope_scaling = RopeScaling::linear;
  } else if (type == "llama3") {
    spec.rope_scaling = RopeScaling::llama3;
    spec.rope_low_freq_factor = inner.number("low_freq_factor", 1.0, 0.0, 1e6);
    spec.rope_high_freq_factor = inner.number("high_freq_factor", 4.0, 0.0, 1e6);
    spec.rope_original_max_positions = inner.integer("original_max_position_embeddings", kMaxSize * 64, 8192);
    if (!(spec.rope_high_freq_factor > spec.rope_low_freq_factor))
      inner.fail("high_freq_factor", "must exceed low_freq_factor");
  } else {
    keys.fail(key, fmt::format("type \"{}\" is not computed by gradflow (default, linear and llama3 are); a "
                               "model trained with it would be analysed with the wrong positions",
                               type));
  }
  (void)config;
}

// Per-layer sliding windows: layer_types when the config lists them, else the family's rule.
void read_sliding_windows(const Keys& keys, HfModelSpec& spec) {
  spec.sliding_window.assign(spec.layers, 0);
  // Gemma2Config's default window is 4096 (an absent key); null switches it off.
  int window = spec.family == HfFamily::gemma2 && !keys.is_null("sliding_window") ? 4096 : 0;
  if (const json* value = keys.find("sliding_window")) {
    if (!value->is_number_integer() || value->get<long long>() < 1 || value->get<long long>() > (1ll << 30))
      keys.fail("sliding_window", fmt::format("must be a positive integer or null, not {}", value->dump()));
    window = static_cast<int>(value->get<long long>());
  }
  if (window == 0) return;
  if (const json* types = keys.find("layer_types")) {
    if (!types->is_array() || types->size() != static_cast<std::size_t>(spec.layers))
      keys.fail("layer_types", fmt::format("must list one type per layer ({})", spec.layers));
    for (int i = 0; i < spec.layers; ++i) {
      const json& type = (*types)[i];
      if (type == "sliding_attention")
        spec.sliding_window[i] = window;
      else if (type != "full_attention")
        keys.fail(
            "layer_types",
            fmt::format("entry {} is {}, not \"sliding_attention\" or \"full_attention\"", i, type.dump()));
    }
    return;
  }
  for (int i = 0; i < spec.layers; ++i) {
    switch (spec.family) {
      case HfFamily::gemma2:  // Gemma2Config: layer i slides when (i + 1) % 2, i.e. even layers
        if (i % 2 == 0) spec.sliding_window[i] = window;
        break;
      case HfFamily::mistral:  // MistralAttention: every layer, when sliding_window is set
        spec.sliding_window[i] = window;
        break;
      case HfFamily::qwen2:  // Qwen2Config: use_sliding_window, from max_window_layers on
        if (keys.boolean("use_sliding_window", false) &&
            i >= keys.integer("max_window_layers", kMaxLayers, 28))
          spec.sliding_window[i] = window;
        break;
      default:
        break;
    }
  }
}

void read_gpt2(const Keys& keys, HfModelSpec& spec) {
  spec.hidden = keys.integer("n_embd", kMaxSize);
  spec.layers = keys.integer("n_layer", kMaxLayers);
  spec.heads = keys.integer("n_head", kMaxSize);
  spec.kv_heads = spec.heads;
  if (spec.hidden % spec.heads != 0)
    keys.fail("n_head", fmt::format("{} does not divide n_embd {}", spec.heads, spec.hidden));
  spec.head_dim = spec.hidden / spec.heads;
  spec.intermediate = keys.integer("n_inner", kMaxSize, 4 * spec.hidden);
  spec.vocab = keys.integer("vocab_size", kMaxSize * 8);
  spec.max_positions = keys.integer("n_positions", kMaxSize * 8, 1024);
  spec.norm_eps = keys.number("layer_norm_epsilon", 1e-5, 0.0, 0.5);
  spec.layer_norm = true;
  spec.qkv_bias = spec.o_bias = spec.mlp_bias = true;
  spec.gated = false;
  spec.activation = activation_of(keys, "activation_function", "gelu_new");
  spec.position_embedding = true;
  spec.attention_scale = keys.boolean("scale_attn_weights", true) ? 1.0 / std::sqrt(spec.head_dim) : 1.0;
  if (keys.boolean("scale_attn_by_inverse_layer_idx", false))
    keys.fail("scale_attn_by_inverse_layer_idx",
              "true is not computed by gradflow; the GPT-2 family uses false");
  spec.tied = keys.boolean("tie_word_embeddings", true);
  spec.sliding_window.assign(spec.layers, 0);
}

void read_shared(const Keys& keys, const json& config, HfModelSpec& spec) {
  spec.hidden = keys.integer("hidden_size", kMaxSize);
  spec.layers = keys.integer("num_hidden_layers", kMaxLayers);
  spec.heads = keys.integer("num_attention_heads", kMaxSize);
  spec.kv_heads = keys.integer("num_key_value_heads", kMaxSize, spec.heads);
  if (spec.heads % spec.kv_heads != 0)
    keys.fail("num_key_value_heads",
              fmt::format("{} does not divide num_attention_heads {}", spec.kv_heads, spec.heads));
  if (!keys.find("head_dim") && spec.hidden % spec.heads != 0)
    keys.fail("num_attention_heads",
              fmt::format("{} does not divide hidden_size {}", spec.heads, spec.hidden));
  // Gemma2Config's head_dim defaults to 256, the others' to hidden_size / num_attention_heads.
  spec.head_dim =
      keys.integer("head_dim", kMaxSize, spec.family == HfFamily::gemma2 ? 256 : spec.hidden / spec.heads);
  spec.intermediate = keys.integer("intermediate_size", kMaxSize);
  spec.vocab = keys.integer("vocab_size", kMaxSize * 8);
  spec.max_positions = keys.integer("max_position_embeddings", 1 << 30, 1 << 30);
  // The configuration classes' defaults: Olmo2Config's rms_norm_eps is 1e-5, the others' 1e-6;
  // every family's rope_theta is 10000.
  spec.norm_eps = keys.number("rms_norm_eps", spec.family == HfFamily::olmo2 ? 1e-5 : 1e-6, 0.0, 0.5);
  spec.rope_theta = keys.number("rope_theta", 10000.0, 0.0, 1e12);
  const double partial = keys.number("partial_rotary_factor", 1.0, 0.0, 1.0);
  spec.rotary_dims = static_cast<int>(spec.head_dim * partial) / 2 * 2;
  if (spec.rotary_dims < 2) keys.fail("partial_rotary_factor", "leaves fewer than 2 rotary dims per head");
  read_rope_scaling(config, keys, spec);
  spec.attention_scale = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  spec.activation = activation_of(keys, "hidden_act", "silu");
  switch (spec.family) {
    case HfFamily::llama:
    case HfFamily::mistral:
      spec.qkv_bias = spec.o_bias = keys.boolean("attention_bias", false);
      spec.mlp_bias = keys.boolean("mlp_bias", false);
      spec.tied = keys.boolean("tie_word_embeddings", false);
      break;
    case HfFamily::qwen2:  // Qwen2Attention: bias=True on q, k, v; none on o
      spec.qkv_bias = true;
      spec.tied = keys.boolean("tie_word_embeddings", false);
      break;
    case HfFamily::olmo2:  // Olmo2Attention: q_norm, k_norm; Olmo2DecoderLayer: post norms only
      spec.qkv_bias = spec.o_bias = keys.boolean("attention_bias", false);
      spec.qk_norm = true;
      spec.input_norms = false;
      spec.output_norms = true;
      spec.tied = keys.boolean("tie_word_embeddings", false);
      break;
    case HfFamily::gemma2:
      spec.gain_offset = true;
      spec.output_norms = true;
      spec.activation = activation_of(
          keys, keys.find("hidden_activation") ? "hidden_activation" : "hidden_act", "gelu_pytorch_tanh");
      spec.embedding_scale = std::sqrt(static_cast<double>(spec.hidden));
      spec.attention_scale = 1.0 / std::sqrt(keys.number("query_pre_attn_scalar", 256.0, 0.0, 1e12));
      // Gemma2Config: attn_logit_softcapping 50 and final_logit_softcapping 30 when absent; null: none
      spec.attn_softcap = keys.is_null("attn_logit_softcapping")
                              ? 0.0
                              : keys.number("attn_logit_softcapping", 50.0, 0.0, 1e12);
      spec.final_softcap = keys.is_null("final_logit_softcapping")
                               ? 0.0
                               : keys.number("final_logit_softcapping", 30.0, 0.0, 1e12);
      spec.tied = keys.boolean("tie_word_embeddings", true);
      break;
    case HfFamily::gpt2:
      break;
  }
  read_sliding_windows(keys, spec);
}

void add(std::vector<ExpectedTensor>& list, std::string name, std::vector<std::int64_t> shape) {
  list.push_back({std::move(name), std::move(shape)});
}

}  // namespace

HfModelSpec read_hf_model_spec(const json& config, std::string_view origin) {
  if (!config.is_object()) throw InputError(fmt::format("{}: must be a JSON object", origin));
  const Keys keys(config, origin);
  HfModelSpec spec;
  const json* type = keys.find("model_type");
  if (!type || !type->is_string())
    keys.fail("model_type", "is missing; a Hugging Face config.json names its family there");
  spec.model_type = type->get<std::string>();
  bool known = false;
  for (const auto& [name, family] : kModelTypes) {
    if (name == spec.model_type) {
      spec.family = family;
      known = true;
    }
  }
  if (!known)
    keys.fail("model_type", fmt::format("\"{}\" is not a family gradflow reads; supported: llama, mistral, "
                                        "qwen2, olmo2, gpt2, gemma2",
                                        spec.model_type));
  if (spec.family == HfFamily::gpt2)
    read_gpt2(keys, spec);
  else
    read_shared(keys, config, spec);
  return spec;
}

std::vector<ExpectedTensor> expected_tensors(const HfModelSpec& spec) {
  std::vector<ExpectedTensor> list;
  const std::int64_t d = spec.hidden, q = spec.q_width(), kv = spec.kv_width(), h = spec.intermediate;
  if (spec.family == HfFamily::gpt2) {
    // Conv1D weights are stored (in, out); c_attn fuses q, k, v along its output.
    const std::string& p = spec.tensor_prefix;
    add(list, p + "wte.weight", {spec.vocab, d});
    add(list, p + "wpe.weight", {spec.max_positions, d});
    for (int i = 0; i < spec.layers; ++i) {
      const std::string l = fmt::format("{}h.{}.", p, i);
      add(list, l + "ln_1.weight", {d});
      add(list, l + "ln_1.bias", {d});
      add(list, l + "attn.c_attn.weight", {d, 3 * d});
      add(list, l + "attn.c_attn.bias", {3 * d});
      add(list, l + "attn.c_proj.weight", {d, d});
      add(list, l + "attn.c_proj.bias", {d});
      add(list, l + "ln_2.weight", {d});
      add(list, l + "ln_2.bias", {d});
      add(list, l + "mlp.c_fc.weight", {d, h});
      add(list, l + "mlp.c_fc.bias", {h});
      add(list, l + "mlp.c_proj.weight", {h, d});
      add(list, l + "mlp.c_proj.bias", {d});
    }
    add(list, p + "ln_f.weight", {d});
    add(list, p + "ln_f.bias", {d});
    if (!spec.tied) add(list, "lm_head.weight", {spec.vocab, d});
    return list;
  }
  add(list, "model.embed_tokens.weight", {spec.vocab, d});
  for (int i = 0; i < spec.layers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    if (spec.input_norms) add(list, l + "input_layernorm.weight", {d});
    add(list, l + "self_attn.q_proj.weight", {q, d});  // nn.Linear: (out, in)
    add(list, l + "self_attn.k_proj.weight", {kv, d});
    add(list, l + "self_attn.v_proj.weight", {kv, d});
    if (spec.qkv_bias) {
      add(list, l + "self_attn.q_proj.bias", {q});
      add(list, l + "self_attn.k_proj.bias", {kv});
      add(list, l + "self_attn.v_proj.bias", {kv});
    }
    if (spec.qk_norm) {
      add(list, l + "self_attn.q_norm.weight", {q});
      add(list, l + "self_attn.k_norm.weight", {kv});
    }
    add(list, l + "self_attn.o_proj.weight", {d, q});
    if (spec.o_bias) add(list, l + "self_attn.o_proj.bias", {d});
    // The norm names: Llama's post_attention_layernorm is the MLP's input norm; OLMo-2's and
    // Gemma-2's normalise the attention output; Gemma-2 adds pre_/post_feedforward_layernorm.
    add(list, l + "post_attention_layernorm.weight", {d});
    if (spec.family == HfFamily::gemma2) add(list, l + "pre_feedforward_layernorm.weight", {d});
    add(list, l + "mlp.gate_proj.weight", {h, d});
    add(list, l + "mlp.up_proj.weight", {h, d});
    add(list, l + "mlp.down_proj.weight", {d, h});
    if (spec.mlp_bias) {
      add(list, l + "mlp.gate_proj.bias", {h});
      add(list, l + "mlp.up_proj.bias", {h});
      add(list, l + "mlp.down_proj.bias", {d});
    }
    if (spec.output_norms) add(list, l + "post_feedforward_layernorm.weight", {d});
  }
  add(list, "model.norm.weight", {d});
  if (!spec.tied) add(list, "lm_head.weight", {spec.vocab, d});
  return list;
}

bool ignorable_tensor(const HfModelSpec& spec, std::string_view name) {
  const auto ends_with = [name](std::string_view tail) {
    return name.size() >= tail.size() && name.substr(name.size() - tail.size()) == tail;
  };
  if (spec.family == HfFamily::gpt2)
    return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
           (spec.tied && name == "lm_head.weight");
  return ends_with(".rotary_emb.inv_freq") || (spec.tied && name == "lm_head.weight");
}

ModelConfig model_config_of(const HfModelSpec& spec, int tokens, Precision precision, std::uint64_t seed) {
  ModelConfig config;
  config.arch = std::string(family_placement(spec.family));
  config.blocks = spec.layers;
  config.width = spec.hidden;
  config.heads = spec.heads;
  config.kv_heads = spec.kv_heads;
  config.seq = tokens;
  config.norm = spec.layer_norm ? NormKind::layer : NormKind::rms;
  config.init = InitKind::normal;
  config.precision = precision;
  config.seed = seed;
  const bool tanh = spec.activation == HfActivation::gelu_tanh;
  config.ffn = to_string(!spec.gated                             ? (tanh ? FfnKind::gelu_tanh : FfnKind::gelu)
                         : spec.activation == HfActivation::silu ? FfnKind::swiglu
                         : tanh                                  ? FfnKind::geglu_tanh
                                                                 : FfnKind::geglu);
  config.ffn_hidden_width = spec.intermediate;
  config.rope_theta = spec.rope_theta;
  config.rope_fraction = spec.rope_theta > 0 ? static_cast<double>(spec.rotary_dims) / spec.head_dim : 1.0;
  config.bias = spec.qkv_bias || spec.mlp_bias;
  config.norm_eps = spec.norm_eps;
  return config;
}

}  // namespace gradflow
