// Eigenvalues of small symmetric matrices (the Gram matrices behind erank): Householder
// tridiagonalisation, then LAPACK's root-free QL/QR (DSTERF).
#pragma once

#include <Eigen/Dense>

namespace gradflow {

// Eigenvalues, ascending, of the symmetric matrix whose lower triangle is `lower` (the strict upper
// triangle is not read; `lower` is overwritten as workspace). Returns false, with the eigenvalues
// unspecified, if the QL/QR iteration does not converge (LAPACK's info > 0; for example when the
// matrix holds a NaN). Never throws, so it is safe on a pool's worker thread.
//
// Drop-in replacement for
//   Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(A, Eigen::EigenvaluesOnly).eigenvalues():
// same scaling by the max abs coefficient and same Householder tridiagonalization as Eigen, then
// LAPACK's DSTERF (root-free QL/QR) instead of Eigen's implicit QR with Givens rotations.
// (gradflow had a port of DSTERF; issue 16 measured it against LAPACK's own: 1.1x faster per call,
// under 3% of a depth-1024 run, so LAPACK's is used. bench/kernels.py's note has the table.)
[[nodiscard]] bool symmetric_eigenvalues(Eigen::MatrixXd& lower, Eigen::VectorXd& eigenvalues);

}  // namespace gradflow
