// Property tests that pin each placement's formula: identities at init, invariants of the
// states, the profiled Admin weights against an independent re-run of the recurrence, and the
// stated constants.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>

#include "gradflow/analysis.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/ops.hpp"

using namespace gradflow;

namespace {
ModelConfig small_f64(int blocks = 4) {
  ModelConfig config;
  config.blocks = blocks;
  config.width = 32;
  config.heads = 2;
  config.seq = 8;
  config.precision = Precision::f64;
  return config;
}

SeedResult run(std::string_view id, const ModelConfig& config, std::uint64_t seed = 1) {
  const Architecture& arch = find_architecture(id);
  return analyze_seed(config, arch, resolve_constants(arch, config), seed);
}

double constant(std::string_view id, const ModelConfig& config, std::string_view name) {
  return constant_value(resolve_constants(find_architecture(id), config), name);
}

const NamedTensor& tensor(const std::vector<NamedTensor>& tensors, std::string_view name) {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return t;
  }
  FAIL("missing tensor " << name);
  return tensors.front();
}

Mat<double> to_matrix(const NamedTensor& t, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const Mat<double>>(t.values.data(), rows, cols);
}
}  // namespace

TEST_CASE("rezero: with a = 0 the stack is the identity at init (x_S == x_0, every gain 1)") {
  const ModelConfig config = small_f64();
  const Architecture& arch = find_architecture("rezero");
  const Constants constants = resolve_constants(arch, config);
  CHECK(constant_value(constants, "alpha") == 0.0);
  // y = x_S, so L = sum(U * x_S) and dL/dx_0 = U exactly when x_S == x_0.
  const auto tensors = run_tensors(config, arch, constants, 1);
  const Mat<double> input = to_matrix(tensor(tensors, "input"), config.seq, config.width);
  const Mat<double> probe = to_matrix(tensor(tensors, "probe"), config.seq, config.width);
  const InputGradient exact = loss_and_input_gradient(config, arch, constants, 1);
  CHECK(exact.loss == doctest::Approx((input.array() * probe.array()).sum()).epsilon(1e-14));
  CHECK((exact.gradient - Eigen::MatrixXd(probe)).norm() <= 1e-12 * probe.norm());

  const SeedResult result = run("rezero", config);
  const auto& rms = result.states.at("rms");
  for (int l = 0; l < config.sublayers(); ++l) {
    CAPTURE(l);
    CHECK(rms[l + 1] == rms[0]);
    CHECK(result.sublayers.at("gain")[l] == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(result.sublayers.at("skip_gain")[l] == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(result.sublayers.at("branch_rms")[l] == 0.0);
    CHECK(result.sublayers.at("stream_share")[l] == 0.0);
  }
  CHECK(std::abs(result.growth.exponent) < 1e-12);  // every state has the same rms: slope 0 up to rounding

  ModelConfig moving = config;  // --rezero-alpha turns the branches on
  moving.rezero_alpha = 0.5;
  CHECK(constant("rezero", moving, "alpha") == 0.5);
  CHECK(run("rezero", moving).states.at("rms")[config.sublayers()] != rms[0]);
}

TEST_CASE("ngpt: every state after the first sublayer has unit-norm tokens") {
  const int width = 32;
  for (const int seq : {1, 8}) {  // with one token, rms = 1/sqrt(d) pins that token's norm
    ModelConfig config = small_f64();
    config.seq = seq;
    const SeedResult result = run("ngpt", config);
    const auto& rms = result.states.at("rms");
    for (int l = 1; l <= config.sublayers(); ++l) {
      CAPTURE(seq);
      CAPTURE(l);
      CHECK(rms[l] == doctest::Approx(1.0 / std::sqrt(width)).epsilon(1e-12));
    }
  }
  CHECK(constant("ngpt", small_f64(), "alpha") == 0.05);
}

TEST_CASE("admin: the profiled weights satisfy w_{l+1}^2 = w_l^2 + Var[F_l] (independent re-run)") {
  // Re-runs the stack with the plain ops and the exported weights: x <- N(w x + F(x)) with the
  // recurrence applied here, compared with the engine's states and its skip_gain_theory
  // w_l / sqrt(w_l^2 + 1), which exposes w_l.
  const ModelConfig config = small_f64(3);
  const Architecture& arch = find_architecture("admin");
  const Constants constants = resolve_constants(arch, config);
  const auto tensors = run_tensors(config, arch, constants, 1);
  const SeedResult result = analyze_seed(config, arch, constants, 1);
  const Eigen::Index d = config.width, hidden = config.ffn_hidden();
  Mat<double> x = to_matrix(tensor(tensors, "input"), config.seq, d);
  double w = 1.0;
  AttentionCache<double> attention;
  FfnCache<double> ffn;
  AttentionOptions options;
  options.heads = config.heads;
  options.score_scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim()));
  for (int l = 0; l < config.sublayers(); ++l) {
    const auto name = [l](const char* matrix) { return fmt::format("sublayer.{:04d}.{}", l, matrix); };
    SublayerWeights<double> weights;
    Mat<double> f;
    if (config.sublayer_kind(l) == SublayerKind::attn) {
      weights.w_q = to_matrix(tensor(tensors, name("W_Q")), d, d);
      weights.w_k = to_matrix(tensor(tensors, name("W_K")), d, d);
      weights.w_v = to_matrix(tensor(tensors, name("W_V")), d, d);
      weights.w_o = to_matrix(tensor(tensors, name("W_O")), d, d);
      attention_forward(x, weights, options, attention, f);
    } else {
      weights.w_1 = to_matrix(tensor(tensors, name("W_1")), d, hidden);
      weights.w_2 = to_matrix(tensor(tensors, name("W_2")), hidden, d);
      ffn_forward(x, weights, ffn, f);
    }
    CAPTURE(l);
    CHECK(result.sublayers.at("skip_gain_theory")[l] ==
          doctest::Approx(w / std::sqrt(w * w + 1)).epsilon(1e-12));
    const Mat<double> sum = w * x + f;
    Mat<double> inv_scale;
    norm_forward(NormKind::rms, 1, sum, x, inv_scale);
    CHECK(result.states.at("rms")[l + 1] ==
          doctest::Approx(std::sqrt(x.squaredNorm() / x.size())).epsilon(1e-12));
    const double mean = f.mean();
    w = std::sqrt(w * w + f.squaredNorm() / f.size() - mean * mean);  // Liu et al. 2020, Alg. 1
  }
  CHECK(w > 1.2);  // the recurrence did move the weights: the check above is not vacuous
}

