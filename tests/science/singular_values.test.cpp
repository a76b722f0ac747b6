// singular_values (singular_values.hpp, LAPACK's DGESVD), behind --exact-jacobian's spectral norm
// and top-k singular values: against Eigen's JacobiSVD on random shapes, and on the Jacobian where
// Eigen 3.4.0's BDCSVD, which gradflow used before, returns a wrong top value.
#include "gradflow/singular_values.hpp"

#include <doctest/doctest.h>

#include <Eigen/SVD>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "support/finite_difference.hpp"

using namespace gradflow;

namespace {
Eigen::MatrixXd read_rows(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  std::vector<std::vector<double>> rows;
  for (std::string line; std::getline(file, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    rows.emplace_back();
    for (double x; fields >> x;) rows.back().push_back(x);
  }
  Eigen::MatrixXd m(static_cast<Eigen::Index>(rows.size()), static_cast<Eigen::Index>(rows.front().size()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = rows[i][j];
  return m;
}

void check_against_jacobi(const Eigen::MatrixXd& m) {
  Eigen::VectorXd values;
  REQUIRE(singular_values(m, values));
  const Eigen::VectorXd expected = Eigen::JacobiSVD<Eigen::MatrixXd>(m).singularValues();
  REQUIRE(values.size() == expected.size());
  CHECK((values - expected).norm() <= 1e-12 * expected.norm());
}
}  // namespace

TEST_CASE("singular_values agrees with JacobiSVD on random matrices of every shape") {
  unsigned seed = 1;
  for (const auto& [rows, cols] : {std::pair{1, 1}, {5, 3}, {3, 5}, {64, 32}, {32, 64}, {40, 40}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    check_against_jacobi(testing::random_matrix(rows, cols, seed++));
  }
  Eigen::VectorXd values;
  REQUIRE(singular_values(Eigen::MatrixXd(0, 4), values));
  CHECK(values.size() == 0);
  Eigen::MatrixXd nan = Eigen::MatrixXd::Ones(4, 3);
  nan(1, 1) = std::nan("");
  CHECK_FALSE((singular_values(nan, values) && values.allFinite()));
}

TEST_CASE("singular_values is right on the Jacobian where Eigen 3.4.0's BDCSVD is not") {
  const Eigen::MatrixXd jacobian =
      read_rows(std::string(GRADFLOW_TEST_DIR) + "/science/bdcsvd_counterexample.txt");
  REQUIRE(jacobian.rows() == 64);
  REQUIRE(jacobian.cols() == 32);
  check_against_jacobi(jacobian);
  Eigen::VectorXd values;
  REQUIRE(singular_values(jacobian, values));
  CHECK(values(0) == doctest::Approx(3.498583).epsilon(1e-6));
  // What gradflow computed before (BDCSVD, divide and conquer): MESSAGE only, since a later Eigen may fix it.
  MESSAGE("BDCSVD's top singular value here: ", Eigen::BDCSVD<Eigen::MatrixXd>(jacobian).singularValues()(0));
}
