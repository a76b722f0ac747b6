// Test helper: the small stacks the unit tests analyse, float64 unless told otherwise.
#pragma once
#include "gradflow/config.hpp"

namespace gradflow::testing {

inline ModelConfig small_model(int blocks, int width, int heads, int seq,
                               Precision precision = Precision::f64) {
  ModelConfig config;
  config.blocks = blocks;
  config.width = width;
  config.heads = heads;
  config.seq = seq;
  config.precision = precision;
  return config;
}

}  // namespace gradflow::testing
