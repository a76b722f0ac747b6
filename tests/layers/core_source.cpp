// A source of the core layer, compiled with gradflow_core's include path and usage requirements
// by tests/layers/test_include_direction.py: as it is it compiles; with
// GRADFLOW_LAYERS_INCLUDE_APP_HEADER it includes an app header, which the build must refuse.
#include "gradflow/architecture.hpp"
#include "gradflow/statistics.hpp"
#ifdef GRADFLOW_LAYERS_INCLUDE_APP_HEADER
#include "gradflow/app/report.hpp"
#endif

namespace gradflow {
int layers_core_source_compiles() {
  return 0;
}
}  // namespace gradflow
