// `gradflow analyze`: build the stacks, measure them, write JSON, CSV or a summary table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "commands.hpp"
#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/app/runner.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

namespace {
// Runs expected to take longer than this (seconds) get an estimate of time and memory on stderr
// before they start.
constexpr double kEstimateAbove = 10.0;

struct AnalyzeOptions {
  ModelOptions model;
  std::string arch{kDefaultPlacement};
  std::uint64_t seed = 0;
  int seeds = 0;  // 0: just --seed
  int threads = 0;
  const CLI::Option* threads_flag = nullptr;  // to tell a given --threads from the default (all cores)
  std::string format;                         // "": by destination (resolve_output_format)
  std::string output;
  std::string export_weights;
  bool quiet = false;
  bool no_timing = false;
  const CLI::Option* output_flag = nullptr;
  const CLI::Option* seeds_flag = nullptr;
  std::string angles = "consecutive";
  std::string config;  // --config PATH|NAME: "" when not given
  std::string checkpoint, tokens,
      loss;  // --checkpoint DIR, --tokens FILE, --loss lm|probe: "" when not given
  bool verbose = false;
  const CLI::App* app = nullptr;  // to tell the flags given from the defaults a config.json replaces
};

// More threads than this is a mistake, not a machine: libgomp fails (or crashes) creating them.
constexpr int kMaxThreads = 1024;

// Runs (placements x seeds) one analyze keeps in memory for its report at most.
constexpr long long kMaxRuns = 1 << 20;

// Past this many sublayer-column evaluations --spectrum takes minutes: say so before starting.
constexpr double kSpectrumWarnEvaluations = 1e6;

// FILE.safetensors -> FILE.{arch}.seed{s}.safetensors when a run writes several files.
std::string export_path(const std::string& base, std::string_view arch, std::uint64_t seed, bool several) {
  if (!several) return base;
  const std::filesystem::path path(base);
  return (path.parent_path() /
          fmt::format("{}.{}.seed{}{}", path.stem().string(), arch, seed, path.extension().string()))
      .string();
}

std::string duration_text(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} days", seconds / 86400);
}

// Refuses --seeds 0, an --export-weights path that is not .safetensors and a --threads out of
// range; returns the thread count (all cores unless --threads is given).
int checked_threads(const AnalyzeOptions& options) {
  if (options.seeds_flag && options.seeds_flag->count() > 0 && options.seeds < 1) {
    throw InputError(
        fmt::format("--seeds {} must be at least 1 (seeds 0..N-1); try --seeds 1, or --seed S for one "
                    "seed",
                    options.seeds));
  }
  if (!options.export_weights.empty() &&
      std::filesystem::path(options.export_weights).extension() != ".safetensors") {
    throw InputError(fmt::format(
        "--export-weights {} must name a .safetensors file (the only format it writes); try --export-weights "
        "{}",
        options.export_weights,
        std::filesystem::path(options.export_weights).replace_extension(".safetensors").string()));
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options.threads_flag && options.threads_flag->count() > 0 &&
      (options.threads < 1 || options.threads > kMaxThreads)) {
    throw InputError(
        fmt::format("--threads {} must lie in [1, {}]; this machine has {} core(s), the default "
                    "(omit --threads) uses them all",
                    options.threads, kMaxThreads, cores));
  }
  return options.threads_flag && options.threads_flag->count() > 0 ? options.threads : cores;
}

// The seeds of every placement: 0..N-1 with --seeds N, else --seed.
std::vector<std::uint64_t> seed_list(const AnalyzeOptions& options) {
  std::vector<std::uint64_t> seeds;
  if (options.seeds > 0) {
    for (int s = 0; s < options.seeds; ++s) seeds.push_back(static_cast<std::uint64_t>(s));
  } else {
    seeds.push_back(options.seed);
  }
  return seeds;
}

