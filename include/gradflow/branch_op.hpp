// The branch ops as one table: each row is an op a sublayer's branch F can be (attention, the
// FFN), with its weights as a list of named tensors, its cost, and a maker for its forward,
// backward, JVP and weight gradients. The graph (graph.cpp), the initialisation
// (initialization.cpp), --update's step (science/update.cpp) and the estimates (config.cpp) read
// the table, so a new op is its own file plus one row in src/ops/branch_ops.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gradflow/config.hpp"
#include "gradflow/ops.hpp"
#include "gradflow/option.hpp"

namespace gradflow {

// The block's ops as --ffn, --kv-heads, --rope-theta/--rope-fraction, --norm-eps and the ops' own
// options set them.
struct BlockOps {
  std::string_view ffn_op = "ffn";  // the name of the row serving FFN sublayers (--ffn's word picks it)
  FfnKind ffn = FfnKind::gelu;      // the activation of that op's FFNs (--ffn's word sets it)
  int kv_heads = 0;                 // 0: = heads
  double rope_theta = 0.0;
  int rotary_dims = 0;             // 0: no rotary embedding
  RopeFrequencies rope_scaling{};  // a trained model's rescaled frequencies (none at init)
  double norm_eps = kNormEps;
  // The FFN op's own options (BranchOpRow::options) by key, each as given or else its default.
  std::map<std::string, OptionValue, std::less<>> options;
  double number(std::string_view key) const;  // throws std::logic_error for an undeclared key
  const std::string& word(std::string_view key) const;
};
BlockOps block_ops(const ModelConfig& config);

// What an op reads besides its input and weights: the block's ops and the placement's options
// for this sublayer's branch (SublayerGraph::branch). Each op uses the options of its kind only.
struct BranchSettings {
  int heads = 1;
  BlockOps ops{};
  QkvNorm qkv_norm = QkvNorm::none;   // attention: q/k/v normalisation
  std::optional<double> score_scale;  // attention: the softmax scale; unset = 1/sqrt(head_dim)
  double hidden_scale = 1.0;          // FFN: the scale of the hidden pre-activations (nGPT's s_uv)
};

// One weight of an op, y = x W (+ b) with W (rows, cols) = (fan_in, fan_out).
struct WeightSpec {
  std::string name;      // the exported tensor's name ("W_Q"); its bias is "b_" + name.substr(2)
  WeightMatrix role;     // base init's rule and the placement's gain (architectures.md), step_rel's kind
  std::uint64_t stream;  // the weight's random stream within its sublayer (rng.hpp, RandomUse::weight)
  Eigen::Index rows = 0, cols = 0;
};

// An op's cost per sublayer, for the estimates (config.cpp).
struct BranchCost {
  double forward_flops = 0;  // one forward pass over the T tokens
  double probe_scalars = 0;  // working values per probe carried through the op, beyond (T, d) ones
  double fixed_scalars = 0;  // working values that do not grow with the probes
};

// An op's computation with its cache. The arguments are those of the op's free functions in
// ops.hpp (attention_forward, ffn_forward, ...), which document them.
template <typename Scalar>
class BranchOp {
 public:
  virtual ~BranchOp() = default;
  virtual void forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
                       Mat<Scalar>& out, WorkPool* pool, bool with_output) = 0;
  virtual void backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const BranchSettings& settings, const Mat<Scalar>& d_out, Mat<Scalar>* dx,
                        ParamGradSquares* param_grads, WorkPool* pool, std::vector<double>* output_dots) = 0;
  virtual void jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
                   const Mat<Scalar>& d_x, Mat<Scalar>& d_out, const SublayerWeights<Scalar>* d_w) = 0;
  // After backward (dx = nullptr) of one probe: dL/dW for every weight, and dL/db with `bias`.
  virtual void weight_gradients(const Mat<Scalar>& x, const BranchSettings& settings,
                                const Mat<Scalar>& d_out, SublayerWeights<Scalar>& gradients, bool bias,
                                WorkPool* pool) const = 0;
};