TEST_CASE("mix-ln: the first floor(r B) blocks are post-ln, the rest pre-ln") {
  for (const int blocks : {8, 10}) {
    const ModelConfig config = small_f64(blocks);
    const int post_blocks = blocks / 4;  // floor(0.25 B)
    CHECK(constant("mix-ln", config, "post_ln_blocks") == post_blocks);
    const SeedResult mix = run("mix-ln", config), post = run("post-ln", config);
    const int boundary = 2 * post_blocks;  // first pre-ln sublayer
    const auto& rms = mix.states.at("rms");
    // The forward pass up to the boundary is post-ln's, bit for bit (same weights, same ops).
    for (int l = 0; l <= boundary; ++l) CHECK(rms[l] == post.states.at("rms")[l]);
    for (int l = 0; l < config.sublayers(); ++l) {
      CAPTURE(blocks);
      CAPTURE(l);
      const double branch_rms = mix.sublayers.at("branch_rms")[l],
                   share = mix.sublayers.at("stream_share")[l];
      if (l < boundary) {
        CHECK(branch_rms == post.sublayers.at("branch_rms")[l]);
        CHECK(share == post.sublayers.at("stream_share")[l]);
        CHECK(mix.sublayers.at("skip_gain")[l] < 0.99);  // the skip runs through N
        CHECK(mix.sublayers.at("skip_gain_theory")[l] == doctest::Approx(1 / std::sqrt(2.0)));
      } else {
        // Pre-ln: x_{l+1} is the un-normalised sum itself and the skip is the identity.
        CHECK(branch_rms / share == doctest::Approx(rms[l + 1]).epsilon(1e-12));
        CHECK(mix.sublayers.at("skip_gain")[l] == doctest::Approx(1.0).epsilon(1e-12));
        CHECK(mix.sublayers.at("skip_gain_theory")[l] == 1.0);
      }
    }
  }
  // The two ends: r = 0 is pre-ln exactly.
  ModelConfig all_pre = small_f64();
  all_pre.mix_ratio = 0.0;
  const SeedResult mix = run("mix-ln", all_pre), pre = run("pre-ln", all_pre);
  CHECK(mix.states.at("log10_grad") == pre.states.at("log10_grad"));
  CHECK(mix.sublayers.at("gain") == pre.sublayers.at("gain"));
}

TEST_CASE("deepnorm: alpha = (2B)^(1/4), beta = (8B)^(-1/4), and beta scales W_V, W_O, W_1, W_2") {
  for (const int blocks : {1, 6, 64, 1000}) {
    ModelConfig config;
    config.blocks = blocks;
    CHECK(constant("deepnorm", config, "alpha") ==
          doctest::Approx(std::pow(2.0 * blocks, 0.25)).epsilon(1e-15));
    CHECK(constant("deepnorm", config, "beta") ==
          doctest::Approx(std::pow(8.0 * blocks, -0.25)).epsilon(1e-15));
    CHECK(constant("deepnorm-glm", config, "alpha") ==
          doctest::Approx(std::sqrt(2.0 * blocks)).epsilon(1e-15));
    CHECK(constant("deepnorm-glm", config, "beta") ==
          doctest::Approx(1 / std::sqrt(2.0 * blocks)).epsilon(1e-15));
  }
  for (const char* id : {"deepnorm", "deepnorm-glm"}) {
    ModelConfig config;
    config.blocks = 16;
    config.width = 128;
    const Architecture& arch = find_architecture(id);
    const Constants constants = resolve_constants(arch, config);
    const auto tensors = run_tensors(config, arch, constants, 0);
    const auto stddev = [&](const char* name) {
      const auto& v = tensor(tensors, name).values;
      double sum = 0;
      for (double x : v) sum += x * x;
      return std::sqrt(sum / v.size());
    };
    const double beta = constant_value(constants, "beta");
    CAPTURE(id);
    CHECK(stddev("sublayer.0000.W_K") == doctest::Approx(stddev("sublayer.0000.W_Q")).epsilon(0.02));
    CHECK(stddev("sublayer.0000.W_V") / stddev("sublayer.0000.W_Q") == doctest::Approx(beta).epsilon(0.02));
    CHECK(stddev("sublayer.0000.W_O") / stddev("sublayer.0000.W_Q") == doctest::Approx(beta).epsilon(0.02));
  }
}

