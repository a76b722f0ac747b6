// Names of the configuration's closed sets, validation, and the memory estimate.
#include "gradflow/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "gradflow/architecture.hpp"
#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_registry.hpp"

namespace gradflow {

std::string_view to_string(Precision value) {
  return value == Precision::f32 ? "f32" : "f64";
}
std::string_view to_string(NormKind value) {
  switch (value) {
    case NormKind::rms:
      return "rms";
    case NormKind::layer:
      return "layer";
    case NormKind::dyt:
      return "dyt";
  }
  return "?";
}
std::string_view to_string(InitKind value) {
  switch (value) {
    case InitKind::xavier:
      return "xavier";
    case InitKind::gpt2:
      return "gpt2";
    case InitKind::small:
      return "small";
    case InitKind::normal:
      return "normal";
  }
  return "?";
}
bool is_tanh_gelu_name(std::string_view activation) {
  return activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast" ||
         activation == "gelu_accurate";
}

std::string_view to_string(FfnKind value) {
  switch (value) {
    case FfnKind::gelu:
      return "gelu";
    case FfnKind::swiglu:
      return "swiglu";
    case FfnKind::geglu:
      return "geglu";
    case FfnKind::gelu_tanh:
      return "gelu_tanh";
    case FfnKind::geglu_tanh:
      return "geglu_tanh";
  }
  return "?";
}
std::string_view to_string(BlockKind value) {
  switch (value) {
    case BlockKind::attn_ffn:
      return "attn-ffn";
    case BlockKind::ffn:
      return "ffn";
    case BlockKind::attn:
      return "attn";
  }
  return "?";
}
std::string_view to_string(SublayerKind value) {
  return value == SublayerKind::attn ? "attn" : "ffn";
}
std::string_view to_string(BranchKind value) {
  return value == BranchKind::model ? "model" : "rotation";
}

std::string_view to_string(UpdateRule value) {
  switch (value) {
    case UpdateRule::sgd:
      return "sgd";
    case UpdateRule::adam:
      return "adam";
    case UpdateRule::none:
      break;
  }
  return "none";
}

namespace {
template <typename Enum, std::size_t N>
Enum parse_enum(std::string_view option, std::string_view name, const Enum (&values)[N]) {
  std::string valid;
  for (const Enum value : values) {
    if (to_string(value) == name) return value;
    valid += (valid.empty() ? "" : ", ") + std::string(to_string(value));
  }
  throw InputError(fmt::format("{} {:?} is not one of {}", option, std::string(name), valid));
}
}  // namespace

BlockKind parse_block_kind(std::string_view name) {
  return parse_enum("--block", name, {BlockKind::attn_ffn, BlockKind::ffn, BlockKind::attn});
}
NormKind parse_norm_kind(std::string_view name) {
  return parse_enum("--norm", name, {NormKind::rms, NormKind::layer, NormKind::dyt});
}
InitKind parse_init_kind(std::string_view name) {
  return parse_enum("--init", name, {InitKind::xavier, InitKind::gpt2, InitKind::small, InitKind::normal});
}

void set_init(ModelConfig& config, std::string_view text) {
  const auto colon = text.find(':');
  config.init = parse_init_kind(text.substr(0, colon));
  if (colon == std::string_view::npos) return;
  const std::string number(text.substr(colon + 1));
  if (config.init != InitKind::normal) {
    throw InputError(
        fmt::format("--init {} takes no standard deviation; only normal:STD does, e.g. "
                    "--init normal:0.02",
                    std::string(text)));
  }
  char* end = nullptr;
  config.init_std = std::strtod(number.c_str(), &end);
  if (number.empty() || *end != '\0') {
    throw InputError(
        fmt::format("--init {:?}: the standard deviation {:?} is not a number; try --init "
                    "normal:0.02",
                    std::string(text), number));
  }
}

std::string init_text(const ModelConfig& config) {
  if (config.init != InitKind::normal) return std::string(to_string(config.init));
  return fmt::format("normal:{}", config.init_std);
}

int ModelConfig::rotary_dims() const {
  if (rope_theta == 0.0) return 0;
  // Partial rotary (GPT-NeoX's rotary_pct, HF's partial_rotary_factor): int(head_dim * fraction).
  const int dims = static_cast<int>(head_dim() * rope_fraction);
  return dims - dims % 2;
}
Precision parse_precision(std::string_view name) {
  return parse_enum("--precision", name, {Precision::f32, Precision::f64});
}

UpdateRule parse_update_rule(std::string_view name) {
  return parse_enum("--update", name, {UpdateRule::none, UpdateRule::sgd, UpdateRule::adam});
}

std::optional<double> ModelConfig::number_option(std::string_view key) const {
  const auto found = options.find(key);
  if (found == options.end() || !std::holds_alternative<double>(found->second)) return std::nullopt;
  return std::get<double>(found->second);
}

std::optional<std::string> ModelConfig::word_option(std::string_view key) const {
  const auto found = options.find(key);
  if (found == options.end() || !std::holds_alternative<std::string>(found->second)) return std::nullopt;
  return std::get<std::string>(found->second);
}

SublayerKind ModelConfig::sublayer_kind(int sublayer) const {
  switch (block) {
    case BlockKind::attn_ffn:
      return sublayer % 2 == 0 ? SublayerKind::attn : SublayerKind::ffn;
    case BlockKind::ffn:
      return SublayerKind::ffn;
    case BlockKind::attn:
      return SublayerKind::attn;
  }
  return SublayerKind::ffn;
}

namespace {
// The issue-19 ops: FFN kind and width, rotary embeddings, key/value heads, init, norm epsilon.
void validate_block_ops(const ModelConfig& config) {
  if (config.ffn_hidden_width < 0 || config.ffn_hidden_width > kMaxWidth) {
    throw InputError(
        fmt::format("--ffn-hidden {} must lie in [1, {}] (or 0 for {} x --width); try --ffn-hidden {}",
                    config.ffn_hidden_width, kMaxWidth, kFfnMultiple, kFfnMultiple * config.width));
  }
  if (!(config.rope_theta >= 0.0 && std::isfinite(config.rope_theta)) ||
      (config.rope_theta > 0.0 && config.rope_theta <= 1.0)) {
    throw InputError(
        fmt::format("--rope-theta {} must be above 1 (or 0 for no rotary embedding); try "
                    "--rope-theta 10000",
                    config.rope_theta));
  }
  if (!(config.rope_fraction > 0.0 && config.rope_fraction <= 1.0)) {
    throw InputError(
        fmt::format("--rope-fraction {} must lie in (0, 1]; try --rope-fraction 1", config.rope_fraction));
  }
  if (config.rope_theta > 0.0 && config.rotary_dims() < 2) {
    throw InputError(
        fmt::format("--rope-fraction {} rotates {} of the {} dims per head; rotary embeddings "
                    "need at least 2: raise --rope-fraction or use fewer --heads",
                    config.rope_fraction, config.rotary_dims(), config.head_dim()));
  }
  if (config.kv_heads < 0 || config.kv_heads > config.heads || config.heads % config.kv_head_count() != 0) {
    throw InputError(fmt::format("--kv-heads {} must divide --heads {} (0 means --heads); try --kv-heads {}",
                                 config.kv_heads, config.heads,
                                 config.heads % 2 == 0 ? config.heads / 2 : 1));
  }
  if (config.init == InitKind::normal && !(config.init_std > 0.0 && std::isfinite(config.init_std))) {
    throw InputError(fmt::format(
        "--init normal:{} needs a positive standard deviation; try --init normal:0.02", config.init_std));
  }
  if (!(config.norm_eps > 0.0 && config.norm_eps < 1.0)) {
    throw InputError(
        fmt::format("--norm-eps {} must lie in (0, 1); try --norm-eps {}", config.norm_eps, kNormEps));
  }
}

// --update and --lr (issue 18): a learning rate is a positive finite number, and the step needs
// weights to step.
void validate_update(const ModelConfig& config) {
  if (config.update == UpdateRule::none) {
    if (!config.learning_rates.empty())
      throw InputError("--lr is the learning rate of --update, which is not given; add --update adam");
    if (config.update_norm_gains)
      throw InputError(
          "--update-params all says what --update steps, and --update is not given; add --update adam");
    return;
  }
  if (config.branch == BranchKind::rotation) {
    throw InputError(
        fmt::format("--update {} steps the branch weights, and --ideal-branch has none; drop "
                    "--ideal-branch or --update",
                    to_string(config.update)));
  }
  if (config.learning_rates.empty() || config.learning_rates.size() > kMaxLearningRates) {
    throw InputError(fmt::format("--lr takes 1 to {} learning rates, not {}; try --lr 1e-3",
                                 kMaxLearningRates, config.learning_rates.size()));
  }
  for (const double lr : config.learning_rates) {
    if (!(lr > 0) || !std::isfinite(lr))
      throw InputError(fmt::format("--lr {} must be a positive finite learning rate; try --lr 1e-3", lr));
  }
  // The step covers every weight matrix, W_Q, W_K, W_V, W_O, W_1, W_2 and a gated FFN's W_3
  // (shared key/value heads and rotary embeddings included), and with --bias every bias.
}
}  // namespace

void validate(const ModelConfig& config, const PlacementRegistry& placements) {
  if (config.blocks < 1)
    throw InputError(fmt::format("--depth {} must be at least 1 block; try --depth 64", config.blocks));
  if (config.blocks > kMaxBlocks)
    throw InputError(
        fmt::format("--depth {} exceeds the largest supported depth, {} blocks", config.blocks, kMaxBlocks));
  if (config.width < 1)
    throw InputError(fmt::format("--width {} must be positive; try --width 256", config.width));
  if (config.width > kMaxWidth)
    throw InputError(
        fmt::format("--width {} exceeds the largest supported width, {}", config.width, kMaxWidth));
  if (config.heads < 1)
    throw InputError(fmt::format("--heads {} must be positive; try --heads 4", config.heads));
  if (config.heads > config.width)
    throw InputError(fmt::format("--heads {} exceeds --width {}; try --heads 4", config.heads, config.width));
  if (config.width % config.heads != 0) {
    // The user more likely mistyped the head count than the width: suggest the nearest head count
    // that divides the width (the larger on a tie), then the nearest width the heads divide.
    int heads = 1;
    for (int step = 1; step < config.heads; ++step) {  // 1 divides every width, so this ends
      if (config.heads + step <= config.width && config.width % (config.heads + step) == 0) {
        heads = config.heads + step;
        break;
      }
      if (config.width % (config.heads - step) == 0) {
        heads = config.heads - step;
        break;
      }
    }
    const int below = config.width / config.heads * config.heads;
    const int width = below >= config.heads && config.width - below <= below + config.heads - config.width
                          ? below
                          : below + config.heads;
    throw InputError(fmt::format("--width {} is not divisible by --heads {}; try --heads {} or --width {}",
                                 config.width, config.heads, heads, width));
  }
  if (config.seq < 1)
    throw InputError(fmt::format("--seq {} must be at least 1 token; try --seq 64", config.seq));
  if (config.seq > kMaxSeq)
    throw InputError(fmt::format("--seq {} exceeds the largest supported length, {}", config.seq, kMaxSeq));
  if (config.probes < 1)
    throw InputError(fmt::format("--probes {} must be at least 1; try --probes 1", config.probes));
  if (config.probes > kMaxProbes)
    throw InputError(fmt::format("--probes {} exceeds {}; try --probes 4", config.probes, kMaxProbes));
  if (!(config.input_corr >= 0.0 && config.input_corr <= 1.0)) {
    throw InputError(
        fmt::format("--input-corr {} must lie in [0, 1]; try --input-corr 0.5", config.input_corr));
  }
  validate_block_ops(config);
  validate_op_options(config);          // --ffn's word and the ops' own options (--experts, ...)
  placements.validate_options(config);  // the placements' own options (--alpha, --keel-variant, ...)
  if (config.angles_all && config.sublayers() > kAnglesMaxSublayers) {
    throw InputError(fmt::format(
        "--angles all needs O(S^2 T d) work and is limited to {} sublayers, not {}; reduce --depth",
        kAnglesMaxSublayers, config.sublayers()));
  }
  if (config.spectrum < 0 || config.spectrum > kSpectrumMaxColumns) {
    throw InputError(fmt::format("--spectrum {} must lie in [0, {}]; try --spectrum 4", config.spectrum,
                                 kSpectrumMaxColumns));
  }
  if (config.exact_jacobian && static_cast<long long>(config.seq) * config.width > kExactJacobianMaxEntries) {
    throw InputError(fmt::format(
        "--exact-jacobian takes one backward pass per output coordinate and is limited to seq * width <= {}, "
        "not {} * {} = {}; try --seq 8 --width 16",
        kExactJacobianMaxEntries, config.seq, config.width,
        static_cast<long long>(config.seq) * config.width));
  }
  validate_update(config);
  if (config.branch == BranchKind::rotation && config.width % 2 != 0) {
    throw InputError(fmt::format("--ideal-branch rotation needs an even --width, not {}; try --width {}",
                                 config.width, config.width + 1));
  }
}

double estimated_result_bytes(const ModelConfig& config, int stream_count) {
  const double s = static_cast<double>(config.blocks) * config.sublayers_per_block();
  // About 40 figure columns of doubles per state and sublayer, plus streams and singular values;
  // the ordered JSON tree costs about 16 times the doubles (measured: 126 kB of text at depth 64).
  constexpr double kJsonOverhead = 16;
  return (s + 1) * 8 * (40 + 2.0 * stream_count + config.spectrum) * kJsonOverhead;
}

// The mean over the block's sublayers of their branch op's forward cost (branch_op.hpp).
double sublayer_forward_flops(const ModelConfig& config) {
  double flops = 0;
  for (int i = 0; i < config.sublayers_per_block(); ++i) {
    const SublayerKind kind = config.sublayer_kind(i);
    flops += branch_op(config, kind).cost(config).forward_flops;
  }
  return flops / config.sublayers_per_block();
}

double estimated_memory_bytes(const ModelConfig& config, int stream_count, int history_streams) {
  const double scalar = config.precision == Precision::f32 ? 4 : 8;
  const double d = config.width, t = config.seq,
               s = static_cast<double>(config.blocks) * config.sublayers_per_block();
  // Columns carried through a sublayer at once: the probes, --spectrum's 2k block, or one per
  // output coordinate for --exact-jacobian (plus its dense (n, T d) copy for the SVD).
  double k = config.probes;
  if (config.spectrum > 0) k = std::max(k, 2.0 * config.spectrum);
  if (config.exact_jacobian) k = std::max(k, 2 * t * d);
  const double states = (s + 1) * stream_count * t * d;
  // Attention's weights and its working values, and the FFN's (branch_op.hpp): attention's
  // weights are counted twice.
  const BranchOpRow& attention = branch_op(config, SublayerKind::attn);
  const BranchOpRow& ffn = branch_op(config, SublayerKind::ffn);
  const auto weight_scalars = [&](const BranchOpRow& op) {
    double count = 0;
    for (const WeightSpec& spec : op.weights(config)) count += static_cast<double>(spec.rows * spec.cols);
    return count;
  };
  const double attention_weights = weight_scalars(attention), ffn_weights = weight_scalars(ffn);
  const double weights = 2 * attention_weights + ffn_weights;
  const BranchCost attention_cost = attention.cost(config), ffn_cost = ffn.cost(config);
  const double working = 24 * k * t * d + k * (attention_cost.probe_scalars + ffn_cost.probe_scalars) +
                         attention_cost.fixed_scalars + ffn_cost.fixed_scalars + 4 * k * t * d * stream_count;
  // The result's per-state and per-sublayer figures (about 40 columns of doubles) and the
  // contribution log per probe.
  const double figures = (s + 1) * 8 * (40 + 2.0 * stream_count + config.spectrum) + s * k * 8;
  // --update (src/science/update.cpp): probe 0's cotangent of every stored state, and the weight
  // gradient, step and stepped weights, in buffers reused from sublayer to sublayer (so attention's
  // and the FFN's, once each) and by every learning rate. Measured peaks against this estimate:
  // keel depth 1024, 284 MB (299 MB); Llama-3.2-1B's block at depth 2, 1.00 GB (1.06 GB).
  const double update =
      config.update == UpdateRule::none ? 0 : states + 3 * (attention_weights + ffn_weights);
  // A history (attend; StackRun, update.cpp), per stream read: every state's key (T x d and T
  // inverse rms) and running sum, and in the backward pass its cotangent (K probes); --update keeps
  // a stepped history (values, keys, running sums) per learning rate. Full AttnRes at depth 1024
  // (keel's sizes, f32): 677 MB measured, this estimate 708 MB.
  const double history_per_state =
      (t * (d + 1) + t * d + k * t * d) +
      (config.update == UpdateRule::none ? 0.0 : config.update_count() * t * (3 * d + 1));
  const double history = history_streams * (s + 1) * history_per_state;
  constexpr double kBaseline = 16 << 20;  // binary, libraries, result arrays
  return (states + weights + working + update + history) * scalar + figures + kBaseline;
}

// Measured on a 2-core machine: the defaults (keel, d = 256, T = 64, f32) take 2.7 ms per sublayer
// on one core (depth 1024, the whole run), and Llama-3.2-1B's block (data/configs, 74.6x the
// forward flops) 0.315 s, 117x: so the time grows like flops^1.1 (sublayer_forward_flops: widths,
// KV heads, a gated FFN); then the probes' backward passes, --update's pass and the precision.
double estimated_run_seconds(const ModelConfig& config, int cores) {
  constexpr double kSecondsPerSublayerAtDefaults = 2.7e-3, kFlopsExponent = 1.1;
  const double work =
      std::pow(sublayer_forward_flops(config) / sublayer_forward_flops(ModelConfig{}), kFlopsExponent);
  const double probes = (2.0 + config.probes) / 3.0;  // forward + recompute fixed, backward per probe
  // --update: the weight gradients' recompute and backward once, then one stepped forward per
  // learning rate; bench/update_cost.py measures 1.94x the run without it at one learning rate.
  const double update = config.update_count() > 0 ? 1.6 + 0.34 * config.update_count() : 1.0;
  const double precision = config.precision == Precision::f64 ? 2.0 : 1.0;
  return kSecondsPerSublayerAtDefaults * config.sublayers() * work * probes * update * precision /
         std::max(cores, 1);
}

}  // namespace gradflow
