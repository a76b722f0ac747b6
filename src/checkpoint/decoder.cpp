// The Hugging Face families' decoder layers as forward/backward pairs (decoder.hpp). Each
// convention cites the modeling file it comes from (transformers/models/<family>/modeling_*.py).
#include "decoder.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numbers>

namespace gradflow::checkpoint {

namespace {

// ---------------------------------------------------------------------------------------------
// Reading parameters

template <typename Scalar>
Mat<Scalar> read_matrix(const TensorStore& store, const std::string& name) {
  const auto shape = store.shape(name);
  Mat<Scalar> m(shape[0], shape.size() > 1 ? shape[1] : 1);
  store.read_rows(name, 0, shape[0], m.data());
  return m;
}
template <typename Scalar>
Vec<Scalar> read_vector(const TensorStore& store, const std::string& name) {
  const auto shape = store.shape(name);
  Vec<Scalar> v(shape[0]);
  store.read_rows(name, 0, shape[0], v.data());
  return v;
}
// A norm's gain (Gemma2RMSNorm: 1 + w) and LayerNorm's bias.
template <typename Scalar>
NormParams<Scalar> read_norm(const HfModelSpec& spec, const TensorStore& store, const std::string& base) {
  NormParams<Scalar> norm;
  norm.gain = read_vector<Scalar>(store, base + ".weight");
  if (spec.gain_offset) norm.gain.array() += Scalar(1);
  if (spec.layer_norm) norm.bias = read_vector<Scalar>(store, base + ".bias");
  return norm;
}

// ---------------------------------------------------------------------------------------------
// Norms, row by row: y = n(x) * gain + bias, n(x) = x r (RMSNorm, Zhang & Sennrich 2019) or
// (x - mean) r (LayerNorm, Ba et al. 2016), r = 1 / sqrt(mean(x^2) or var + eps).

template <typename Scalar>
void norm_forward(bool layer, double eps, const Mat<Scalar>& x, const NormParams<Scalar>& p, Mat<Scalar>& y,
                  Mat<Scalar>& n, Vec<Scalar>& inv) {
  const Eigen::Index rows = x.rows(), cols = x.cols();
  n.resize(rows, cols);
  inv.resize(rows);
  for (Eigen::Index t = 0; t < rows; ++t) {
    auto row = x.row(t).array();
    const Scalar mean = layer ? row.mean() : Scalar(0);
    const Scalar second = (row - mean).square().mean();
    inv[t] = Scalar(1) / std::sqrt(second + static_cast<Scalar>(eps));
    n.row(t) = (row - mean) * inv[t];
  }
  y = n.array().rowwise() * p.gain.transpose().array();
  if (p.bias.size() > 0) y.array().rowwise() += p.bias.transpose().array();
}

// dx += d n(x)^T (dy * gain): RMS: r (dn - n mean(dn n)); Layer: r (dn - mean(dn) - n mean(dn n)).
template <typename Scalar>
void norm_backward(bool layer, const Mat<Scalar>& n, const Vec<Scalar>& inv, const NormParams<Scalar>& p,
                   const Mat<Scalar>& dy, Mat<Scalar>& dx) {
  const Mat<Scalar> dn = dy.array().rowwise() * p.gain.transpose().array();
  for (Eigen::Index t = 0; t < n.rows(); ++t) {
    const Scalar projection = (dn.row(t).array() * n.row(t).array()).mean();
    const Scalar shift = layer ? dn.row(t).mean() : Scalar(0);
    dx.row(t).array() += inv[t] * (dn.row(t).array() - shift - n.row(t).array() * projection);
  }
}

// ---------------------------------------------------------------------------------------------
// Activations (transformers/activations.py), as the FFN op computes them (ops.hpp): silu, gelu
// (erf) and gelu_tanh (gelu_new, gelu_pytorch_tanh).

template <typename Scalar>
void activation_forward(HfActivation kind, const Mat<Scalar>& x, Mat<Scalar>& y) {
  if (kind == HfActivation::silu) return silu_forward(x, y);
  gelu_forward(x, y, kind == HfActivation::gelu_tanh);
}
// d_x = d_y * act'(x).
template <typename Scalar>
void activation_backward(HfActivation kind, const Mat<Scalar>& x, const Mat<Scalar>& d_y, Mat<Scalar>& d_x) {
  d_x.setZero(x.rows(), x.cols());
  if (kind == HfActivation::silu) return silu_backward(x, d_y, d_x);
  gelu_backward(x, d_y, d_x, kind == HfActivation::gelu_tanh);
}

// ---------------------------------------------------------------------------------------------
// Rotary embeddings, rotate_half layout (modeling_llama.py, apply_rotary_pos_emb): within each
// head's first rotary_dims dims, (x_i, x_{i+r/2}) -> (x_i cos - x_{i+r/2} sin, x_{i+r/2} cos + x_i sin).
// inverse: the transpose (rotation by minus the angle), the backward.

template <typename Scalar>
void rotate(const Rotary<Scalar>& rotary, int head_dim, bool inverse, Mat<Scalar>& x) {
  const Eigen::Index half = rotary.cos.cols();
  if (half == 0) return;
  const Eigen::Index heads = x.cols() / head_dim;
  const Scalar sign = inverse ? Scalar(-1) : Scalar(1);
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    for (Eigen::Index h = 0; h < heads; ++h) {
      Scalar* row = x.data() + t * x.cols() + h * head_dim;
      for (Eigen::Index i = 0; i < half; ++i) {
        const Scalar c = rotary.cos(t, i), s = sign * rotary.sin(t, i);
        const Scalar a = row[i], b = row[i + half];
        row[i] = a * c - b * s;
        row[i + half] = b * c + a * s;
      }
    }
  }
}

// Whether query i may see key j: causal, and within the layer's sliding window (masking_utils.py,
// sliding_window_overlay: kv_idx > q_idx - sliding_window).
bool visible(Eigen::Index i, Eigen::Index j, int window) { return j <= i && (window == 0 || i - j < window); }

// ---------------------------------------------------------------------------------------------
// Attention (modeling_llama.py LlamaAttention; Qwen2's q/k/v biases; OLMo-2's q_norm/k_norm over
// the whole projections before the head split; Gemma-2's query_pre_attn_scalar and
// attn_logit_softcapping; GPT-2's fused c_attn).

template <typename Scalar>
void attention_forward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& p,
                       SublayerCache<Scalar>& c) {
  const Eigen::Index T = c.h.rows();
  const int hd = spec.head_dim, group = spec.heads / spec.kv_heads;
  const auto project = [&](const Mat<Scalar>& w, const Vec<Scalar>& b, Mat<Scalar>& out) {
    out.noalias() = c.h * w.transpose();
    if (b.size() > 0) out.rowwise() += b.transpose();
  };
  project(p.w_q, p.b_q, c.q_lin);
  project(p.w_k, p.b_k, c.k_lin);
  project(p.w_v, p.b_v, c.v);
  if (spec.qk_norm) {
    norm_forward(false, spec.norm_eps, c.q_lin, p.q_norm, c.q, c.q_n, c.q_inv);
    norm_forward(false, spec.norm_eps, c.k_lin, p.k_norm, c.k, c.k_n, c.k_inv);
  } else {
    c.q = c.q_lin;
    c.k = c.k_lin;
  }
  rotate(rotary, hd, false, c.q);
  rotate(rotary, hd, false, c.k);
  const int window = spec.sliding_window[p.layer];
  c.probs.resize(spec.heads);
  c.capped.resize(spec.attn_softcap > 0 ? spec.heads : 0);
  c.context.resize(T, spec.q_width());
  for (int head = 0; head < spec.heads; ++head) {
    const int kv = head / group;
    Mat<Scalar>& P = c.probs[head];
    P.noalias() = c.q.middleCols(head * hd, hd) * c.k.middleCols(kv * hd, hd).transpose();
    P *= static_cast<Scalar>(spec.attention_scale);
    if (spec.attn_softcap > 0) {
      const Scalar cap = static_cast<Scalar>(spec.attn_softcap);
      c.capped[head] = (P.array() / cap).tanh();
      P = c.capped[head] * cap;
    }
    for (Eigen::Index i = 0; i < T; ++i) {
      Scalar largest = -std::numeric_limits<Scalar>::infinity();
      for (Eigen::Index j = 0; j < T; ++j)
        if (visible(i, j, window)) largest = std::max(largest, P(i, j));
      Scalar sum = 0;
      for (Eigen::Index j = 0; j < T; ++j) {
        P(i, j) = visible(i, j, window) ? std::exp(P(i, j) - largest) : Scalar(0);
        sum += P(i, j);
      }
      P.row(i) /= sum;
    }
    c.context.middleCols(head * hd, hd).noalias() = P * c.v.middleCols(kv * hd, hd);
  }
  c.branch.noalias() = c.context * p.w_o.transpose();
  if (p.b_o.size() > 0) c.branch.rowwise() += p.b_o.transpose();
}