TEST_CASE("layerscale: lambda = 0.1 up to 18 blocks, 1e-5 up to 24, 1e-6 beyond, applied to the branch") {
  for (const auto& [blocks, lambda] : {std::pair{1, 0.1}, std::pair{18, 0.1}, std::pair{19, 1e-5},
                                       std::pair{24, 1e-5}, std::pair{25, 1e-6}, std::pair{256, 1e-6}}) {
    ModelConfig config;
    config.blocks = blocks;
    CAPTURE(blocks);
    CHECK(constant("layerscale", config, "lambda") == lambda);
  }
  // The update is lambda F(N(x)): its RMS is lambda times pre-ln's branch RMS on the same x_0.
  const ModelConfig config = small_f64();
  CHECK(run("layerscale", config).sublayers.at("branch_rms")[0] ==
        doctest::Approx(0.1 * run("pre-ln", config).sublayers.at("branch_rms")[0]).epsilon(1e-12));
}

TEST_CASE("deepscalelm: b^2 = 2/S and l^2 + b^2 = 1; its skip factor is l") {
  for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
    for (const int blocks : {2, 7, 64, 512}) {
      ModelConfig config;
      config.blocks = blocks;
      config.block = block;
      const double beta = constant("deepscalelm", config, "beta"),
                   lambda = constant("deepscalelm", config, "lambda");
      CAPTURE(blocks);
      CHECK(beta * beta == doctest::Approx(2.0 / config.sublayers()).epsilon(1e-14));
      CHECK(lambda * lambda + beta * beta == doctest::Approx(1.0).epsilon(1e-14));
    }
  }
  ModelConfig one;
  one.blocks = 1;
  one.block = BlockKind::ffn;
  CHECK_THROWS_AS(resolve_constants(find_architecture("deepscalelm"), one), InputError);
  const ModelConfig config = small_f64();
  const SeedResult result = run("deepscalelm", config);
  for (int l = 0; l < config.sublayers(); ++l) {
    CHECK(result.sublayers.at("skip_gain")[l] ==
          doctest::Approx(constant("deepscalelm", config, "lambda")).epsilon(1e-12));
  }
}

TEST_CASE("depth-mup scales branches by 1/sqrt(S); lns and siamese-norm use the 0-based block index") {
  ModelConfig config;
  config.blocks = 32;
  CHECK(constant("depth-mup", config, "branch_scale") == doctest::Approx(1 / std::sqrt(64.0)).epsilon(1e-15));
  CHECK(constant("lns", config, "input_scale") == doctest::Approx(1 / std::sqrt(32.0)).epsilon(1e-15));
  CHECK(constant("siamese-norm", config, "c") == doctest::Approx(std::sqrt(64.0)).epsilon(1e-15));
}

TEST_CASE("multi-stream states: resi-dual and siamese-norm carry two streams, span-norm two inside a block") {
  const ModelConfig config = small_f64(3);
  for (const char* id : {"resi-dual", "siamese-norm"}) {
    const SeedResult result = run(id, config);
    REQUIRE(result.streams.size() == 2);
    for (int l = 0; l <= config.sublayers(); ++l) {
      const double a = result.streams[0].states.at("rms")[l], b = result.streams[1].states.at("rms")[l];
      // The whole state's rms is that of both streams together (equal sizes).
      CHECK(result.states.at("rms")[l] == doctest::Approx(std::sqrt((a * a + b * b) / 2)).epsilon(1e-12));
      CHECK(std::isfinite(result.streams[1].states.at("log10_grad")[l]));
    }
  }
  // span-norm: the state between a block's attention and FFN holds (x, h); block boundaries hold x.
  const SeedResult span = run("span-norm", config);
  const auto& h_rms = span.streams[1].states.at("rms");
  for (int l = 0; l <= config.sublayers(); ++l) {
    CAPTURE(l);
    CHECK(std::isfinite(h_rms[l]) == (l % 2 == 1));
    if (l % 2 == 0 && l > 0)
      CHECK(span.states.at("rms")[l] == doctest::Approx(1.0).epsilon(1e-5));  // N2 output
  }
  CHECK(find_architecture("span-norm").provisional);
  CHECK(find_architecture("sandwich-ln").id == "peri-ln");
}
