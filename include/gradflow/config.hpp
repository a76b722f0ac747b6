// The model configuration every analysis starts from, and the closed sets it is made of.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gradflow {

enum class Precision { f32, f64 };
enum class NormKind { rms, layer, dyt };
enum class InitKind { xavier, gpt2, small, normal };
enum class BlockKind { attn_ffn, ffn, attn };
enum class SublayerKind { attn, ffn };
// The feed-forward sublayer: gelu(x W_1) W_2 (Vaswani et al. 2017), or a gated linear unit
// (act(x W_1) * (x W_3)) W_2 with act = SiLU (swiglu) or GELU (geglu) (Shazeer 2020, arXiv 2002.05202).
// gelu_tanh and geglu_tanh take GELU's tanh approximation (Hendrycks & Gimpel 2016, arXiv 1606.08415,
// Sec. 2), the form GPT-2 and Gemma were trained with (transformers' gelu_new, gelu_pytorch_tanh).
enum class FfnKind { gelu, swiglu, geglu, gelu_tanh, geglu_tanh };
// Whether the FFN has a gate x W_3 (every kind but gelu and gelu_tanh).
inline bool ffn_gated(FfnKind kind) {
  return kind != FfnKind::gelu && kind != FfnKind::gelu_tanh;
}
// transformers/activations.py's ACT2FN names of GELU's tanh approximation (gelu_new,
// gelu_pytorch_tanh, gelu_fast, gelu_accurate: one function written four ways); its other gelu*
// names are the erf form.
bool is_tanh_gelu_name(std::string_view activation);
// Whether its GELU is the tanh approximation.
inline bool gelu_tanh_form(FfnKind kind) {
  return kind == FfnKind::gelu_tanh || kind == FfnKind::geglu_tanh;
}
// `rotation` replaces every branch F by a fixed 90-degree rotation within coordinate pairs: the
// idealised branch of the closed forms (as large as its input and orthogonal to it).
enum class BranchKind { model, rotation };
// --update: one optimizer step on probe 0's loss, then the forward pass again (metrics.md, "The
// model update"); none leaves every figure as it is without it.
enum class UpdateRule { none, sgd, adam };

std::string_view to_string(Precision value);
std::string_view to_string(NormKind value);
std::string_view to_string(InitKind value);
std::string_view to_string(BlockKind value);
std::string_view to_string(SublayerKind value);
std::string_view to_string(FfnKind value);
std::string_view to_string(BranchKind value);
std::string_view to_string(UpdateRule value);
// The inverses of to_string; each throws InputError listing the valid names.
BlockKind parse_block_kind(std::string_view name);
NormKind parse_norm_kind(std::string_view name);
InitKind parse_init_kind(std::string_view name);
struct ModelConfig;
// --init NAME or normal:STD (STD defaults to 0.02): sets init and init_std, or throws InputError.
void set_init(ModelConfig& config, std::string_view text);
// The --init text that reproduces config's init ("xavier", "normal:0.02").
std::string init_text(const ModelConfig& config);
Precision parse_precision(std::string_view name);
UpdateRule parse_update_rule(std::string_view name);

// Every norm's default epsilon (RMSNorm and LayerNorm, as in LLaMA's RMSNorm); --norm-eps sets it.
inline constexpr double kNormEps = 1e-6;
// DyT's initial alpha: y = gamma * tanh(alpha * x) (Zhu et al. 2025, arXiv 2503.10622, Sec. 4).
inline constexpr double kDytAlpha = 0.5;
// The FFN's hidden width is this multiple of d (Vaswani et al. 2017).
inline constexpr int kFfnMultiple = 4;

// The value of a placement option (architecture.hpp, PlacementOption): a number or a word.
using OptionValue = std::variant<double, std::string>;

// The placement analyze measures when --arch is not given.
inline constexpr std::string_view kDefaultPlacement = "keel";

