// Every registered placement: the whole stack's input gradient against central differences
// (float64), across block kinds, norms and inits.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/placement_file.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;

namespace {
double whole_stack_error(const ModelConfig& config, const Architecture& arch) {
  const Constants constants = resolve_constants(arch, config);
  const InputGradient exact = loss_and_input_gradient(config, arch, constants, 3);
  // The seed's own x_0, as the run uses it (the first exported tensor).
  const auto tensors = run_tensors(config, arch, constants, 3);
  Eigen::MatrixXd input(config.seq, config.width);
  for (Eigen::Index i = 0; i < input.rows(); ++i) {
    for (Eigen::Index j = 0; j < input.cols(); ++j)
      input(i, j) = tensors.front().values[i * input.cols() + j];
  }
  const double h = 1e-5;
  Eigen::MatrixXd numeric(config.seq, config.width);
  Eigen::MatrixXd shifted = input;
  for (Eigen::Index i = 0; i < input.rows(); ++i) {
    for (Eigen::Index j = 0; j < input.cols(); ++j) {
      shifted(i, j) = input(i, j) + h;
      const double up = loss_and_input_gradient(config, arch, constants, 3, &shifted).loss;
      shifted(i, j) = input(i, j) - h;
      const double down = loss_and_input_gradient(config, arch, constants, 3, &shifted).loss;
      shifted(i, j) = input(i, j);
      numeric(i, j) = (up - down) / (2 * h);
    }
  }
  return (numeric - exact.gradient).norm() / exact.gradient.norm();
}

ModelConfig small_config() {
  ModelConfig config;
  config.blocks = 3;
  config.width = 8;
  config.heads = 2;
  config.seq = 4;
  config.precision = Precision::f64;
  return config;
}
}  // namespace

TEST_CASE("every placement's whole-stack gradient matches central differences (float64)") {
  double worst = 0;
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    double worst_of_arch = 0;
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn, BlockKind::attn}) {
      for (const NormKind norm : {NormKind::rms, NormKind::layer, NormKind::dyt}) {
        ModelConfig config = small_config();
        config.block = block;
        config.norm = norm;
        CAPTURE(arch.id);
        CAPTURE(to_string(block));
        CAPTURE(to_string(norm));
        const double error = whole_stack_error(config, arch);
        worst_of_arch = std::max(worst_of_arch, error);
        CHECK(error <= testing::kFiniteDifferenceTolerance);
      }
    }
    MESSAGE(arch.id, ": worst whole-stack relative error over block kinds and norms: ", worst_of_arch);
    worst = std::max(worst, worst_of_arch);
  }
  MESSAGE("worst whole-stack relative error over placements, block kinds and norms: ", worst);
}

TEST_CASE("whole-stack gradients hold for every base init and the idealised branch") {
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    for (const InitKind init : {InitKind::gpt2, InitKind::small}) {
      ModelConfig config = small_config();
      config.init = init;
      CAPTURE(arch.id);
      CAPTURE(to_string(init));
      CHECK(whole_stack_error(config, arch) <= testing::kFiniteDifferenceTolerance);
    }
    ModelConfig config = small_config();
    config.branch = BranchKind::rotation;
    CAPTURE(arch.id);
    CHECK(whole_stack_error(config, arch) <= testing::kFiniteDifferenceTolerance);
  }
}

