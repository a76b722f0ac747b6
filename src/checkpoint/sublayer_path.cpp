// The checkpoint analysis's two ways through a sublayer (sublayer_path.hpp): gradflow's graph and
// ops, or decoder.cpp's maths. Layout only here: the graph path transposes nn.Linear's (out, in)
// weights to the ops' (in, out) and hands the norms' learned affines to the graph's norm nodes.
#include "sublayer_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "gradflow/branch_op.hpp"

namespace gradflow::checkpoint {

std::string graph_path_gap(const HfModelSpec& spec, int tokens) {
  if (spec.head_dim * spec.heads != spec.hidden)
    return fmt::format("head_dim {} other than hidden_size / heads", spec.head_dim);
  if (spec.qk_norm) return "q/k norms with learned gains";
  for (const int window : spec.sliding_window)  // a window of T or more keys masks nothing
    if (window > 0 && window < tokens) return fmt::format("a sliding window of {} tokens", window);
  if (spec.attn_softcap > 0 || spec.final_softcap > 0) return "logit soft-capping";
  if (spec.gain_offset) return "norm gains stored as 1 + w";
  if (std::abs(spec.attention_scale * std::sqrt(static_cast<double>(spec.head_dim)) - 1.0) > 1e-12)
    return "an attention scale other than head_dim^-1/2";
  if (!spec.input_norms || spec.output_norms) return "norms other than one before each sublayer";
  return {};
}

namespace {

// The analysis's sublayers through decoder.cpp (families the ops do not cover yet).
template <typename Scalar>
class DecoderSublayers final : public SublayerPath<Scalar> {
 public:
  using ByKind = typename SublayerPath<Scalar>::ByKind;
  DecoderSublayers(const HfModelSpec& spec, const TensorStore& store, int tokens)
      : spec_(spec), store_(store), rotary_(rotary_tables<Scalar>(spec, tokens)) {}

  void load(int sublayer) override { load_sublayer(spec_, store_, sublayer, params_); }
  void forward(const Mat<Scalar>& x, Mat<Scalar>& x_out, Mat<Scalar>& update) override {
    sublayer_forward(spec_, rotary_, params_, x, cache_, x_out);
    update = cache_.update;
  }
  double backward(const Mat<Scalar>& d_out, Mat<Scalar>& d_in, Mat<Scalar>& d_branch) override {
    sublayer_backward(spec_, rotary_, params_, cache_, d_out, d_in, &d_branch, &grads_, false);
    return grads_.squared_norm;
  }
  void matrix_gradients(const Mat<Scalar>& d_out) override {
    sublayer_backward<Scalar>(spec_, rotary_, params_, cache_, d_out, scratch_, nullptr, &grads_, true);
  }
  ByKind matrices() override { return by_kind(params_); }
  ByKind gradients() override {
    return by_kind_of(grads_.w_q, grads_.w_k, grads_.w_v, grads_.w_o, grads_.w_gate, grads_.w_up,
                      grads_.w_down);
  }
  void stepped_forward(const std::array<const Mat<Scalar>*, kMatrixKindCount>& step, const Mat<Scalar>& x,
                       Mat<Scalar>& x_out) override {
    moved_ = params_;
    const ByKind targets = by_kind(moved_);
    for (int m = 0; m < kMatrixKindCount; ++m)
      if (targets[m] && step[m]) *targets[m] += *step[m];
    sublayer_forward(spec_, rotary_, moved_, x, moved_cache_, x_out);
  }

 private:
  // kMatrixKinds' order; the MLP's gate is w_1 (the activated one, as in analyze's gated FFN), up
  // w_3 (w_1 when ungated), down w_2.
  ByKind by_kind_of(Mat<Scalar>& q, Mat<Scalar>& k, Mat<Scalar>& v, Mat<Scalar>& o, Mat<Scalar>& gate,
                    Mat<Scalar>& up, Mat<Scalar>& down) const {
    const auto present = [](Mat<Scalar>& m) { return m.size() > 0 ? &m : nullptr; };
    if (spec_.gated)
      return {present(q), present(k), present(v), present(o), present(gate), present(down), present(up)};
    return {present(q), present(k), present(v), present(o), present(up), present(down), nullptr};
  }
  ByKind by_kind(SublayerParams<Scalar>& p) const {
    return by_kind_of(p.w_q, p.w_k, p.w_v, p.w_o, p.w_gate, p.w_up, p.w_down);
  }