// Warnings and the time estimate, on stderr before the work starts.
void warn_before_start(const ModelConfig& model, const std::string& format, int jobs, int threads,
                       double memory_bytes) {
  if (model.spectrum > 0) {
    const double sublayers = model.sublayers();
    const double evaluations = sublayers * (sublayers + 1) / 2 * 2 * model.spectrum;
    if (evaluations > kSpectrumWarnEvaluations) {
      fmt::print(stderr,
                 "gradflow: warning: --spectrum {} at {} sublayers costs O(S^2) sweeps (about {:.1e} "
                 "sublayer-column evaluations, {:.0f}x the analysis without it); expect a long run, or "
                 "reduce --depth or --spectrum\n",
                 model.spectrum, model.sublayers(), evaluations,
                 evaluations / (2 * sublayers * model.probes));
    }
  }
  if (model.angles_all && format == "csv") {
    fmt::print(
        stderr,
        "gradflow: warning: the --angles all matrix is written in JSON only; use --format json to get it\n");
  }
  const int cores =
      std::max(1, std::min<int>(threads, static_cast<int>(std::thread::hardware_concurrency())));
  if (const double seconds = estimated_run_seconds(model, cores) * static_cast<double>(jobs);
      seconds > kEstimateAbove) {
    fmt::print(stderr,
               "gradflow: note: {} run(s) of {} sublayers will take about {} and {:.2f} GB on {} thread(s) "
               "(estimate); Ctrl-C stops it, fewer --seeds or a smaller --depth shortens it\n",
               jobs, model.sublayers(), duration_text(seconds), memory_bytes / 1e9, threads);
  }
}

// --export-weights: input, probes and every weight of each run, one file per placement and seed.
void export_weights(const AnalysisReport& report, const std::string& base, bool several) {
  for (const ArchResult& result : report.results) {
    for (const SeedResult& seed : result.seeds) {
      AtomicOutput file(export_path(base, result.arch->id, seed.seed, several), "--export-weights");
      const nlohmann::ordered_json metadata = {{"arch", std::string(result.arch->id)},
                                               {"seed", std::to_string(seed.seed)},
                                               {"config", config_to_json(result).dump()}};
      write_safetensors(run_tensors(result.config, *result.arch, result.constants, seed.seed),
                        result.config.precision, metadata, file.stream());
      file.commit();
    }
  }
}

// -o onto a file the run reads (--config, --tokens, a placement file, a checkpoint's files) would
// replace that input with the report: refused before any work.
void refuse_output_onto_inputs(const AnalyzeOptions& options, const std::string& config_origin) {
  if (options.output.empty() || options.output == "-") return;
  std::vector<std::pair<std::string, std::string>> inputs;  // (option, path)
  if (!config_origin.empty()) inputs.emplace_back("--config", config_origin);
  if (!options.tokens.empty()) inputs.emplace_back("--tokens", options.tokens);
  std::size_t start = 0;
  while (start <= options.arch.size()) {
    const auto end = std::min(options.arch.find(',', start), options.arch.size());
    const std::string item = options.arch.substr(start, end - start);
    if (item.find('/') != std::string::npos || item.ends_with(".toml")) inputs.emplace_back("--arch", item);
    start = end + 1;
  }
  std::error_code error;
  if (!options.checkpoint.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(options.checkpoint, error)) {
      if (entry.is_regular_file(error)) inputs.emplace_back("--checkpoint", entry.path().string());
    }
  }
  for (const auto& [option, path] : inputs) {
    if (same_file(options.output, path)) {
      throw InputError(fmt::format("-o {} is {} {}, a file this run reads; write the report to another file",
                                   options.output, option, path));
    }
  }
}

// --export-weights files that would replace -o's output or each other are refused before any
// work: the run would end with one of them silently lost.
void refuse_clashing_exports(const AnalyzeOptions& options, const std::vector<const Architecture*>& archs,
                             const std::vector<std::uint64_t>& seeds) {
  if (options.export_weights.empty()) return;
  const bool several = archs.size() * seeds.size() > 1;
  for (const Architecture* arch : archs) {
    for (const std::uint64_t seed : seeds) {
      const std::string path = export_path(options.export_weights, arch->id, seed, several);
      if (!options.output.empty() && options.output != "-" && same_file(path, options.output)) {
        throw InputError(fmt::format(
            "--export-weights {} would overwrite -o {}, the report; give the two different file names", path,
            options.output));
      }
    }
  }
}

