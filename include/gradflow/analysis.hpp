// The analysis of one randomly initialised stack: the engine's entry points and its plain
// result structs (metrics.md). Reporters turn these into JSON / CSV; nothing here does I/O.
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/architecture.hpp"
#include "gradflow/config.hpp"
#include "gradflow/figures.hpp"
#include "gradflow/statistics.hpp"

namespace gradflow {

struct StreamFigures {
  std::string name;
  FigureColumns states;  // rms, log10_grad per state (NaN where the state lacks the stream)
  GrowthFit growth;
};

struct Extremum {
  double value = 0.0;
  int sublayer = -1;
};

// Where a value stopped being finite; everything before it is still reported.
struct Divergence {
  int sublayer = -1;
  std::string phase;  // "forward" or "backward"
  std::string reason;
};

// The matrix kinds of a sublayer, in SublayerWeights' order; --update's step size is per kind.
// w_3: a gated FFN's third matrix (--ffn swiglu|geglu; empty otherwise).
inline constexpr const char* kMatrixKinds[] = {"w_q", "w_k", "w_v", "w_o", "w_1", "w_2", "w_3"};
inline constexpr int kMatrixKindCount = 7;

// One optimizer step at one learning rate (--update; metrics.md, "The model update").
struct UpdateStep {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  double learning_rate = kNone;
  double output_update_rel = kNone;       // norm(y(theta + Delta) - y(theta)) / norm(y(theta))
  double delta_loss = kNone;              // L(theta + Delta) - L(theta), measured
  double delta_loss_first_order = kNone;  // sum_l update_loss_l
  // Per matrix kind (kMatrixKinds): norm(Delta W) / norm(W) over the stack's matrices of that kind.
  double step_rel[kMatrixKindCount] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone};
  // --update-params all: norm(Delta gamma) / norm(gamma) over every norm gain of the stack and head.
  double step_rel_norm_gain = kNone;
  int diverged_state = -1;  // the first stepped state with a non-finite entry; -1: none
};

// --checkpoint (issue 28): the backward starts from the language-model loss (lm) or from a random
// probe of the final norm's output (probe, as at init).
enum class LossKind { lm, probe };

// The figures only a trained checkpoint's run has (metrics.md, "Trained checkpoints").
struct CheckpointFigures {
  LossKind loss_kind = LossKind::lm;
  double loss = 0.0;                     // the LM loss in nats per predicted token, or the probe loss
  std::vector<double> angular_distance;  // per layer i: arccos(cos(x_2i, x_2i+2) at t = T-1) / pi
  std::vector<std::int64_t> tokens;      // the ids analysed
  bool random_tokens = false;            // drawn by seed, not read from --tokens
};

struct SeedResult {
  std::uint64_t seed = 0;
  // index 0..S: rms, log10_grad, log10_grad_rel, log10_grad_se, token_cos, erank (+ --spectrum and
  // --exact-jacobian columns)
  FigureColumns states;
  // index 0..S-1: gain, skip_gain, branch_gain, skip_gain_theory, branch_rms, stream_share,
  // output_share, output_share_se, stream_decomposition, angle, block_influence, log10_param_grad
  FigureColumns sublayers;
  std::vector<SublayerKind> kinds;
  std::vector<int> blocks;
  std::vector<StreamFigures> streams;  // one per stream name of the architecture
  double log10_grad_ratio = 0.0;
  Extremum gain_min, gain_max;
  GrowthFit growth;
  // Participation ratio of the output contributions: (sum c_l)^2 / sum c_l^2 (metrics.md).
  double effective_depth = std::numeric_limits<double>::quiet_NaN();
  // Additive placements: the input's share <x_0, x_S> / norm(x_S)^2 of the exact decomposition
  // x_S = x_0 + sum_l update_l; NaN otherwise.
  double stream_decomposition_input = std::numeric_limits<double>::quiet_NaN();
  // --angles all: (S+1) x (S+1) mean-over-tokens angular distance / pi between states; else empty.
  std::vector<std::vector<double>> angles_matrix;
  std::optional<Divergence> diverged;
  std::vector<UpdateStep> updates;              // --update: one per learning rate, in --lr order
  std::optional<CheckpointFigures> checkpoint;  // --checkpoint runs only
  double seconds = 0.0;                         // wall time of this seed, and of its phases:
  double forward_seconds = 0.0;         // the forward loop over sublayers (weights drawn, states stored)
  double representation_seconds = 0.0;  // token_cos, erank and angle from the stored states
  double backward_seconds = 0.0;        // the backward loop (recompute, VJPs, gains)
};