  const HfModelSpec& spec_;
  const TensorStore& store_;
  const Rotary<Scalar> rotary_;
  SublayerParams<Scalar> params_, moved_;
  SublayerCache<Scalar> cache_, moved_cache_;
  SublayerGradients<Scalar> grads_;
  Mat<Scalar> scratch_;
};

// Rows of an nn.Linear weight read at a time: a tile of 64 x in values (512 KB at in = 2048 in f32).
constexpr Eigen::Index kTileRows = 64;
// The transpose goes through square blocks of this side held in a local buffer, so that both the
// tile's rows and W's rows are walked contiguously: 3x faster than an element-wise transpose at
// 8192 x 2048 (19 against 62 ms on this machine's EPYC).
constexpr int kBlock = 16;

// out(c, r) = tile(r, c) for the block at (r0, c0) of at most kBlock x kBlock.
template <typename Scalar>
void transpose_block(const Mat<Scalar>& tile, Eigen::Index r0, Eigen::Index c0, Eigen::Index first,
                     Mat<Scalar>& out) {
  const Eigen::Index rows = std::min<Eigen::Index>(kBlock, tile.rows() - r0);
  const Eigen::Index cols = std::min<Eigen::Index>(kBlock, tile.cols() - c0);
  Scalar buffer[kBlock][kBlock];
  for (Eigen::Index r = 0; r < rows; ++r)
    for (Eigen::Index c = 0; c < cols; ++c) buffer[c][r] = tile(r0 + r, c0 + c);
  for (Eigen::Index c = 0; c < cols; ++c)
    std::copy(buffer[c], buffer[c] + rows, out.data() + (c0 + c) * out.cols() + first + r0);
}

// nn.Linear's weight `name`, (out, in) in the file with y = x W^T, into an op's layout (in, out)
// with y = x W: kTileRows rows at a time, read, converted and written transposed into W's columns,
// so that the file's layout is never held whole beside W. The tiles are the pool's pieces (each
// writes its own columns; a damaged tensor's error is the lowest tile's, as on one thread).
template <typename Scalar>
void read_transposed(const TensorStore& store, const std::string& name, Mat<Scalar>& out, WorkPool* pool) {
  const auto shape = store.shape(name);
  const Eigen::Index rows = shape[0], cols = shape[1];
  out.resize(cols, rows);
  const auto tiles = static_cast<int>((rows + kTileRows - 1) / kTileRows);
  for_each_piece(pool, tiles, [&](int piece) {
    thread_local Mat<Scalar> tile;  // a tile of scratch per thread
    const Eigen::Index first = piece * kTileRows, count = std::min(kTileRows, rows - first);
    tile.resize(count, cols);
    store.read_rows(name, first, count, tile.data());
    for (Eigen::Index c0 = 0; c0 < cols; c0 += kBlock)
      for (Eigen::Index r0 = 0; r0 < count; r0 += kBlock) transpose_block(tile, r0, c0, first, out);
  });
}

// A GPT-2 Conv1D weight, stored (in, out) as the ops take it.
template <typename Scalar>
void read_as_stored(const TensorStore& store, const std::string& name, Mat<Scalar>& out) {
  const auto shape = store.shape(name);
  out.resize(shape[0], shape[1]);
  store.read_rows(name, 0, shape[0], out.data());
}

template <typename Scalar>
void read_vector(const TensorStore& store, const std::string& name, Vec<Scalar>& out) {
  out.resize(store.shape(name)[0]);
  store.read_rows(name, 0, out.size(), out.data());
}

// A norm's gain (and LayerNorm's bias) as the graph's norm node takes them, (1, d).
template <typename Scalar>
void read_norm(const HfModelSpec& spec, const TensorStore& store, const std::string& base, Mat<Scalar>& gain,
               Mat<Scalar>& bias) {
  Vec<Scalar> values;
  read_vector(store, base + ".weight", values);
  gain = values.transpose();
  if (spec.layer_norm) {
    read_vector(store, base + ".bias", values);
    bias = values.transpose();
  } else {
    bias.resize(0, 0);
  }
}

// The analysis's sublayers through the family's placement graph and the ops (attention, the FFN),
// on a WorkPool: the same code, kernels and threads as an init run.
template <typename Scalar>
class GraphSublayers final : public SublayerPath<Scalar> {
 public:
  using ByKind = typename SublayerPath<Scalar>::ByKind;
  GraphSublayers(const HfModelSpec& spec, const ModelConfig& config, const Architecture& arch,
                 const TensorStore& store, int threads)
      : spec_(spec),
        config_(config),
        arch_(arch),
        store_(store),
        constants_(resolve_constants(arch, config)) {
    if (threads >= 2) pool_ = std::make_unique<WorkPool>(threads);
  }

  void load(int sublayer) override {
    sublayer_ = sublayer;
    if (spec_.family == HfFamily::gpt2) {
      read_gpt2();
    } else {
      read_llama();
    }
    build_graph();
  }