// dX^T-free gradient norm: ||dY^T X||_F^2 = <dY dY^T, X X^T>_F (T x T Grams).
template <typename Scalar>
double gradient_square(const Mat<Scalar>& dy, const Mat<Scalar>& x) {
  const Eigen::MatrixXd a = dy.template cast<double>() * dy.template cast<double>().transpose();
  const Eigen::MatrixXd b = x.template cast<double>() * x.template cast<double>().transpose();
  return (a.array() * b.array()).sum();
}

// dW = dY^T X in full, or only its squared norm.
template <typename Scalar>
void weight_gradient(const Mat<Scalar>& dy, const Mat<Scalar>& x, bool form, Mat<Scalar>& dw, double& squared) {
  if (form) {
    dw.noalias() = dy.transpose() * x;
    squared += dw.template cast<double>().squaredNorm();
  } else {
    squared += gradient_square(dy, x);
  }
}

template <typename Scalar>
void attention_backward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& p,
                        SublayerCache<Scalar>& c, const Mat<Scalar>& d_branch_out, Mat<Scalar>& d_h,
                        SublayerGradients<Scalar>* grads, bool form) {
  const Eigen::Index T = c.h.rows();
  const int hd = spec.head_dim, group = spec.heads / spec.kv_heads;
  const Mat<Scalar> d_context = d_branch_out * p.w_o;
  Mat<Scalar> d_q = Mat<Scalar>::Zero(T, spec.q_width()), d_k = Mat<Scalar>::Zero(T, spec.kv_width()),
              d_v = Mat<Scalar>::Zero(T, spec.kv_width());
  Mat<Scalar> d_p(T, T);
  for (int head = 0; head < spec.heads; ++head) {
    const int kv = head / group;
    const Mat<Scalar>& P = c.probs[head];
    const auto d_ctx = d_context.middleCols(head * hd, hd);
    d_p.noalias() = d_ctx * c.v.middleCols(kv * hd, hd).transpose();
    d_v.middleCols(kv * hd, hd).noalias() += P.transpose() * d_ctx;
    // softmax: dS = P (dP - rowsum(dP P)); masked entries have P = 0
    const Vec<Scalar> row_dot = (d_p.array() * P.array()).rowwise().sum();
    Mat<Scalar> d_s = P.array() * (d_p.colwise() - row_dot).array();
    if (spec.attn_softcap > 0) d_s.array() *= Scalar(1) - c.capped[head].array().square();
    d_s *= static_cast<Scalar>(spec.attention_scale);
    d_q.middleCols(head * hd, hd).noalias() += d_s * c.k.middleCols(kv * hd, hd);
    d_k.middleCols(kv * hd, hd).noalias() += d_s.transpose() * c.q.middleCols(head * hd, hd);
  }
  rotate(rotary, hd, true, d_q);
  rotate(rotary, hd, true, d_k);
  Mat<Scalar> d_q_lin = d_q, d_k_lin = d_k;
  if (spec.qk_norm) {
    d_q_lin.setZero();
    d_k_lin.setZero();
    norm_backward(false, c.q_n, c.q_inv, p.q_norm, d_q, d_q_lin);
    norm_backward(false, c.k_n, c.k_inv, p.k_norm, d_k, d_k_lin);
  }
  d_h.noalias() = d_q_lin * p.w_q;
  d_h.noalias() += d_k_lin * p.w_k;
  d_h.noalias() += d_v * p.w_v;
  if (grads) {
    weight_gradient(d_q_lin, c.h, form, grads->w_q, grads->squared_norm);
    weight_gradient(d_k_lin, c.h, form, grads->w_k, grads->squared_norm);
    weight_gradient(d_v, c.h, form, grads->w_v, grads->squared_norm);
    weight_gradient(d_branch_out, c.context, form, grads->w_o, grads->squared_norm);
  }
}

