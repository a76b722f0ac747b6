// read_model_config_file: the resolved configuration of every shipped config.json, where each value
// came from, flags overriding the file, and the notes on what gradflow cannot model.
#include "gradflow/app/model_config_file.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "gradflow/errors.hpp"

using namespace gradflow;

namespace {
std::string shipped(const std::string& name) {
  std::ifstream file(std::string(GRADFLOW_TEST_DIR) + "/../data/configs/" + name + ".json");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The configuration a shipped file resolves to with no flags given, and the sources.
struct Resolved {
  ModelConfigFile file;
  ModelConfig model;
  nlohmann::ordered_json sources;
};
Resolved resolve(const std::string& name) {
  Resolved resolved{read_model_config_file(shipped(name), name, false), {}, {}};
  resolved.sources =
      apply_model_config_file(resolved.file, resolved.model, [](std::string_view) { return false; });
  return resolved;
}

bool has_note(const ModelConfigFile& file, const std::string& part) {
  return std::any_of(file.notes.begin(), file.notes.end(),
                     [&](const std::string& note) { return note.find(part) != std::string::npos; });
}
}  // namespace

TEST_CASE("config.json gpt2: LayerNorm pre-ln GELU MLP of width 4d, biases, no rotary embedding, gpt2 init") {
  const Resolved r = resolve("gpt2");
  CHECK(r.file.placement == "pre-ln");
  CHECK(r.model.width == 768);
  CHECK(r.model.blocks == 12);
  CHECK(r.model.heads == 12);
  CHECK(r.model.ffn == "gelu_tanh");  // activation_function gelu_new: GELU's tanh approximation
  CHECK(r.model.ffn_hidden() == 4 * 768);
  CHECK(r.model.norm == NormKind::layer);
  CHECK(r.model.norm_eps == 1e-5);
  CHECK(r.model.rope_theta == 0.0);
  CHECK(r.model.bias);
  CHECK(r.model.init == InitKind::gpt2);
  CHECK(r.sources["width"] == "config.json:n_embd");
  CHECK(r.sources["ffn_hidden"] == "default of model_type gpt2 (4 d)");
  CHECK(r.sources["ffn"] == "config.json:activation_function");
  CHECK_FALSE(has_note(r.file, "tanh approximation"));  // computed as it is, not noted as a difference
  CHECK(std::count(r.file.unused.begin(), r.file.unused.end(), "n_ctx") == 1);
  CHECK(std::count(r.file.unused.begin(), r.file.unused.end(), "n_embd") == 0);
}

TEST_CASE(
    "config.json llama-3.2-1b: pre-ln SwiGLU, 8 KV heads, RoPE 500000, normal 0.02, rope_scaling noted") {
  const Resolved r = resolve("llama-3.2-1b");
  CHECK(r.file.placement == "pre-ln");
  CHECK(r.model.width == 2048);
  CHECK(r.model.blocks == 16);
  CHECK(r.model.heads == 32);
  CHECK(r.model.kv_head_count() == 8);
  CHECK(r.model.ffn == "swiglu");
  CHECK(r.model.ffn_hidden() == 8192);
  CHECK(r.model.norm == NormKind::rms);
  CHECK(r.model.norm_eps == 1e-5);
  CHECK(r.model.rope_theta == 500000.0);
  CHECK(!r.model.bias);
  CHECK(r.model.init == InitKind::normal);
  CHECK(r.model.init_std == 0.02);
  CHECK(r.sources["kv_heads"] == "config.json:num_key_value_heads");
  CHECK(r.sources["blocks"] == "config.json:num_hidden_layers");
  CHECK(has_note(r.file, "rope_scaling"));
  CHECK(!has_note(r.file, "head_dim"));  // 2048 / 32 = 64, as the file says
}

TEST_CASE("config.json qwen2.5-0.5b: pre-ln SwiGLU, 2 KV heads, q/k/v biases from the family") {
  const Resolved r = resolve("qwen2.5-0.5b");
  CHECK(r.file.placement == "pre-ln");
  CHECK(r.model.width == 896);
  CHECK(r.model.blocks == 24);
  CHECK(r.model.heads == 14);
  CHECK(r.model.kv_head_count() == 2);
  CHECK(r.model.ffn == "swiglu");
  CHECK(r.model.ffn_hidden() == 4864);
  CHECK(r.model.norm_eps == 1e-6);
  CHECK(r.model.rope_theta == 1000000.0);
  CHECK(r.model.bias);
  CHECK(r.sources["bias"] == "model_type qwen2");
}

TEST_CASE("config.json olmo-2-1b: the olmo2 placement, SwiGLU, 16 heads and KV heads") {
  const Resolved r = resolve("olmo-2-1b");
  CHECK(r.file.placement == "olmo2");
  CHECK(r.file.placement_source == "config.json:model_type (olmo2 -> olmo2)");
  CHECK(r.model.width == 2048);
  CHECK(r.model.blocks == 16);
  CHECK(r.model.heads == 16);
  CHECK(r.model.kv_head_count() == 16);
  CHECK(r.model.ffn == "swiglu");
  CHECK(r.model.ffn_hidden() == 8192);
  CHECK(r.model.norm_eps == 1e-6);
  CHECK(r.model.rope_theta == 500000.0);
  CHECK(!r.model.bias);
}

TEST_CASE(
    "config.json gemma-2-2b: peri-ln GeGLU (tanh GELU) from hidden_activation, 4 KV heads, head_dim 256 "
    "noted") {
  const Resolved r = resolve("gemma-2-2b");
  CHECK(r.file.placement == "peri-ln");
  CHECK(r.model.width == 2304);
  CHECK(r.model.blocks == 26);
  CHECK(r.model.heads == 8);
  CHECK(r.model.kv_head_count() == 4);
  CHECK(r.model.ffn == "geglu_tanh");  // gelu_pytorch_tanh
  CHECK(r.model.ffn_hidden() == 9216);
  CHECK(r.model.rope_theta == 10000.0);
  CHECK(r.sources["ffn"] == "config.json:hidden_activation");
  CHECK(has_note(r.file, "head_dim 256 differs from hidden_size / num_attention_heads = 288"));
  CHECK(std::count(r.file.unused.begin(), r.file.unused.end(), "query_pre_attn_scalar") == 1);
}

TEST_CASE("config.json: a flag given keeps its value and is named as the source") {
  const ModelConfigFile file = read_model_config_file(shipped("llama-3.2-1b"), "llama", false);
  ModelConfig model;
  model.blocks = 128;
  const auto sources =
      apply_model_config_file(file, model, [](std::string_view flag) { return flag == "--depth"; });
  CHECK(model.blocks == 128);
  CHECK(model.width == 2048);
  CHECK(sources["blocks"] == "--depth");
  CHECK(sources["width"] == "config.json:hidden_size");
}

TEST_CASE(
    "config.json: an unknown model_type is refused without --arch and read with Llama's names with it") {
  std::string text = shipped("llama-3.2-1b");
  text.replace(text.find("\"llama\""), 7, "\"mymodel\"");
  CHECK_THROWS_WITH_AS(read_model_config_file(text, "c.json", false),
                       doctest::Contains("c.json: model_type \"mymodel\" is not a family gradflow knows"),
                       InputError);
  const ModelConfigFile file = read_model_config_file(text, "c.json", true);
  CHECK(file.placement.empty());
  CHECK(has_note(file, "model_type mymodel is not a known family"));
  ModelConfig model;
  apply_model_config_file(file, model, [](std::string_view) { return false; });
  CHECK(model.ffn == "swiglu");
  CHECK(model.kv_head_count() == 8);
}

// Issue 33: the mixture-of-experts families. The MoE op's row (src/ops/moe.cpp) names the keys that
// choose it and set its options; the family gives the placement, norm and biases as for dense ones.
TEST_CASE("config.json mixtral-8x7b: the MoE FFN with 8 experts, top-2, renormalized gates, GQA") {
  const Resolved r = resolve("mixtral-8x7b");
  CHECK(r.file.placement == "pre-ln");
  CHECK(r.model.width == 4096);
  CHECK(r.model.blocks == 32);
  CHECK(r.model.kv_head_count() == 8);
  CHECK(r.model.ffn == "moe");
  CHECK(r.model.ffn_hidden() == 14336);
  CHECK(std::get<double>(r.model.op_options.at("experts")) == 8);
  CHECK(std::get<double>(r.model.op_options.at("experts_active")) == 2);
  CHECK(
      !r.model.op_options.count("router_gates"));  // Mixtral has no norm_topk_prob: the default, renormalized
  CHECK(r.model.rope_theta == 1000000.0);
  CHECK(!r.model.bias);
  CHECK(r.sources["ffn"] == "config.json:num_local_experts");
  CHECK(r.sources["experts"] == "config.json:num_local_experts");
}

TEST_CASE(
    "config.json olmoe-1b-7b: 64 experts, top-8, softmax gates (norm_topk_prob false), a q/k-norm note") {
  const Resolved r = resolve("olmoe-1b-7b");
  CHECK(r.model.ffn == "moe");
  CHECK(r.model.ffn_hidden() == 1024);
  CHECK(std::get<double>(r.model.op_options.at("experts")) == 64);
  CHECK(std::get<double>(r.model.op_options.at("experts_active")) == 8);
  CHECK(std::get<std::string>(r.model.op_options.at("router_gates")) == "softmax");
  CHECK(r.sources["router_gates"] == "config.json:norm_topk_prob");
  CHECK(has_note(r.file, "OLMoE normalises q and k"));
}

TEST_CASE("config.json qwen1.5-moe-a2.7b: experts of moe_intermediate_size, a gated shared expert, biases") {
  const Resolved r = resolve("qwen1.5-moe-a2.7b");
  CHECK(r.model.ffn == "moe");
  CHECK(r.model.ffn_hidden() == 1408);  // moe_intermediate_size, not intermediate_size 5632
  CHECK(r.sources["ffn_hidden"] == "config.json:moe_intermediate_size");
  CHECK(std::get<double>(r.model.op_options.at("experts")) == 60);
  CHECK(std::get<double>(r.model.op_options.at("experts_active")) == 4);
  CHECK(std::get<double>(r.model.op_options.at("shared_expert_hidden")) == 5632);
  CHECK(r.model.bias);
}

TEST_CASE("config.json MoE: --ffn given wins whole, and a bad expert count names the key") {
  const ModelConfigFile file = read_model_config_file(shipped("mixtral-8x7b"), "m.json", false);
  ModelConfig model;
  model.ffn = "swiglu";  // as --ffn swiglu on the command line
  apply_model_config_file(file, model, [](std::string_view flag) { return flag == "--ffn"; });
  CHECK(model.ffn == "swiglu");
  CHECK(model.op_options.empty());  // the experts apply to the MoE only
  // Qwen-MoE's experts are moe_intermediate_size wide; a dense FFN instead keeps intermediate_size,
  // and the run records no source for the experts' keys it did not use.
  const ModelConfigFile qwen = read_model_config_file(shipped("qwen1.5-moe-a2.7b"), "q.json", false);
  ModelConfig dense;
  dense.ffn = "swiglu";
  const nlohmann::ordered_json sources =
      apply_model_config_file(qwen, dense, [](std::string_view flag) { return flag == "--ffn"; });
  CHECK(dense.ffn_hidden() == 5632);
  CHECK(sources["ffn_hidden"] == "config.json:intermediate_size");
  CHECK(!sources.contains("experts"));
  CHECK(dense.op_options.empty());
  std::string text = shipped("mixtral-8x7b");
  text.replace(text.find("\"num_local_experts\": 8"), 22, "\"num_local_experts\": 0");
  CHECK_THROWS_WITH_AS(
      read_model_config_file(text, "m.json", false),
      doctest::Contains("m.json: num_local_experts must lie in [1, 4096] (it sets --experts)"), InputError);
}