void warn_diverged(const AnalysisReport& report) {
  for (const ArchResult& result : report.results) {
    for (const SeedResult& seed : result.seeds) {
      if (seed.diverged) {
        fmt::print(stderr, "gradflow: warning: {} seed {} diverged at sublayer {} ({}): {}\n",
                   result.arch->id, seed.seed, seed.diverged->sublayer, seed.diverged->phase,
                   seed.diverged->reason);
      }
    }
  }
}

void write_report(const AnalysisReport& report, const std::string& format, const AnalyzeOptions& options,
                  AtomicOutput& output) {
  if (const CliHooks* hooks = active_hooks(); hooks && hooks->report) {
    hooks->report(report);
    if (options.output.empty() || options.output == "-") return;  // the caller renders it
  }
  const bool to_stdout = options.output.empty() || options.output == "-";
  find_format(format, OutputKind::analysis)
      .analysis(report, output.stream(), {.colour = to_stdout && stdout_is_terminal()});
  output.commit();
}

// The flags a checkpoint run refuses, and why: the model's config.json sets the model and its
// placement; the others are analyses of a random init, or work a checkpoint run does not split.
struct RefusedFlag {
  const char* flag;
  const char* reason;
};
constexpr const char* kSetByConfig = "the checkpoint's config.json sets the model";
constexpr const char* kInitOnly = "it belongs to an analysis of a random init";
constexpr RefusedFlag kCheckpointRefuses[] = {
    {"--arch", "the placement is the model's own (its config.json's model_type)"},
    {"--depth", kSetByConfig},
    {"--width", kSetByConfig},
    {"--config", kSetByConfig},
    {"--heads", kSetByConfig},
    {"--kv-heads", kSetByConfig},
    {"--ffn", kSetByConfig},
    {"--ffn-hidden", kSetByConfig},
    {"--rope-theta", kSetByConfig},
    {"--rope-fraction", kSetByConfig},
    {"--bias", kSetByConfig},
    {"--norm-eps", kSetByConfig},
    {"--block", kSetByConfig},
    {"--norm", kSetByConfig},
    {"--init", kSetByConfig},
    {"--input-corr", kInitOnly},
    {"--ideal-branch", kInitOnly},
    {"--probes", "the loss is one (--loss probe draws one probe)"},
    {"--spectrum", "it is not computed for a checkpoint"},
    {"--exact-jacobian", "it is not computed for a checkpoint"},
    {"--seeds", "a checkpoint has one set of weights (--seed draws random tokens or the probe)"},
    {"--export-weights", "the weights are the checkpoint's own files"},
    {"--verbose", "it lists config.json keys for --config only"}};

bool given(const AnalyzeOptions& options, const char* flag) {
  const CLI::Option* option = options.app->get_option_no_throw(flag);
  return option && option->count() > 0;
}

// analyze --checkpoint: refuses the flags that do not apply, then runs checkpoint_command.cpp.
int run_checkpoint(const AnalyzeOptions& options) {
  for (const auto& [flag, reason] : kCheckpointRefuses) {
    if (given(options, flag))
      throw InputError(fmt::format("{} does not apply with --checkpoint: {}; remove {}", flag, reason, flag));
  }
  for (const auto& [key, value] : options.model.numbers)
    if (value)
      throw InputError(
          fmt::format("--{} is a placement option; with --checkpoint the placement is the "
                      "model's own; remove it",
                      key));
  for (const auto& [key, value] : options.model.words)
    if (value)
      throw InputError(
          fmt::format("--{} is a placement option; with --checkpoint the placement is the "
                      "model's own; remove it",
                      key));
  if (options.angles == "all")
    throw InputError(
        "--angles all is not computed with --checkpoint (the layers' angular distances are); remove it");
  if (!options.model.update_params.empty() && options.model.update_params != "matrices")
    throw InputError(
        fmt::format("--update-params {} is not computed with --checkpoint: the step moves the layers' "
                    "matrices; use --update-params matrices or leave it out",
                    options.model.update_params));
  if (!options.tokens.empty() && given(options, "--seq"))
    throw InputError("--seq does not apply with --tokens: T is the number of ids in the file; remove --seq");
  if (given(options, "--tokens") && options.tokens.empty())
    throw InputError("--tokens '' names no file; give --tokens FILE (whitespace-separated token ids)");
  if (options.checkpoint.empty())
    throw InputError("--checkpoint '' names no directory; give --checkpoint DIR");
  const std::string format = resolve_output_format(options.format, options.output_flag, options.output,
                                                   OutputKind::analysis, "table");
  refuse_output_onto_inputs(options, "");
  CheckpointCommand command;
  command.directory = options.checkpoint;
  command.tokens = options.tokens;
  command.loss = options.loss.empty() ? "lm" : options.loss;
  command.output = options.output;
  command.quiet = options.quiet;
  command.no_timing = options.no_timing;
  command.seq = options.model.model.seq;
  command.seed = options.seed;
  command.threads = checked_threads(options);
  command.model = resolve_model(options.model);
  return run_analyze_checkpoint(command, [&](const AnalysisReport& report, AtomicOutput& output) {
    write_report(report, format, options, output);
  });
}