// ---------------------------------------------------------------------------------------------
// MLP: down(act(gate(x)) * up(x)) (LlamaMLP, Gemma2MLP with gelu_pytorch_tanh), or GPT-2's
// c_proj(gelu_new(c_fc(x))) (GPT2MLP).

template <typename Scalar>
void mlp_forward(const HfModelSpec& spec, const SublayerParams<Scalar>& p, SublayerCache<Scalar>& c) {
  c.up.noalias() = c.h * p.w_up.transpose();
  if (p.b_up.size() > 0) c.up.rowwise() += p.b_up.transpose();
  if (spec.gated) {
    c.gate_pre.noalias() = c.h * p.w_gate.transpose();
    if (p.b_gate.size() > 0) c.gate_pre.rowwise() += p.b_gate.transpose();
    activation_forward(spec.activation, c.gate_pre, c.activated);
    c.hidden = c.activated.array() * c.up.array();
  } else {
    activation_forward(spec.activation, c.up, c.hidden);
  }
  c.branch.noalias() = c.hidden * p.w_down.transpose();
  if (p.b_down.size() > 0) c.branch.rowwise() += p.b_down.transpose();
}

template <typename Scalar>
void mlp_backward(const HfModelSpec& spec, const SublayerParams<Scalar>& p, SublayerCache<Scalar>& c,
                  const Mat<Scalar>& d_branch_out, Mat<Scalar>& d_h, SublayerGradients<Scalar>* grads, bool form) {
  const Mat<Scalar> d_hidden = d_branch_out * p.w_down;
  Mat<Scalar> d_up, d_gate;
  if (spec.gated) {
    d_up = d_hidden.array() * c.activated.array();
    activation_backward(spec.activation, c.gate_pre, Mat<Scalar>(d_hidden.array() * c.up.array()), d_gate);
    d_h.noalias() = d_gate * p.w_gate;
    d_h.noalias() += d_up * p.w_up;
  } else {
    activation_backward(spec.activation, c.up, d_hidden, d_up);
    d_h.noalias() = d_up * p.w_up;
  }
  if (grads) {
    if (spec.gated) weight_gradient(d_gate, c.h, form, grads->w_gate, grads->squared_norm);
    weight_gradient(d_up, c.h, form, grads->w_up, grads->squared_norm);
    weight_gradient(d_branch_out, c.hidden, form, grads->w_down, grads->squared_norm);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

template <typename Scalar>
void load_sublayer(const HfModelSpec& spec, const TensorStore& store, int sublayer, SublayerParams<Scalar>& p) {
  p = SublayerParams<Scalar>{};
  p.layer = sublayer / 2;
  p.kind = sublayer % 2 == 0 ? SublayerKind::attn : SublayerKind::ffn;
  const bool attention = p.kind == SublayerKind::attn;
  if (spec.family == HfFamily::gpt2) {
    const std::string l = fmt::format("{}h.{}.", spec.tensor_prefix, p.layer);
    p.input_norm = read_norm<Scalar>(spec, store, l + (attention ? "ln_1" : "ln_2"));
    const int d = spec.hidden;
    if (attention) {  // Conv1D (in, out); c_attn's output is [q | k | v]
      const Mat<Scalar> fused = read_matrix<Scalar>(store, l + "attn.c_attn.weight");
      const Vec<Scalar> bias = read_vector<Scalar>(store, l + "attn.c_attn.bias");
      p.w_q = fused.leftCols(d).transpose();
      p.w_k = fused.middleCols(d, d).transpose();
      p.w_v = fused.rightCols(d).transpose();
      p.b_q = bias.head(d);
      p.b_k = bias.segment(d, d);
      p.b_v = bias.tail(d);
      p.w_o = read_matrix<Scalar>(store, l + "attn.c_proj.weight").transpose();
      p.b_o = read_vector<Scalar>(store, l + "attn.c_proj.bias");
    } else {
      p.w_up = read_matrix<Scalar>(store, l + "mlp.c_fc.weight").transpose();
      p.b_up = read_vector<Scalar>(store, l + "mlp.c_fc.bias");
      p.w_down = read_matrix<Scalar>(store, l + "mlp.c_proj.weight").transpose();
      p.b_down = read_vector<Scalar>(store, l + "mlp.c_proj.bias");
    }
    return;
  }
  const std::string l = fmt::format("model.layers.{}.", p.layer);
  if (attention) {
    if (spec.input_norms) p.input_norm = read_norm<Scalar>(spec, store, l + "input_layernorm");
    if (spec.output_norms) p.output_norm = read_norm<Scalar>(spec, store, l + "post_attention_layernorm");
    const std::string a = l + "self_attn.";
    p.w_q = read_matrix<Scalar>(store, a + "q_proj.weight");
    p.w_k = read_matrix<Scalar>(store, a + "k_proj.weight");
    p.w_v = read_matrix<Scalar>(store, a + "v_proj.weight");
    p.w_o = read_matrix<Scalar>(store, a + "o_proj.weight");
    if (spec.qkv_bias) {
      p.b_q = read_vector<Scalar>(store, a + "q_proj.bias");
      p.b_k = read_vector<Scalar>(store, a + "k_proj.bias");
      p.b_v = read_vector<Scalar>(store, a + "v_proj.bias");
    }
    if (spec.o_bias) p.b_o = read_vector<Scalar>(store, a + "o_proj.bias");
    if (spec.qk_norm) {
      p.q_norm = read_norm<Scalar>(spec, store, a + "q_norm");
      p.k_norm = read_norm<Scalar>(spec, store, a + "k_norm");
    }
    return;
  }
  // The MLP's norms: Llama's post_attention_layernorm is its input norm; Gemma-2 has
  // pre_feedforward_layernorm and post_feedforward_layernorm; OLMo-2 post_feedforward_layernorm.
  if (spec.family == HfFamily::gemma2) p.input_norm = read_norm<Scalar>(spec, store, l + "pre_feedforward_layernorm");
  else if (spec.input_norms) p.input_norm = read_norm<Scalar>(spec, store, l + "post_attention_layernorm");
  if (spec.output_norms) p.output_norm = read_norm<Scalar>(spec, store, l + "post_feedforward_layernorm");
  p.w_gate = read_matrix<Scalar>(store, l + "mlp.gate_proj.weight");
  p.w_up = read_matrix<Scalar>(store, l + "mlp.up_proj.weight");
  p.w_down = read_matrix<Scalar>(store, l + "mlp.down_proj.weight");
  if (spec.mlp_bias) {
    p.b_gate = read_vector<Scalar>(store, l + "mlp.gate_proj.bias");
    p.b_up = read_vector<Scalar>(store, l + "mlp.up_proj.bias");
    p.b_down = read_vector<Scalar>(store, l + "mlp.down_proj.bias");
  }
}

// inv_freq = theta^(-2i/r) (modeling_rope_utils.py, _compute_default_rope_parameters), rescaled by
// _compute_linear_scaling_rope_parameters (/ factor) or _compute_llama3_parameters.
template <typename Scalar>
Rotary<Scalar> rotary_tables(const HfModelSpec& spec, int tokens) {
  Rotary<Scalar> rotary;
  if (spec.rope_theta <= 0) return rotary;
  const int half = spec.rotary_dims / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i)
    inv_freq[i] = rotary_frequency(i, spec.rotary_dims, spec.rope_theta, spec.rope_frequencies());
  rotary.cos.resize(tokens, half);
  rotary.sin.resize(tokens, half);
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      rotary.cos(t, i) = static_cast<Scalar>(std::cos(t * inv_freq[i]));
      rotary.sin(t, i) = static_cast<Scalar>(std::sin(t * inv_freq[i]));
    }
  }
  return rotary;
}