struct ModelConfig {
  std::string arch{kDefaultPlacement};
  int blocks = 64;  // --depth: blocks B
  int width = 256;  // d
  int heads = 4;
  int seq = 64;  // T tokens
  BlockKind block = BlockKind::attn_ffn;
  NormKind norm = NormKind::rms;
  InitKind init = InitKind::xavier;
  double init_std = 0.02;  // --init normal:STD: every matrix N(0, STD^2), as HF's initializer_range
  Precision precision = Precision::f32;
  BranchKind branch = BranchKind::model;
  std::uint64_t seed = 0;
  int probes = 1;
  double input_corr = 0.0;
  // The block's ops (issue 19); the defaults are the GPT-2-like block.
  std::string ffn = "gelu";    // --ffn: a word of the branch-op table (branch_op.hpp, FfnWord)
  int ffn_hidden_width = 0;    // --ffn-hidden: the FFN's hidden width; 0 means kFfnMultiple * width
  double rope_theta = 0.0;     // --rope-theta: rotary base (Su et al. 2021); 0 means no rotary embedding
  double rope_fraction = 1.0;  // --rope-fraction: the leading fraction of each head's dims rotated
  int kv_heads = 0;            // --kv-heads: key/value heads (Ainslie et al. 2023); 0 means = heads
  bool bias = false;           // --bias: a bias on every projection, zero at init
  double norm_eps = kNormEps;  // --norm-eps: every norm's epsilon
  // Placement options given by the user (--alpha, --keel-variant, ...), by PlacementOption::key;
  // an absent key means "the placement's own default".
  std::map<std::string, OptionValue, std::less<>> options;
  // The branch ops' options given by the user (--experts, ...), by key (BranchOpRow::options).
  std::map<std::string, OptionValue, std::less<>> op_options;
  // Optional analyses (issue 4); each costs extra passes over the stack.
  bool angles_all = false;      // --angles all: the (S+1)x(S+1) angular-distance matrix over states
  int spectrum = 0;             // --spectrum k: top-k singular values of J_{l->out} per state
  bool exact_jacobian = false;  // --exact-jacobian: the full J_{l->out} per state (tiny configs only)
  // --update, --lr: one optimizer step per learning rate on probe 0's loss (issue 18)
  UpdateRule update = UpdateRule::none;
  std::vector<double> learning_rates;
  // --update-params all: the norms' gains (gamma, 1 at init) take the step too; matrices: only
  // the weight matrices.
  bool update_norm_gains = false;
  int update_count() const {
    return update == UpdateRule::none ? 0 : static_cast<int>(learning_rates.size());
  }

  int sublayers_per_block() const { return block == BlockKind::attn_ffn ? 2 : 1; }
  int sublayers() const { return blocks * sublayers_per_block(); }
  int head_dim() const { return width / heads; }
  int ffn_hidden() const { return ffn_hidden_width > 0 ? ffn_hidden_width : kFfnMultiple * width; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int kv_width() const { return kv_head_count() * head_dim(); }  // the columns of W_K and W_V
  // Dims of each head that rotary embeddings rotate: the leading rope_fraction of head_dim, even;
  // 0 when rope_theta is 0.
  int rotary_dims() const;
  SublayerKind sublayer_kind(int sublayer) const;
  int block_of(int sublayer) const { return sublayer / sublayers_per_block(); }
  // A given option's value; nullopt when it was not given (or is of the other type).
  std::optional<double> number_option(std::string_view key) const;
  std::optional<std::string> word_option(std::string_view key) const;
};

// Largest sizes gradflow accepts, checked before anything is sized from them: every index and
// product below stays far inside 64 bits, and S = 2 B fits an int with room to spare. Real runs
// are limited much earlier by the memory check (estimated_memory_bytes).
inline constexpr int kMaxBlocks = 1 << 24;  // --depth
inline constexpr int kMaxWidth = 1 << 20;   // --width and --ffn-hidden
inline constexpr int kMaxSeq = 1 << 20;     // --seq
inline constexpr int kMaxProbes = 4096;     // --probes

// Throws InputError naming the bad value and the fix; the placements' own options by their
// declarations in `placements`.
class PlacementRegistry;
void validate(const ModelConfig& config, const PlacementRegistry& placements);

// Limits of the optional analyses: beyond them the cost (quadratic in S, or one backward pass
// per output coordinate) is refused up front with an InputError naming the limit.
inline constexpr int kAnglesMaxSublayers = 4096;             // --angles all is O(S^2 T d)
inline constexpr long long kExactJacobianMaxEntries = 4096;  // --exact-jacobian: T * d * streams
inline constexpr int kSpectrumMaxColumns = 64;               // --spectrum k
inline constexpr double kDefaultLearningRate = 1e-3;         // --update without --lr
inline constexpr std::size_t kMaxLearningRates = 16;         // --lr: one stepped forward pass each

// Bytes an analysis of this configuration needs at peak (residual states plus one sublayer's
// working set, and --update's stored cotangents and weight copies), used to refuse up front what
// would not fit. history_streams: how many streams a placement's attend reads (an upper bound is
// fine: every stream of a placement that may read one), whose keys, running sums and backward
// cotangents are kept for every state, and, with --update, each learning rate's stepped history.
// Computed in floating point, so that absurd sizes give a huge estimate, never a wrapped one.
double estimated_memory_bytes(const ModelConfig& config, int stream_count, int history_streams = 0);
// Floating-point operations of one sublayer's forward pass, averaged over the block's sublayers:
// attention's projections (q and the output d x d, k and v d x kv_width), its T x T scores and
// weighted sum, and the FFN's two matrices (three when gated). The unit of analyze's time estimate.
double sublayer_forward_flops(const ModelConfig& config);
// Bytes one finished run's figures take while the report is built (the arrays, their JSON tree
// and text): what each of `--seeds N` runs keeps until the end.
double estimated_result_bytes(const ModelConfig& config, int stream_count);
// Wall seconds one run of this configuration takes on `cores` cores (a model fitted to measured
// runs, good to a factor of about 2): analyze's time note and the SLURM plan's time limits.
double estimated_run_seconds(const ModelConfig& config, int cores);

}  // namespace gradflow
