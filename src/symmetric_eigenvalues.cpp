// Eigenvalues only, for erank: Eigen's tridiagonalisation and LAPACK's DSTERF.
#include "gradflow/symmetric_eigenvalues.hpp"

#include <Eigen/Eigenvalues>
#include <algorithm>

namespace gradflow {

// LAPACK's DSTERF (Pal-Walker-Kahan root-free QL/QR): OpenBLAS's LAPACK, or the system's liblapack
// on builds without OpenBLAS (CMakeLists.txt).
extern "C" void dsterf_(const int* n, double* d, double* e, int* info);

bool symmetric_eigenvalues(Eigen::MatrixXd& lower, Eigen::VectorXd& eigenvalues) {
  const Eigen::Index n = lower.rows();
  if (lower.cols() != n) return false;
  eigenvalues.resize(n);
  if (n == 0) return true;
  if (n == 1) {  // as SelfAdjointEigenSolver: no scaling, no reduction
    eigenvalues(0) = lower(0, 0);
    return true;
  }

  // Map the coefficients to [-1, 1] exactly as SelfAdjointEigenSolver::compute does
  // (max abs coefficient of the lower triangle, then divide the lower triangle by it).
  double scale = 0.0;
  for (Eigen::Index j = 0; j < n; ++j)
    scale = std::max(scale, lower.col(j).tail(n - j).cwiseAbs().maxCoeff());
  if (scale == 0.0) scale = 1.0;
  lower.triangularView<Eigen::Lower>() /= scale;

  Eigen::VectorXd subdiag(n - 1), hcoeffs(n - 1);
  Eigen::internal::tridiagonalization_inplace(lower, eigenvalues, subdiag, hcoeffs,
                                              /*extractQ=*/false);

  const int size = static_cast<int>(n);
  int info = 0;
  dsterf_(&size, eigenvalues.data(), subdiag.data(), &info);
  if (info > 0) return false;
  eigenvalues *= scale;
  return true;
}

}  // namespace gradflow
