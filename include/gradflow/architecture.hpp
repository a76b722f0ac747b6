// The registry of residual / normalisation placements: one recipe file per architecture
// (src/archs/*.cpp), one table (src/archs/registry.cpp).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/config.hpp"
#include "gradflow/graph.hpp"

namespace gradflow {

// A constant of a placement at a given depth, with the depth unit its formula is written in.
struct Constant {
  std::string name;  // e.g. "alpha"
  double value = 0.0;
  std::string formula;  // e.g. "(2B)^(1/4)"
  std::string unit;     // "blocks", "sublayers", "fraction of blocks", "-" ...
};
using Constants = std::vector<Constant>;
// The named constant's value; throws std::logic_error when the recipe lacks it.
double constant_value(const Constants& constants, std::string_view name);

enum class WeightMatrix { q, k, v, o, up, down, gate };  // gate: W_3 of swiglu / geglu, drawn like up

// What gradflow does when an option is given but no selected placement declares it.
enum class UnusedOption {
  ignore,  // say nothing
  warn,    // warn that it is ignored, and run
  refuse,  // refuse the run; when some selected placement declares it, warn for each one that does not
};

// A setting of a placement (--alpha, --keel-variant, ...), declared in its recipe file next to the
// constants it feeds. The CLI flags, validate(), the JSON documents, `archs` and `check` are derived
// from these declarations; a value given by the user sits in ModelConfig::options under `key`.
// Several placements may declare the same option (the same key and flag); it is one flag.
struct PlacementOption {
  std::string_view key;   // ModelConfig::options key and JSON key, e.g. "mix_ratio"
  std::string_view flag;  // e.g. "--mix-ratio"
  std::string_view help;  // the flag's --help text
  // The value the placement uses when the flag is not given, or nullopt when that depends on the
  // placement (a paper's constant); then `default_text` says so, in --help and in a sweep's model.
  std::optional<OptionValue> default_value;
  std::string_view default_text;
  std::vector<std::string_view> choices;   // the values of a word option; empty: a number option
  void (*check_number)(double) = nullptr;  // a number's rule: throws InputError naming value and fix
  UnusedOption when_unused = UnusedOption::warn;
  std::string_view sets;  // what it sets, for the refusal: "the skip weight" (refuse only)
  bool in_run_config =
      false;  // also in each run's "config" (and compared by `check`); else in constants only
  bool in_sweep_model = false;  // in a sweep manifest's "model" (so a resumed sweep must agree on it)
  bool is_word() const { return !choices.empty(); }
  std::string shown_default() const;  // default_value as text, else default_text ("0.25", "paper's constant")
};

// What a recipe sees when it builds sublayer l (or, with sublayer = S, the output head).
struct SublayerContext {
  const ModelConfig& config;
  const Constants& constants;
  int sublayer = 0;
  int block = 0;
  SublayerKind kind = SublayerKind::attn;
  double profiled_skip_weight = 1.0;  // Admin's w_l, profiled during the forward pass
  int blocks() const { return config.blocks; }
  int sublayers() const { return config.sublayers(); }
};

struct Architecture {
  std::string_view id;
  std::vector<std::string_view> aliases;
  std::string_view update_rule;      // one line, in architectures.md's notation
  std::string_view final_norm;       // "yes", "none", or the documented combination
  std::string_view citation;         // authors, year, arXiv id
  std::string_view expected_growth;  // growth class of the residual stream at init (metrics.md)
  bool provisional = false;
  std::string_view provisional_note;
  // Stream names; a state has the first few of them (most placements: one stream "x").
  std::vector<std::string_view> streams = {"x"};
  int initial_streams = 1;               // streams of x_0 (each a copy of the input)
  bool profiles_skip_weight = false;     // Admin: w_{l+1}^2 = w_l^2 Var[x_l] + Var[F_l], forward pass
  std::vector<PlacementOption> options;  // its settings (--alpha, --mix-ratio, ...)
  // x <- x + update with nothing else touching the stream, so x_S = x_0 + sum_l update_l exactly:
  // enables the exact stream decomposition (stream_decomposition, metrics.md).
  bool additive_stream = false;