namespace {
// Central differences of the loss along `directions` random unit directions v against <dL/dx_0, v>:
// the relative error of the largest miss. Two forward runs per direction, where whole_stack_error
// takes two per input entry: fast enough for issue 19's 18 block variants of every placement.
double directional_error(const ModelConfig& config, const Architecture& arch, int directions) {
  const Constants constants = resolve_constants(arch, config);
  const InputGradient exact = loss_and_input_gradient(config, arch, constants, 3);
  const auto tensors = run_tensors(config, arch, constants, 3);
  Eigen::MatrixXd input(config.seq, config.width);
  for (Eigen::Index i = 0; i < input.size(); ++i)
    input(i / config.width, i % config.width) = tensors.front().values[i];
  const double h = 1e-5;
  double worst = 0;
  for (int k = 0; k < directions; ++k) {
    Eigen::MatrixXd v = testing::random_matrix(config.seq, config.width, 100 + k);
    v /= v.norm();
    Eigen::MatrixXd shifted = input + h * v;
    const double up = loss_and_input_gradient(config, arch, constants, 3, &shifted).loss;
    shifted = input - h * v;
    const double down = loss_and_input_gradient(config, arch, constants, 3, &shifted).loss;
    const double analytic = (exact.gradient.array() * v.array()).sum();
    worst = std::max(worst, std::abs((up - down) / (2 * h) - analytic) / exact.gradient.norm());
  }
  return worst;
}
}  // namespace

TEST_CASE(
    "whole-stack gradients hold for every placement with gated FFNs, rotary embeddings and shared KV heads") {
  double worst = 0;
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    for (const FfnKind ffn : {FfnKind::gelu, FfnKind::swiglu, FfnKind::geglu}) {
      for (const double rope_theta : {0.0, 10000.0}) {
        for (const int kv_heads : {4, 2, 1}) {
          ModelConfig config = small_config();
          config.width = 16;
          config.heads = 4;
          config.blocks = 2;
          config.ffn = to_string(ffn);
          config.ffn_hidden_width = 24;
          config.rope_theta = rope_theta;
          config.kv_heads = kv_heads;
          CAPTURE(arch.id);
          CAPTURE(to_string(ffn));
          CAPTURE(rope_theta);
          CAPTURE(kv_heads);
          const double error = directional_error(config, arch, 3);
          worst = std::max(worst, error);
          CHECK(error <= testing::kFiniteDifferenceTolerance);
        }
      }
    }
  }
  MESSAGE("worst directional whole-stack relative error over placements x ffn x rope x kv-heads: ", worst);
}

// Issue 33: the mixture-of-experts FFN through every placement. The routing is piecewise smooth;
// a seed's draws keep every token's K-th and (K+1)-th router probabilities far apart compared with
// the step h, so central differences see one selection. Variants: renormalized gates; softmax gates
// with a sigmoid-gated shared expert and biases; and one active expert of eight, so that experts
// no token chooses take part with zero gradients.
TEST_CASE("whole-stack gradients hold for every placement with the mixture-of-experts FFN (float64)") {
  struct Variant {
    std::map<std::string, OptionValue, std::less<>> options;
    bool bias;
  };
  const std::vector<Variant> variants = {
      {{{"experts", 4.0}, {"experts_active", 2.0}}, false},
      {{{"experts", 3.0},
        {"experts_active", 2.0},
        {"shared_expert_hidden", 6.0},
        {"router_gates", std::string("softmax")}},
       true},
      {{{"experts", 8.0}, {"experts_active", 1.0}}, false},
  };
  double worst = 0;
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
      for (const NormKind norm : {NormKind::rms, NormKind::layer}) {
        for (std::size_t v = 0; v < variants.size(); ++v) {
          ModelConfig config = small_config();
          config.blocks = 2;
          config.block = block;
          config.norm = norm;
          config.ffn = "moe";
          config.ffn_hidden_width = 10;
          config.op_options = variants[v].options;
          config.bias = variants[v].bias;
          CAPTURE(arch.id);
          CAPTURE(to_string(block));
          CAPTURE(to_string(norm));
          CAPTURE(v);
          const double error = whole_stack_error(config, arch);
          worst = std::max(worst, error);
          CHECK(error <= testing::kFiniteDifferenceTolerance);
        }
      }
    }
  }
  MESSAGE("worst whole-stack relative error with --ffn moe over placements x blocks x norms x variants: ",
          worst);
}

