// Subcommands (one file each, CLI11's subcom_in_files pattern) and the helpers they share.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gradflow/architecture.hpp"
#include "gradflow/config.hpp"

namespace gradflow::cli {

// setup_x registers subcommand x on the app; `run` executes it once parsed and returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
Command setup_analyze(CLI::App& app);
Command setup_archs(CLI::App& app);
Command setup_sweep(CLI::App& app);
Command setup_merge(CLI::App& app);
Command setup_check(CLI::App& app);
Command setup_explain(CLI::App& app);

// parse_errors.cpp: CLI11's parse errors as one line naming the value, the fix and the
// subcommand's --help; a mistyped subcommand (argv without the program name) with a suggestion,
// or "" when the first word is a subcommand or absent.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& error,
                                const std::vector<std::string>& args);
std::string unknown_subcommand(const CLI::App& app, const std::vector<std::string>& args);

// The model flags analyze and sweep share (model_options.cpp): everything but --arch, --depth,
// --width and the seeds, which each subcommand declares in its own shape.
struct ModelOptions {
  ModelConfig model;
  std::string block = "attn-ffn", norm = "rms", init = "xavier", precision = "f32";
  bool ideal_branch = false;
  const CLI::Option* mix_ratio_flag = nullptr;  // to tell a given --mix-ratio from its default
};
void add_model_options(CLI::App* sub, ModelOptions& options);
// The configuration the flags describe (depth and width as set on options.model), validated.
ModelConfig resolve_model(const ModelOptions& options);
// Refuses --alpha when no placement of `archs` accepts it; warns for those that ignore it.
void check_alpha_applies(const ModelConfig& model, const std::vector<const Architecture*>& archs,
                         const std::string& arch_list);
// Warns when --mix-ratio or --rezero-alpha is given but no placement of `archs` uses it.
void warn_unused_placement_options(const ModelOptions& options,
                                   const std::vector<const Architecture*>& archs);
// Refuses up front a configuration whose `concurrent` runs would not fit in memory.
void check_memory(const ModelConfig& model, const std::vector<const Architecture*>& archs, int concurrent);

// Output that appears whole or not at all: a temporary file beside the target, renamed on
// commit(); removed if never committed. An empty path means stdout (written at commit()).
class AtomicOutput {
 public:
  explicit AtomicOutput(std::string path);  // throws InputError when the path is not writable
  ~AtomicOutput();
  std::ostream& stream();
  void commit();

 private:
  std::string path_, temporary_;
  std::ofstream file_;
  std::ostringstream buffer_;
  bool committed_ = false;
};

// The output format of analyze and merge: --format when given (`format`, "" when not); else the
// format -o's extension names (.json, .csv, .md), JSON for any other file or a pipe, and
// `terminal_format` when stdout is a terminal. Refuses -o '' and an extension that contradicts
// --format or names a format outside `allowed`.
std::string resolve_output_format(const std::string& format, const CLI::Option* output_flag,
                                  const std::string& output, const std::vector<std::string>& allowed,
                                  const std::string& terminal_format);

// A file's whole contents; nullopt when it cannot be opened.
std::optional<std::string> read_text_file(const std::string& path);
// Parses a JSON file; throws InputError naming the path when it is missing or malformed.
nlohmann::ordered_json read_json_file(const std::string& path);
// The key where two JSON objects first differ, as "PREFIXkey: A vs B"; empty when equal.
std::string first_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                             const std::string& prefix);
// Writes `text` to `path` whole or not at all (AtomicOutput).
void write_file_atomically(const std::string& path, const std::string& text);

// Bytes of memory this machine can give a new process (MemAvailable), 0 if unknown.
std::uint64_t available_memory_bytes();

// A one-line progress bar on stderr, shown only when stderr is a terminal and not --quiet, and
// only once the run has taken longer than kDelay: short runs never flash a bar.
class ProgressBar {
 public:
  static constexpr std::chrono::milliseconds kDelay{1000};
  ProgressBar(bool enabled, std::string label);
  ~ProgressBar();
  void update(long long done, long long total);
  void set_label(std::string label);
  void finish();  // erase the bar (if drawn) and draw no more

 private:
  bool enabled_;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  int last_permille_ = -1;
};
bool stderr_is_terminal();
bool stdout_is_terminal();

}  // namespace gradflow::cli
