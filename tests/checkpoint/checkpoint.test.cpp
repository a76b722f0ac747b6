// Trained checkpoints (issue 28): the decoder's whole-stack gradient against central differences of
// the loss in f64 for every family (acceptance 2), the layer-by-layer analysis against the
// standalone float64 pass, and the spec's reading of config.json.
#include "gradflow/checkpoint.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>

#include "gradflow/app/placements.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {
namespace {

using json = nlohmann::ordered_json;

// Every tensor a spec expects, drawn at random (gains near 1, biases and weights O(0.1-0.3)), in
// memory: the TensorStore a checkpoint directory would be.
class MemoryStore : public TensorStore {
 public:
  explicit MemoryStore(const HfModelSpec& spec, unsigned seed = 3) {
    std::mt19937_64 engine(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (const ExpectedTensor& tensor : expected_tensors(spec)) {
      std::int64_t count = 1;
      for (const auto size : tensor.shape) count *= size;
      std::vector<double> values(count);
      const bool gain = tensor.name.find("norm.weight") != std::string::npos ||
                        (tensor.name.find("ln_") != std::string::npos && tensor.name.ends_with(".weight"));
      const double fan_in = tensor.shape.size() > 1 ? static_cast<double>(tensor.shape.back()) : 1.0;
      for (double& v : values) {
        if (gain)
          v = (spec.gain_offset ? 0.0 : 1.0) + 0.2 * normal(engine);
        else if (tensor.shape.size() == 1)
          v = 0.1 * normal(engine);
        else
          v = 1.2 / std::sqrt(fan_in) * normal(engine);
      }
      tensors_[tensor.name] = {tensor.shape, std::move(values)};
    }
  }
  void read_rows(const std::string& name, std::int64_t first, std::int64_t rows, float* out) const override {
    copy(name, first, rows, out);
  }
  void read_rows(const std::string& name, std::int64_t first, std::int64_t rows, double* out) const override {
    copy(name, first, rows, out);
  }
  std::vector<std::int64_t> shape(const std::string& name) const override { return tensors_.at(name).first; }

 private:
  template <typename Scalar>
  void copy(const std::string& name, std::int64_t first, std::int64_t rows, Scalar* out) const {
    const auto& [shape, values] = tensors_.at(name);
    const std::int64_t row = values.size() / shape[0];
    for (std::int64_t i = 0; i < rows * row; ++i) out[i] = static_cast<Scalar>(values[first * row + i]);
  }
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<double>>> tensors_;
};

json shared_config(const char* model_type) {
  return {{"model_type", model_type}, {"hidden_size", 16},
          {"num_hidden_layers", 3},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 24},
          {"vocab_size", 23},         {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},    {"max_position_embeddings", 64}};
}

std::vector<std::pair<std::string, json>> family_configs() {
  json gemma = shared_config("gemma2");
  gemma["query_pre_attn_scalar"] = 6;
  gemma["attn_logit_softcapping"] = 2.0;
  gemma["final_logit_softcapping"] = 3.0;
  gemma["sliding_window"] = 3;
  json llama3 = shared_config("llama");
  llama3["attention_bias"] = true;
  llama3["mlp_bias"] = true;
  llama3["tie_word_embeddings"] = true;
  llama3["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 16}};
  const json gpt2 = {{"model_type", "gpt2"},
                     {"n_embd", 16},
                     {"n_layer", 3},
                     {"n_head", 4},
                     {"vocab_size", 23},
                     {"n_positions", 32},
                     {"activation_function", "gelu_new"}};
  return {{"llama", shared_config("llama")},
          {"llama+biases+llama3 rope+tied", llama3},
          {"qwen2", shared_config("qwen2")},
          {"olmo2", shared_config("olmo2")},
          {"gemma2", gemma},
          {"gpt2", gpt2}};
}

// The family's placement as analyze resolves it: the sublayers run through its graph and the ops
// where checkpoint_graph_gap is empty, else through the decoder.
CheckpointRun make_run(const json& config, LossKind loss) {
  CheckpointRun run;
  run.spec = read_hf_model_spec(config, "config.json");
  run.tokens = {3, 17, 0, 22, 9, 9, 4};
  run.loss = loss;
  run.config = model_config_of(run.spec, static_cast<int>(run.tokens.size()), Precision::f64, 5);
  run.arch = &find_architecture(family_placement(run.spec.family));
  return run;
}

// The same run through the decoder's own maths (no placement given).
CheckpointRun on_decoder(CheckpointRun run) {
  run.arch = nullptr;
  return run;
}

}  // namespace

TEST_CASE("every family's whole-stack gradient of the loss matches central differences in f64") {
  for (const auto& [name, config] : family_configs()) {
    for (const LossKind loss : {LossKind::lm, LossKind::probe}) {
      CAPTURE(name);
      CAPTURE(static_cast<int>(loss));
      const CheckpointRun run = make_run(config, loss);
      const MemoryStore store(run.spec);
      const InputGradient exact = checkpoint_loss_and_input_gradient(run, store);
      // x_0 rebuilt from the store (token rows, GPT-2's positions, Gemma's scale), then central
      // differences of L along every one of its T x d = 112 entries.
      Eigen::MatrixXd embedded = Eigen::MatrixXd::Zero(exact.gradient.rows(), exact.gradient.cols());
      const std::string table =
          run.spec.family == HfFamily::gpt2 ? "wte.weight" : "model.embed_tokens.weight";
      for (Eigen::Index t = 0; t < embedded.rows(); ++t) {
        Eigen::RowVectorXd row(embedded.cols());
        store.read_rows(table, run.tokens[t], 1, row.data());
        embedded.row(t) = row;
      }
      if (run.spec.position_embedding) {
        Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> wpe(embedded.rows(),
                                                                                   embedded.cols());
        store.read_rows("wpe.weight", 0, embedded.rows(), wpe.data());
        embedded += wpe;
      }
      embedded *= run.spec.embedding_scale;
      const InputGradient from_x0 = checkpoint_loss_and_input_gradient(run, store, &embedded);
      CHECK(from_x0.loss == doctest::Approx(exact.loss).epsilon(1e-14));
      Eigen::MatrixXd numeric(embedded.rows(), embedded.cols());
      constexpr double h = 1e-5;
      for (Eigen::Index i = 0; i < embedded.size(); ++i) {
        Eigen::MatrixXd plus = embedded, minus = embedded;
        plus.data()[i] += h;
        minus.data()[i] -= h;
        numeric.data()[i] = (checkpoint_loss_and_input_gradient(run, store, &plus).loss -
                             checkpoint_loss_and_input_gradient(run, store, &minus).loss) /
                            (2 * h);
      }
      const double error = (numeric - from_x0.gradient).norm() / from_x0.gradient.norm();
      MESSAGE(name, " loss ", static_cast<int>(loss), ": relative error ", error);
      CHECK(error < 1e-6);
      CHECK(from_x0.gradient.norm() > 0);
    }
  }
}

TEST_CASE("the layer-by-layer analysis reports the standalone pass's loss and gradient") {
  for (const auto& [name, config] : family_configs()) {
    CAPTURE(name);
    const CheckpointRun run = make_run(config, LossKind::lm);
    const MemoryStore store(run.spec);
    const InputGradient exact = checkpoint_loss_and_input_gradient(run, store);
    const SeedResult result = analyze_checkpoint(run, store);
    REQUIRE(result.checkpoint.has_value());
    CHECK(result.checkpoint->loss == doctest::Approx(exact.loss).epsilon(1e-13));
    CHECK(result.states.at(Figure::log10_grad)[0] ==
          doctest::Approx(std::log10(exact.gradient.norm())).epsilon(1e-12));
    CHECK(result.checkpoint->angular_distance.size() == 3);
    for (const double a : result.checkpoint->angular_distance) CHECK((a >= 0 && a <= 1));
    // x_S = x_0 + sum_l update_l: the parts' shares of x_S sum to 1
    double shares = result.stream_decomposition_input;
    for (const double share : result.sublayers.at(Figure::stream_decomposition)) shares += share;
    CHECK(shares == doctest::Approx(1.0).epsilon(1e-12));
    // the gains multiply up to the whole ratio
    const auto& gain = result.sublayers.at(Figure::gain);
    double log_product = 0;
    for (const double g : gain) log_product += std::log10(g);
    CHECK(log_product == doctest::Approx(result.log10_grad_ratio).epsilon(1e-10));
  }
}

TEST_CASE("--update on a checkpoint: the first-order change of the loss predicts the measured one") {
  const CheckpointRun graph = make_run(shared_config("llama"), LossKind::lm);
  const MemoryStore store(graph.spec);
  for (const auto& [rule, base] : {std::pair{UpdateRule::sgd, graph}, std::pair{UpdateRule::adam, graph},
                                   std::pair{UpdateRule::adam, on_decoder(graph)}}) {
    CAPTURE(base.arch != nullptr);
    CheckpointRun run = base;
    run.config.update = rule;
    run.config.learning_rates = {1e-7, 1e-6};
    const SeedResult result = analyze_checkpoint(run, store);
    REQUIRE(result.updates.size() == 2);
    for (const UpdateStep& step : result.updates) {
      CAPTURE(step.learning_rate);
      CHECK(step.delta_loss < 0);  // a small step down the gradient lowers the loss
      CHECK(step.delta_loss == doctest::Approx(step.delta_loss_first_order).epsilon(1e-3));
      CHECK(step.diverged_state == -1);
    }
    // second order: ten times the step, ten times the change (to first order)
    CHECK(result.updates[1].delta_loss / result.updates[0].delta_loss == doctest::Approx(10.0).epsilon(1e-3));
  }
}

TEST_CASE("config.json: unsupported families and rope scalings are refused naming the key") {
  json config = shared_config("mamba");
  CHECK_THROWS_WITH_AS(read_hf_model_spec(config, "c.json"), doctest::Contains("model_type"), InputError);
  config = shared_config("llama");
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK_THROWS_WITH_AS(read_hf_model_spec(config, "c.json"), doctest::Contains("rope_scaling"), InputError);
  config = shared_config("llama");
  config["num_key_value_heads"] = 3;
  CHECK_THROWS_WITH_AS(read_hf_model_spec(config, "c.json"), doctest::Contains("num_key_value_heads"),
                       InputError);
  // Transformers 5's rope_parameters: theta and scaling read from it, and it must agree with rope_theta
  config = shared_config("llama");
  config.erase("rope_theta");
  config["rope_parameters"] = {{"rope_theta", 500000.0},  {"rope_type", "llama3"},
                               {"factor", 32.0},          {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const HfModelSpec v5 = read_hf_model_spec(config, "c.json");
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling == RopeScaling::llama3);
  CHECK(v5.rope_factor == 32.0);
  config["rope_theta"] = 10000.0;
  CHECK_THROWS_WITH_AS(read_hf_model_spec(config, "c.json"), doctest::Contains("rope_theta"), InputError);
  // Gemma2Config's defaults where a key is absent; null switches a soft-cap or the window off
  json minimal = shared_config("gemma2");
  const HfModelSpec defaults = read_hf_model_spec(minimal, "c.json");
  CHECK(defaults.attn_softcap == 50.0);
  CHECK(defaults.final_softcap == 30.0);
  CHECK(defaults.head_dim == 256);
  CHECK(defaults.sliding_window == std::vector<int>{4096, 0, 4096});
  minimal["attn_logit_softcapping"] = nullptr;
  minimal["sliding_window"] = nullptr;
  const HfModelSpec off = read_hf_model_spec(minimal, "c.json");
  CHECK(off.attn_softcap == 0.0);
  CHECK(off.sliding_window == std::vector<int>{0, 0, 0});
  json olmo = shared_config("olmo2"), llama = shared_config("llama");
  olmo.erase("rms_norm_eps");
  llama.erase("rms_norm_eps");
  CHECK(read_hf_model_spec(olmo, "c.json").norm_eps == 1e-5);   // Olmo2Config's default
  CHECK(read_hf_model_spec(llama, "c.json").norm_eps == 1e-6);  // LlamaConfig's
  const HfModelSpec gemma = read_hf_model_spec(family_configs()[4].second, "c.json");
  CHECK(gemma.sliding_window == std::vector<int>{3, 0, 3});  // Gemma2Config: even layers slide
  CHECK(gemma.tied);
  CHECK(gemma.embedding_scale == doctest::Approx(4.0));
}

TEST_CASE(
    "which families run through the placement graph and the ops (issue 47), and why the others do not") {
  const int tokens = 7;
  std::map<std::string, std::string> gaps;
  for (const auto& [name, config] : family_configs())
    gaps[name] = checkpoint_graph_gap(read_hf_model_spec(config, "config.json"), tokens);
  CHECK(gaps["llama"].empty());
  CHECK(gaps["llama+biases+llama3 rope+tied"].empty());
  CHECK(gaps["gpt2"].empty());
  CHECK(gaps["qwen2"].empty());  // biases on q, k and v, none on o
  CHECK(gaps["olmo2"] == "q/k norms with learned gains");
  CHECK(gaps["gemma2"] == "head_dim 256 other than hidden_size / heads");
  json window = shared_config("mistral");
  window["sliding_window"] = 7;  // as long as the sequence: masks nothing
  CHECK(checkpoint_graph_gap(read_hf_model_spec(window, "config.json"), tokens).empty());
  window["sliding_window"] = 6;
  CHECK(checkpoint_graph_gap(read_hf_model_spec(window, "config.json"), tokens) ==
        "a sliding window of 6 tokens");
}

TEST_CASE(
    "the graph path and the decoder agree on every figure, and the graph path's threads change no bit") {
  for (const auto& [name, config] : family_configs()) {
    const CheckpointRun run = make_run(config, LossKind::lm);
    if (!checkpoint_graph_gap(run.spec, static_cast<int>(run.tokens.size())).empty()) continue;
    CAPTURE(name);
    const MemoryStore store(run.spec);
    const SeedResult graph = analyze_checkpoint(run, store);
    const SeedResult decoder = analyze_checkpoint(on_decoder(run), store);
    CHECK(graph.checkpoint->loss == doctest::Approx(decoder.checkpoint->loss).epsilon(1e-13));
    for (const Figure figure : {Figure::rms, Figure::log10_grad, Figure::erank, Figure::token_cos}) {
      const auto& a = graph.states.at(figure);
      const auto& b = decoder.states.at(figure);
      for (std::size_t l = 0; l < a.size(); ++l) CHECK(a[l] == doctest::Approx(b[l]).epsilon(1e-12));
    }
    for (const Figure figure :
         {Figure::gain, Figure::branch_gain, Figure::stream_share, Figure::output_share}) {
      const auto& a = graph.sublayers.at(figure);
      const auto& b = decoder.sublayers.at(figure);
      for (std::size_t l = 0; l < a.size(); ++l) CHECK(a[l] == doctest::Approx(b[l]).epsilon(1e-11));
    }
    for (const int threads : {2, 3, 7}) {
      CheckpointRun threaded = run;
      threaded.threads = threads;
      const SeedResult again = analyze_checkpoint(threaded, store);
      CHECK(again.checkpoint->loss == graph.checkpoint->loss);
      CHECK(again.states.at(Figure::log10_grad) == graph.states.at(Figure::log10_grad));
      CHECK(again.sublayers.at(Figure::log10_param_grad) == graph.sublayers.at(Figure::log10_param_grad));
    }
  }
}

}  // namespace gradflow
