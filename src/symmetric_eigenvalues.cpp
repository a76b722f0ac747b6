// Eigenvalues only, for erank: Eigen's tridiagonalisation and a port of LAPACK's DSTERF.
#include "gradflow/symmetric_eigenvalues.hpp"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <limits>

#include "gradflow/kernels.hpp"

namespace gradflow {
namespace detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Port of LAPACK 3.x DSTERF (BSD licence), Pal-Walker-Kahan root-free QL/QR, together with the
// pieces of DLAMCH, DLANST('M'), DLASCL('G'), DLAPY2 and DLAE2 that it uses. Translated from the
// Reference-LAPACK sources (SRC/dsterf.f, dlae2.f, dlapy2.f, dlanst.f, dlascl.f, INSTALL/dlamch.f).
// Indices are 0-based: Fortran D(I), E(I) is d[i], e[i] with i = I - 1 throughout, so every
// comparison below reads exactly as in the Fortran. The GO TOs are restructured as loops:
// label 10 -> outer `while` in sterf, labels 50..90 -> ql_block, 100..140 -> qr_block, 150 -> the
// code after the block call, 170 -> final sort.
// ---------------------------------------------------------------------------------------------

constexpr int kMaxIt = 30;                                         // MAXIT
const double kEps = std::numeric_limits<double>::epsilon() * 0.5;  // DLAMCH('E'): rounding
const double kEps2 = kEps * kEps;
const double kSafmin = std::numeric_limits<double>::min();  // DLAMCH('S') (1/HUGE < TINY)
const double kSafmax = 1.0 / kSafmin;
const double kSsfmax = std::sqrt(kSafmax) / 3.0;
const double kSsfmin = std::sqrt(kSafmin) / kEps2;

// DLAPY2(x, y) = sqrt(x^2 + y^2) avoiding unnecessary overflow.
double lapy2(double x, double y) {
  const double xabs = std::abs(x), yabs = std::abs(y);
  const double w = std::max(xabs, yabs), z = std::min(xabs, yabs);
  if (z == 0.0) return w;
  const double q = z / w;
  return w * std::sqrt(1.0 + q * q);
}

// DLAE2: eigenvalues of [[a, b], [b, c]]; rt1 has the larger absolute value.
void lae2(double a, double b, double c, double& rt1, double& rt2) {
  const double sm = a + c, df = a - c, adf = std::abs(df), tb = b + b, ab = std::abs(tb);
  const double acmx = std::abs(a) > std::abs(c) ? a : c;
  const double acmn = std::abs(a) > std::abs(c) ? c : a;
  double rt;
  if (adf > ab) {
    const double q = ab / adf;
    rt = adf * std::sqrt(1.0 + q * q);
  } else if (adf < ab) {
    const double q = adf / ab;
    rt = ab * std::sqrt(1.0 + q * q);
  } else {
    rt = ab * std::sqrt(2.0);  // includes ab = adf = 0
  }
  if (sm < 0.0) {
    rt1 = 0.5 * (sm - rt);
    rt2 = (acmx / rt1) * acmn - (b / rt1) * b;  // order of evaluation as in LAPACK
  } else if (sm > 0.0) {
    rt1 = 0.5 * (sm + rt);
    rt2 = (acmx / rt1) * acmn - (b / rt1) * b;
  } else {
    rt1 = 0.5 * rt;  // includes rt1 = rt2 = 0
    rt2 = -0.5 * rt;
  }
}

// DLANST('M', n, d, e): largest absolute entry of the tridiagonal matrix (d[0..n-1], e[0..n-2]).
double lanst_max(Eigen::Index n, const double* d, const double* e) {
  if (n <= 0) return 0.0;
  double anorm = std::abs(d[n - 1]);
  for (Eigen::Index i = 0; i < n - 1; ++i) {
    anorm = std::max(anorm, std::abs(d[i]));
    anorm = std::max(anorm, std::abs(e[i]));
  }
  return anorm;
}

// DLASCL('G', 0, 0, cfrom, cto, m, 1, a, ...): a[0..m-1] *= cto / cfrom, done in steps of
// SMLNUM / BIGNUM so that the product never over- or underflows. cfrom is nonzero here.
void lascl(double cfrom, double cto, Eigen::Index m, double* a) {
  const double smlnum = kSafmin, bignum = 1.0 / smlnum;
  double cfromc = cfrom, ctoc = cto;
  bool done = false;
  while (!done) {
    const double cfrom1 = cfromc * smlnum;
    double mul;
    if (cfrom1 == cfromc) {  // cfromc is an inf
      mul = ctoc / cfromc;
      done = true;
    } else {
      const double cto1 = ctoc / bignum;
      if (cto1 == ctoc) {  // ctoc is 0 or an inf
        mul = ctoc;
        done = true;
        cfromc = 1.0;
      } else if (std::abs(cfrom1) > std::abs(ctoc) && ctoc != 0.0) {
        mul = smlnum;
        cfromc = cfrom1;
      } else if (std::abs(cto1) > std::abs(cfromc)) {
        mul = bignum;
        ctoc = cto1;
      } else {
        mul = ctoc / cfromc;
        done = true;
      }
    }
    for (Eigen::Index i = 0; i < m; ++i) a[i] *= mul;
  }
}

// Wilkinson-type shift from the leading 2x2 of the block: d[l] = p, neighbour d[nb], e2 = E^2.
double root_free_shift(double p, double d_neighbour, double e2) {
  const double rte = std::sqrt(e2);
  double sigma = (d_neighbour - p) / (2.0 * rte);
  const double r = lapy2(sigma, 1.0);
  return p - rte / (sigma + std::copysign(r, sigma));  // SIGN(R, SIGMA)
}

// QL iteration on the block l..lend (l <= lend), e holding squared off-diagonals
// (DSTERF labels 50-90). Returns when the block is finished or jtot reaches nmaxit.
void ql_block(double* d, double* e, Eigen::Index l, Eigen::Index lend, int& jtot, int nmaxit) {
  while (l <= lend) {
    // Look for small subdiagonal element.
    Eigen::Index m = lend;
    for (Eigen::Index i = l; i < lend; ++i) {
      if (std::abs(e[i]) <= kEps2 * std::abs(d[i] * d[i + 1])) {
        m = i;
        break;
      }
    }
    if (m < lend) e[m] = 0.0;
    double p = d[l];
    if (m == l) {  // eigenvalue found (label 90)
      d[l] = p;
      l += 1;
      continue;
    }
    if (m == l + 1) {  // remaining 2x2: DLAE2
      double rt1, rt2;
      lae2(d[l], std::sqrt(e[l]), d[l + 1], rt1, rt2);
      d[l] = rt1;
      d[l + 1] = rt2;
      e[l] = 0.0;
      l += 2;
      continue;
    }
    if (jtot == nmaxit) return;
    ++jtot;

    const double sigma = root_free_shift(p, d[l + 1], e[l]);
    double c = 1.0, s = 0.0;
    double gamma = d[m] - sigma;
    p = gamma * gamma;
    for (Eigen::Index i = m - 1; i >= l; --i) {  // inner loop (label 80)
      const double bb = e[i];
      const double r = p + bb;
      if (i != m - 1) e[i + 1] = s * r;
      const double oldc = c;
      c = p / r;
      s = bb / r;
      const double oldgam = gamma;
      const double alpha = d[i];
      gamma = c * (alpha - sigma) - s * oldgam;
      d[i + 1] = oldgam + (alpha - gamma);
      p = (c != 0.0) ? (gamma * gamma) / c : oldc * bb;
    }
    e[l] = s * p;
    d[l] = sigma + gamma;
  }
}

// QR iteration on the block lend..l (l > lend), e holding squared off-diagonals
// (DSTERF labels 100-140). Mirror image of ql_block.
void qr_block(double* d, double* e, Eigen::Index l, Eigen::Index lend, int& jtot, int nmaxit) {
  while (l >= lend) {
    // Look for small superdiagonal element.
    Eigen::Index m = lend;
    for (Eigen::Index i = l; i > lend; --i) {
      if (std::abs(e[i - 1]) <= kEps2 * std::abs(d[i] * d[i - 1])) {
        m = i;
        break;
      }
    }
    if (m > lend) e[m - 1] = 0.0;
    double p = d[l];
    if (m == l) {  // eigenvalue found (label 140)
      d[l] = p;
      l -= 1;
      continue;
    }
    if (m == l - 1) {  // remaining 2x2: DLAE2
      double rt1, rt2;
      lae2(d[l], std::sqrt(e[l - 1]), d[l - 1], rt1, rt2);
      d[l] = rt1;
      d[l - 1] = rt2;
      e[l - 1] = 0.0;
      l -= 2;
      continue;
    }
    if (jtot == nmaxit) return;
    ++jtot;

    const double sigma = root_free_shift(p, d[l - 1], e[l - 1]);
    double c = 1.0, s = 0.0;
    double gamma = d[m] - sigma;
    p = gamma * gamma;
    for (Eigen::Index i = m; i <= l - 1; ++i) {  // inner loop (label 130)
      const double bb = e[i];
      const double r = p + bb;
      if (i != m) e[i - 1] = s * r;
      const double oldc = c;
      c = p / r;
      s = bb / r;
      const double oldgam = gamma;
      const double alpha = d[i + 1];
      gamma = c * (alpha - sigma) - s * oldgam;
      d[i] = oldgam + (alpha - gamma);
      p = (c != 0.0) ? (gamma * gamma) / c : oldc * bb;
    }
    e[l - 1] = s * p;
    d[l] = sigma + gamma;
  }
}

}  // namespace

