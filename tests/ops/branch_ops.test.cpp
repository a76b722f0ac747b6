// The branch-op table (branch_op.hpp, src/ops/branch_ops.cpp): which row serves which sublayer,
// and the contract every row keeps, checked for each row through the table alone, so that a new
// op is held to it by adding its row: weights drawn as its weight list says, an input cotangent
// and a JVP (in the input, and in the weights and biases) against central differences, weight gradients
// against central differences in every weight and bias, and parameter-gradient squares equal to those
// gradients' squared norm.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/branch_op.hpp"
#include "gradflow/initialization.hpp"
#include "gradflow/rng.hpp"
#include "support/finite_difference.hpp"
#include "support/small_model.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
ModelConfig op_config(std::string_view ffn, bool bias) {
  ModelConfig config = small_model(1, 16, 4, 5);
  config.ffn = ffn;
  config.kv_heads = 2;  // grouped-query attention: K and V narrower than Q
  config.bias = bias;
  return config;
}

// The FFN words and op options the contract runs over: each FFN op, the mixture of experts with
// and without a gated shared expert and with both kinds of gates.
struct OpVariant {
  std::string_view ffn;
  std::map<std::string, OptionValue, std::less<>> options;
};
const std::vector<OpVariant>& op_variants() {
  static const std::vector<OpVariant> variants = {
      {"gelu", {}},
      {"swiglu", {}},
      {"moe", {{"experts", 4.0}, {"experts_active", 2.0}}},
      {"moe",
       {{"experts", 3.0},
        {"experts_active", 2.0},
        {"shared_expert_hidden", 6.0},
        {"router_gates", std::string("softmax")}}},
      {"moe", {{"experts", 8.0}, {"experts_active", 1.0}}},  // 5 tokens: at least 3 experts unchosen
  };
  return variants;
}

// The kind of sublayer a row serves under `ops` (every row serves one).
SublayerKind served_kind(const BranchOpRow& row, const BlockOps& ops) {
  return row.serves(SublayerKind::attn, ops) ? SublayerKind::attn : SublayerKind::ffn;
}

// Weights drawn as the row's list says, then biases made non-zero so that their use is checked.
SublayerWeights<double> drawn_weights(const ModelConfig& config, SublayerKind kind) {
  const Architecture& arch = find_architecture("pre-ln");
  const Constants constants = resolve_constants(arch, config);
  const SublayerContext ctx{config, constants, kind == SublayerKind::attn ? 0 : 1, 0, kind};
  SublayerWeights<double> weights;
  generate_weights(config, arch, ctx, 3, weights);
  for (std::size_t m = 0; m < weights.biases.size(); ++m) {
    if (weights.biases[m].size() > 0)
      weights.biases[m] = random_matrix(weights.biases[m].size(), 1, 40 + static_cast<unsigned>(m), 0.3);
  }
  return weights;
}

// <dy, F(x; w)> by a fresh op of the row.
double probe_loss(const BranchOpRow& row, const MatD& x, const SublayerWeights<double>& w,
                  const BranchSettings& settings, const MatD& dy) {
  auto op = row.make<double>();
  MatD out;
  op->forward(x, w, settings, out, nullptr, true);
  return dy.cwiseProduct(out).sum();
}
}  // namespace

TEST_CASE("the branch-op table: attention serves attention sublayers, the FFN every FFN kind") {
  for (const FfnKind ffn :
       {FfnKind::gelu, FfnKind::swiglu, FfnKind::geglu, FfnKind::gelu_tanh, FfnKind::geglu_tanh}) {
    const BlockOps ops = block_ops(op_config(to_string(ffn), false));
    CHECK(branch_op(SublayerKind::attn, ops).name == "attention");
    CHECK(branch_op(SublayerKind::ffn, ops).name == "ffn");
    CHECK(ops.ffn == ffn);
  }
  const BlockOps moe = block_ops(op_config("moe", false));
  CHECK(branch_op(SublayerKind::attn, moe).name == "attention");
  CHECK(branch_op(SublayerKind::ffn, moe).name == "moe");
  CHECK(moe.number("experts") == 8);  // the row's defaults fill the options not given
  std::set<std::string_view> names;
  for (const BranchOpRow& row : branch_ops()) names.insert(row.name);
  CHECK(names.size() == branch_ops().size());
}

