// The C++ recipes of the placements the file format cannot express (docs/placement-files.md, "What
// a file cannot express"); registry.cpp puts them in the table with the built-in files.
#pragma once
#include "gradflow/architecture.hpp"

namespace gradflow::archs {
Architecture span_norm();  // two streams inside a block, one between blocks
Architecture admin();      // the skip weight is profiled in a forward pass
}  // namespace gradflow::archs