int sterf(Eigen::Index n, double* d, double* e) {
  if (n <= 1) return 0;
  const int nmaxit = static_cast<int>(n) * kMaxIt;
  int jtot = 0;

  // Determine where the matrix splits and choose QL or QR iteration for each block, according to
  // whether the top or bottom diagonal element is smaller (label 10).
  for (Eigen::Index l1 = 0; l1 < n;) {
    if (l1 > 0) e[l1 - 1] = 0.0;
    Eigen::Index m = n - 1;
    for (Eigen::Index i = l1; i < n - 1; ++i) {
      if (std::abs(e[i]) <= (std::sqrt(std::abs(d[i])) * std::sqrt(std::abs(d[i + 1]))) * kEps) {
        e[i] = 0.0;
        m = i;
        break;
      }
    }
    Eigen::Index l = l1, lend = m;
    const Eigen::Index lsv = l, lendsv = lend;
    l1 = m + 1;
    if (lend == l) continue;

    // Scale submatrix in rows and columns l to lend.
    const double anorm = lanst_max(lend - l + 1, d + l, e + l);
    if (anorm == 0.0) continue;
    double scaled_to = 0.0;  // 0: ISCALE = 0; else SSFMAX (ISCALE = 1) or SSFMIN (ISCALE = 2)
    if (anorm > kSsfmax) {
      scaled_to = kSsfmax;
    } else if (anorm < kSsfmin) {
      scaled_to = kSsfmin;
    }
    if (scaled_to != 0.0) {
      lascl(anorm, scaled_to, lend - l + 1, d + l);
      lascl(anorm, scaled_to, lend - l, e + l);
    }
    for (Eigen::Index i = l; i < lend; ++i) e[i] = e[i] * e[i];

    // Choose between QL and QR iteration.
    if (std::abs(d[lend]) < std::abs(d[l])) std::swap(l, lend);
    if (lend >= l) {
      ql_block(d, e, l, lend, jtot, nmaxit);
    } else {
      qr_block(d, e, l, lend, jtot, nmaxit);
    }

    // Undo scaling if necessary (label 150).
    if (scaled_to != 0.0) lascl(scaled_to, anorm, lendsv - lsv + 1, d + lsv);

    // Check for no convergence to an eigenvalue after a total of nmaxit iterations.
    if (jtot >= nmaxit) {
      int info = 0;
      for (Eigen::Index i = 0; i < n - 1; ++i) info += (e[i] != 0.0);
      // LAPACK returns here without sorting even if info == 0 (the last allowed iteration happened
      // to finish everything, which needs every later block to be already split); we carry on to
      // the sort in that case so that the output is ascending.
      if (info > 0) return info;
    }
  }

  std::sort(d, d + n);  // DLASRT('I')
  return 0;
}

}  // namespace detail

namespace {
#if defined(GRADFLOW_OPENBLAS)
extern "C" void dsterf_(const int* n, double* d, double* e, int* info);  // LAPACK, in OpenBLAS
#endif

// The port, or LAPACK's own DSTERF when the kernel choice asks for the library (kernels.hpp).
int sterf_of_choice(Eigen::Index n, double* d, double* e) {
#if defined(GRADFLOW_OPENBLAS)
  if (!kernel_choice().sterf_port) {
    const int size = static_cast<int>(n);
    int info = 0;
    dsterf_(&size, d, e, &info);
    return info;
  }
#endif
  return detail::sterf(n, d, e);
}
}  // namespace

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

  if (sterf_of_choice(n, eigenvalues.data(), subdiag.data()) > 0) return false;
  eigenvalues *= scale;
  return true;
}

}  // namespace gradflow
