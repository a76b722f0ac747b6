// analyze --checkpoint DIR and archs --checkpoint DIR (issue 28): a trained Hugging Face model, read
// from its safetensors files, analysed on real tokens from the language-model loss.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>

#include "commands.hpp"
#include "gradflow/app/checkpoint_files.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/rng.hpp"

namespace gradflow::cli {

namespace {

// Without --tokens: ids drawn uniformly from the vocabulary by the seed (not text).
std::vector<std::int64_t> random_tokens(int count, int vocab, std::uint64_t seed) {
  std::vector<std::int64_t> ids(count);
  const std::uint64_t key = stream_key(seed, RandomUse::input, 2);
  for (int t = 0; t < count; ++t)
    ids[t] = static_cast<std::int64_t>(mix64(key + static_cast<std::uint64_t>(t)) %
                                       static_cast<std::uint64_t>(vocab));
  return ids;
}

}  // namespace

int run_analyze_checkpoint(const CheckpointCommand& command,
                           const std::function<void(const AnalysisReport&, AtomicOutput&)>& write) {
  const CheckpointFiles files(command.directory);
  const HfModelSpec& spec = files.spec();
  const LossKind loss = parse_loss_kind(command.loss);
  std::vector<std::int64_t> tokens;
  const bool random = command.tokens.empty();
  if (random) {
    tokens = random_tokens(command.seq, spec.vocab, command.seed);
  } else {
    tokens = read_token_file(command.tokens, spec.vocab);
  }
  const std::string origin = random ? fmt::format("--seq {}", tokens.size()) : command.tokens;
  if (loss == LossKind::lm && tokens.size() < 2)
    throw InputError(
        random ? fmt::format("--seq {}: the language-model loss needs at least 2 tokens (each predicts "
                             "the next); try --seq 2 or more, or --loss probe",
                             tokens.size())
               : fmt::format("{}: holds {} token id; the language-model loss needs at least 2 (each "
                             "predicts the next); give more ids, or --loss probe",
                             origin, tokens.size()));
  if (spec.position_embedding && static_cast<int>(tokens.size()) > spec.max_positions)
    throw InputError(
        fmt::format("{}: {} tokens are more than the {} positions of the model's position embedding "
                    "(config.json:n_positions); give at most {}",
                    origin, tokens.size(), spec.max_positions, spec.max_positions));
  if (tokens.size() > static_cast<std::size_t>(kMaxSeq))
    throw InputError(
        fmt::format("{}: {} tokens are more than gradflow's limit of {}", origin, tokens.size(), kMaxSeq));

  CheckpointRun run;
  run.spec = spec;
  run.tokens = tokens;
  run.random_tokens = random;
  run.loss = loss;
  run.config = model_config_of(spec, static_cast<int>(tokens.size()), command.model.precision, command.seed);
  run.config.update = command.model.update;
  run.config.learning_rates = command.model.learning_rates;
  const double memory =
      checkpoint_memory_bytes(spec, run.config, loss, static_cast<double>(files.largest_tensor_bytes()));
  std::string fix = "try fewer tokens";
  if (run.config.precision == Precision::f64) fix += ", or --precision f32";
  if (run.config.update_count() > 1) fix += ", or fewer --lr values";
  check_memory_need(memory, 1,
                    fmt::format("analysing {} ({} layers, width {}, {} tokens)", command.directory,
                                spec.layers, spec.hidden, tokens.size()),
                    fix);
  const auto archs = parse_architecture_list(run.config.arch);
  run.arch = archs.front();
  const std::string gap = checkpoint_graph_gap(spec, static_cast<int>(tokens.size()));
  run.threads = gap.empty() ? command.threads : 1;
  if (random && !command.quiet)
    fmt::print(
        stderr,
        "gradflow: warning: no --tokens: the {} token ids are drawn uniformly by --seed {}, not text; give "
        "--tokens FILE for the model's behaviour on real text (docs/checkpoints.md)\n",
        tokens.size(), command.seed);
  AtomicOutput output(command.output);  // fails now, before any work, if the path is not writable

  const auto start = std::chrono::steady_clock::now();
  ProgressBar progress(!command.quiet && stderr_is_terminal(), "gradflow analyze --checkpoint");
  SeedResult seed = analyze_checkpoint(run, files, [&](long long done, long long total) {
    progress.update(done, total);
    report_progress_to_hooks(done, total);
  });
  progress.finish();

  AnalysisReport report;
  report.threads = run.threads;
  report.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.timing = !command.no_timing;
  report.checkpoint = checkpoint_to_json(checkpoint_contents(files));
  report.checkpoint["tokens_file"] =
      random ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(command.tokens);
  report.checkpoint["loss"] = std::string(to_string(loss));
  ArchResult result;
  result.arch = archs.front();
  result.config = run.config;
  result.constants = resolve_constants(*result.arch, result.config);
  result.seeds.push_back(std::move(seed));
  report.results.push_back(std::move(result));
  write(report, output);
  return 0;
}

void print_checkpoint(const std::string& directory, const std::string& format) {
  const CheckpointContents contents = checkpoint_contents(CheckpointFiles(directory));
  find_format(format, OutputKind::checkpoint_contents).checkpoint_contents(contents, std::cout);
}

}  // namespace gradflow::cli