template <typename Scalar>
void sublayer_forward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& p,
                      const Mat<Scalar>& x_in, SublayerCache<Scalar>& c, Mat<Scalar>& x_out) {
  if (p.input_norm.present()) norm_forward(spec.layer_norm, spec.norm_eps, x_in, p.input_norm, c.h, c.input_n, c.input_inv);
  else c.h = x_in;
  if (p.kind == SublayerKind::attn) attention_forward(spec, rotary, p, c);
  else mlp_forward(spec, p, c);
  if (p.output_norm.present()) norm_forward(spec.layer_norm, spec.norm_eps, c.branch, p.output_norm, c.update, c.output_n, c.output_inv);
  else c.update = c.branch;
  x_out = x_in + c.update;
}

template <typename Scalar>
void sublayer_backward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& p,
                       SublayerCache<Scalar>& c, const Mat<Scalar>& d_out, Mat<Scalar>& d_in, Mat<Scalar>* d_branch,
                       SublayerGradients<Scalar>* grads, bool form) {
  if (grads) grads->squared_norm = 0.0;
  Mat<Scalar> d_branch_out;
  if (p.output_norm.present()) {
    d_branch_out = Mat<Scalar>::Zero(d_out.rows(), d_out.cols());
    norm_backward(spec.layer_norm, c.output_n, c.output_inv, p.output_norm, d_out, d_branch_out);
  } else {
    d_branch_out = d_out;
  }
  Mat<Scalar> d_h;
  if (p.kind == SublayerKind::attn) attention_backward(spec, rotary, p, c, d_branch_out, d_h, grads, form);
  else mlp_backward(spec, p, c, d_branch_out, d_h, grads, form);
  Mat<Scalar> through_branch;
  if (p.input_norm.present()) {
    through_branch = Mat<Scalar>::Zero(d_h.rows(), d_h.cols());
    norm_backward(spec.layer_norm, c.input_n, c.input_inv, p.input_norm, d_h, through_branch);
  } else {
    through_branch = std::move(d_h);
  }
  d_in = d_out + through_branch;
  if (d_branch) *d_branch = std::move(through_branch);
}

