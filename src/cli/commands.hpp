// Subcommands (one file each, CLI11's subcom_in_files pattern) and the helpers they share.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gradflow/app/model_config_file.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/config.hpp"
#include "gradflow/decimal.hpp"

namespace gradflow {
struct AnalysisReport;
enum class OutputKind;  // report.hpp: what a subcommand writes, for the output formats' table
}  // namespace gradflow

namespace gradflow::cli {

class AtomicOutput;

// analyze --checkpoint DIR (checkpoint_command.cpp): the flags that apply to a trained checkpoint.
struct CheckpointCommand {
  std::string directory, tokens;  // tokens: "" draws --seq ids by --seed
  std::string loss = "lm";
  std::string output;
  bool quiet = false, no_timing = false;
  int seq = 64;
  std::uint64_t seed = 0;
  int threads = 1;    // the ops' threads (families on the graph path; checkpoint_graph_gap)
  ModelConfig model;  // precision, --update and its learning rates
};
// Reads, checks and analyses the checkpoint; `write` writes the report to the output opened
// before the work. Returns the exit code.
int run_analyze_checkpoint(const CheckpointCommand& command,
                           const std::function<void(const AnalysisReport&, AtomicOutput&)>& write);
// archs --checkpoint DIR: what was found (model_type, layers, widths, tensors and dtypes, placement).
void print_checkpoint(const std::string& directory, const std::string& format);

// What the items of a comma-separated list are, for an option whose one value the subcommand
// splits itself (--arch keel,pre-ln; sweep's --depth 8,16): CLI11 sees one word of text.
enum class ListItems { text, whole };

// setup_x registers subcommand x on the app; `run` executes it once parsed and returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
  // The options of `app` that take such a list, by long name ("--arch"), for option_table.
  std::map<std::string, ListItems> comma_lists = {};
};

// ---- one command line in this process (run_cli.cpp): main.cpp and the Python module
// What a caller embedding gradflow sees of a run, besides stdout (std::cout) and the files.
struct CliHooks {
  // analyze's finished report, handed over before it is written (not written when it would go
  // to stdout: the caller renders it).
  std::function<void(const AnalysisReport&)> report;
  // (work done, total) as the runs go, from the worker threads (serialised); it may throw
  // Cancelled to stop the run between two sublayers.
  std::function<void(long long, long long)> progress;
  // std::cout writes into the caller's buffer: check_stdout checks that stream only, not the
  // process's C stdout (which the caller's other code may use, or have closed).
  bool stdout_captured = false;
};
// Thrown by a progress hook to stop a run; the command line then ends with exit 130.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "interrupted"; }
};
inline constexpr int kExitInterrupted = 130;
struct CliOutcome {
  int code = 0;
  std::string message;  // the one line for stderr ("" when there is none)
};
// Parses `args` (without the program name) as gradflow's command line and runs it, with `hooks`
// (may be null) active for its duration; one call at a time.
CliOutcome run_cli(const std::string& program, const std::vector<std::string>& args, const CliHooks* hooks);

// One option of a subcommand as the app run_cli parses declares it, for the Python module's type
// check (python/gradflow: what each keyword takes, without reading --help).
struct OptionRow {
  std::vector<std::string> names;  // its long names without "--" ("output"), the first its own
  bool flag = false;               // takes no value (CLI11: expects 0 values)
  // What a value (for a list: each item) is: "whole" (CLI11's INT and UINT, or a number option
  // whose rule refuses fractions: PlacementOption::whole), "real" (FLOAT) or "text".
  std::string kind;
  // "repeat": one occurrence per value (a CLI11 list, --lr); "join": one value of comma-separated
  // items (Command::comma_lists); "": a single value.
  std::string several;
};
struct OptionTable {
  CliOutcome outcome;  // code 2 and the line when the app cannot be built (a broken placement file)
  std::vector<OptionRow> rows;
};
// The options with a long name of `subcommand` (positionals left out), in declaration order; an
// unknown subcommand is exit 2. One call at a time, as run_cli.
OptionTable option_table(const std::string& subcommand);
// The hooks of the run_cli call in progress, or null.
const CliHooks* active_hooks();
// Passes progress to the active hooks, if any (may throw Cancelled).
void report_progress_to_hooks(long long done, long long total);
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
// Every numeric option of the tree reads its values in decimal only (number_options.cpp).
void read_numbers_in_decimal(CLI::App& app);
// The kind of number CLI11 converts an option's values to, from its type name ("INT:POSITIVE",
// "UINT", "FLOAT"); nullopt for words and paths.
std::optional<NumberKind> number_kind(const CLI::Option& option);
// The one-line error for an option given '' or a list with an empty item; "" when there is none.
std::string empty_value_problem(const CLI::App& app, const std::vector<std::string>& args);

