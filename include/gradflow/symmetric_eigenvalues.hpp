// Eigenvalues of small symmetric matrices (the Gram matrices behind erank): Householder
// tridiagonalisation, then LAPACK's root-free QL/QR (DSTERF).
#pragma once

#include <Eigen/Dense>

namespace gradflow {

// Eigenvalues, ascending, of the symmetric matrix whose lower triangle is `lower` (the strict upper
// triangle is not read; `lower` is overwritten as workspace). Returns false, with the eigenvalues
// unspecified, if the QL/QR iteration does not converge (LAPACK's info > 0; for example when the
// matrix holds a NaN). Never throws, so it is safe on a shard's worker thread.
//
// Drop-in replacement for
//   Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(A, Eigen::EigenvaluesOnly).eigenvalues():
// same scaling by the max abs coefficient and same Householder tridiagonalization as Eigen, then
// LAPACK's DSTERF (root-free QL/QR) instead of Eigen's implicit QR with Givens rotations.
[[nodiscard]] bool symmetric_eigenvalues(Eigen::MatrixXd& lower, Eigen::VectorXd& eigenvalues);

namespace detail {

// Port of LAPACK DSTERF. On entry d[0..n-1] is the diagonal and e[0..n-2] the subdiagonal of a
// symmetric tridiagonal matrix; on exit (return value 0) d holds the eigenvalues in ascending order
// and e is destroyed. Returns LAPACK's INFO: > 0 means that many e entries did not converge to zero
// within 30*n iterations (d is then not sorted).
int sterf(Eigen::Index n, double* d, double* e);

}  // namespace detail
}  // namespace gradflow