// Issue 30, acceptance 1 for frac-connections with more than one fraction: the library's layout
// (gathers of fractions into the branch input and the residual, the branch output's fractions summed
// into each) and the identity, at m = 2 and 4 (width 8: fractions of 4 and 2 columns).
TEST_CASE("frac-connections with m > 1 fractions: the whole-stack gradient matches central differences") {
  const Architecture& arch = find_architecture("frac-connections");
  for (const double fractions : {2.0, 4.0}) {
    for (const char* init : {"library", "identity"}) {
      for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
        for (const NormKind norm : {NormKind::rms, NormKind::layer}) {
          ModelConfig config = small_config();
          config.block = block;
          config.norm = norm;
          config.options["num_fracs"] = fractions;
          config.options["frac_init"] = std::string(init);
          CAPTURE(fractions);
          CAPTURE(init);
          CAPTURE(to_string(block));
          CAPTURE(to_string(norm));
          const double error = whole_stack_error(config, arch);
          MESSAGE("frac-connections m = ", fractions, " ", std::string(init), ": whole-stack relative error ",
                  error);
          CHECK(error <= testing::kFiniteDifferenceTolerance);
        }
      }
    }
  }
}

// --frac-init identity maps every fraction to itself, so its mix_fractions build no node: pre-ln
// bit for bit at any m; the library's layout at m = 2 is another stack (its branch reads [h_1, h_1]).
TEST_CASE("frac-connections --frac-init identity is pre-ln bit for bit at every fraction count") {
  const Architecture& frac = find_architecture("frac-connections");
  const Architecture& pre_ln = find_architecture("pre-ln");
  ModelConfig config = small_config();
  config.blocks = 4;
  const SeedResult base = analyze_seed(config, pre_ln, resolve_constants(pre_ln, config), 2);
  for (const double fractions : {1.0, 2.0, 4.0, 8.0}) {
    CAPTURE(fractions);
    config.options["num_fracs"] = fractions;
    config.options["frac_init"] = std::string("identity");
    const SeedResult identity = analyze_seed(config, frac, resolve_constants(frac, config), 2);
    CHECK(identity.states.at(Figure::rms) == base.states.at(Figure::rms));
    CHECK(identity.states.at(Figure::log10_grad) == base.states.at(Figure::log10_grad));
    config.options["frac_init"] = std::string("library");
    const SeedResult library = analyze_seed(config, frac, resolve_constants(frac, config), 2);
    CHECK((library.states.at(Figure::rms) == base.states.at(Figure::rms)) == (fractions == 1.0));
  }
}

namespace {
// The placements that read a history, each with the options it is checked at: the shipped Full and
// Block AttnRes (stream v / p holding the sources, h the read; Block AttnRes's history kept at the
// block boundaries by [history], with N = 2 AttnRes blocks: at B = 3 a block of two and one of one)
// at the paper's zero pseudo-queries and at 0.3; DenseFormer's DWA over its block outputs
// (history_sum) with uniform weights; and tests/placements/history/fixed-weights.toml (history_sum
// and history_mean of a stream that keeps every other state).
struct HistoryVariant {
  const char* placement;  // an id, or a file of tests/placements/history/
  const char* label;
  std::map<std::string, OptionValue, std::less<>> options;
};

const std::vector<HistoryVariant>& history_variants() {
  static const std::vector<HistoryVariant> variants = {
      {"attnres-history", "--attnres-query 0", {{"attnres_query", 0.0}}},
      {"attnres-history", "--attnres-query 0.3", {{"attnres_query", 0.3}}},
      {"attnres-block-history", "--attnres-query 0", {{"attnres_query", 0.0}, {"attnres_blocks", 2.0}}},
      {"attnres-block-history", "--attnres-query 0.3", {{"attnres_query", 0.3}, {"attnres_blocks", 2.0}}},
      {"denseformer-history", "--dwa-init uniform", {{"dwa_init", std::string("uniform")}}},
      {"fixed-weights.toml", "", {}},
  };
  return variants;
}

// The variant's placement: from the registry, or read from tests/placements/history/.
Architecture history_placement(const HistoryVariant& variant) {
  const std::string_view name = variant.placement;
  if (!name.ends_with(".toml")) return find_architecture(name);
  std::ifstream file(fmt::format("{}/placements/history/{}", GRADFLOW_TEST_DIR, name));
  std::stringstream text;
  text << file.rdbuf();
  return load_placement_text(std::string(name), text.str());
}

// Every history variant x the block kinds (x the norms when `norms`): the placement and config each
// check below runs on.
template <typename Check>
void for_each_history_case(bool norms, Check check) {
  for (const HistoryVariant& variant : history_variants()) {
    const Architecture arch = history_placement(variant);
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
      for (const NormKind norm : {NormKind::rms, NormKind::layer}) {
        if (!norms && norm != NormKind::rms) continue;
        ModelConfig config = small_config();
        config.options = variant.options;
        config.block = block;
        config.norm = norm;
        const std::string what = fmt::format("{} {}", variant.placement, variant.label);
        CAPTURE(what);
        CAPTURE(to_string(block));
        CAPTURE(to_string(norm));
        check(arch, config, what);
      }
    }
  }
}
}  // namespace