  void forward(const Mat<Scalar>& x, Mat<Scalar>& x_out, Mat<Scalar>& update) override {
    inputs_.assign(1, x);
    executor_.forward(graph_, inputs_, context(weights_));
    x_out = executor_.value(graph_.outputs().front());
    update = executor_.value(graph_.update_id());
  }

  double backward(const Mat<Scalar>& d_out, Mat<Scalar>& d_in, Mat<Scalar>& d_branch) override {
    d_outputs_.assign(1, d_out);
    const BranchContext<Scalar> branch = context(weights_);
    executor_.backward(graph_, d_outputs_, false, branch, d_inputs_);  // the skip path's share
    skip_ = d_inputs_.front();
    ParamGradSquares squares;
    executor_.backward(graph_, d_outputs_, true, branch, d_inputs_, &squares);
    d_in = d_inputs_.front();
    d_branch = d_in - skip_;
    return squares.empty() ? 0.0 : squares.front();
  }

  void matrix_gradients(const Mat<Scalar>& d_out) override {
    d_outputs_.assign(1, d_out);
    const BranchContext<Scalar> branch = context(weights_);
    executor_.backward_to_branch_weights(graph_, d_outputs_, branch);
    executor_.weight_gradients(graph_, branch, gradients_);
  }
  ByKind matrices() override { return by_kind(weights_); }
  ByKind gradients() override { return by_kind(gradients_); }

  void stepped_forward(const std::array<const Mat<Scalar>*, kMatrixKindCount>& step, const Mat<Scalar>& x,
                       Mat<Scalar>& x_out) override {
    moved_ = weights_;
    const ByKind targets = by_kind(moved_);
    for (int m = 0; m < kMatrixKindCount; ++m)
      if (targets[m] && step[m]) *targets[m] += *step[m];
    inputs_.assign(1, x);
    executor_.forward(graph_, inputs_, context(moved_));
    x_out = executor_.value(graph_.outputs().front());
  }

 private:
  SublayerContext sublayer_context() const {
    return SublayerContext{
        config_, constants_, sublayer_, config_.block_of(sublayer_), config_.sublayer_kind(sublayer_), 1.0};
  }

  bool attention() const { return sublayer_ % 2 == 0; }

  // Llama, Mistral, Qwen2 (modeling_llama.py, modeling_qwen2.py): the input norm, then the
  // projections; the ops' weight lists (branch_op.hpp) are attention's W_Q W_K W_V W_O and the FFN's
  // W_1 (activated: gate_proj), W_2 (down_proj), W_3 (the linear half: up_proj).
  void read_llama() {
    const std::string layer = fmt::format("model.layers.{}.", sublayer_ / 2);
    read_norm(spec_, store_, layer + (attention() ? "input_layernorm" : "post_attention_layernorm"),
              input_gain_, input_bias_);
    const std::vector<std::string> names =
        attention() ? std::vector<std::string>{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                               "self_attn.o_proj"}
                    : std::vector<std::string>{"mlp.gate_proj", "mlp.down_proj", "mlp.up_proj"};
    const bool bias = attention() ? spec_.qkv_bias || spec_.o_bias : spec_.mlp_bias;
    weights_.resize(names.size());
    for (std::size_t m = 0; m < names.size(); ++m) {
      read_transposed(store_, layer + names[m] + ".weight", weights_.matrices[m], pool_.get());
      // Qwen2: biases on q, k and v, none on o (empty: the op adds none and counts none)
      const bool has_bias =
          bias && (!attention() || (m == static_cast<std::size_t>(kWeightO) ? spec_.o_bias : spec_.qkv_bias));
      if (has_bias) {
        read_vector(store_, layer + names[m] + ".bias", weights_.biases[m]);
      } else {
        weights_.biases[m].resize(0);
      }
    }
  }

  // GPT-2 (modeling_gpt2.py): ln_1 / ln_2, Conv1D weights stored (in, out) as the ops take them;
  // c_attn's output columns are [q | k | v].
  void read_gpt2() {
    const std::string layer = fmt::format("{}h.{}.", spec_.tensor_prefix, sublayer_ / 2);
    read_norm(spec_, store_, layer + (attention() ? "ln_1" : "ln_2"), input_gain_, input_bias_);
    if (attention()) {
      const Eigen::Index d = spec_.hidden;
      read_as_stored(store_, layer + "attn.c_attn.weight", tile_);
      Vec<Scalar> fused_bias;
      read_vector(store_, layer + "attn.c_attn.bias", fused_bias);
      weights_.resize(kAttentionWeights);
      for (int m = 0; m < 3; ++m) {
        weights_.matrices[m] = tile_.middleCols(m * d, d);
        weights_.biases[m] = fused_bias.segment(m * d, d);
      }
      read_as_stored(store_, layer + "attn.c_proj.weight", weights_.matrices[kWeightO]);
      read_vector(store_, layer + "attn.c_proj.bias", weights_.biases[kWeightO]);
      return;
    }
    weights_.resize(2);
    read_as_stored(store_, layer + "mlp.c_fc.weight", weights_.matrices[kWeightUp]);
    read_vector(store_, layer + "mlp.c_fc.bias", weights_.biases[kWeightUp]);
    read_as_stored(store_, layer + "mlp.c_proj.weight", weights_.matrices[kWeightDown]);
    read_vector(store_, layer + "mlp.c_proj.bias", weights_.biases[kWeightDown]);
  }

