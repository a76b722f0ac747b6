// analyze --config and sweep --config PATH|NAME: a Hugging Face config.json (or one shipped in
// data/configs/) as the model's configuration, flags given on the command line overriding it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "commands.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"
#include "shipped_configs.hpp"

namespace gradflow::cli {

namespace {
// The file's text and the name messages give it: the path when it exists, else a shipped config
// by name ("llama-3.2-1b" or "llama-3.2-1b.json").
std::pair<std::string, std::string> config_text(const std::string& spec) {
  if (path_exists(spec)) {
    if (std::filesystem::is_directory(spec))
      throw InputError(fmt::format("--config {} is a directory; give the model's config.json", spec));
    const auto text = read_text_file(spec);
    if (!text) throw InputError(fmt::format("--config {}: cannot read the file", spec));
    return {spec, *text};
  }
  const std::string name = std::filesystem::path(spec).extension() == ".json"
                               ? std::filesystem::path(spec).replace_extension().string()
                               : spec;
  for (const auto& [shipped, text] : kShippedConfigs) {
    if (shipped == name) return {fmt::format("data/configs/{}.json", name), std::string(text)};
  }
  throw InputError(fmt::format("--config {}: no such file, and no shipped config of that name ({})", spec,
                               shipped_config_names()));
}

bool flag_given(const CLI::App& app, std::string_view flag) {
  const CLI::Option* option = app.get_option_no_throw(std::string(flag));
  return option && option->count() > 0;
}
}  // namespace

std::string shipped_config_names() {
  std::vector<std::string_view> names;
  for (const auto& [shipped, text] : kShippedConfigs) names.push_back(shipped);
  return fmt::format("{}", fmt::join(names, ", "));
}

ConfigOption read_config_option(const std::string& spec, const CLI::App& app) {
  auto [origin, text] = config_text(spec);
  ConfigOption option{origin, read_model_config_file(text, origin, flag_given(app, "--arch")), {}};
  return option;
}

void apply_config_option(ConfigOption& option, const CLI::App& app, ModelConfig& model, std::string& arch) {
  const auto given = [&app](std::string_view flag) { return flag_given(app, flag); };
  const nlohmann::ordered_json from_file = apply_model_config_file(option.file, model, given);
  if (!given("--arch")) arch = option.file.placement;
  // Every config field's source: the file's, else the flag when given, else the default.
  nlohmann::ordered_json sources = {{"arch", given("--arch") ? "--arch" : option.file.placement_source}};
  for (const ConfigField& field : config_fields()) {
    const std::string key(field.key);
    if (from_file.contains(key)) {
      sources[key] = from_file[key];
    } else if (field.flag.find('/') != std::string_view::npos) {
      sources[key] = fmt::format("derived ({})", field.flag);
    } else {
      sources[key] = !field.flag.empty() && given(field.flag) ? std::string(field.flag) : "default";
    }
  }
  for (const auto& [key, source] : from_file.items()) {
    if (!sources.contains(key)) sources[key] = source;
  }
  option.document = {{"path", option.origin},
                     {"model_type", option.file.model_type},
                     {"sources", sources},
                     {"notes", option.file.notes}};
}

void print_config_notes(const ConfigOption& option, bool verbose) {
  for (const std::string& note : option.file.notes)
    fmt::print(stderr, "gradflow: note: {}: {}\n", option.origin, note);
  if (verbose && !option.file.unused.empty()) {
    fmt::print(stderr, "gradflow: {}: keys not used: {}\n", option.origin,
               fmt::join(option.file.unused, ", "));
  }
}

}  // namespace gradflow::cli
