// One constructor per architecture recipe file; registry.cpp puts them in one table.
#pragma once
#include "gradflow/architecture.hpp"

namespace gradflow::archs {
Architecture post_ln();
Architecture pre_ln();
Architecture deepnorm();
Architecture keel();
Architecture mix_ln();
Architecture hybridnorm();
Architecture hybridnorm_star();
Architecture resi_dual();
Architecture siamese_norm();
Architecture span_norm();
Architecture peri_ln();
Architecture olmo2();
Architecture admin();
Architecture rezero();
Architecture layerscale();
Architecture depth_mup();
Architecture deepscalelm();
Architecture ngpt();
Architecture lns();
Architecture deepnorm_glm();
Architecture plain();
}  // namespace gradflow::archs