// The model flags analyze and sweep share (model_options.cpp): everything but --arch, --depth,
// --width and the seeds, which each subcommand declares in its own shape.
struct ModelOptions {
  ModelConfig model;
  std::string block = "attn-ffn", norm = "rms", init = "xavier", precision = "f32", ffn = "gelu";
  bool ideal_branch = false;
  std::string update = "none";  // --update; its learning rates go to model.learning_rates
  std::string update_params;    // --update-params (empty: not given, matrices)
  // The placement options' flags (PlacementOption), by key; a value only when the flag is given.
  std::map<std::string, std::optional<double>, std::less<>> numbers;
  std::map<std::string, std::optional<std::string>, std::less<>> words;
  // The branch ops' own flags (BranchOpRow::options, e.g. --experts), likewise.
  std::map<std::string, std::optional<double>, std::less<>> op_numbers;
  std::map<std::string, std::optional<std::string>, std::less<>> op_words;
};
void add_model_options(CLI::App* sub, ModelOptions& options);
// The placements' own flags (--alpha, --keel-variant, ...); called after every other flag of `sub`.
void add_placement_options(CLI::App* sub, ModelOptions& options);
// The configuration the flags describe (depth and width as set on options.model), validated;
// `adjust` (analyze --config) changes it before the validation.
ModelConfig resolve_model(const ModelOptions& options, const std::function<void(ModelConfig&)>& adjust = {});
// analyze and sweep --config (config_option.cpp): a config.json given by path or by a shipped
// config's name; one reading and one set of rules (flags given override the file) for both.
struct ConfigOption {
  std::string origin;  // the path, or data/configs/NAME.json for a shipped config
  ModelConfigFile file;
  nlohmann::ordered_json
      document;  // config.config_file (sweep.json's config_file): path, model_type, sources, notes
};
// Reads and checks the file (InputError naming the key or the parse error's line and column).
ConfigOption read_config_option(const std::string& spec, const CLI::App& app);
// The shipped configs' names, comma-separated, for --config's help ("gemma-2-2b, gpt2, ...").
std::string shipped_config_names();
// Sets on `model` every field whose flag `app` did not see and, without --arch, `arch` to the
// family's placement; fills option.document with the source of every configuration field.
void apply_config_option(ConfigOption& option, const CLI::App& app, ModelConfig& model, std::string& arch);
// The file's notes on stderr; with `verbose`, also the keys gradflow did not read, once.
void print_config_notes(const ConfigOption& option, bool verbose);
// For each placement option given but declared by no placement of `archs` (--arch `arch_list`):
// what its `when_unused` says (refuse with an InputError, warn, or nothing).
void check_options_apply(const ModelConfig& model, const std::vector<const Architecture*>& archs,
                         const std::string& arch_list);
// Refuses up front a configuration whose `concurrent` runs would not fit in memory, counting
// `threads` threads for the address space.
// `stored_runs` finished runs are kept until the report is written (analyze's placements x seeds).
// Returns the estimate in bytes.
double check_memory(const ModelConfig& model, const std::vector<const Architecture*>& archs, int concurrent,
                    int threads, long long stored_runs);
// Address space each thread maps besides the data: an 8 MB stack, glibc's new malloc arena (it
// maps 128 MB for a moment to align its 64 MB heap) and OpenBLAS 0.3.21's 128 MB buffer, mapped on
// the thread's first BLAS call, where a failed mapping spins forever instead of failing. Measured:
// analyze --arch keel --depth 64 on 2 threads hangs there at 358 MB of RLIMIT_AS, runs at 460 MB.
inline constexpr std::uint64_t kThreadAddressSpace = 320ull << 20;
// Refuses `needed` bytes (what: the work it is for; fix: what to try) when they exceed the
// memory available to this process, or its address-space limit with `threads` threads.
void check_memory_need(double needed, int threads, const std::string& what, const std::string& fix);

// Removes every AtomicOutput's temporary file on SIGINT, SIGTERM and SIGHUP, then exits with
// 128 + the signal (130, 143, 129). Installed once by main.
void install_signal_cleanup();
// Flushes stdout and throws InputError when anything written to it was lost (a full disk,
// /dev/full, a closed pipe).
void check_stdout();

// This machine's name as it appears in temporary file names (letters, digits and '-', at most 32):
// a sweep directory shared by several machines' tasks cleans up only its own machine's leftovers.
std::string host_tag();
// Output that appears whole or not at all: a temporary file beside the target, renamed on
// commit(); removed if never committed. An empty path means stdout (written at commit()).
class AtomicOutput {
 public:
  // `option` names the path in messages ("-o", "--export-weights"; "" for a file of a sweep
  // directory, named by its path alone). Throws InputError when the path is not writable.
  explicit AtomicOutput(std::string path, std::string option = "-o");
  ~AtomicOutput();
  std::ostream& stream();
  void commit();