template <typename Scalar>
Mat<Scalar> embed(const HfModelSpec& spec, const TensorStore& store, const std::vector<std::int64_t>& tokens) {
  const Eigen::Index T = static_cast<Eigen::Index>(tokens.size());
  Mat<Scalar> x(T, spec.hidden);
  const std::string table = spec.family == HfFamily::gpt2 ? spec.tensor_prefix + "wte.weight" : "model.embed_tokens.weight";
  // The whole table is read once, in chunks, so that a damaged row is found even where no token
  // uses it (a NaN or infinity is an InputError naming the tensor).
  const std::int64_t vocab = spec.vocab, chunk = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / spec.hidden);
  Mat<Scalar> rows;
  for (std::int64_t first = 0; first < vocab; first += chunk) {
    const std::int64_t count = std::min(chunk, vocab - first);
    rows.resize(count, spec.hidden);
    store.read_rows(table, first, count, rows.data());
    for (Eigen::Index t = 0; t < T; ++t)
      if (tokens[t] >= first && tokens[t] < first + count) x.row(t) = rows.row(tokens[t] - first);
  }
  if (spec.position_embedding) {  // GPT2Model.forward: inputs_embeds + wpe(position_ids)
    const std::string positions = spec.tensor_prefix + "wpe.weight";
    Mat<Scalar> wpe(T, spec.hidden);
    store.read_rows(positions, 0, T, wpe.data());
    x += wpe;
  }
  // Gemma2Model.forward: hidden_states * normalizer, normalizer = hidden_size ** 0.5 in the model's dtype
  if (spec.embedding_scale != 1.0) x *= static_cast<Scalar>(spec.embedding_scale);
  return x;
}