// Issue 30, acceptance 1 (the input gradient): a placement that reads a history is not Markov, so
// its backward adds every read's share to each earlier state (StackRun::begin_history_backward).
// Central differences see the whole dependence, at the paper's zero init and at a nonzero query.
TEST_CASE("a placement reading a history: the whole-stack gradient matches central differences (float64)") {
  for_each_history_case(true,
                        [](const Architecture& arch, const ModelConfig& config, const std::string& what) {
                          const double error = whole_stack_error(config, arch);
                          MESSAGE(what, ": whole-stack relative error ", error);
                          CHECK(error <= testing::kFiniteDifferenceTolerance);
                        });
}

// Issue 30, acceptance 3: with zero pseudo-queries every read is the uniform mean of its sources,
// which is what the shipped attnres.toml and attnres-block.toml carry in one stream (the running
// mean; Block AttnRes's of the completed blocks and the partial sum): the history stack's read h has
// the same rms at every state, to rounding. Block AttnRes with N = 2 at B = 6: two blocks of three.
TEST_CASE(
    "attend with zero pseudo-queries reads the uniform mean: the history stack's h is attnres's stream") {
  for (const auto& [name, shipped] :
       {std::pair{"attnres-history", "attnres"}, std::pair{"attnres-block-history", "attnres-block"}}) {
    const Architecture& history = find_architecture(name);
    const Architecture& mean = find_architecture(shipped);
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
      ModelConfig config = small_config();
      config.blocks = 6;
      config.block = block;
      const std::string placement = name;
      CAPTURE(placement);
      CAPTURE(to_string(block));
      ModelConfig history_config = config;
      history_config.options["attnres_query"] = 0.0;
      if (std::string_view(shipped) == "attnres-block") history_config.options["attnres_blocks"] = 2.0;
      const SeedResult with_history =
          analyze_seed(history_config, history, resolve_constants(history, history_config), 3);
      if (std::string_view(shipped) == "attnres-block") config.options["attnres_blocks"] = 2.0;  // the same N
      const SeedResult running_mean = analyze_seed(config, mean, resolve_constants(mean, config), 3);
      const auto& read = with_history.streams.at(1).states.at(Figure::rms);
      const auto& expected = running_mean.states.at(Figure::rms);
      REQUIRE(read.size() == expected.size());
      for (std::size_t l = 0; l < read.size(); ++l) {
        CAPTURE(l);
        CHECK(std::abs(read[l] - expected[l]) <= 1e-12 * expected[l]);
      }
    }
  }
}