  // The placement's graph of this sublayer, its one norm node (pre-ln's, before the branch) given
  // the family's input norm.
  void build_graph() {
    graph_.reset(1);
    arch_.build_sublayer(graph_, sublayer_context());
    gains_.resize(static_cast<std::size_t>(graph_.value_count()));
    biases_.resize(static_cast<std::size_t>(graph_.value_count()));
    int norms = 0;
    for (int index = 0; index < static_cast<int>(graph_.nodes().size()); ++index) {
      const auto id = static_cast<std::size_t>(graph_.input_count() + index);
      gains_[id].resize(0, 0);
      biases_[id].resize(0, 0);
      if (graph_.nodes()[static_cast<std::size_t>(index)].op != NodeOp::norm) continue;
      gains_[id] = input_gain_;
      biases_[id] = input_bias_;
      ++norms;
    }
    if (norms != 1)
      throw std::logic_error(fmt::format("placement {} has {} norms in a sublayer; the {} family has one",
                                         arch_.id, norms, to_string(spec_.family)));
  }

  BranchContext<Scalar> context(const SublayerWeights<Scalar>& weights) const {
    BranchContext<Scalar> branch;
    branch.kind = config_.sublayer_kind(sublayer_);
    branch.branch = BranchKind::model;
    branch.norm = config_.norm;
    branch.heads = config_.heads;
    branch.weights = &weights;
    branch.pool = pool_.get();
    branch.ops = block_ops(config_);
    branch.ops.rope_scaling = spec_.rope_frequencies();
    branch.norm_gains = &gains_;
    branch.norm_biases = &biases_;
    return branch;
  }

  ByKind by_kind(SublayerWeights<Scalar>& w) const {
    ByKind out{};
    const int first = config_.sublayer_kind(sublayer_) == SublayerKind::attn ? 0 : 4;
    for (std::size_t m = 0; m < w.matrices.size(); ++m)
      out[static_cast<std::size_t>(first) + m] = w.matrices[m].size() > 0 ? &w.matrices[m] : nullptr;
    return out;
  }

  const HfModelSpec& spec_;
  const ModelConfig& config_;
  const Architecture& arch_;
  const TensorStore& store_;
  const Constants constants_;
  std::unique_ptr<WorkPool> pool_;
  int sublayer_ = 0;
  SublayerWeights<Scalar> weights_, moved_, gradients_;
  Mat<Scalar> input_gain_, input_bias_, tile_;
  std::vector<Mat<Scalar>> gains_, biases_;
  SublayerGraph graph_;
  GraphExecutor<Scalar> executor_;
  std::vector<Mat<Scalar>> inputs_, d_outputs_, d_inputs_;
  Mat<Scalar> skip_;
};

}  // namespace

template <typename Scalar>
std::unique_ptr<SublayerPath<Scalar>> make_graph_sublayers(const HfModelSpec& spec, const ModelConfig& config,
                                                           const Architecture& arch, const TensorStore& store,
                                                           int threads) {
  return std::make_unique<GraphSublayers<Scalar>>(spec, config, arch, store, threads);
}

template <typename Scalar>
std::unique_ptr<SublayerPath<Scalar>> make_decoder_sublayers(const HfModelSpec& spec,
                                                             const TensorStore& store, int tokens) {
  return std::make_unique<DecoderSublayers<Scalar>>(spec, store, tokens);
}

#define GRADFLOW_INSTANTIATE_SUBLAYER_PATH(Scalar)                                                  \
  template std::unique_ptr<SublayerPath<Scalar>> make_graph_sublayers<Scalar>(                      \
      const HfModelSpec&, const ModelConfig&, const Architecture&, const TensorStore&, int);        \
  template std::unique_ptr<SublayerPath<Scalar>> make_decoder_sublayers<Scalar>(const HfModelSpec&, \
                                                                                const TensorStore&, int);
GRADFLOW_INSTANTIATE_SUBLAYER_PATH(float)
GRADFLOW_INSTANTIATE_SUBLAYER_PATH(double)

}  // namespace gradflow::checkpoint