int run_analyze(const AnalyzeOptions& options) {
  if (!options.checkpoint.empty() || given(options, "--checkpoint")) return run_checkpoint(options);
  if (given(options, "--tokens") || given(options, "--loss"))
    throw InputError(
        fmt::format("{} applies only with --checkpoint DIR (a trained model); remove it, or give "
                    "--checkpoint",
                    given(options, "--tokens") ? "--tokens" : "--loss"));
  const int threads = checked_threads(options);
  const std::string format = resolve_output_format(options.format, options.output_flag, options.output,
                                                   OutputKind::analysis, "table");
  std::optional<ConfigOption> config_file;
  if (!options.config.empty()) config_file = read_config_option(options.config, *options.app);
  refuse_output_onto_inputs(options, config_file ? config_file->origin : "");
  std::string arch_list = options.arch;
  ModelConfig model = resolve_model(options.model, [&](ModelConfig& resolved) {
    if (config_file) apply_config_option(*config_file, *options.app, resolved, arch_list);
  });
  model.angles_all = options.angles == "all";
  validate(model);
  const auto archs = parse_architecture_list(arch_list);
  check_options_apply(model, archs, arch_list);
  // Counted in 64 bits and checked before anything is sized from it.
  const long long seed_count = options.seeds > 0 ? options.seeds : 1;
  const long long job_count = static_cast<long long>(archs.size()) * seed_count;
  if (job_count > kMaxRuns) {
    throw InputError(
        fmt::format("{} placement(s) x {} seed(s) is {} runs, more than the {} one analyze holds; "
                    "use fewer --seeds, or 'gradflow sweep' for large grids",
                    archs.size(), seed_count, job_count, kMaxRuns));
  }
  const int jobs = static_cast<int>(job_count);
  const int concurrent = std::min(threads, jobs);
  // Runs side by side share the threads out; each splits its ops' pieces over its share.
  const double memory_bytes =
      check_memory(model, archs, concurrent, concurrent * threads_per_run(threads, concurrent), job_count);
  if (config_file) print_config_notes(*config_file, options.verbose);
  warn_before_start(model, format, jobs, threads, memory_bytes);
  refuse_clashing_exports(options, archs, seed_list(options));
  AtomicOutput output(options.output);  // fails now, before any work, if the path is not writable

  const auto start = std::chrono::steady_clock::now();
  AnalysisReport report;
  report.threads = threads;
  if (config_file) report.config_file = config_file->document;
  report.results = plan_analysis(model, archs, seed_list(options));
  ProgressBar progress(!options.quiet && stderr_is_terminal(),
                       fmt::format("gradflow analyze ({} run(s))", jobs));
  run_analysis(report.results, {concurrent, threads, [&](long long done, long long total) {
                                  progress.update(done, total);
                                  report_progress_to_hooks(done, total);
                                }});
  report.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();  // clear the bar before warnings and output share the terminal

  warn_diverged(report);
  if (!options.export_weights.empty()) export_weights(report, options.export_weights, jobs > 1);
  report.timing = !options.no_timing;
  write_report(report, format, options, output);
  return 0;
}
}  // namespace