// Issue 30, acceptance 3: DenseFormer at its identity init (alpha_{i,i} = 1, every earlier weight 0)
// is its base placement bit for bit; written with its history of block outputs (history_sum times 0
// adds exact zeros), its stream y has denseformer.toml's one stream's rms bit for bit, state by state, in
// the forward pass, and in the gradient to rounding (X's history is read with weight 0).
TEST_CASE("denseformer-history at its identity init: y is denseformer's stream (rms bit for bit)") {
  const Architecture& history = find_architecture("denseformer-history");
  const Architecture& base = find_architecture("denseformer");
  for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
    ModelConfig config = small_config();
    config.blocks = 6;
    config.block = block;
    CAPTURE(to_string(block));
    const SeedResult with_history = analyze_seed(config, history, resolve_constants(history, config), 5);
    const SeedResult one_stream = analyze_seed(config, base, resolve_constants(base, config), 5);
    CHECK(with_history.streams.at(1).states.at(Figure::rms) == one_stream.states.at(Figure::rms));
    // The gradient to rounding: a history stack's cotangents keep the output's scale where the
    // Markov stack renormalises them at every state.
    const auto& read = with_history.streams.at(1).states.at(Figure::log10_grad);
    const auto& expected = one_stream.states.at(Figure::log10_grad);
    REQUIRE(read.size() == expected.size());
    for (std::size_t l = 0; l < read.size(); ++l) {
      CAPTURE(l);
      CHECK(std::abs(read[l] - expected[l]) <= 1e-13);
    }
  }
}

// A read whose pseudo-query is exactly zero keeps the uniform mean as a running sum (DepthHistory::
// prefix) and spreads its backward shares once (StackRun::add_history_cotangent): the same figures as
// reading every source, to rounding, in the forward pass and in every gradient.
TEST_CASE("attend's uniform-read shortcut gives the figures of the full read") {
  AnalysisHooks full;
  full.attend_in_full = true;
  for (const HistoryVariant& variant : history_variants()) {
    const Architecture arch = history_placement(variant);
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
      const std::string what = fmt::format("{} {}", variant.placement, variant.label);
      CAPTURE(what);
      ModelConfig config = small_config();
      config.options = variant.options;
      config.blocks = 8;
      config.block = block;
      config.probes = 3;
      CAPTURE(to_string(block));
      const Constants constants = resolve_constants(arch, config);
      const SeedResult shortcut = analyze_seed(config, arch, constants, 3);
      const SeedResult every_source = analyze_seed(config, arch, constants, 3, {}, {}, full);
      for (const Figure figure : {Figure::rms, Figure::log10_grad}) {
        const auto& a = shortcut.states.at(figure);
        const auto& b = every_source.states.at(figure);
        for (std::size_t l = 0; l < a.size(); ++l) {
          CAPTURE(l);
          CHECK(std::abs(a[l] - b[l]) <= 1e-12 * std::max(1.0, std::abs(b[l])));
        }
      }
      const auto& a = shortcut.sublayers.at(Figure::gain);
      const auto& b = every_source.sublayers.at(Figure::gain);
      for (std::size_t l = 0; l < a.size(); ++l) CHECK(std::abs(a[l] - b[l]) <= 1e-12 * b[l]);
      const InputGradient fast = loss_and_input_gradient(config, arch, constants, 3);
      const InputGradient slow = loss_and_input_gradient(config, arch, constants, 3, nullptr, full);
      CHECK((fast.gradient - slow.gradient).norm() <= 1e-12 * slow.gradient.norm());
    }
  }
}

