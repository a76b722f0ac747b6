// The model flags that analyze and sweep share, and the up-front refusals both apply.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "commands.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

namespace {
// The block's ops (issue 19): FFN kind and width, rotary embeddings, key/value heads, biases, eps.
void add_block_op_options(CLI::App* sub, ModelConfig& m, ModelOptions& options) {
  // --ffn's words and help come from the branch-op table (branch_op.hpp).
  std::vector<std::string> words, helps;
  for (const FfnWord* ffn : ffn_words()) {
    words.emplace_back(ffn->word);
    helps.emplace_back(ffn->help);
  }
  sub->add_option("--ffn", options.ffn, fmt::format("Feed-forward: {}", fmt::join(helps, ", ")))
      ->check(CLI::IsMember(words))
      ->default_str(words.front());
  sub->add_option("--ffn-hidden", m.ffn_hidden_width, "FFN hidden width (units); 0 means 4 x --width")
      ->default_str("0");
  sub->add_option("--kv-heads", m.kv_heads,
                  "Key/value heads for grouped-query attention (must divide --heads); 0 means --heads")
      ->default_str("0");
  sub->add_option("--rope-theta", m.rope_theta,
                  "Rotary position embedding base theta (e.g. 10000); 0 means no position embedding")
      ->default_str("0");
  sub->add_option("--rope-fraction", m.rope_fraction,
                  "Fraction of each head's dims rotated by rotary embeddings, in (0, 1]")
      ->default_str("1");
  sub->add_flag("--bias", m.bias, "A bias on every projection (q, k, v, out, FFN), zero at init");
  sub->add_option("--norm-eps", m.norm_eps, "Epsilon of every RMSNorm / LayerNorm")->default_str("1e-06");
}

// One flag per branch-op option (BranchOpRow::options, e.g. --experts), as for the placements'.
void add_op_options(CLI::App* sub, ModelOptions& options) {
  for (const PlacementOption* option : op_options()) {
    const std::string flag(option->flag), key(option->key), help(option->help);
    CLI::Option* added = option->is_word() ? sub->add_option(flag, options.op_words[key], help)
                                           : sub->add_option(flag, options.op_numbers[key], help);
    added->default_str(option->shown_default())->group("FFN op options (declared by the branch-op table)");
  }
}
}  // namespace

void add_model_options(CLI::App* sub, ModelOptions& options) {
  ModelConfig& m = options.model;
  sub->add_option("--heads", m.heads, "Attention heads (must divide --width)");
  sub->add_option("--seq", m.seq, "Sequence length T (tokens)");
  sub->add_option("--block", options.block, "Sublayers per block: attn-ffn (2), ffn (1) or attn (1)")
      ->check(CLI::IsMember({"attn-ffn", "ffn", "attn"}));
  sub->add_option("--norm", options.norm,
                  "Normalisation: rms (RMSNorm), layer (LayerNorm) or dyt (DyT, alpha 0.5)")
      ->check(CLI::IsMember({"rms", "layer", "dyt"}));
  sub->add_option(
         "--init", options.init,
         "Base init: xavier, gpt2 (0.02, out-proj / sqrt(2B)), small (sqrt(2/5d), out-proj / sqrt(2B)) "
         "or normal:STD (every matrix N(0, STD^2), a config's initializer_range; STD 0.02 if omitted)")
      ->default_str("xavier");
  add_block_op_options(sub, m, options);
  add_op_options(sub, options);
  sub->add_option("--precision", options.precision,
                  "Arithmetic: f32 or f64 (gradient logs are always accumulated in double)")
      ->check(CLI::IsMember({"f32", "f64"}));
  sub->add_option("--probes", m.probes, "Random probes U per seed (per-state figures are RMS over probes)");
  sub->add_option("--input-corr", m.input_corr, "Correlation r of the input tokens, in [0, 1]");
  sub->add_flag("--ideal-branch", options.ideal_branch,
                "Replace every branch F by a 90-degree rotation within coordinate pairs (the closed forms' "
                "idealised branch)");
  sub->add_option("--update", options.update,
                  "One optimizer step on probe 0's loss, then the forward pass again: sgd or adam (its "
                  "first, bias-corrected step); adds the model-update figures")
      ->check(CLI::IsMember({"none", "sgd", "adam"}))
      ->default_str("none");
  sub->add_option("--lr", m.learning_rates, "Learning rates of --update, comma-separated (e.g. 1e-4,1e-3)")
      ->delimiter(',')
      ->default_str("1e-3 with --update");
  sub->add_option("--update-params", options.update_params,
                  "What --update steps: matrices (every weight matrix, and with --bias every bias) or all "
                  "(those, every norm's gain, gamma = 1 at init, and every attend's pseudo-query)")
      ->default_str("matrices");
}

