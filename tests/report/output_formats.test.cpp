// The output formats' table: --format's choices, the extension map and --help's list are read from
// it, so a table with one more row accepts, maps and lists that format with no other change.
#include <doctest/doctest.h>

#include <sstream>

#include "gradflow/app/check.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

using namespace gradflow;

namespace {
void write_tab_separated(const AnalysisReport& report, std::ostream& out, const WriteOptions&) {
  out << "tsv of " << report.results.size() << " runs\n";
}

// The shipped table and one more row: a format for analyses only.
std::vector<OutputFormat> with_tsv() {
  std::vector<OutputFormat> formats = output_formats();
  formats.push_back(
      {.name = "tsv", .extension = ".tsv", .help = "tab-separated", .analysis = write_tab_separated});
  return formats;
}
}  // namespace

TEST_CASE("the shipped formats: each subcommand's choices, extensions and help list") {
  using Names = std::vector<std::string>;
  CHECK(format_names(OutputKind::analysis) == Names{"json", "csv", "table", "markdown"});
  CHECK(format_names(OutputKind::placements) == Names{"json", "table"});
  CHECK(format_names(OutputKind::checkpoint_contents) == Names{"json", "table"});
  CHECK(format_names(OutputKind::check) == Names{"json", "markdown"});
  CHECK(format_names(OutputKind::sweep) == Names{"json", "csv"});
  CHECK(format_extensions(OutputKind::analysis) == Names{".json", ".csv", ".md"});
  CHECK(format_extensions(OutputKind::sweep) == Names{".json", ".csv"});
  CHECK(format_of_extension(".md") == "markdown");
  CHECK(format_of_extension(".csv") == "csv");
  CHECK(format_of_extension(".txt") == "");
  CHECK(format_of_extension("") == "");  // table has no extension: a file without one is not a table
  CHECK(format_list_help(OutputKind::analysis) ==
        "json, csv, table (a summary for people) or markdown (the same as a Markdown table)");
  CHECK(format_list_help(OutputKind::sweep) == "json or csv");
}

TEST_CASE("every format offers a writer for what it lists, and no two share a name or an extension") {
  const auto& formats = output_formats();
  for (std::size_t i = 0; i < formats.size(); ++i) {
    CHECK((formats[i].analysis || formats[i].placements || formats[i].checkpoint_contents ||
           formats[i].check || formats[i].sweep));
    for (std::size_t j = i + 1; j < formats.size(); ++j) {
      CHECK(formats[i].name != formats[j].name);
      if (!formats[i].extension.empty()) CHECK(formats[i].extension != formats[j].extension);
    }
  }
}

TEST_CASE("a row added to the table is accepted by --format, named by its extension and listed in --help") {
  const std::vector<OutputFormat> formats = with_tsv();
  const auto names = format_names(OutputKind::analysis, formats);
  CHECK(std::find(names.begin(), names.end(), "tsv") != names.end());
  CHECK(format_of_extension(".tsv", formats) == "tsv");
  CHECK(format_list_help(OutputKind::analysis, formats).ends_with("or tsv (tab-separated)"));
  // It offers analyses only: not a choice of archs, check or merge.
  for (const OutputKind kind :
       {OutputKind::placements, OutputKind::checkpoint_contents, OutputKind::check, OutputKind::sweep}) {
    const auto others = format_names(kind, formats);
    CHECK(std::find(others.begin(), others.end(), "tsv") == others.end());
    CHECK_THROWS_AS(find_format("tsv", kind, formats), InputError);
  }
  // The row's writer is the one find_format hands out.
  std::ostringstream out;
  find_format("tsv", OutputKind::analysis, formats).analysis(AnalysisReport{}, out, {});
  CHECK(out.str() == "tsv of 0 runs\n");
  // Without the row, the shipped table knows nothing of it.
  CHECK(format_of_extension(".tsv") == "");
  CHECK_THROWS_AS(find_format("tsv", OutputKind::analysis), InputError);
}
