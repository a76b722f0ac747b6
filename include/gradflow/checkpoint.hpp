// Trained Hugging Face checkpoints (issue 28): the decoder a config.json describes, as its family's
// Hugging Face implementation computes it, and the analysis of the language-model loss through it.
// Pure: the tensors come through the TensorStore interface (src/checkpoint/checkpoint_files.cpp
// reads them from safetensors files); nothing here opens a file.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/analysis.hpp"
#include "gradflow/config.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

// The families whose modeling code gradflow reproduces (transformers/models/<family>/modeling_*.py).
enum class HfFamily { llama, mistral, qwen2, olmo2, gpt2, gemma2 };
// The MLP's activation (transformers/activations.py): silu; gelu (erf); gelu_tanh (gelu_new,
// gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
enum class HfActivation { silu, gelu, gelu_tanh };
std::string_view to_string(HfFamily value);
std::string_view to_string(LossKind value);
LossKind parse_loss_kind(std::string_view name);

// One tensor a family's checkpoint must hold (or may hold), with the shape the config implies.
struct ExpectedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};

// What a config.json describes, in the terms of its family's Hugging Face implementation.
struct HfModelSpec {
  std::string model_type;
  HfFamily family = HfFamily::llama;
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  int max_positions = 0;  // 0: unbounded (rotary families without max_position_embeddings)
  double norm_eps = 1e-6;
  bool layer_norm = false;    // GPT-2: LayerNorm with bias; the others RMSNorm
  bool gain_offset = false;   // Gemma-2: RMSNorm scales by (1 + w)
  bool input_norms = true;    // a norm before each sublayer (all but OLMo-2)
  bool output_norms = false;  // a norm on each sublayer's output before the add (OLMo-2, Gemma-2)
  bool qk_norm = false;       // OLMo-2: RMSNorm over the whole q and k projections
  bool qkv_bias = false;      // biases on q, k, v (Qwen2; Llama's attention_bias; GPT-2)
  bool o_bias = false;        // a bias on the output projection (Llama's attention_bias; GPT-2)
  bool mlp_bias = false;      // biases on the MLP's projections (Llama's mlp_bias; GPT-2)
  bool gated = true;          // down(act(gate(x)) * up(x)); GPT-2: c_proj(act(c_fc(x)))
  HfActivation activation = HfActivation::silu;
  bool position_embedding = false;  // GPT-2's learned wpe
  double embedding_scale = 1.0;     // Gemma-2: sqrt(hidden_size)
  double rope_theta = 0.0;          // 0: no rotary embedding (GPT-2)
  int rotary_dims = 0;              // dims of each head rotated (partial_rotary_factor)
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_positions = 8192;
  double attention_scale = 1.0;     // on q k^T: head_dim^-1/2 (Gemma-2: query_pre_attn_scalar^-1/2)
  double attn_softcap = 0.0;        // Gemma-2: scores = c tanh(scores / c); 0: none
  double final_softcap = 0.0;       // Gemma-2: logits = c tanh(logits / c); 0: none
  std::vector<int> sliding_window;  // per layer: keys within this many positions; 0: all earlier
  bool tied = false;                // the LM head is the token embedding
  std::string tensor_prefix;        // GPT-2 checkpoints: "" (the hub's gpt2) or "transformer."

  int sublayers() const { return 2 * layers; }
  // The rotary frequencies' rescaling as the rotary op takes it (ops.hpp, RopeFrequencies).
  RopeFrequencies rope_frequencies() const {
    return {rope_scaling, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
            rope_original_max_positions};
  }
  int q_width() const { return heads * head_dim; }
  int kv_width() const { return kv_heads * head_dim; }
};

// Reads config.json (`origin` names it in messages). Throws InputError naming the key for a
// missing or impossible value, an unsupported model_type or rope_scaling.
HfModelSpec read_hf_model_spec(const nlohmann::ordered_json& config, std::string_view origin);
// The tensors the checkpoint must hold, in the order a layer-by-layer pass reads them. The GPT-2
// prefix is chosen by the caller from the names present (spec.tensor_prefix).
std::vector<ExpectedTensor> expected_tensors(const HfModelSpec& spec);
// Tensors a checkpoint may hold that the forward does not read (GPT-2's causal-mask buffers,
// old rotary inv_freq buffers, a tied model's saved lm_head).
bool ignorable_tensor(const HfModelSpec& spec, std::string_view name);
// The gradflow configuration that describes this model (for the report): width, depth in
// blocks, heads, KV heads, FFN, norm, RoPE, biases, epsilon; seq and precision as given.
ModelConfig model_config_of(const HfModelSpec& spec, int tokens, Precision precision, std::uint64_t seed);
// The placement the family's block is (pre-ln, olmo2, peri-ln), a registry id.
std::string_view family_placement(HfFamily family);

// The checkpoint's tensors, converted on request. Rows are the first dimension (1-D tensors
// are one row); the values are written row-major into `out`. Implementations validate names,
// shapes and values (a NaN or infinite entry is an InputError naming the tensor) and hold nothing
// of a tensor after the call, so that a pass over the model holds one sublayer's weights.
class TensorStore {
 public:
  virtual ~TensorStore() = default;
  virtual void read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                         float* out) const = 0;
  virtual void read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                         double* out) const = 0;
  virtual std::vector<std::int64_t> shape(const std::string& name) const = 0;
};

struct CheckpointRun {
  HfModelSpec spec;
  ModelConfig config;  // model_config_of(spec, ...), with update options
  std::vector<std::int64_t> tokens;
  bool random_tokens = false;
  LossKind loss = LossKind::lm;
  // The family's placement (family_placement, resolved by the caller): the sublayers then run
  // through its graph and gradflow's ops on `threads` threads where the ops have every convention
  // of the family (checkpoint_graph_gap); else through the checkpoint decoder, on one thread.
  const Architecture* arch = nullptr;
  int threads = 1;
};

// Empty when a checkpoint of this spec runs through the placement graph and the ops at T tokens
// (issue 47); else the first convention of its family the ops do not have yet.
std::string checkpoint_graph_gap(const HfModelSpec& spec, int tokens);

// Analyses the model on one sequence: forward (states x_0..x_S stored, weights read layer by
// layer), the backward from the loss (weights read again), every per-state and per-sublayer
// figure the checkpoint supports, and --update's step. Returns the seed's result with its
// CheckpointFigures (SeedResult::checkpoint); `progress` as for analyze_seed.
SeedResult analyze_checkpoint(const CheckpointRun& run, const TensorStore& tensors,
                              const ProgressCallback& progress = {});

// The loss of the checkpoint's forward in float64, and its gradient with respect to x_0 (T, d):
// what finite-difference tests compare against. `x0` replaces the embedding output when given.
InputGradient checkpoint_loss_and_input_gradient(const CheckpointRun& run, const TensorStore& tensors,
                                                 const Eigen::MatrixXd* x0 = nullptr);

// Bytes the analysis holds at peak: the stored states and their gradients, one sublayer's
// weights and working set (with --update, a stepped copy per learning rate), the logits, and the
// mapped pages of the largest tensor (`largest_tensor_file_bytes`, its size in the file).
double checkpoint_memory_bytes(const HfModelSpec& spec, const ModelConfig& config, LossKind loss,
                               double largest_tensor_file_bytes);

}  // namespace gradflow
