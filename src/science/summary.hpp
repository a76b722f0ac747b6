// The summary figures that follow from the columns alone, apart from any run so that tests can
// feed them hand-made columns.
#pragma once
#include "gradflow/analysis.hpp"

namespace gradflow {

// log10_grad_rel, log10_grad_ratio, gain_min / gain_max (finite gains only) and the growth fits of
// rms (whole state and per stream), from the columns rms, log10_grad and gain of `result`.
void summarize_figures(SeedResult& result);

}  // namespace gradflow
