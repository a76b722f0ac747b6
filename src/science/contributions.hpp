// The output shares from per-probe contributions, apart from any run so that tests can feed it
// hand-made contributions.
#pragma once
#include <vector>

#include "gradflow/analysis.hpp"

namespace gradflow {

// output_share, output_share_se and effective_depth of `result` from log_contribution (S x K,
// row-major: log |c_{l,k}|); leaves them NaN when a contribution is missing (NaN) or none is finite.
void output_shares(const std::vector<double>& log_contribution, int sublayers, int probes,
                   SeedResult& result);

}  // namespace gradflow
