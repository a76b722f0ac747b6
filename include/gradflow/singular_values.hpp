// Singular values of a dense matrix, for --exact-jacobian's spectral norm and top-k singular values.
#pragma once

#include <Eigen/Dense>

namespace gradflow {

// Singular values, descending, of `matrix` (min(rows, cols) of them), by LAPACK's DGESVD (bidiagonal
// QR, no singular vectors). Returns false, with the values unspecified, if it does not converge
// (LAPACK's info > 0, e.g. a NaN entry). Never throws.
//
// Not Eigen 3.4.0's BDCSVD: its divide and conquer returned wrong singular values for a 64 x 32
// Jacobian of a two-stream stack (top value 2.860 where JacobiSVD, LAPACK and numpy give 3.499;
// the Frobenius norm agreed), so --exact-jacobian's spectral norm was wrong for that run. JacobiSVD
// is right but O(n m^2) per sweep, too slow at the 4096 x 4096 the flag allows.
[[nodiscard]] bool singular_values(const Eigen::MatrixXd& matrix, Eigen::VectorXd& values);

}  // namespace gradflow
