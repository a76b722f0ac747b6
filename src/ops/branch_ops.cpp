// The table of branch ops (branch_op.hpp): one row per op, each defined in its own file.
#include <stdexcept>

#include "gradflow/branch_op.hpp"

namespace gradflow {

const std::vector<BranchOpRow>& branch_ops() {
  static const std::vector<BranchOpRow> rows = {attention_op_row(), ffn_op_row()};
  return rows;
}

int branch_op_index(SublayerKind kind, const BlockOps& ops) {
  const auto& rows = branch_ops();
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].serves(kind, ops)) return static_cast<int>(i);
  throw std::logic_error("no branch op serves this sublayer");
}

BlockOps block_ops(const ModelConfig& config) {
  return {config.ffn, config.kv_head_count(), config.rope_theta, config.rotary_dims(), config.norm_eps};
}

}  // namespace gradflow
