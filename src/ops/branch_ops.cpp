// The table of branch ops (branch_op.hpp): one row per op, each defined in its own file, and what
// is derived from the rows: --ffn's words, the ops' options and their validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

const std::vector<BranchOpRow>& branch_ops() {
  static const std::vector<BranchOpRow> rows = {attention_op_row(), ffn_op_row(), moe_op_row()};
  return rows;
}

int branch_op_index(SublayerKind kind, const BlockOps& ops) {
  const auto& rows = branch_ops();
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].serves(kind, ops)) return static_cast<int>(i);
  throw std::logic_error("no branch op serves this sublayer");
}

const BranchOpRow* ffn_op_by_word(std::string_view word) {
  for (const BranchOpRow& row : branch_ops()) {
    for (const FfnWord& ffn : row.ffn_words)
      if (ffn.word == word) return &row;
  }
  return nullptr;
}

std::vector<const FfnWord*> ffn_words() {
  std::vector<const FfnWord*> words;
  for (const BranchOpRow& row : branch_ops()) {
    for (const FfnWord& ffn : row.ffn_words) words.push_back(&ffn);
  }
  return words;
}

std::vector<const PlacementOption*> op_options() {
  std::vector<const PlacementOption*> options;
  for (const BranchOpRow& row : branch_ops()) {
    for (const PlacementOption& option : row.options) options.push_back(&option);
  }
  return options;
}

std::pair<const BranchOpRow*, const PlacementOption*> op_option(std::string_view key) {
  for (const BranchOpRow& row : branch_ops()) {
    for (const PlacementOption& option : row.options)
      if (option.key == key) return {&row, &option};
  }
  return {nullptr, nullptr};
}

namespace {
const FfnWord& ffn_word(std::string_view word) {
  for (const FfnWord* ffn : ffn_words())
    if (ffn->word == word) return *ffn;
  std::vector<std::string_view> words;
  for (const FfnWord* ffn : ffn_words()) words.push_back(ffn->word);
  throw InputError(
      fmt::format("--ffn {:?} is not one of {}; try --ffn {}", word, fmt::join(words, ", "), words.front()));
}

std::string option_text(const OptionValue& value) {
  return std::visit([](const auto& v) { return fmt::format("{}", v); }, value);
}
}  // namespace

void validate_op_options(const ModelConfig& config) {
  ffn_word(config.ffn);
  const BranchOpRow* in_use = ffn_op_by_word(config.ffn);
  for (const auto& [key, value] : config.op_options) {
    const auto [row, option] = op_option(key);
    if (!option) throw std::logic_error(fmt::format("op option {:?} is declared by no branch op", key));
    check_option_value(*option, value);
    if (row != in_use) {
      std::vector<std::string_view> words;
      for (const FfnWord& ffn : row->ffn_words) words.push_back(ffn.word);
      throw InputError(fmt::format("{} {} applies to --ffn {} only, and --ffn is {}; add --ffn {} or omit {}",
                                   option->flag, option_text(value), fmt::join(words, "|"), config.ffn,
                                   words.front(), option->flag));
    }
  }
  if (in_use->check) in_use->check(config);
}

BlockOps block_ops(const ModelConfig& config) {
  BlockOps ops;
  const FfnWord& ffn = ffn_word(config.ffn);
  const BranchOpRow& row = *ffn_op_by_word(config.ffn);
  ops.ffn_op = row.name;
  ops.ffn = ffn.activation;
  ops.kv_heads = config.kv_head_count();
  ops.rope_theta = config.rope_theta;
  ops.rotary_dims = config.rotary_dims();
  ops.norm_eps = config.norm_eps;
  for (const PlacementOption& option : row.options) {
    const auto given = config.op_options.find(option.key);
    if (given != config.op_options.end()) {
      ops.options.emplace(std::string(option.key), given->second);
    } else if (option.default_value) {
      ops.options.emplace(std::string(option.key), *option.default_value);
    }
  }
  return ops;
}

double BlockOps::number(std::string_view key) const {
  const auto found = options.find(key);
  if (found == options.end() || !std::holds_alternative<double>(found->second))
    throw std::logic_error(fmt::format("the FFN op has no number option {:?}", key));
  return std::get<double>(found->second);
}

const std::string& BlockOps::word(std::string_view key) const {
  const auto found = options.find(key);
  if (found == options.end() || !std::holds_alternative<std::string>(found->second))
    throw std::logic_error(fmt::format("the FFN op has no word option {:?}", key));
  return std::get<std::string>(found->second);
}

}  // namespace gradflow