 private:
  std::string named() const;  // "-o out.json", or the path alone
  std::string path_, option_, temporary_;
  int slot_ = -1;  // its entry in the table the SIGINT/SIGTERM handler cleans up
  std::ofstream file_;
  std::ostringstream buffer_;
  bool committed_ = false;
};

// The output format of analyze and merge, among the output formats that offer `kind`
// (output_formats()): --format when given (`format`, "" when not); else the format -o's extension
// names, JSON for any other file or a pipe, and `terminal_format` when stdout is a terminal.
// Refuses -o '' and an extension that contradicts --format or names a format that does not offer `kind`.
std::string resolve_output_format(const std::string& format, const CLI::Option* output_flag,
                                  const std::string& output, OutputKind kind,
                                  const std::string& terminal_format);
// Adds --format to `sub`, its choices the output formats that offer `kind`.
CLI::Option* add_format_option(CLI::App* sub, std::string& format, OutputKind kind, const std::string& help);

// What gradflow reads back as one document (results, baselines, tolerances, sweep manifests and
// cells, config files). The largest it writes: a sweep summary of the most cells a sweep holds
// (2^20 rows of about 450 bytes) is 0.5 GB, an analyze document of all placements x 10 seeds at
// depth 1024 about 0.45 GB; its documents nest 9 levels deep. Deeper nesting would recurse (crash)
// in the parsed document's copies, comparisons and dumps.
inline constexpr std::uint64_t kMaxDocumentBytes = std::uint64_t{1} << 30;  // 1 GiB
inline constexpr int kMaxDocumentDepth = 64;

// A file's whole contents; nullopt when it cannot be opened (missing, not readable). Throws
// InputError naming the path when it is not a regular file after following links (a FIFO, device,
// socket or directory, which is never opened in a way that could wait) or is larger than
// kMaxDocumentBytes.
std::optional<std::string> read_text_file(const std::string& path);
// Throws InputError naming `origin` when the JSON text nests deeper than kMaxDocumentDepth.
void check_json_nesting(const std::string& text, const std::string& origin);
// Parses a JSON file; throws InputError naming the path when it is missing, not a regular file,
// too large, nested too deep or malformed.
nlohmann::ordered_json read_json_file(const std::string& path);
// The checks of read_json_file short of parsing, for a file another reader parses (a sweep's
// existing cells): throws InputError when `path` is not a regular file, too large or nested too
// deep; returns when it is missing or unreadable (that reader says so).
void check_json_file_bounds(const std::string& path);
// Whether a path exists; throws InputError naming it when it cannot be examined (ELOOP, EACCES).
bool path_exists(const std::string& path);
// Writes `text` to `path` whole or not at all (AtomicOutput; `option` as there).
void write_file_atomically(const std::string& path, const std::string& text, const std::string& option = "");
// True when the two paths name one file: by identity when both exist (hard links included),
// else by the resolved path (links and ".." followed), for an output not written yet.
bool same_file(const std::string& a, const std::string& b);

// What limits this process's memory: the machine (MemAvailable), the cgroup (memory.max minus
// memory.current) and the address-space limit (RLIMIT_AS, e.g. ulimit -v) with what is mapped already.
struct MemoryLimits {
  std::uint64_t available = 0;  // MemAvailable, 0 if unknown
  bool has_cgroup_limit = false;
  std::uint64_t cgroup_free = 0;
  std::uint64_t address_space = 0, address_space_used = 0;  // 0: no RLIMIT_AS
};
MemoryLimits memory_limits();
// Bytes of memory this process can still use (the smaller of MemAvailable and the cgroup's
// room), 0 if unknown.
std::uint64_t available_memory_bytes();

// A one-line progress bar on stderr, shown only when stderr is a terminal and not --quiet, and
// only once the run has taken longer than kDelay: short runs never flash a bar. It redraws at most
// once per kInterval (a terminal needs about ten redraws a second, not one per step of the run),
// except that the completed state is always drawn.
class ProgressBar {
 public:
  static constexpr std::chrono::milliseconds kDelay{1000};
  static constexpr std::chrono::milliseconds kInterval{100};
  ProgressBar(bool enabled, std::string label);
  ~ProgressBar();
  void update(long long done, long long total);
  void finish();  // erase the bar (if drawn) and draw no more

 private:
  bool enabled_;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int last_permille_ = -1;  // -1: not drawn yet
};
bool stderr_is_terminal();
bool stdout_is_terminal();

}  // namespace gradflow::cli