template <typename Scalar>
double head_loss(const HfModelSpec& spec, const TensorStore& store, LossKind loss, const Mat<Scalar>& probe,
                 const std::vector<std::int64_t>& tokens, const Mat<Scalar>& x, Mat<Scalar>* d_x, Mat<Scalar>* y_out) {
  const bool gpt2 = spec.family == HfFamily::gpt2;
  const NormParams<Scalar> final_norm = read_norm<Scalar>(spec, store, gpt2 ? spec.tensor_prefix + "ln_f" : "model.norm");
  Mat<Scalar> y, n;
  Vec<Scalar> inv;
  norm_forward(spec.layer_norm, spec.norm_eps, x, final_norm, y, n, inv);
  if (y_out) *y_out = y;
  const Eigen::Index T = x.rows();
  Mat<Scalar> d_y;
  double value = 0.0;
  if (loss == LossKind::probe) {
    value = (probe.template cast<double>().array() * y.template cast<double>().array()).sum();
    d_y = probe;
  } else {
    // logits = y E^T over the vocabulary, in chunks of rows of the head's matrix so that a large
    // vocabulary is never converted whole; Gemma-2 soft-caps them (Gemma2ForCausalLM.forward).
    const std::string head = spec.tied ? (gpt2 ? spec.tensor_prefix + "wte.weight" : "model.embed_tokens.weight")
                                       : "lm_head.weight";
    const Eigen::Index vocab = spec.vocab, chunk = std::max<Eigen::Index>(1, (Eigen::Index{1} << 22) / spec.hidden);
    Mat<Scalar> logits(T, vocab), rows;
    for (Eigen::Index first = 0; first < vocab; first += chunk) {
      const Eigen::Index count = std::min(chunk, vocab - first);
      rows.resize(count, spec.hidden);
      store.read_rows(head, first, count, rows.data());
      logits.middleCols(first, count).noalias() = y * rows.transpose();
    }
    Mat<Scalar> capped;
    if (spec.final_softcap > 0) {
      const Scalar cap = static_cast<Scalar>(spec.final_softcap);
      capped = (logits.array() / cap).tanh();
      logits = capped * cap;
    }
    // L = mean over t < T-1 of logsumexp(z_t) - z_t[id_{t+1}]; dz = (softmax - onehot) / (T - 1)
    Mat<Scalar> d_logits = Mat<Scalar>::Zero(T, vocab);
    const double scale = 1.0 / static_cast<double>(T - 1);
    for (Eigen::Index t = 0; t + 1 < T; ++t) {
      const Scalar largest = logits.row(t).maxCoeff();
      const auto shifted = (logits.row(t).array() - largest).exp();
      const Scalar sum = shifted.sum();
      value += (static_cast<double>(largest) + std::log(static_cast<double>(sum)) -
                static_cast<double>(logits(t, tokens[t + 1]))) * scale;
      d_logits.row(t) = shifted / sum * static_cast<Scalar>(scale);
      d_logits(t, tokens[t + 1]) -= static_cast<Scalar>(scale);
    }
    if (spec.final_softcap > 0) d_logits.array() *= Scalar(1) - capped.array().square();
    if (d_x) {
      d_y = Mat<Scalar>::Zero(T, spec.hidden);
      for (Eigen::Index first = 0; first < vocab; first += chunk) {
        const Eigen::Index count = std::min(chunk, vocab - first);
        rows.resize(count, spec.hidden);
        store.read_rows(head, first, count, rows.data());
        d_y.noalias() += d_logits.middleCols(first, count) * rows;
      }
    }
  }
  if (d_x) {
    d_x->setZero(T, spec.hidden);
    norm_backward(spec.layer_norm, n, inv, final_norm, d_y, *d_x);
  }
  return value;
}