// Issue 30, acceptance 1 (the pseudo-query's gradient): under --update-params all every read's
// pseudo-query w is a parameter (update.cpp), and the first-order change of the loss,
// delta_loss_first_order = sum <g, Delta theta> over the matrices, the gains and every w, must be the
// measured change to first order. With SGD, Delta theta = -eta g: the central difference
// (Delta L(eta) - Delta L(-eta)) / 2 removes the eta^2 term, so it matches to O(eta^3). A wrong dL/dw
// moves the prediction and the measurement apart by its share (w's share of the step is large: a
// gradient scaled by 1.5 moves the one-sided difference by 18%).
TEST_CASE(
    "a placement reading a history: one step's first-order Delta L, pseudo-queries included, matches "
    "central differences (float64)") {
  const double eta = 1e-6;
  for_each_history_case(true, [&](const Architecture& arch, ModelConfig config, const std::string& what) {
    config.update = UpdateRule::sgd;
    config.learning_rates = {eta, -eta};
    // all: the queries are stepped (w + Delta w, read in full); matrices: at query 0 the stepped
    // reads stay uniform, running sums over the stepped history (update.cpp's SteppedHistory).
    for (const bool all : {true, false}) {
      config.update_norm_gains = all;
      CAPTURE(all);
      const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 3);
      REQUIRE(run.updates.size() == 2);
      const UpdateStep& up = run.updates[0];
      const UpdateStep& down = run.updates[1];
      CHECK(up.delta_loss_first_order < 0);
      CHECK(down.delta_loss_first_order == doctest::Approx(-up.delta_loss_first_order).epsilon(1e-12));
      const double central = (up.delta_loss - down.delta_loss) / 2;
      const double error =
          std::abs(central - up.delta_loss_first_order) / std::abs(up.delta_loss_first_order);
      MESSAGE(what, std::string(all ? ": --update-params all" : ": --update-params matrices"),
              ", central-difference error ", error);
      CHECK(error <= testing::kFiniteDifferenceTolerance);
    }
  });
}

// The memory estimate's history term counts the streams some attend reads (Architecture::
// history_streams): v in Full AttnRes (not h), p in Block AttnRes, both in two-histories.toml, none
// in a plain file.
TEST_CASE("a placement file's history streams are the streams its attends read") {
  CHECK(find_architecture("attnres-history").history_streams == 1);
  CHECK(find_architecture("attnres-block-history").history_streams == 1);
  const std::string two = std::string(GRADFLOW_TEST_DIR) + "/placements/history/two-histories.toml";
  std::ifstream file(two);
  std::stringstream text;
  text << file.rdbuf();
  CHECK(load_placement_text("two-histories.toml", text.str()).history_streams == 2);
  CHECK(find_architecture("attnres").history_streams == 0);
  CHECK(find_architecture("keel").history_streams == 0);
}

// --exact-jacobian over a history (compute_exact_jacobian's history backward): the 64-probe
// Frobenius estimate of the probe backward, an independent path, is within 3 standard errors of the
// exact norm at every state. (The exact norms themselves are checked against the reference's
// autograd Jacobians in tests/placements/test_attend_reference.py.)
TEST_CASE(
    "a placement reading a history: the 64-probe Frobenius estimate is within 3 standard errors of the exact "
    "norm") {
  for_each_history_case(false, [](const Architecture& arch, ModelConfig config, const std::string&) {
    config.probes = 64;
    config.exact_jacobian = true;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    const auto& estimate = run.states.at(Figure::log10_grad);
    const auto& se = run.states.at(Figure::log10_grad_se);
    const auto& exact = run.states.at(Figure::log10_jacobian_fro_exact);
    for (std::size_t l = 0; l < exact.size(); ++l) {
      CAPTURE(l);
      CHECK(se[l] > 0);
      CHECK(std::abs(estimate[l] - exact[l]) <= 3 * se[l]);
    }
  });
}

// --spectrum over a history (spectrum.cpp's history sweeps: a JVP carrying every earlier state's
// tangent to the later reads, StackRun::begin_history_forward, and a history backward): the top-4
// singular values of J_{l->out} match --exact-jacobian's (themselves checked against the
// reference's autograd Jacobians) to 1e-3 relative at every state, at zero and nonzero queries.
TEST_CASE("a placement reading a history: --spectrum 4 matches the exact top-4 singular values (float64)") {
  for_each_history_case(false, [](const Architecture& arch, ModelConfig config, const std::string&) {
    config.exact_jacobian = true;
    config.spectrum = 4;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 1);
    for (int i = 1; i <= 4; ++i) {
      const auto& estimate = run.states.at({Figure::log10_singular_value, i});
      const auto& exact = run.states.at({Figure::log10_singular_value_exact, i});
      for (std::size_t l = 0; l < exact.size(); ++l) {
        CAPTURE(i);
        CAPTURE(l);
        CHECK(std::abs(std::pow(10.0, estimate[l] - exact[l]) - 1.0) <= 1e-3);
      }
    }
  });
}