TEST_CASE("every branch op keeps the table's contract (float64, central differences)") {
  for (const BranchOpRow& row : branch_ops()) {
    for (const OpVariant& variant : op_variants()) {
      for (const bool bias : {false, true}) {
        CAPTURE(row.name);
        CAPTURE(variant.ffn);
        CAPTURE(variant.options.size());
        CAPTURE(bias);
        ModelConfig config = op_config(variant.ffn, bias);
        config.op_options = variant.options;
        const BlockOps ops = block_ops(config);
        const SublayerKind kind = served_kind(row, ops);
        if (&branch_op(kind, ops) != &row) continue;  // another row serves this configuration
        const std::vector<WeightSpec> specs = row.weights(config);
        SublayerWeights<double> w = drawn_weights(config, kind);
        // The weights are the list's, in its order and shapes; names are distinct.
        REQUIRE(w.matrices.size() == specs.size());
        std::set<std::string> spec_names;
        for (std::size_t m = 0; m < specs.size(); ++m) {
          CAPTURE(specs[m].name);
          spec_names.insert(specs[m].name);
          CHECK(w.matrices[m].rows() == specs[m].rows);
          CHECK(w.matrices[m].cols() == specs[m].cols);
          CHECK(w.matrices[m].norm() > 0);
          CHECK(w.biases[m].size() == (bias ? specs[m].cols : 0));
        }
        CHECK(spec_names.size() == specs.size());
        CHECK(row.cost(config).forward_flops > 0);

        const BranchSettings settings{config.heads, ops, QkvNorm::none, std::nullopt, 1.0};
        const MatD x = random_matrix(config.seq, config.width, 11);
        const auto forward = [&](const MatD& input) {
          auto op = row.make<double>();
          MatD out;
          op->forward(input, w, settings, out, nullptr, true);
          return out;
        };
        const auto forward_with = [&](const SublayerWeights<double>& weights) {
          auto op = row.make<double>();
          MatD out;
          op->forward(x, weights, settings, out, nullptr, true);
          return out;
        };
        auto op = row.make<double>();
        CHECK(backward_relative_error(x, forward, [&](const MatD& input, const MatD& dy) {
                MatD out, dx = MatD::Zero(dy.rows(), input.cols());
                op->forward(input, w, settings, out, nullptr, true);
                op->backward(input, w, settings, dy, &dx, nullptr, nullptr, nullptr);
                return dx;
              }) < kFiniteDifferenceTolerance);
        CHECK(jvp_relative_error(x, forward, [&](const MatD& input, const MatD& dx) {
                MatD out, dy;
                op->forward(input, w, settings, out, nullptr, true);
                op->jvp(input, w, settings, dx, dy, nullptr);
                return dy;
              }) < kFiniteDifferenceTolerance);

        // Forward mode in the weights and biases (one tangent): J_w dW against central differences.
        SublayerWeights<double> tangent = w;
        for (std::size_t m = 0; m < specs.size(); ++m) {
          tangent.matrices[m] = random_matrix(specs[m].rows, specs[m].cols, 60 + static_cast<unsigned>(m));
          if (bias) tangent.biases[m] = random_matrix(specs[m].cols, 1, 70 + static_cast<unsigned>(m));
        }
        const auto moved = [&](double step) {
          SublayerWeights<double> v = w;
          for (std::size_t m = 0; m < specs.size(); ++m) {
            v.matrices[m] += step * tangent.matrices[m];
            v.biases[m] += step * tangent.biases[m];
          }
          return v;
        };
        const double h_w = 1e-6;
        MatD jvp_w, unused;
        op->forward(x, w, settings, unused, nullptr, true);
        op->jvp(x, w, settings, MatD::Zero(x.rows(), x.cols()), jvp_w, &tangent);
        const MatD numeric_w = (forward_with(moved(h_w)) - forward_with(moved(-h_w))) / (2 * h_w);
        CHECK((numeric_w - jvp_w).norm() / jvp_w.norm() < kFiniteDifferenceTolerance);

        // One probe: weight gradients, and the parameter-gradient squares of the probe backward.
        const MatD dy = random_matrix(config.seq, config.width, 13);
        MatD out, dx = MatD::Zero(dy.rows(), config.width);
        ParamGradSquares squares;
        op->forward(x, w, settings, out, nullptr, true);
        op->backward(x, w, settings, dy, &dx, &squares, nullptr, nullptr);
        SublayerWeights<double> gradients;
        op->weight_gradients(x, settings, dy, gradients, bias, nullptr);
        REQUIRE(gradients.matrices.size() == specs.size());
        double gradient_squares = 0;
        const double h = 1e-6;
        for (std::size_t m = 0; m < specs.size(); ++m) {
          CAPTURE(specs[m].name);
          REQUIRE(gradients.matrices[m].rows() == specs[m].rows);
          REQUIRE(gradients.matrices[m].cols() == specs[m].cols);
          REQUIRE(gradients.biases[m].size() == (bias ? specs[m].cols : 0));
          gradient_squares += gradients.matrices[m].squaredNorm() + gradients.biases[m].squaredNorm();
          MatD numeric(specs[m].rows, specs[m].cols);
          SublayerWeights<double> shifted = w;
          for_each_central_difference(
              shifted.matrices[m], h, [&] { return probe_loss(row, x, shifted, settings, dy); },
              [&](Eigen::Index i, Eigen::Index j, double up, double down) {
                numeric(i, j) = (up - down) / (2 * h);
              });
          if (gradients.matrices[m].norm() == 0) {  // an expert no token chose: no gradient at all
            CHECK(numeric.norm() < 1e-9);
          } else {
            CHECK((numeric - gradients.matrices[m]).norm() / gradients.matrices[m].norm() <
                  kFiniteDifferenceTolerance);
          }
          if (!bias) continue;
          Vec<double> numeric_bias(specs[m].cols);
          for_each_central_difference(
              shifted.biases[m], h, [&] { return probe_loss(row, x, shifted, settings, dy); },
              [&](Eigen::Index i, Eigen::Index, double up, double down) {
                numeric_bias[i] = (up - down) / (2 * h);
              });
          // Measured against the larger of the bias's and its matrix's gradient: attention's b_K has
          // a zero gradient (a key bias adds q.b_K to every score of a row, which softmax ignores).
          const double scale = std::max(gradients.biases[m].norm(), gradients.matrices[m].norm());
          if (scale == 0) continue;  // checked with its matrix
          CHECK((numeric_bias - gradients.biases[m]).norm() / scale < kFiniteDifferenceTolerance);
        }
        REQUIRE(squares.size() == 1);
        CHECK(squares[0] == doctest::Approx(gradient_squares).epsilon(1e-10));
      }
    }
  }
}