// A word --ffn takes, naming an FFN op and the activation of its FFNs ("swiglu": the FFN op
// with SiLU gates; "moe": the mixture of experts with SwiGLU experts).
struct FfnWord {
  std::string_view word;
  FfnKind activation;
  std::string_view help;  // for --help: "swiglu (gated, SiLU; a third matrix W_3)"
};

// A config.json key an op reads (model_config_file.hpp): when a file has any of `names` (the
// first one present wins), the FFN is this op and the value sets `option`, one of the row's
// options, or "ffn_hidden" (--ffn-hidden). A word option maps a JSON boolean to `if_true`/`if_false`.
struct ConfigJsonKey {
  std::string_view option;
  std::vector<std::string_view> names;
  std::string_view if_true, if_false;
};

struct BranchOpRow {
  std::string_view name;
  // Whether this op is the branch of a sublayer of `kind` under the block's ops.
  bool (*serves)(SublayerKind kind, const BlockOps& ops);
  // An FFN op: the --ffn words that choose it (the first one is its default activation's).
  std::vector<FfnWord> ffn_words = {};
  // Its own settings (--experts, ...): flags of analyze and sweep, checked by validate(), given
  // values in ModelConfig::op_options, and written to each run's "config" while the op is in use.
  std::vector<PlacementOption> options = {};
  // Checks across its options and the model (e.g. top-k at most the expert count) when in use;
  // throws InputError naming the value and the fix. May be null.
  void (*check)(const ModelConfig& config) = nullptr;
  // config.json keys that choose this op and set its options (empty: the file cannot choose it).
  std::vector<ConfigJsonKey> config_json = {};
  // The weights in SublayerWeights' order, each drawn by base init (initialization.cpp).
  std::vector<WeightSpec> (*weights)(const ModelConfig& config);
  BranchCost (*cost)(const ModelConfig& config);
  std::unique_ptr<BranchOp<float>> (*make_float)();
  std::unique_ptr<BranchOp<double>> (*make_double)();
  template <typename Scalar>
  std::unique_ptr<BranchOp<Scalar>> make() const {
    if constexpr (std::is_same_v<Scalar, float>) {
      return make_float();
    } else {
      return make_double();
    }
  }
};

// The rows (src/ops/branch_ops.cpp): attention, the FFN, the mixture of experts.
const std::vector<BranchOpRow>& branch_ops();
// The row serving a sublayer of `kind` (its index in branch_ops()); throws std::logic_error if none.
int branch_op_index(SublayerKind kind, const BlockOps& ops);
inline const BranchOpRow& branch_op(SublayerKind kind, const BlockOps& ops) {
  return branch_ops()[static_cast<std::size_t>(branch_op_index(kind, ops))];
}
inline const BranchOpRow& branch_op(const ModelConfig& config, SublayerKind kind) {
  return branch_op(kind, block_ops(config));
}

// The row whose ffn_words hold `word`, or nullptr.
const BranchOpRow* ffn_op_by_word(std::string_view word);
// Every --ffn word in table order, and every op option once (by key): the flags analyze and sweep take.
std::vector<const FfnWord*> ffn_words();
std::vector<const PlacementOption*> op_options();
// The row declaring op option `key` and its declaration, or {nullptr, nullptr}.
std::pair<const BranchOpRow*, const PlacementOption*> op_option(std::string_view key);
// Refuses (InputError) a --ffn word no row takes, an op option's bad value, an option of an op not
// in use ("--experts applies to --ffn moe"), and what the op in use's check() refuses.
void validate_op_options(const ModelConfig& config);

// The ops' rows, defined in their own files.
BranchOpRow attention_op_row();
BranchOpRow ffn_op_row();
BranchOpRow moe_op_row();

}  // namespace gradflow
