// One constructor per architecture recipe file; registry.cpp puts them in one table.
#pragma once
#include "gradflow/architecture.hpp"

namespace gradflow::archs {
Architecture post_ln();
Architecture pre_ln();
Architecture deepnorm();
Architecture keel();
Architecture plain();
}  // namespace gradflow::archs