#define GRADFLOW_DECODER(Scalar)                                                                                    \
  template void load_sublayer(const HfModelSpec&, const TensorStore&, int, SublayerParams<Scalar>&);                \
  template Rotary<Scalar> rotary_tables(const HfModelSpec&, int);                                                   \
  template void sublayer_forward(const HfModelSpec&, const Rotary<Scalar>&, const SublayerParams<Scalar>&,          \
                                 const Mat<Scalar>&, SublayerCache<Scalar>&, Mat<Scalar>&);                         \
  template void sublayer_backward(const HfModelSpec&, const Rotary<Scalar>&, const SublayerParams<Scalar>&,         \
                                  SublayerCache<Scalar>&, const Mat<Scalar>&, Mat<Scalar>&, Mat<Scalar>*,           \
                                  SublayerGradients<Scalar>*, bool);                                                \
  template Mat<Scalar> embed(const HfModelSpec&, const TensorStore&, const std::vector<std::int64_t>&);             \
  template double head_loss(const HfModelSpec&, const TensorStore&, LossKind, const Mat<Scalar>&,                   \
                            const std::vector<std::int64_t>&, const Mat<Scalar>&, Mat<Scalar>*, Mat<Scalar>*);
GRADFLOW_DECODER(float)
GRADFLOW_DECODER(double)
#undef GRADFLOW_DECODER

}  // namespace gradflow::checkpoint
