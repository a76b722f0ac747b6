// What a trained checkpoint directory holds (archs --checkpoint; analyze's config.checkpoint), as
// JSON or for people.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>

#include "gradflow/app/checkpoint_files.hpp"

namespace gradflow {

namespace {
using json = nlohmann::ordered_json;

std::string update_rule(const HfModelSpec& spec) {
  return spec.input_norms && !spec.output_norms ? "x <- x + F(N(x))"
         : spec.input_norms                     ? "x <- x + N(F(N(x)))"
                                                : "x <- x + N(F(x))";
}
}  // namespace

CheckpointContents checkpoint_contents(const CheckpointFiles& files) {
  return {.directory = files.directory(),
          .spec = files.spec(),
          .file_names = files.file_names(),
          .tensors = files.entries(),
          .ignored_tensors = files.ignored_tensors()};
}

json checkpoint_to_json(const CheckpointContents& contents) {
  const HfModelSpec& spec = contents.spec;
  std::map<std::string, int> dtypes;
  for (const TensorEntry& entry : contents.tensors) ++dtypes[entry.dtype_name];
  json doc = {{"directory", contents.directory},
              {"model_type", spec.model_type},
              {"placement", std::string(family_placement(spec.family))},
              {"layers", spec.layers},
              {"hidden_size", spec.hidden},
              {"heads", spec.heads},
              {"kv_heads", spec.kv_heads},
              {"head_dim", spec.head_dim},
              {"intermediate_size", spec.intermediate},
              {"vocab_size", spec.vocab},
              {"tied_embeddings", spec.tied},
              {"files", json::array()},
              {"tensor_count", contents.tensors.size()},
              {"dtypes", dtypes}};
  for (const std::string& name : contents.file_names)
    doc["files"].push_back(std::filesystem::path(name).filename().string());
  if (!contents.ignored_tensors.empty()) doc["ignored_tensors"] = contents.ignored_tensors;
  return doc;
}

void write_checkpoint_json(const CheckpointContents& contents, std::ostream& out) {
  json doc = checkpoint_to_json(contents);
  doc["update_rule"] = update_rule(contents.spec);
  json tensors = json::array();
  for (const TensorEntry& entry : contents.tensors)
    tensors.push_back({{"name", entry.name}, {"dtype", entry.dtype_name}, {"shape", entry.shape}});
  doc["tensors"] = tensors;
  out << doc.dump(2) << '\n';
}

void write_checkpoint_table(const CheckpointContents& contents, std::ostream& out) {
  const HfModelSpec& spec = contents.spec;
  const json doc = checkpoint_to_json(contents);
  std::string dtypes;
  for (const auto& [name, count] : doc["dtypes"].items())
    dtypes += fmt::format("{}{} x {}", dtypes.empty() ? "" : ", ", count.get<int>(), name);
  fmt::print(out, "checkpoint  {}\n", contents.directory);
  fmt::print(out, "model_type  {} -> placement {} ({})\n", spec.model_type,
             std::string(family_placement(spec.family)), update_rule(spec));
  fmt::print(out, "layers      {} ({} sublayers)\n", spec.layers, spec.sublayers());
  fmt::print(out, "widths      hidden {}, heads {} x {}, kv heads {}, intermediate {}, vocab {}\n",
             spec.hidden, spec.heads, spec.head_dim, spec.kv_heads, spec.intermediate, spec.vocab);
  fmt::print(out, "head        {}\n", spec.tied ? "tied to the token embedding" : "its own lm_head.weight");
  fmt::print(out, "files       {}\n", fmt::join(doc["files"].get<std::vector<std::string>>(), ", "));
  fmt::print(out, "tensors     {} ({})\n", contents.tensors.size(), dtypes);
  for (const TensorEntry& entry : contents.tensors)
    fmt::print(out, "  {:<52} {:<5} [{}]\n", entry.name, entry.dtype_name, fmt::join(entry.shape, ", "));
}

}  // namespace gradflow