Command setup_analyze(CLI::App& app) {
  auto options = std::make_shared<AnalyzeOptions>();
  ModelConfig& m = options->model.model;
  CLI::App* sub =
      app.add_subcommand("analyze", "Measure signal and gradient flow through randomly initialised stacks");
  options->app = sub;
  sub->option_defaults()->always_capture_default();
  sub->add_option("--arch", options->arch,
                  "Placement id or placement file PATH.toml (docs/placement-files.md), a comma-separated "
                  "list, or 'all' (see 'gradflow archs')");
  sub->add_option("--depth", m.blocks, "Depth in blocks B (a block is attention + FFN by default)");
  sub->add_option("--width", m.width, "Model width d");
  add_model_options(sub, options->model);
  sub->add_option("--angles", options->angles,
                  "consecutive: angle between x_l and x_{l+1} per sublayer; all: also the all-pairs matrix "
                  "(JSON, O(S^2 T d))")
      ->check(CLI::IsMember({"consecutive", "all"}));
  sub->add_option("--spectrum", m.spectrum,
                  "Top-k singular values of the Jacobian from each state to the output (subspace iteration, "
                  "O(S^2) sweeps)")
      ->default_str("off");
  sub->add_flag("--exact-jacobian", m.exact_jacobian,
                "Full Jacobian from each state to the output, exact Frobenius and spectral norms (seq * "
                "width <= 4096)");
  auto* seed =
      sub->add_option("--seed", options->seed, "Seed of a single run")->check(CLI::NonNegativeNumber);
  options->seeds_flag =
      sub->add_option("--seeds", options->seeds, "Run seeds 0..N-1 and add mean, std and 95% intervals")
          ->excludes(seed)
          ->default_str("off");
  options->threads_flag =
      sub->add_option(
             "--threads", options->threads,
             "Threads: runs (placements x seeds) go side by side, each splitting its ops over an even "
             "share of the threads (a single run: all of them). Results are identical for every count")
          ->default_str("all cores");
  add_format_option(sub, options->format, OutputKind::analysis,
                    fmt::format("Output format: {}. Default: table on a terminal; JSON when piped; with -o, "
                                "the format the file's extension names ({}; JSON otherwise)",
                                format_list_help(OutputKind::analysis),
                                fmt::join(format_extensions(OutputKind::analysis), ", ")))
      ->default_str("by destination");
  options->output_flag =
      sub->add_option("-o,--output", options->output, "Write to FILE (whole or not at all) instead of stdout")
          ->default_str("stdout");
  sub->add_flag("--no-timing", options->no_timing,
                "Leave wall times and the thread count out of the JSON, so that two runs compare with cmp");
  sub->add_option("--export-weights", options->export_weights,
                  "Also write input, probes and every weight to a .safetensors file (one per arch and seed)")
      ->default_str("off");
  sub->add_option(
         "--config", options->config,
         "A Hugging Face config.json (or a shipped one by name: " + shipped_config_names() +
             ") setting width, depth, heads, KV heads, FFN, norm, RoPE, init and the family's "
             "placement; flags given override it, and --seq stays 64 unless given (the file's context "
             "length is only an upper bound)")
      ->default_str("off");
  sub->add_option(
         "--checkpoint", options->checkpoint,
         "A trained Hugging Face checkpoint: DIR with config.json and model.safetensors (or its shards "
         "and model.safetensors.index.json); model_type llama, mistral, qwen2, olmo2, gpt2 or gemma2. "
         "The model's own forward and placement; docs/checkpoints.md")
      ->default_str("off");
  sub->add_option("--tokens", options->tokens,
                  "With --checkpoint: the token ids to analyse, whitespace-separated (T = their count); "
                  "without it, --seq ids drawn by --seed")
      ->default_str("off");
  sub->add_option(
         "--loss", options->loss,
         "With --checkpoint: lm, the language-model loss (mean cross-entropy of each next token), or "
         "probe, a random probe of the final norm's output as at init")
      ->check(CLI::IsMember({"lm", "probe"}))
      ->default_str("lm");
  sub->add_flag("-q,--quiet", options->quiet, "No progress bar");
  sub->add_flag("-v,--verbose", options->verbose, "With --config: also list the config.json keys not used");
  add_placement_options(sub, options->model);
  return {sub, [options] { return run_analyze(*options); }, {{"--arch", ListItems::text}}};
}

}  // namespace gradflow::cli