// One flag per placement option (PlacementOption), each declared by a placement file's
// [options.KEY], added after every other flag of the subcommand, so that a key whose flag
// gradflow already has is refused, naming the file's table.
void add_placement_options(CLI::App* sub, ModelOptions& options) {
  for (const PlacementOption* option : placement_options()) {
    const std::string flag(option->flag), key(option->key), help(option->help);
    if (sub->get_option_no_throw(flag))
      throw InputError(
          fmt::format("{}: option '{}' would take the flag {}, which gradflow {} already has; "
                      "choose another key",
                      option->defined_at, key, flag, sub->get_name()));
    CLI::Option* added = option->is_word() ? sub->add_option(flag, options.words[key], help)
                                           : sub->add_option(flag, options.numbers[key], help);
    added->default_str(option->shown_default())
        ->group("Placement options (declared by the placements' files)");
  }
}

ModelConfig resolve_model(const ModelOptions& options, const std::function<void(ModelConfig&)>& adjust) {
  ModelConfig model = options.model;
  for (const auto& [key, value] : options.numbers) {
    if (value) model.options[key] = *value;
  }
  for (const auto& [key, value] : options.words) {
    if (value) model.options[key] = *value;
  }
  for (const auto& [key, value] : options.op_numbers) {
    if (value) model.op_options[key] = *value;
  }
  for (const auto& [key, value] : options.op_words) {
    if (value) model.op_options[key] = *value;
  }
  if (options.ideal_branch) model.branch = BranchKind::rotation;
  model.block = parse_block_kind(options.block);
  model.norm = parse_norm_kind(options.norm);
  set_init(model, options.init);
  model.ffn = options.ffn;
  model.precision = parse_precision(options.precision);
  model.update = parse_update_rule(options.update);
  if (model.update != UpdateRule::none && model.learning_rates.empty())
    model.learning_rates = {kDefaultLearningRate};
  if (!options.update_params.empty() && model.update == UpdateRule::none) {
    throw InputError(
        fmt::format("--update-params {} says what --update steps, and --update is not given; add "
                    "--update adam",
                    options.update_params));
  }
  if (!options.update_params.empty() && options.update_params != "matrices" &&
      options.update_params != "all") {
    throw InputError(fmt::format("--update-params \"{}\" is not matrices or all; try --update-params all",
                                 options.update_params));
  }
  model.update_norm_gains = options.update_params == "all";
  if (adjust) adjust(model);
  validate(model);
  if (model.rope_theta == 0.0 && model.rope_fraction != 1.0) {  // it would be ignored: nothing rotates
    throw InputError(
        fmt::format("--rope-fraction {} has no effect without rotary embeddings; add --rope-theta (e.g. "
                    "10000) or omit it",
                    model.rope_fraction));
  }
  return model;
}

