// The checkpoint analysis's two ways through a sublayer (sublayer_path.hpp): gradflow's graph and
// ops, or decoder.cpp's maths. Layout only here: the graph path transposes nn.Linear's (out, in)
// weights to the ops' (in, out) and hands the norms' learned affines to the graph's norm nodes.
#include "sublayer_path.hpp"

#include <fmt/format.h>

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

// nn.Linear's weight (out, in), y = x W^T, as an op's (in, out), y = x W.
template <typename Scalar>
void transposed(const Mat<Scalar>& weight, Mat<Scalar>& out) {
  out = weight.transpose();
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
    load_sublayer(spec_, store_, sublayer, params_);
    const bool attention = params_.kind == SublayerKind::attn;
    // The ops' weight lists (branch_op.hpp): attention W_Q W_K W_V W_O; the FFN W_1 (activated),
    // W_2 (down) and, gated, W_3 (the linear half): Llama's gate_proj, down_proj, up_proj.
    const std::vector<const Mat<Scalar>*> sources =
        attention ? std::vector<const Mat<Scalar>*>{&params_.w_q, &params_.w_k, &params_.w_v, &params_.w_o}
        : spec_.gated ? std::vector<const Mat<Scalar>*>{&params_.w_gate, &params_.w_down, &params_.w_up}
                      : std::vector<const Mat<Scalar>*>{&params_.w_up, &params_.w_down};
    const std::vector<const Vec<Scalar>*> biases =
        attention ? std::vector<const Vec<Scalar>*>{&params_.b_q, &params_.b_k, &params_.b_v, &params_.b_o}
        : spec_.gated ? std::vector<const Vec<Scalar>*>{&params_.b_gate, &params_.b_down, &params_.b_up}
                      : std::vector<const Vec<Scalar>*>{&params_.b_up, &params_.b_down};
    weights_.resize(sources.size());
    for (std::size_t m = 0; m < sources.size(); ++m) {
      transposed(*sources[m], weights_.matrices[m]);
      weights_.biases[m] = *biases[m];  // empty where the projection has none (Qwen2's o_proj)
    }
    sublayer_ = sublayer;
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

  // The placement's graph of this sublayer, its norm nodes given the family's norms in order:
  // the input norm before the branch, the output norm after it (a missing one is skipped).
  void build_graph() {
    graph_.reset(1);
    arch_.build_sublayer(graph_, sublayer_context());
    gains_.assign(static_cast<std::size_t>(graph_.value_count()), Mat<Scalar>());
    biases_.assign(static_cast<std::size_t>(graph_.value_count()), Mat<Scalar>());
    std::vector<const NormParams<Scalar>*> norms;
    if (params_.input_norm.present()) norms.push_back(&params_.input_norm);
    if (params_.output_norm.present()) norms.push_back(&params_.output_norm);
    std::size_t next = 0;
    for (int index = 0; index < static_cast<int>(graph_.nodes().size()); ++index) {
      if (graph_.nodes()[static_cast<std::size_t>(index)].op != NodeOp::norm) continue;
      if (next == norms.size())
        throw std::logic_error(fmt::format("placement {} has more norms than the {} family's sublayer",
                                           arch_.id, to_string(spec_.family)));
      const auto id = static_cast<std::size_t>(graph_.input_count() + index);
      gains_[id] = norms[next]->gain.transpose();
      if (norms[next]->bias.size() > 0) biases_[id] = norms[next]->bias.transpose();
      ++next;
    }
    if (next != norms.size())
      throw std::logic_error(fmt::format("placement {} has fewer norms than the {} family's sublayer",
                                         arch_.id, to_string(spec_.family)));
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
  SublayerParams<Scalar> params_;
  SublayerWeights<Scalar> weights_, moved_, gradients_;
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