  Constants (*constants)(const ModelConfig&) = nullptr;
  void (*build_sublayer)(SublayerGraph&, const SublayerContext&) = nullptr;
  // The output y from the final state's streams (final norm or combination); one output.
  void (*build_output)(SublayerGraph&, const SublayerContext&) = nullptr;
  // Closed-form skip factor under the idealised branch (architectures.md), when one exists.
  std::optional<double> (*skip_gain_theory)(const SublayerContext&) = nullptr;
  // Multiplier on the base init's standard deviation (DeepNorm's beta), 1 when null.
  double (*init_gain)(const SublayerContext&, WeightMatrix) = nullptr;
  // nGPT: after the base draw, every matrix is normalised along the width-d (embedding) dimension
  // (normalize_along_width, initialization.hpp).
  bool unit_norm_weights = false;
};

const std::vector<Architecture>& architectures();
// By id or alias; throws InputError naming the nearest valid id.
const Architecture& find_architecture(std::string_view id);
// "all" or a comma-separated list, each resolved by find_architecture, duplicates removed.
std::vector<const Architecture*> parse_architecture_list(std::string_view list);
// Every placement option once (by key), in registry order: the flags analyze and sweep accept.
std::vector<const PlacementOption*> placement_options();
// Whether the placement declares the option `key`.
bool declares_option(const Architecture& arch, std::string_view key);
// The placements that declare the option `key`, in registry order.
std::vector<std::string_view> placements_declaring(std::string_view key);
// Throws InputError naming the flag and the value when a given option breaks its rule
// (a number's check, a word's choices), or std::logic_error for a key no placement declares.
void validate_options(const ModelConfig& config);

// Shared recipe pieces used by several placements.
namespace recipes {
void post_norm(SublayerGraph& g, double skip_weight);  // x <- N(w x + F(x))
void pre_norm(SublayerGraph& g);                       // x <- x + F(N(x))
// x <- w x + s F(N(x)): pre-norm with a skip weight w and a branch scale s (LayerScale, depth-muP,
// DeepScaleLM); the update is s F(N(x)).
void scaled_pre_norm(SublayerGraph& g, double skip_weight, double branch_scale);
// HybridNorm (Zhuo et al. 2025, arXiv 2503.04598): attention x <- x + Attn(x) with per-head
// q/k/v norm and no input norm; FFN h = N(x), x <- h + FFN(h).
void hybrid_norm(SublayerGraph& g, SublayerKind kind);
// x <- x + update as the next state, marking update and sum for branch_rms and stream_share.
void residual_add(SublayerGraph& g, Value x, Value update);
// DeepNet's shape, shared by deepnorm and deepnorm-glm (only their constants differ):
// x <- N(alpha x + F(x)), no final norm, DeepNet init gains, --alpha overrides alpha.
void deepnet_post_norm(Architecture& arch);
// --alpha: overrides the skip weight of the placements that declare it (their constant "alpha").
PlacementOption skip_weight_option();
void final_norm(SublayerGraph& g);       // y = N(x)
void identity_output(SublayerGraph& g);  // y = x
// The idealised skip factor of a post-norm sublayer with skip weight a: a / sqrt(a^2 + 1)
// (Keel, arXiv 2601.19895, Eq. 15 with a = 1 and Eq. 19).
double post_norm_skip_theory(double skip_weight);
// An identity skip path: skip_gain is exactly 1.
std::optional<double> identity_skip_theory(const SublayerContext& ctx);
// DeepNet's init (arXiv 2203.00555, Fig. 2): gain beta (the constant "beta") on W_V, W_O, W_1,
// W_2 and gain 1 on W_Q, W_K; shared by deepnorm and deepnorm-glm.
double deepnet_init_gain(const SublayerContext& ctx, WeightMatrix matrix);
}  // namespace recipes

}  // namespace gradflow
