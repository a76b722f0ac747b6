// Placement files (docs/placement-files.md): the graphs their rules build, the shipped new
// placements (b2t, hc, mhc; their whole-stack gradients are checked with every placement in
// whole_stack.test.cpp), and Hyper-Connections at init against pre-ln.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_file.hpp"
#include "science/stack_run.hpp"
#include "support/small_model.hpp"

using namespace gradflow;

namespace {
std::string write_placement(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / ("gradflow-test-" + name)).string();
  std::ofstream(path) << text;
  return path;
}

const std::string kHead = "id = \"t\"\ncitation = \"c\"\nexpected_growth = \"sqrt\"\noutput = \"N(x)\"\n";

SublayerGraph sublayer_graph(const Architecture& arch, const ModelConfig& config, int l) {
  const Constants constants = resolve_constants(arch, config);
  SublayerGraph g;
  g.reset(static_cast<int>(arch.streams.size()));
  arch.build_sublayer(g, {config, constants, l, config.block_of(l), config.sublayer_kind(l)});
  return g;
}
}  // namespace

TEST_CASE("a placement file's rule builds the nodes the format states, and marks the update and sum") {
  const ModelConfig config = testing::small_model(2, 8, 2, 4);
  const Architecture arch = load_placement_file(
      write_placement("rule_nodes.toml",
                      kHead + "[constants]\na = 2\n[[sublayer]]\nrule = \"x <- N(a*x + F(N(x)) - x/4)\"\n"));
  const SublayerGraph g = sublayer_graph(arch, config, 0);
  // The operand holding F first: norm(x), branch, scale(x, 2), add, then scale(x, 1/4),
  // scale(-1), add, and the outer norm.
  const std::vector<NodeOp> expected = {NodeOp::norm,  NodeOp::branch, NodeOp::scale, NodeOp::add,
                                        NodeOp::scale, NodeOp::scale,  NodeOp::add,   NodeOp::norm};
  REQUIRE(g.nodes().size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(g.nodes()[i].op == expected[i]);
  CHECK(g.nodes()[2].factor == 2.0);
  CHECK(g.nodes()[4].factor == 0.25);
  CHECK(g.nodes()[5].factor == -1.0);
  // The outermost + or - on the path to F is the last add (the '-'); its F side is add #1.
  CHECK(g.sum_id() == 1 + 6);
  CHECK(g.update_id() == 1 + 3);
  CHECK(!arch.additive_stream);
}

TEST_CASE("a placement file infers the additive stream and evaluates per-sublayer constants") {
  const ModelConfig config = testing::small_model(3, 8, 2, 4);
  const Architecture arch = load_placement_file(
      write_placement("per_block.toml", kHead + "[constants]\nc = \"1/sqrt(b + 1)\"\n[[sublayer]]\nrule = "
                                                "\"x <- x + c*F(N(x))\"\nskip_gain = \"1\"\n"));
  CHECK(arch.additive_stream);
  for (int l = 0; l < config.sublayers(); ++l) {
    const SublayerGraph g = sublayer_graph(arch, config, l);
    const double c = 1.0 / std::sqrt(config.block_of(l) + 1.0);
    if (c == 1.0) {
      CHECK(g.nodes().size() == 3);  // a scale by exactly 1 builds no node
    } else {
      CHECK(g.nodes()[2].factor == c);
    }
  }
  const Constants constants = resolve_constants(arch, config);
  REQUIRE(constants.size() == 1);
  CHECK(constants[0].value == 1.0 / std::sqrt(3.0));  // at the last block
}

TEST_CASE("a placement file's errors name file, line and column") {
  const std::string path =
      write_placement("bad_rule.toml", kHead + "[[sublayer]]\nrule = \"x <- x + F(x) + F(x)\"\n");
  try {
    load_placement_file(path);
    FAIL("no error");
  } catch (const InputError& error) {
    // line 6, the string's contents start at column 9; the second F at offset 16
    CHECK(std::string(error.what()) ==
          path + ":6:25: F is used a second time; a rule uses the branch F exactly once");
  }
}

TEST_CASE(
    "the shipped placement files b2t, hc and mhc are in the registry (and so in every placement's tests)") {
  for (const char* id : {"b2t", "hc", "mhc"}) {
    CAPTURE(id);
    const Architecture& arch = find_architecture(id);
    CHECK(arch.source != "built-in");
    CHECK(arch.file_hash.substr(0, 8) == "fnv1a64:");
  }
  CHECK(find_architecture("hc").streams.size() == 4);
  CHECK(find_architecture("mhc").streams.size() == 4);
}

TEST_CASE("hc at init: every stream's states are pre-ln's bit for bit and only the output head differs") {
  {
    const ModelConfig config = testing::small_model(3, 16, 2, 4);
    const Architecture &hc = find_architecture("hc"), &pre_ln = find_architecture("pre-ln");
    const Constants none;
    StackRun<double> a(config, hc, none, 5, {}, 1), b(config, pre_ln, none, 5, {}, 1);
    const Mat<double> input = make_input<double>(config, 5);
    a.start(input), b.start(input);
    for (int l = 0; l < config.sublayers(); ++l) a.forward(l), b.forward(l);
    for (int l = 0; l <= config.sublayers(); ++l) {
      CAPTURE(l);
      REQUIRE(a.state(l).size() == 4);
      for (const auto& stream : a.state(l)) CHECK((stream.array() == b.state(l)[0].array()).all());
    }
    a.recompute(config.sublayers()), b.recompute(config.sublayers());
    const Mat<double>& y_hc = a.executor().value(a.graph().outputs()[0]);
    const Mat<double>& y_pre = b.executor().value(b.graph().outputs()[0]);
    // N(4x) against N(x): the same up to the norm's epsilon (1e-6 against mean(x^2) ~ 1).
    CHECK((y_hc - y_pre).norm() / y_pre.norm() < 1e-6);
  }
}

TEST_CASE("a gated FFN's W_3 takes the file's up gain, as it is drawn like W_1") {
  const ModelConfig config = testing::small_model(4, 16, 2, 4);
  const Architecture& deepnorm = find_architecture("deepnorm");  // beta on up, 1 on q (DeepNet Fig. 2)
  const Constants constants = resolve_constants(deepnorm, config);
  const SublayerContext ffn{config, constants, 1, 0, SublayerKind::ffn};
  const double beta = std::pow(8.0 * config.blocks, -0.25);
  CHECK(deepnorm.init_gain(ffn, WeightMatrix::up) == beta);
  CHECK(deepnorm.init_gain(ffn, WeightMatrix::gate) == beta);
  CHECK(deepnorm.init_gain(ffn, WeightMatrix::q) == 1.0);
}

TEST_CASE("an option-bound constant records its formula and unit, and the flag's value when given") {
  ModelConfig config = testing::small_model(4, 16, 2, 4);
  const Architecture& keel = find_architecture("keel");
  Constants constants = resolve_constants(keel, config);
  REQUIRE(constants.size() == 1);
  CHECK(constants[0].value == 8.0);  // a = S
  CHECK(constants[0].formula == "S");
  CHECK(constants[0].unit == "sublayers");
  config.options["alpha"] = 1.5;
  constants = resolve_constants(keel, config);
  CHECK(constants[0].value == 1.5);
  CHECK(constants[0].formula == "--alpha");
  CHECK(constants[0].unit == "sublayers");
  // The given value reaches the rule: the skip scale of a later sublayer is 1.5.
  const SublayerGraph g = sublayer_graph(keel, config, 3);
  const bool scaled = std::any_of(g.nodes().begin(), g.nodes().end(), [](const auto& node) {
    return node.op == NodeOp::scale && node.factor == 1.5;
  });
  CHECK(scaled);
}

TEST_CASE("a file's constants take the depth unit of the sizes they use, through other constants") {
  const ModelConfig config = testing::small_model(3, 8, 2, 4);
  const Architecture arch = load_placement_file(write_placement(
      "units.toml",
      kHead + "[constants]\nper_block = \"1/B\"\nper_sublayer = \"sqrt(S)\"\nboth = \"per_block * S\"\n"
              "none = \"d / heads\"\nstated = { value = \"b + 1\", unit = \"0-based blocks\" }\n"
              "[[sublayer]]\nrule = \"x <- x + F(N(x))\"\n"));
  std::map<std::string, std::string> units;
  for (const Constant& c : resolve_constants(arch, config)) units[c.name] = c.unit;
  CHECK(units["per_block"] == "blocks");
  CHECK(units["per_sublayer"] == "sublayers");
  CHECK(units["both"] == "blocks and sublayers");
  CHECK(units["none"] == "-");
  CHECK(units["stated"] == "0-based blocks");
}

TEST_CASE(
    "a word option selects the file's entry: keel's --keel-variant v1 makes the first FFN plain pre-ln") {
  ModelConfig config = testing::small_model(3, 16, 2, 4);
  const Architecture& keel = find_architecture("keel");
  const auto outer_norms = [&](int l) {
    const SublayerGraph g = sublayer_graph(keel, config, l);
    return std::count_if(g.nodes().begin(), g.nodes().end(),
                         [](const auto& n) { return n.op == NodeOp::norm; });
  };
  CHECK(outer_norms(1) == 2);  // v2 (default): N(x + F(N(x)))
  config.options["keel_variant"] = std::string("v1");
  CHECK(outer_norms(1) == 1);  // v1: x + F(N(x))
  CHECK(outer_norms(2) == 2);  // later sublayers are Keel's in both
}

TEST_CASE("a number option's range states what a value must do") {
  NumberRange any;
  CHECK(any.requirement() == "be finite");
  CHECK(!any.contains(std::nan("")));
  CHECK(!any.contains(std::numeric_limits<double>::infinity()));
  NumberRange positive{0.0, std::numeric_limits<double>::infinity(), false, false};
  CHECK(positive.requirement() == "be positive and finite");
  CHECK(!positive.contains(0.0));
  NumberRange unit{0.0, 1.0, true, true};
  CHECK(unit.requirement() == "lie in [0, 1]");
  CHECK(unit.contains(0.0));
  CHECK(unit.contains(1.0));
  CHECK(!unit.contains(1.0000001));
}

TEST_CASE(
    "a file's learning_rate_scale multiplies --lr for its sublayers' parameters (CompleteP, depth-muP)") {
  ModelConfig config = testing::small_model(2, 16, 2, 4);
  config.update = UpdateRule::sgd;
  const Architecture& pre_ln = find_architecture("pre-ln");
  const auto run = [&](const Architecture& arch, double lr) {
    config.learning_rates = {lr};
    return analyze_seed(config, arch, resolve_constants(arch, config), 5);
  };
  SUBCASE("a constant scale of 2 is --lr doubled, bit for bit, for every sublayer's matrices") {
    const Architecture doubled = load_placement_file(write_placement(
        "lr-doubled.toml",
        kHead +
            "[learning_rate_scale]\nsgd = \"2\"\nadam = \"4\"\n[[sublayer]]\nrule = \"x <- x + F(N(x))\"\n"));
    const SeedResult scaled = run(doubled, 1e-3), plain = run(pre_ln, 2e-3);
    for (const Figure f : {Figure::update_rms, Figure::log10_update_rel})
      CHECK(scaled.states.at({f, 1}) == plain.states.at({f, 1}));
    CHECK(scaled.sublayers.at({Figure::update_loss, 1}) == plain.sublayers.at({Figure::update_loss, 1}));
    CHECK(scaled.updates[0].learning_rate == 1e-3);  // the run records --lr, the file its scale
    config.update = UpdateRule::adam;                // adam = 4: Adam's step is --lr times 4
    const SeedResult adam = run(doubled, 1e-3), adam_plain = run(pre_ln, 4e-3);
    CHECK(adam.sublayers.at({Figure::update_loss, 1}) == adam_plain.sublayers.at({Figure::update_loss, 1}));
  }
  SUBCASE("a rule the table does not name keeps --lr") {
    const Architecture adam_only = load_placement_file(write_placement(
        "lr-adam-only.toml",
        kHead + "[learning_rate_scale]\nadam = \"7\"\n[[sublayer]]\nrule = \"x <- x + F(N(x))\"\n"));
    CHECK(run(adam_only, 1e-3).sublayers.at({Figure::update_loss, 1}) ==
          run(pre_ln, 1e-3).sublayers.at({Figure::update_loss, 1}));
  }
  SUBCASE(
      "a scale per sublayer: SGD's first-order loss change of sublayer 1 triples, the others keep theirs") {
    const Architecture third = load_placement_file(
        write_placement("lr-third.toml", kHead + "[learning_rate_scale]\nsgd = \"if(l == 1, 3, "
                                                 "1)\"\n[[sublayer]]\nrule = \"x <- x + F(N(x))\"\n"));
    config.update_norm_gains = true;  // the sublayer's norm gains take the scale too
    const auto scaled = run(third, 1e-3).sublayers.at({Figure::update_loss, 1});
    const auto plain = run(pre_ln, 1e-3).sublayers.at({Figure::update_loss, 1});
    for (std::size_t l = 0; l < plain.size(); ++l) {
      CAPTURE(l);
      CHECK(scaled[l] == doctest::Approx(plain[l] * (l == 1 ? 3.0 : 1.0)).epsilon(1e-12));
    }
  }
  SUBCASE("a scale that is not positive at some sublayer is refused before the run, naming the file") {
    const Architecture zero = load_placement_file(write_placement(
        "lr-zero.toml",
        kHead + "[learning_rate_scale]\nadam = \"1 - b\"\n[[sublayer]]\nrule = \"x <- x + F(N(x))\"\n"));
    CHECK_THROWS_WITH_AS(resolve_constants(zero, config), doctest::Contains("lr-zero.toml:"), InputError);
    CHECK_THROWS_WITH_AS(
        resolve_constants(zero, config),
        doctest::Contains("[learning_rate_scale] adam must be > 0, not 0, at sublayer l = 2 (block b = 1)"),
        InputError);
  }
}
