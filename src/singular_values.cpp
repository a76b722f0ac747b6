// Singular values only, by LAPACK's DGESVD (OpenBLAS's LAPACK, or the system's liblapack;
// CMakeLists.txt), as symmetric_eigenvalues.cpp uses its DSTERF.
#include "gradflow/singular_values.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace gradflow {

// The two trailing lengths are those of the character arguments jobu and jobvt, which gfortran
// passes hidden at the end (as size_t); leaving them out is undefined behaviour with a LAPACK built
// by gfortran, as LAPACKE's own wrappers note.
extern "C" void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a,
                        const int* lda, double* s, double* u, const int* ldu, double* vt, const int* ldvt,
                        double* work, const int* lwork, int* info, std::size_t jobu_length,
                        std::size_t jobvt_length);

bool singular_values(const Eigen::MatrixXd& matrix, Eigen::VectorXd& values) {
  const int rows = static_cast<int>(matrix.rows()), cols = static_cast<int>(matrix.cols());
  values.resize(std::min(rows, cols));
  if (values.size() == 0) return true;
  Eigen::MatrixXd a = matrix;  // column-major, overwritten by DGESVD
  const char none = 'N';
  const int lda = std::max(1, rows), one = 1;
  double unused = 0, query = 0;
  int info = 0, lwork = -1;  // workspace query first
  dgesvd_(&none, &none, &rows, &cols, a.data(), &lda, values.data(), &unused, &one, &unused, &one, &query,
          &lwork, &info, 1, 1);
  if (info != 0) return false;
  lwork = static_cast<int>(query);
  std::vector<double> work(static_cast<std::size_t>(std::max(lwork, 1)));
  dgesvd_(&none, &none, &rows, &cols, a.data(), &lda, values.data(), &unused, &one, &unused, &one,
          work.data(), &lwork, &info, 1, 1);
  return info == 0;
}

}  // namespace gradflow
