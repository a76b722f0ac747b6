// validate(): each rule refuses its bad value with a message naming the value; placement options
// are checked by the rule their placement declares.
#include "gradflow/config.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "gradflow/app/placements.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/errors.hpp"

using namespace gradflow;

namespace {
// The message validate() throws for the configuration `change` makes, "" when it accepts it.
std::string refusal(const std::function<void(ModelConfig&)>& change) {
  ModelConfig config;
  change(config);
  try {
    validate(config);
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("validate accepts the defaults and refuses each bad size, naming the value") {
  CHECK(refusal([](ModelConfig&) {}).empty());
  CHECK(contains(refusal([](ModelConfig& c) { c.blocks = 0; }), "--depth 0"));
  CHECK(contains(refusal([](ModelConfig& c) { c.blocks = kMaxBlocks + 1; }), "--depth"));
  CHECK(contains(refusal([](ModelConfig& c) { c.width = -3; }), "--width -3"));
  CHECK(contains(refusal([](ModelConfig& c) { c.heads = 0; }), "--heads 0"));
  CHECK(contains(refusal([](ModelConfig& c) { c.heads = 512; }), "--heads 512 exceeds --width 256"));
  CHECK(contains(refusal([](ModelConfig& c) { c.seq = 0; }), "--seq 0"));
  CHECK(contains(refusal([](ModelConfig& c) { c.probes = kMaxProbes + 1; }), "--probes 4097"));
  CHECK(contains(refusal([](ModelConfig& c) { c.input_corr = 1.5; }), "--input-corr 1.5"));
  CHECK(contains(refusal([](ModelConfig& c) { c.input_corr = std::nan(""); }), "--input-corr nan"));
  CHECK(contains(refusal([](ModelConfig& c) { c.spectrum = kSpectrumMaxColumns + 1; }), "--spectrum 65"));
}

TEST_CASE("validate suggests a head count that divides the width") {
  const std::string message = refusal([](ModelConfig& c) { c.width = 250, c.heads = 4; });
  CHECK(contains(message, "--width 250 is not divisible by --heads 4"));
  CHECK(contains(message, "try --heads 5"));
}

TEST_CASE(
    "validate refuses the optional analyses beyond their limits and an odd width for the ideal branch") {
  CHECK(contains(refusal([](ModelConfig& c) { c.angles_all = true, c.blocks = kAnglesMaxSublayers; }),
                 "--angles all"));
  CHECK(contains(refusal([](ModelConfig& c) { c.exact_jacobian = true; }), "--exact-jacobian"));
  CHECK(contains(refusal([](ModelConfig& c) { c.branch = BranchKind::rotation, c.width = 7, c.heads = 1; }),
                 "--ideal-branch"));
}

TEST_CASE("validate checks placement options by their declared rules") {
  CHECK(refusal([](ModelConfig& c) { c.options["alpha"] = 2.0; }).empty());
  CHECK(contains(refusal([](ModelConfig& c) { c.options["alpha"] = -1.0; }), "--alpha -1 must be positive"));
  CHECK(contains(refusal([](ModelConfig& c) { c.options["alpha"] = std::nan(""); }), "--alpha nan"));
  CHECK(refusal([](ModelConfig& c) { c.options["keel_variant"] = std::string("v1"); }).empty());
  CHECK(refusal([](ModelConfig& c) { c.options["keel_variant"] = std::string("v3"); }) ==
        "--keel-variant \"v3\" is not v1 or v2; try --keel-variant v2");
  CHECK(contains(refusal([](ModelConfig& c) { c.options["mix_ratio"] = 1.5; }), "--mix-ratio 1.5"));
  CHECK(
      contains(refusal([](ModelConfig& c) { c.options["rezero_alpha"] = INFINITY; }), "--rezero-alpha inf"));
  ModelConfig unknown;
  unknown.options["no_such_option"] = 1.0;
  CHECK_THROWS_AS(validate(unknown), std::logic_error);
}

TEST_CASE("placement options: one flag per key, declared by the placements that use them") {
  std::vector<std::string_view> keys;
  for (const PlacementOption* option : placement_options()) keys.push_back(option->key);
  // The built-ins' options, then the shipped files' (data/placements, in file-name order).
  CHECK(keys == std::vector<std::string_view>{"alpha", "keel_variant", "mix_ratio", "rezero_alpha",
                                              "attnres_blocks", "attnres_query", "completep_alpha",
                                              "completep_base_depth", "dwa_init", "frac_init", "num_fracs"});
  CHECK(placements_declaring("alpha") == std::vector<std::string_view>{"deepnorm", "keel", "deepnorm-glm"});
  CHECK(placements_declaring("mix_ratio") == std::vector<std::string_view>{"mix-ln"});
  // A given option reaches the placement's constants; an absent one leaves its own default.
  ModelConfig config;
  const Architecture& mix_ln = find_architecture("mix-ln");
  CHECK(constant_value(mix_ln.constants(config), "mix_ratio") == 0.25);
  config.options["mix_ratio"] = 0.5;
  CHECK(constant_value(mix_ln.constants(config), "mix_ratio") == 0.5);
  CHECK(config.number_option("mix_ratio") == 0.5);
  CHECK_FALSE(config.word_option("mix_ratio"));
}

TEST_CASE("the memory estimate counts --update's stored cotangents and weight copies") {
  ModelConfig config;  // 64 blocks of width 256, T = 64, f32
  config.precision = Precision::f32;
  const double without = estimated_memory_bytes(config, 1);
  config.update = UpdateRule::adam;
  config.learning_rates = {1e-3};
  const double with = estimated_memory_bytes(config, 1);
  const double states = (2.0 * config.blocks + 1) * config.seq * config.width * 4;  // one cotangent each
  // Attention's four matrices and the FFN's two, in f32: gradient, step and stepped weights of each.
  const double weights = (4.0 * 256 * 256 + 2 * 256 * 1024) * 4;
  CHECK(with - without == doctest::Approx(states + 3 * weights));
  config.learning_rates = {1e-3, 1e-4, 1e-5};  // each stepped pass reuses the same buffers
  CHECK(estimated_memory_bytes(config, 1) == with);
  // Four streams: four cotangents per state.
  ModelConfig plain = config;
  plain.update = UpdateRule::none;
  CHECK(estimated_memory_bytes(config, 4) - estimated_memory_bytes(plain, 4) ==
        doctest::Approx(4 * states + 3 * weights));
}

// Issue 30, build item 1: a history's memory is in the estimate. Per stream read and per state:
// its key (T x d and T inverse rms), its running sum and its backward cotangent (K probes); with
// --update, each learning rate's stepped history (values, keys, running sums). Full AttnRes at depth
// 1024 (one history stream) measured 677 MB peak against 708 MB estimated, and with --update adam at
// two learning rates 1.61 GB against 1.79 GB.
TEST_CASE("the memory estimate counts a history's keys, running sums and cotangents, and --update's") {
  ModelConfig config;  // 64 blocks of width 256, T = 64, f32
  config.precision = Precision::f32;
  config.probes = 3;
  const double states = 2.0 * config.blocks + 1, t = config.seq, d = config.width;
  const double per_state = t * (d + 1) + t * d + 3 * t * d;
  CHECK(estimated_memory_bytes(config, 2, 1) - estimated_memory_bytes(config, 2, 0) ==
        doctest::Approx(states * per_state * 4));
  CHECK(estimated_memory_bytes(config, 2, 2) - estimated_memory_bytes(config, 2, 0) ==
        doctest::Approx(2 * states * per_state * 4));
  config.update = UpdateRule::adam;
  config.learning_rates = {1e-3, 1e-4};
  CHECK(estimated_memory_bytes(config, 2, 1) - estimated_memory_bytes(config, 2, 0) ==
        doctest::Approx(states * (per_state + 2 * t * (3 * d + 1)) * 4));
}
