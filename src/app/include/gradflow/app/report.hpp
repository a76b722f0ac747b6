// Reporters: one function per output format, each writing a finished analysis to a stream.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/analysis.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/sweep.hpp"

namespace gradflow {

inline constexpr int kSchemaVersion = 1;

struct AnalysisReport {
  std::vector<ArchResult> results;
  int threads = 1;
  double total_seconds = 0.0;
  bool timing = true;  // false (--no-timing): no wall times and no thread count, for byte-comparable output
  // analyze --config: every run's config.config_file (path, model_type, sources, notes); null otherwise.
  nlohmann::ordered_json config_file;
  // analyze --checkpoint: every run's config.checkpoint (directory, model_type, files, tokens, loss).
  nlohmann::ordered_json checkpoint;
};

// Where the numbers come from (JSON "tool"): version, the git commit CMake saw when it configured the
// build ("" outside a checkout), the compiler, and which product kernels ran: "avx512" (gradflow's
// tiled float32 kernels) or "portable" (Eigen), with "openblas" or "eigen" for float64 products.
// Figures differ between kernel paths by float rounding.
nlohmann::ordered_json provenance_to_json();

// A double as JSON: the number, or null when it is not finite (the document's `diverged` says why).
nlohmann::ordered_json json_number(double value);
nlohmann::ordered_json json_numbers(const std::vector<double>& values);

// ---- the configuration in documents (config_fields.cpp)
// One field of the model configuration as the documents record it. config_fields() lists them in
// document order: analyze's per-run "config", a sweep's "model", the manifest check and `check`'s
// comparison all loop over this one list (placement options come from the placements).
struct ConfigField {
  std::string_view key;   // JSON key
  std::string_view flag;  // the flag that sets it, for advice ("--depth"); "" when none does
  nlohmann::ordered_json (*value)(const ModelConfig&);
  bool in_sweep_model;  // shared by every cell of a sweep, so in its "model" (depth and width vary per cell)
  bool compared;        // runs that differ in it measure different things: `check` refuses to compare them
  // Whether documents record it for this configuration (null: always); --update's fields only with it.
  bool (*present)(const ModelConfig&) = nullptr;
};
const std::vector<ConfigField>& config_fields();
// Every field of config_fields() for one run, in order.
nlohmann::ordered_json run_config_fields(const ModelConfig& config);
// Appends to a run's config the placement's options marked in_run_config, then norm constants (dyt_alpha).
void add_run_config_options(nlohmann::ordered_json& config, const Architecture& arch,
                            const ModelConfig& model);
// The keys whose difference makes two runs incomparable: compared fields, then in_run_config options.
std::vector<std::string> compared_config_keys();
// A recorded config's value of `key`: as written, else (for fields added after the document's
// version, such as issue 19's ffn or kv_heads) the default configuration's value, else null.
nlohmann::ordered_json recorded_config_value(const nlohmann::ordered_json& config, std::string_view key);
// The flag that sets a config key or placement option, for advice; the key itself when none does.
std::string config_flag(std::string_view key);

// ---- the summary figures in documents (summary_fields.cpp)
// How a figure's difference is measured by `check`: log-space figures (log10_*) by absolute
// difference in decades; positive linear figures (rms, gain, effective_depth, ...) by
// |log10(new / old)|, also in decades; exponents and slopes by absolute difference.
enum class FigureScale { log_space, linear, exponent };

// What one summary entry holds, which says how the JSON aggregate, the sweep rows and CSV and
// `check` treat it: a number; an extremum {"value", "sublayer"} (check compares the value and
// names the sublayer; CSV has KEY and KEY_sublayer); a word that must not change; an event, null
// or an object with a "sublayer" (CSV: KEY_sublayer; not compared, the figures it stops are); or a
// structure that another entry's figures already gate (the fit whose exponent is growth_exponent).
enum class SummaryKind { number, extremum, word, event, structure };

// One entry of a seed's "summary". summary_fields() lists them in document order: the per-seed
// JSON, the across-seed aggregate, a sweep's rows and CSV, the document check and `check`'s
// comparison all loop over this one list, so a new summary figure is one row here.
struct SummaryField {
  std::string_view key;
  SummaryKind kind;
  nlohmann::ordered_json (*value)(const SeedResult&);  // the per-seed JSON
  // The across-seed aggregate: the spread of a sample (numbers, extrema), or a value of its own
  // (words: the seeds' common one); neither: not aggregated.
  double (*sample)(const SeedResult&) = nullptr;
  nlohmann::ordered_json (*across_seeds)(const std::vector<SeedResult>&) = nullptr;
  bool in_sweep_cell = false;  // a column of the sweep's rows and CSV
  FigureScale scale = FigureScale::linear;
  std::optional<double> tolerance =
      std::nullopt;  // check's tolerance; none: the --tolerances value of its scale
  // Whether documents record it for this seed (null: always); --update's entry only with it.
  bool (*present)(const SeedResult&) = nullptr;
};
const std::vector<SummaryField>& summary_fields();
// A seed's "summary" object: every field of `fields` that is present, in order.
nlohmann::ordered_json summary_to_json(const SeedResult& seed,
                                       const std::vector<SummaryField>& fields = summary_fields());
// The across-seed "summary": the mean, std and t-interval of every sampled field, the common word.
nlohmann::ordered_json aggregate_summary_to_json(const std::vector<SeedResult>& seeds,
                                                 const std::vector<SummaryField>& fields = summary_fields());
// The summary field named `key`, or null.
const SummaryField* find_summary_field(std::string_view key,
                                       const std::vector<SummaryField>& fields = summary_fields());
// {"mean", "std", "ci95_low", "ci95_high"} of samples (statistics.hpp's spread).
nlohmann::ordered_json spread_to_json(const std::vector<double>& samples);

// The resolved configuration of one placement's run (every default explicit, constants included).
nlohmann::ordered_json config_to_json(const ArchResult& result);
nlohmann::ordered_json report_to_json(const AnalysisReport& report);
// How an analysis is written besides its figures: ANSI colour in the table only when set (the
// caller knows whether stdout is a terminal).
struct WriteOptions {
  bool colour = false;
};
void write_json(const AnalysisReport& report, std::ostream& out, const WriteOptions& options = {});
void write_csv(const AnalysisReport& report, std::ostream& out, const WriteOptions& options = {});
// A summary for people: one row per placement (mean and spread across seeds), aligned in columns.
void write_table(const AnalysisReport& report, std::ostream& out, const WriteOptions& options = {});
// The same rows as a GitHub Markdown table.
void write_markdown(const AnalysisReport& report, std::ostream& out, const WriteOptions& options = {});

// ---- the output formats (output_formats.cpp)
// What a subcommand writes: each is one typed result, which a format may or may not offer.
enum class OutputKind { analysis, placements, checkpoint_contents, check, sweep };
struct PlacementsReport;    // archs (below)
struct CheckpointContents;  // archs --checkpoint (checkpoint_files.hpp)
struct CheckReport;         // check (check.hpp)
struct SweepSummary;        // merge (below)

// One output format: its name for --format, the -o extension that names it, and a writer for each
// kind of result it offers (null: not offered). output_formats() lists them; --format's choices,
// the extension map and --help's list of formats are read from it, so a new format is one file
// (its writers) and one row.
struct OutputFormat {
  std::string_view name;       // --format's value
  std::string_view extension;  // the -o FILE extension that names it (".csv"); "" when none does
  std::string_view help;       // what it is, in --help ("a summary for people"); "" when the name says it
  void (*analysis)(const AnalysisReport&, std::ostream&, const WriteOptions&) = nullptr;  // analyze
  void (*placements)(const PlacementsReport&, std::ostream&) = nullptr;                   // archs
  void (*checkpoint_contents)(const CheckpointContents&, std::ostream&) = nullptr;  // archs --checkpoint
  void (*check)(const CheckReport&, std::ostream&) = nullptr;                       // check
  void (*sweep)(const SweepSummary&, std::ostream&) = nullptr;                      // merge
};
const std::vector<OutputFormat>& output_formats();
// Whether `format` offers a writer for `kind`.
bool offers(const OutputFormat& format, OutputKind kind);
// The names of the formats that offer `kind`, in table order: --format's choices.
std::vector<std::string> format_names(OutputKind kind,
                                      const std::vector<OutputFormat>& formats = output_formats());
// The format named `name` that offers `kind`; throws InputError naming the choices otherwise.
const OutputFormat& find_format(std::string_view name, OutputKind kind,
                                const std::vector<OutputFormat>& formats = output_formats());
// The format a file's extension names (".md" -> "markdown"), any kind; "" when none does.
std::string format_of_extension(std::string_view extension,
                                const std::vector<OutputFormat>& formats = output_formats());
// The extensions of the formats that offer `kind` (".json", ".csv"), in table order.
std::vector<std::string> format_extensions(OutputKind kind,
                                           const std::vector<OutputFormat>& formats = output_formats());
// --help's list: "json, csv, table (a summary for people) or markdown (...)".
std::string format_list_help(OutputKind kind, const std::vector<OutputFormat>& formats = output_formats());

// ---- sweeps (sweep_reporter.cpp)
// One sweep cell: exactly the analyze document of that single (arch, depth, width, seed) run,
// minus the timing-dependent fields (threads, timing), so that reruns give the same bytes.
nlohmann::ordered_json cell_document(const ArchResult& result);
// The model options every cell of a sweep shares (everything but arch, depth, width and seed).
nlohmann::ordered_json sweep_model_to_json(const ModelConfig& config);
// DIR/sweep.json: the grid and the shared model options; identical for every shard of a sweep.
// `config_file` (sweep --config: path, model_type, sources, notes; null without) is recorded too.
nlohmann::ordered_json sweep_manifest(const SweepGrid& grid, const ModelConfig& config,
                                      const nlohmann::ordered_json& config_file = nullptr);
// The grid of a manifest; throws InputError naming `origin` when it is malformed.
SweepGrid grid_from_manifest(const nlohmann::ordered_json& manifest, const std::string& origin);
// The figures the fits need, read from a cell document; throws InputError naming `origin`.
CellFigures cell_figures(const nlohmann::ordered_json& cell, const std::string& origin);
// One cell's row of a sweep: its identity, rms(x_S), the summary figures of the sweep rows (as
// the cell document records them, in summary_fields() order; null when an older cell lacks one)
// and, with --update, output_update_rel per learning rate.
struct SweepRow {
  SweepCell cell;
  int sublayers = 0;
  double rms_final = 0.0;
  std::vector<std::pair<std::string_view, nlohmann::ordered_json>> summary;
  std::vector<double> output_update_rel;
};
// A finished sweep: its manifest, one row per cell in the global order, and the cross-depth fits.
struct SweepSummary {
  nlohmann::ordered_json manifest;
  std::vector<SweepRow> rows;
  std::vector<SweepFit> fits;
};
// `cells` holds every cell document of the grid, in the global order.
SweepSummary sweep_summary(const nlohmann::ordered_json& manifest,
                           const std::vector<nlohmann::ordered_json>& cells);
// The sweep document: manifest, one summary row per cell in the global order, and the fits.
nlohmann::ordered_json sweep_summary_to_json(const SweepSummary& sweep);
nlohmann::ordered_json sweep_document(const nlohmann::ordered_json& manifest,
                                      const std::vector<nlohmann::ordered_json>& cells);
// The sweep document, compact, one line.
void write_sweep_json(const SweepSummary& sweep, std::ostream& out);
// The sweep as CSV: one row per cell (its summary figures), RFC 4180.
void write_sweep_csv(const SweepSummary& sweep, std::ostream& out);

// The key where two JSON objects first differ, as "PREFIXkey: A vs B" ("model.seq: 16 vs 32");
// empty when equal. Compares a sweep's manifests and a cell file with the run it should hold.
std::string first_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                             const std::string& prefix);

// ---- the placements (archs_reporter.cpp)
// A placement's registry entry (gradflow archs), with constants at `config`'s depth.
nlohmann::ordered_json architecture_to_json(const Architecture& arch, const ModelConfig& config);
// What `gradflow archs` lists: placements with their constants at `config`'s depth.
struct PlacementsReport {
  std::vector<const Architecture*> architectures;
  ModelConfig config;
  bool detail = false;  // --arch given: each in detail, with its closed forms
};
// {"schema_version", "depth_blocks", "sublayers", "architectures"}, indented by one.
void write_placements_json(const PlacementsReport& report, std::ostream& out);
// For people: one paragraph per placement (in detail, or a few lines each and a count).
void write_placements_table(const PlacementsReport& report, std::ostream& out);

// safetensors: 8-byte little-endian header size, JSON header, raw little-endian data.
void write_safetensors(const std::vector<NamedTensor>& tensors, Precision precision,
                       const nlohmann::ordered_json& metadata, std::ostream& out);

}  // namespace gradflow
