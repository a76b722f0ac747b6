// The output formats: one table of {name, -o extension, writers}, from which every subcommand's
// --format choices, the extension map and --help's list of formats are read.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gradflow/app/check.hpp"
#include "gradflow/app/checkpoint_files.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

const std::vector<OutputFormat>& output_formats() {
  // In the order --help and the errors list them. A format offers only the kinds it has a writer
  // for: csv has no layout for a list of placements, the table none for a check's report.
  static const std::vector<OutputFormat> formats = {
      {.name = "json",
       .extension = ".json",
       .help = "",
       .analysis = write_json,
       .placements = write_placements_json,
       .checkpoint_contents = write_checkpoint_json,
       .check = write_check_json,
       .sweep = write_sweep_json},
      {.name = "csv", .extension = ".csv", .help = "", .analysis = write_csv, .sweep = write_sweep_csv},
      {.name = "table",
       .extension = "",
       .help = "a summary for people",
       .analysis = write_table,
       .placements = write_placements_table,
       .checkpoint_contents = write_checkpoint_table},
      {.name = "markdown",
       .extension = ".md",
       .help = "the same as a Markdown table",
       .analysis = write_markdown,
       .check = write_check_markdown},
  };
  return formats;
}

bool offers(const OutputFormat& format, OutputKind kind) {
  switch (kind) {
    case OutputKind::analysis:
      return format.analysis != nullptr;
    case OutputKind::placements:
      return format.placements != nullptr;
    case OutputKind::checkpoint_contents:
      return format.checkpoint_contents != nullptr;
    case OutputKind::check:
      return format.check != nullptr;
    case OutputKind::sweep:
      return format.sweep != nullptr;
  }
  return false;
}

std::vector<std::string> format_names(OutputKind kind, const std::vector<OutputFormat>& formats) {
  std::vector<std::string> names;
  for (const OutputFormat& format : formats)
    if (offers(format, kind)) names.emplace_back(format.name);
  return names;
}

const OutputFormat& find_format(std::string_view name, OutputKind kind,
                                const std::vector<OutputFormat>& formats) {
  for (const OutputFormat& format : formats)
    if (format.name == name && offers(format, kind)) return format;
  throw InputError(
      fmt::format("--format {:?} is not one of {}", name, fmt::join(format_names(kind, formats), ", ")));
}

std::string format_of_extension(std::string_view extension, const std::vector<OutputFormat>& formats) {
  for (const OutputFormat& format : formats)
    if (!format.extension.empty() && format.extension == extension) return std::string(format.name);
  return {};
}

std::vector<std::string> format_extensions(OutputKind kind, const std::vector<OutputFormat>& formats) {
  std::vector<std::string> extensions;
  for (const OutputFormat& format : formats)
    if (offers(format, kind) && !format.extension.empty()) extensions.emplace_back(format.extension);
  return extensions;
}

std::string format_list_help(OutputKind kind, const std::vector<OutputFormat>& formats) {
  std::vector<std::string> items;
  for (const OutputFormat& format : formats) {
    if (!offers(format, kind)) continue;
    items.push_back(format.help.empty() ? std::string(format.name)
                                        : fmt::format("{} ({})", format.name, format.help));
  }
  if (items.size() < 2) return fmt::format("{}", fmt::join(items, ""));
  return fmt::format("{} or {}", fmt::join(items.begin(), items.end() - 1, ", "), items.back());
}

}  // namespace gradflow
