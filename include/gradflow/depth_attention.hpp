// Attention over depth: one read of a history of earlier values, as a forward/backward/JVP triple
// (llm.c style, like ops.hpp). The op that Attention Residuals (and any placement whose block reads
// every earlier layer) is built from; the stack keeps the history, this op reads it.
//
// Kimi Team 2026 "Attention Residuals", arXiv 2603.15031, Sec. 3.1, Eq. 2-4 (MoonshotAI/
// Attention-Residuals @ 85e22310, README pseudocode = the paper's Fig. 2, `block_attn_res`): a read
// of n sources v_0 .. v_{n-1}, each (T, d), with one learned pseudo-query w (1, d):
//   k_i = RMSNorm(v_i)                     (the read's own RMSNorm, gain 1, on the keys only)
//   s_{i,t} = w . k_{i,t}                  (no temperature, Sec. 3.1)
//   alpha_{i,t} = softmax over i of s_{i,t}   (per token t)
//   h_t = sum_i alpha_{i,t} v_{i,t}        (the values are the sources themselves, not normalised)
// At w = 0 every alpha is 1/n: the read is the uniform mean of its sources (the paper's init, Sec. 5).
//
// Shapes follow ops.hpp: forward values are one sequence (T rows); cotangents and tangents carry K
// probes (or P tangents) stacked as blocks of T rows, row r pairing with token r % T; every backward
// ADDS into its outputs, so a source read by many reads accumulates its cotangent in one buffer.
#pragma once
#include <span>

#include "gradflow/ops.hpp"

namespace gradflow {

// A source's key, computed once when the source is stored and shared by every later read:
// key = RMSNorm(v) (T, d) and inv = 1 / rms per token (T, 1), from norm_forward.
template <typename Scalar>
struct DepthKey {
  Mat<Scalar> key, inv;
};
template <typename Scalar>
void depth_key(const Mat<Scalar>& value, double eps, DepthKey<Scalar>& key);

// True when every entry of the pseudo-query is exactly zero: every weight is then 1/n exactly and
// the keys' path carries no gradient (the paper's init).
template <typename Scalar>
bool is_zero_query(const Mat<Scalar>& query) {
  return (query.array() == Scalar(0)).all();
}

// One source of a read: its value and its key (both owned by the caller's history).
template <typename Scalar>
struct DepthSource {
  const Mat<Scalar>* value = nullptr;
  const DepthKey<Scalar>* key = nullptr;
};

// What a read's forward keeps for its backward and JVP.
template <typename Scalar>
struct DepthRead {
  Mat<Scalar> alpha;  // (n, T): the softmax weights, column t summing to 1
  Mat<Scalar> out;    // (T, d): h
};

// h = sum_i softmax_i(w . k_i) v_i per token. query: (1, d). Needs at least one source.
template <typename Scalar>
void depth_attention_forward(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                             DepthRead<Scalar>& read);

// d_out (K*T, d) to the sources and the query, added into d_sources[i] (K*T, d) for every source i
// and, when d_query is given, into d_query (K, d), one row per probe:
//   ds_{i,t} = alpha_{i,t} (g_t . v_{i,t} - g_t . h_t)                 (softmax backward)
//   dv_{i,t} += alpha_{i,t} g_t + ds_{i,t} inv_{i,t} (w - k_{i,t} (k_{i,t} . w) / d)   (value + key path)
//   dw      += sum_{i,t} ds_{i,t} k_{i,t}
// The key path is exactly zero at w = 0 and is then skipped.
template <typename Scalar>
void depth_attention_backward(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                              const DepthRead<Scalar>& read, const Mat<Scalar>& d_out,
                              std::span<Mat<Scalar>* const> d_sources, Mat<Scalar>* d_query = nullptr);

// Tangents of the sources (each (P*T, d)) and, when d_query is given, of the query ((P, d), one row
// per tangent) to the tangent of h, written to d_out (P*T, d):
//   dk_i = inv_i (dv_i - k_i (k_i . dv_i) / d),  ds_i = dw . k_i + w . dk_i,
//   dalpha_i = alpha_i (ds_i - sum_j alpha_j ds_j),  dh = sum_i alpha_i dv_i + dalpha_i v_i.
template <typename Scalar>
void depth_attention_jvp(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                         const DepthRead<Scalar>& read, std::span<const Mat<Scalar>* const> d_sources,
                         const Mat<Scalar>* d_query, Mat<Scalar>& d_out);

}  // namespace gradflow