TEST_CASE_TEMPLATE(
    "normalize_along_width: nGPT's unit vectors along d, the same bits as a norm summed down each column", T,
    float, double) {
  // nGPT's normalize_matrices() (initialization.hpp): the columns of W_Q and W_1 (an input
  // projection, (d, n)) and the rows of W_O and W_2 (an output projection, (n, d)) get unit norm.
  // The columns are summed a row at a time; the result must equal, bit for bit, the squares summed
  // in double down each column in row order 0 .. d-1 (the documented order; not Eigen's own column
  // norm, whose order and fusing depend on the target: -march=native on an AMD EPYC and on an Intel
  // server differ), and the rows Eigen's row norm. In double the factor is not
  // rounded to float, so there the sums' order shows in the bits (summing the rows in reverse fails).
  const std::vector<WeightSpec> specs = {{"W_Q", WeightMatrix::q, 0, 48, 48},
                                         {"W_O", WeightMatrix::o, 1, 48, 48},
                                         {"W_1", WeightMatrix::up, 2, 48, 200},
                                         {"W_2", WeightMatrix::down, 3, 200, 48}};
  SublayerWeights<T> weights;
  for (const WeightSpec& spec : specs) {
    Mat<T> m(spec.rows, spec.cols);
    fill_normal(stream_key(5, RandomUse::weight, 0, spec.stream), T(0.02), m.data(),
                static_cast<std::size_t>(m.size()));
    weights.matrices.push_back(m);
  }
  const SublayerWeights<T> drawn = weights;
  std::vector<double> scratch;
  normalize_along_width(specs, weights, scratch);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].name);
    const bool output_projection = specs[i].role == WeightMatrix::o || specs[i].role == WeightMatrix::down;
    Mat<T> expected = drawn.matrices[i];
    if (output_projection) {
      for (Eigen::Index r = 0; r < expected.rows(); ++r)
        expected.row(r) *= static_cast<T>(1.0 / expected.row(r).template cast<double>().norm());
    } else {
      // The compiler may fuse each x * x + sum into one FMA (GCC's default -ffp-contract=fast for
      // C++) or not, target by target: the library's bits must be one of the two, for every column.
      Mat<T> fused = expected;
      for (Eigen::Index c = 0; c < expected.cols(); ++c) {
        double squares = 0, fused_squares = 0;
        for (Eigen::Index r = 0; r < expected.rows(); ++r) {
          const double x = static_cast<double>(expected(r, c));
          volatile double square = x * x;  // rounded on its own: never fused into the sum
          squares += square;
          fused_squares = std::fma(x, x, fused_squares);
        }
        expected.col(c) *= static_cast<T>(1.0 / std::sqrt(squares));
        fused.col(c) *= static_cast<T>(1.0 / std::sqrt(fused_squares));
      }
      if (weights.matrices[i] == fused) expected = fused;
    }
    CHECK(weights.matrices[i] == expected);
    const Eigen::Index vectors = output_projection ? expected.rows() : expected.cols();
    for (Eigen::Index v = 0; v < vectors; ++v) {
      const double norm = output_projection ? weights.matrices[i].row(v).template cast<double>().norm()
                                            : weights.matrices[i].col(v).template cast<double>().norm();
      REQUIRE(std::abs(norm - 1.0) < 1e-6);
    }
  }
}
