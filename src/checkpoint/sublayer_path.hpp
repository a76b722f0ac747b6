// How the checkpoint analysis runs one sublayer (issue 47). GraphSublayers runs it through
// gradflow's own placement graph, ops and threads, with the checkpoint's weights in the ops'
// layouts; DecoderSublayers through decoder.cpp's maths, for the families whose conventions the
// ops do not have yet (graph_path_supports says which). Both read the tensors with load_sublayer.
// Internal to src/checkpoint/.
#pragma once
#include <array>
#include <memory>
#include <string>

#include "decoder.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/checkpoint.hpp"
#include "gradflow/graph.hpp"
#include "gradflow/work_pool.hpp"

namespace gradflow::checkpoint {

// Empty when the model's sublayers run through the graph at T tokens; else the first convention
// its ops lack ("logit soft-capping").
std::string graph_path_gap(const HfModelSpec& spec, int tokens);

template <typename Scalar>
class SublayerPath {
 public:
  using ByKind = std::array<Mat<Scalar>*, kMatrixKindCount>;  // kMatrixKinds' order; null: absent
  virtual ~SublayerPath() = default;
  // Reads sublayer l's weights (dropping the previous sublayer's).
  virtual void load(int sublayer) = 0;
  // x_out = x + update, keeping what backward needs.
  virtual void forward(const Mat<Scalar>& x, Mat<Scalar>& x_out, Mat<Scalar>& update) = 0;
  // After forward(x): d_in = dL/dx from d_out = dL/dx_out, d_branch = its part through the branch
  // (d_in minus the skip path's); returns ||dL/dW||^2 over the sublayer's matrices.
  virtual double backward(const Mat<Scalar>& d_out, Mat<Scalar>& d_in, Mat<Scalar>& d_branch) = 0;
  // After forward(x): the matrices' gradients dL/dW in full (gradients()).
  virtual void matrix_gradients(const Mat<Scalar>& d_out) = 0;
  // The loaded matrices and their gradients by kind, in one layout (each path its own).
  virtual ByKind matrices() = 0;
  virtual ByKind gradients() = 0;
  // x_out of the sublayer with each loaded matrix W moved to W + step (the same layout and kinds).
  virtual void stepped_forward(const std::array<const Mat<Scalar>*, kMatrixKindCount>& step,
                               const Mat<Scalar>& x, Mat<Scalar>& x_out) = 0;
};

// The graph path: `arch` is the family's placement (family_placement), `config` the run's
// model_config_of; the ops' pieces run on `threads` threads.
template <typename Scalar>
std::unique_ptr<SublayerPath<Scalar>> make_graph_sublayers(const HfModelSpec& spec, const ModelConfig& config,
                                                           const Architecture& arch, const TensorStore& store,
                                                           int threads);
template <typename Scalar>
std::unique_ptr<SublayerPath<Scalar>> make_decoder_sublayers(const HfModelSpec& spec,
                                                             const TensorStore& store, int tokens);

}  // namespace gradflow::checkpoint