struct ArchResult {
  const Architecture* arch = nullptr;
  ModelConfig config;  // arch field set to arch->id
  Constants constants;
  std::vector<SeedResult> seeds;
};

// Called after each sublayer of forward and backward, and after each state of --spectrum:
// (work done, total work), in the units of analysis_work_units.
using ProgressCallback = std::function<void(long long done, long long total)>;
// The progress units of one seed: 2 S sublayer passes, plus for --spectrum k the subspace
// iteration's sweeps (state l sweeps over S - l + 1 sublayers), so that 100% means done.
long long analysis_work_units(const ModelConfig& config);

// Test-only hooks into one analysis; the CLI never sets them, and the defaults change nothing.
struct AnalysisHooks {
  // Added to one weight entry after the sublayer's weights are drawn, so that tests can take
  // finite differences of the loss with respect to a weight.
  struct WeightNudge {
    int sublayer = -1;
    WeightMatrix matrix = WeightMatrix::q;
    long long entry = 0;  // index into the matrix's row-major data
    double delta = 0.0;
  };
  std::optional<WeightNudge> weight_nudge;
  // Recompute every sublayer in full during the backward pass, also where the branch's output
  // projection is not needed (GraphExecutor::recompute), to compare the two.
  bool recompute_in_full = false;
  // Read every attend node's sources one by one (depth_attention.hpp), also where its pseudo-query
  // is zero and the uniform mean of the sources is kept as a running sum (DepthHistory::prefix).
  bool attend_in_full = false;
};

// The resolved constants of `arch` at this configuration (empty for constant-free placements).
Constants resolve_constants(const Architecture& arch, const ModelConfig& config);

// How one analysis runs; no option changes a number.
struct ExecutionOptions {
  // Threads inside the run: above 1, every op of a model branch runs its pieces (work_pool.hpp)
  // on that many threads, which also draw the next sublayer's weights while they would wait; 1
  // runs all on the calling thread (as inside a parallel loop over runs, whose cores are busy).
  int threads = 1;
};

// Analyses one seed: forward pass, probe backward pass with renormalised gradients, figures.
SeedResult analyze_seed(const ModelConfig& config, const Architecture& arch, const Constants& constants,
                        std::uint64_t seed, const ExecutionOptions& execution = {},
                        const ProgressCallback& progress = {}, const AnalysisHooks& hooks = {});

// The probe loss L = sum(U * y) of probe 0 and its exact gradient dL/dx_0 (summed over the
// streams that start as copies of x_0), in float64: what finite-difference tests and the
// oracle compare against. `input` replaces the seed's x_0 when given.
struct InputGradient {
  double loss = 0.0;
  Eigen::MatrixXd gradient;  // (T, d)
};
InputGradient loss_and_input_gradient(const ModelConfig& config, const Architecture& arch,
                                      const Constants& constants, std::uint64_t seed,
                                      const Eigen::MatrixXd* input = nullptr,
                                      const AnalysisHooks& hooks = {});

// A named tensor as stored for --export-weights: row-major data in the run's precision.
struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<double> values;  // exact: float32 values are representable in double
};
// The tensors a run of (config, arch, seed) uses: input, probes, every sublayer's weights.
std::vector<NamedTensor> run_tensors(const ModelConfig& config, const Architecture& arch,
                                     const Constants& constants, std::uint64_t seed);

}  // namespace gradflow
