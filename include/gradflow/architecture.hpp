// The registry of residual / normalisation placements: one placement file per architecture
// (data/placements/builtins/*.toml, compiled in; src/archs/*.cpp for the two the file format cannot
// express), one table (src/archs/registry.cpp).
#pragma once
#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/config.hpp"
#include "gradflow/graph.hpp"
#include "gradflow/option.hpp"

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
  // How many streams some rule may read the history of (attend, attention over depth): an upper
  // bound for the memory estimate; whether this run's sublayers do is decided from their graphs
  // (StackRun), since a `when` may leave the rule unused.
  int history_streams = 0;
  // Functions rather than plain pointers so that a placement file's definition
  // (placement_file.hpp) can be bound into them; built-in recipes assign capture-free lambdas.
  std::function<Constants(const ModelConfig&)> constants;
  std::function<void(SublayerGraph&, const SublayerContext&)> build_sublayer;
  // The output y from the final state's streams (final norm or combination); one output.
  std::function<void(SublayerGraph&, const SublayerContext&)> build_output;
  // Closed-form skip factor under the idealised branch (architectures.md), when one exists.
  std::function<std::optional<double>(const SublayerContext&)> skip_gain_theory;
  // Multiplier on the base init's standard deviation (DeepNorm's beta), 1 when empty.
  std::function<double(const SublayerContext&, WeightMatrix)> init_gain;
  // Multiplier on --update's learning rate, per update rule, for every parameter of a sublayer
  // (CompleteP's and depth-muP's depth-scaled learning rates), 1 when empty; the head keeps --lr.
  std::function<double(const SublayerContext&, UpdateRule)> learning_rate_scale;
  // Where the definition comes from: "built-in", or a placement file's path; for a file also its
  // text and hash ("fnv1a64:" and 16 hex digits), recorded in each run's config.
  std::string_view source = "built-in";
  std::string_view file_text;
  std::string_view file_hash;
  std::string_view defined_at;  // a file's "path:line:column" of its id, for errors naming it
  // nGPT: after the base draw, every matrix is normalised along the width-d (embedding) dimension
  // (normalize_along_width, initialization.hpp).
  bool unit_norm_weights = false;
  // A placement file's parsed definition, which the views and functions above point into: shared
  // by every copy, so that it lives as long as the last of them (empty for a C++ recipe).
  std::shared_ptr<const void> definition;
};

// Whether the placement declares the option `key`. The registry of placements, and the options
// across it, are a PlacementRegistry (placement_registry.hpp).
bool declares_option(const Architecture& arch, std::string_view key);

// Recipe pieces of the C++ recipes (admin, span-norm).
namespace recipes {
void post_norm(SublayerGraph& g, double skip_weight);  // x <- N(w x + F(x))
void identity_output(SublayerGraph& g);                // y = x
// The idealised skip factor of a post-norm sublayer with skip weight a: a / sqrt(a^2 + 1)
// (Keel, arXiv 2601.19895, Eq. 15 with a = 1 and Eq. 19).
double post_norm_skip_theory(double skip_weight);
}  // namespace recipes

}  // namespace gradflow