void check_options_apply(const ModelConfig& model, const std::vector<const Architecture*>& archs,
                         const std::string& arch_list) {
  for (const PlacementOption* option : placement_options()) {
    const auto given = model.options.find(option->key);
    if (given == model.options.end() || option->when_unused == UnusedOption::ignore) continue;
    const bool applies = std::any_of(archs.begin(), archs.end(), [&](const Architecture* arch) {
      return declares_option(*arch, option->key);
    });
    const std::vector<std::string_view> owners = placements_declaring(option->key);
    if (option->when_unused == UnusedOption::warn) {
      if (!applies) {
        fmt::print(stderr, "gradflow: warning: {} applies to {} only; ignored (add {} to --arch)\n",
                   option->flag, fmt::join(owners, ", "), fmt::join(owners, ", "));
      }
      continue;
    }
    if (!applies) {
      const std::string value = std::visit([](const auto& v) { return fmt::format("{}", v); }, given->second);
      throw InputError(fmt::format("{} {} does not apply to {}; it sets {} of {}", option->flag, value,
                                   arch_list, option->sets, fmt::join(owners, ", ")));
    }
    for (const Architecture* arch : archs) {
      if (!declares_option(*arch, option->key))
        fmt::print(stderr, "gradflow: warning: {} does not apply to {}; ignored there\n", option->flag,
                   arch->id);
    }
  }
}

double check_memory(const ModelConfig& model, const std::vector<const Architecture*>& archs, int concurrent,
                    int threads, long long stored_runs) {
  double needed = 0, result = 0;
  for (const Architecture* arch : archs) {
    const int streams = static_cast<int>(arch->streams.size());
    needed = std::max(needed, estimated_memory_bytes(model, streams, arch->history_streams));
    result = std::max(result, estimated_result_bytes(model, static_cast<int>(arch->streams.size())));
  }
  const double working = needed * concurrent, kept = result * static_cast<double>(stored_runs);
  // Each run's figures are kept until the document is written: with many seeds they dominate.
  const bool results_dominate = kept > working;
  check_memory_need(
      working + kept, threads,
      fmt::format("depth {}, width {}, seq {}, {}, {} run(s) at once, {} run result(s) kept "
                  "for the output",
                  model.blocks, model.width, model.seq, to_string(model.precision), concurrent, stored_runs),
      results_dominate ? "use fewer --seeds or placements, or 'gradflow sweep', which writes "
                         "each run to disk as it ends"
                       : "reduce --depth, --width or --seq, use --precision f32, or --threads 1");
  return working + kept;
}

void check_memory_need(double needed, int threads, const std::string& what, const std::string& fix) {
  const MemoryLimits limits = memory_limits();
  const std::uint64_t available = available_memory_bytes();
  if (available > 0 && needed > static_cast<double>(available)) {
    throw InputError(fmt::format(
        "out of memory: this needs about {:.2f} GB ({}) but {} {:.2f} GB; {}", needed / 1e9, what,
        limits.has_cgroup_limit && limits.cgroup_free < limits.available ? "the cgroup's memory.max leaves"
                                                                         : "the machine has",
        static_cast<double>(available) / 1e9, fix));
  }
  if (limits.address_space > 0) {
    // Address space, not memory: every thread besides the main one (already counted in VmSize) maps a stack,
    // a malloc arena and OpenBLAS's buffer, whether it touches them or not. Checked here because OpenBLAS
    // does not fail cleanly when its buffer cannot be mapped (the thread spins, or the process hangs).
    const double address_space_needed =
        static_cast<double>(limits.address_space_used) + needed +
        static_cast<double>(std::max(threads - 1, 0)) * static_cast<double>(kThreadAddressSpace);
    if (address_space_needed > static_cast<double>(limits.address_space)) {
      throw InputError(
          fmt::format("out of memory: this needs about {:.2f} GB of address space ({}, {} thread(s), {} MB "
                      "per extra thread) but "
                      "the limit (RLIMIT_AS, ulimit -v) is {:.2f} GB; {}, or raise the limit",
                      address_space_needed / 1e9, what, threads, kThreadAddressSpace >> 20,
                      static_cast<double>(limits.address_space) / 1e9, fix));
    }
  }
}

}  // namespace gradflow::cli
