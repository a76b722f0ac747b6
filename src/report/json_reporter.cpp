// JSON reporter: one self-describing document (metrics.md "Output contract"). Non-finite numbers
// become null, and `diverged` says why.
#include <cmath>

#include "gradflow/gemm.hpp"
#include "gradflow/report.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

json json_number(double value) {
  return std::isfinite(value) ? json(value) : json(nullptr);
}

json json_numbers(const std::vector<double>& values) {
  json out = json::array();
  for (double v : values) out.push_back(json_number(v));
  return out;
}

namespace {
json columns_to_json(const FigureColumns& columns) {
  json out = json::object();
  for (std::size_t i = 0; i < columns.names.size(); ++i)
    out[columns.names[i]] = json_numbers(columns.values[i]);
  return out;
}

json index_range(int count) {
  json out = json::array();
  for (int i = 0; i < count; ++i) out.push_back(i);
  return out;
}

json growth_to_json(const GrowthFit& fit) {
  return {{"exponent", json_number(fit.exponent)},
          {"standard_error", json_number(fit.standard_error)},
          {"class", fit.growth_class},
          {"fitted_states", {fit.first_state, fit.first_state + fit.points - 1}}};
}

json seed_to_json(const SeedResult& seed, bool timing) {
  json states = {{"index", index_range(static_cast<int>(seed.states.values.front().size()))}};
  states.update(columns_to_json(seed.states));
  json streams = json::object();
  for (const auto& stream : seed.streams) streams[stream.name] = columns_to_json(stream.states);
  states["streams"] = streams;

  json kinds = json::array();
  for (const SublayerKind kind : seed.kinds) kinds.push_back(to_string(kind));
  json sublayers = {
      {"index", index_range(static_cast<int>(seed.kinds.size()))}, {"kind", kinds}, {"block", seed.blocks}};
  sublayers.update(columns_to_json(seed.sublayers));

  json stream_growth = json::object();
  for (const auto& stream : seed.streams) stream_growth[stream.name] = growth_to_json(stream.growth);
  json summary = {
      {"log10_grad_ratio", json_number(seed.log10_grad_ratio)},
      {"gain_min", {{"value", json_number(seed.gain_min.value)}, {"sublayer", seed.gain_min.sublayer}}},
      {"gain_max", {{"value", json_number(seed.gain_max.value)}, {"sublayer", seed.gain_max.sublayer}}},
      {"growth_exponent", json_number(seed.growth.exponent)},
      {"growth_exponent_se", json_number(seed.growth.standard_error)},
      {"growth_class", seed.growth.growth_class},
      {"growth_fit", growth_to_json(seed.growth)},
      {"stream_growth", stream_growth},
      {"effective_depth", json_number(seed.effective_depth)},
      {"stream_decomposition_input", json_number(seed.stream_decomposition_input)},
      {"diverged", nullptr},
  };
  if (seed.diverged) {
    summary["diverged"] = {{"sublayer", seed.diverged->sublayer},
                           {"phase", seed.diverged->phase},
                           {"reason", seed.diverged->reason}};
  }
  json out = {{"seed", seed.seed}, {"states", states}, {"sublayers", sublayers}, {"summary", summary}};
  if (!seed.angles_matrix.empty()) {
    json matrix = json::array();
    for (const auto& row : seed.angles_matrix) matrix.push_back(json_numbers(row));
    out["angles_matrix"] = matrix;
  }
  if (!timing) return out;
  out["timing"] = {{"seconds", seed.seconds},
                   {"forward_seconds", seed.forward_seconds},
                   {"representation_seconds", seed.representation_seconds},
                   {"backward_seconds", seed.backward_seconds}};
  return out;
}

json spread_arrays(const std::vector<const std::vector<double>*>& per_seed) {
  const std::size_t length = per_seed.front()->size();
  std::vector<double> mean(length), std(length), low(length), high(length), samples(per_seed.size());
  for (std::size_t i = 0; i < length; ++i) {
    for (std::size_t s = 0; s < per_seed.size(); ++s) samples[s] = (*per_seed[s])[i];
    const Spread sp = spread(samples);
    mean[i] = sp.mean, std[i] = sp.std, low[i] = sp.ci95_low, high[i] = sp.ci95_high;
  }
  return {{"mean", json_numbers(mean)},
          {"std", json_numbers(std)},
          {"ci95_low", json_numbers(low)},
          {"ci95_high", json_numbers(high)}};
}

json spread_to_json(const std::vector<double>& samples) {
  const Spread sp = spread(samples);
  return {{"mean", json_number(sp.mean)},
          {"std", json_number(sp.std)},
          {"ci95_low", json_number(sp.ci95_low)},
          {"ci95_high", json_number(sp.ci95_high)}};
}

json aggregate_columns(const std::vector<SeedResult>& seeds, const FigureColumns SeedResult::*member) {
  json out = json::object();
  const FigureColumns& first = seeds.front().*member;
  for (std::size_t c = 0; c < first.names.size(); ++c) {
    std::vector<const std::vector<double>*> per_seed;
    for (const auto& seed : seeds) per_seed.push_back(&(seed.*member).values[c]);
    out[first.names[c]] = spread_arrays(per_seed);
  }
  return out;
}

// The seeds' class when they agree (a collapsed stream is "vanishing" though its exponent may be
// unfit), else the class of the mean exponent.
std::string_view common_growth_class(const std::vector<SeedResult>& seeds,
                                     const std::vector<double>& exponents) {
  for (const auto& seed : seeds) {
    if (seed.growth.growth_class != seeds.front().growth.growth_class)
      return growth_class(spread(exponents).mean);
  }
  return seeds.front().growth.growth_class;
}

json aggregate_to_json(const std::vector<SeedResult>& seeds) {
  std::vector<double> ratio, exponent, gain_min, gain_max, effective_depth, input_share;
  for (const auto& seed : seeds) {
    effective_depth.push_back(seed.effective_depth);
    input_share.push_back(seed.stream_decomposition_input);
    ratio.push_back(seed.log10_grad_ratio);
    exponent.push_back(seed.growth.exponent);
    gain_min.push_back(seed.gain_min.value);
    gain_max.push_back(seed.gain_max.value);
  }
  return {{"seed_count", seeds.size()},
          {"interval", "95% t-interval of the mean across seeds"},
          {"states", aggregate_columns(seeds, &SeedResult::states)},
          {"sublayers", aggregate_columns(seeds, &SeedResult::sublayers)},
          {"summary",
           {{"log10_grad_ratio", spread_to_json(ratio)},
            {"growth_exponent", spread_to_json(exponent)},
            {"growth_class", common_growth_class(seeds, exponent)},
            {"gain_min", spread_to_json(gain_min)},
            {"gain_max", spread_to_json(gain_max)},
            {"effective_depth", spread_to_json(effective_depth)},
            {"stream_decomposition_input", spread_to_json(input_share)}}}};
}
}  // namespace

json config_to_json(const ArchResult& result) {
  const ModelConfig& c = result.config;
  const Architecture& arch = *result.arch;
  json constants = json::object();
  for (const Constant& k : result.constants) {
    constants[k.name] = {{"value", k.value}, {"formula", k.formula}, {"unit", k.unit}};
  }
  json seeds = json::array();
  for (const auto& seed : result.seeds) seeds.push_back(seed.seed);
  json config = {{"arch", std::string(arch.id)},
                 {"update_rule", std::string(arch.update_rule)},
                 {"final_norm", std::string(arch.final_norm)},
                 {"citation", std::string(arch.citation)},
                 {"provisional", arch.provisional},
                 {"blocks", c.blocks},
                 {"sublayers", c.sublayers()},
                 {"block", to_string(c.block)},
                 {"width", c.width},
                 {"heads", c.heads},
                 {"head_dim", c.head_dim()},
                 {"ffn_hidden", c.ffn_hidden()},
                 {"seq", c.seq},
                 {"norm", to_string(c.norm)},
                 {"norm_eps", kNormEps},
                 {"init", to_string(c.init)},
                 {"precision", to_string(c.precision)},
                 {"branch", to_string(c.branch)},
                 {"probes", c.probes},
                 {"input_corr", c.input_corr},
                 {"angles", c.angles_all ? "all" : "consecutive"},
                 {"spectrum", c.spectrum},
                 {"exact_jacobian", c.exact_jacobian},
                 {"seeds", seeds},
                 {"streams", json::array()},
                 {"constants", constants}};
  for (const auto name : arch.streams) config["streams"].push_back(std::string(name));
  if (arch.id == "keel") config["keel_variant"] = c.keel_variant;
  if (c.norm == NormKind::dyt) config["dyt_alpha"] = kDytAlpha;
  return config;
}

json report_to_json(const AnalysisReport& report) {
  json runs = json::array();
  for (const ArchResult& result : report.results) {
    json seeds = json::array();
    for (const auto& seed : result.seeds) seeds.push_back(seed_to_json(seed, report.timing));
    runs.push_back({{"arch", std::string(result.arch->id)},
                    {"config", config_to_json(result)},
                    {"seeds", seeds},
                    {"aggregate", aggregate_to_json(result.seeds)}});
  }
  json document = {{"schema_version", kSchemaVersion},
                   {"tool", provenance_to_json()},
                   {"command", "analyze"},
                   {"threads", report.threads},
                   {"runs", runs},
                   {"timing", {{"total_seconds", report.total_seconds}}}};
  if (!report.timing) {
    document.erase("threads");
    document.erase("timing");
  }
  return document;
}

json provenance_to_json() {
#ifdef __clang__
  const std::string compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = "gcc " __VERSION__;
#else
  const std::string compiler = "unknown";
#endif
#ifdef GRADFLOW_OPENBLAS
  const char* float64_products = "openblas";
#else
  const char* float64_products = "eigen";
#endif
  return {{"name", "gradflow"},
          {"version", GRADFLOW_VERSION},
          {"commit", GRADFLOW_GIT_COMMIT},
          {"compiler", compiler},
          {"kernels", kTiledMultiply ? "avx512" : "portable"},
          {"float64_products", float64_products}};
}

void write_json(const AnalysisReport& report, std::ostream& out) {
  out << report_to_json(report).dump() << '\n';
}

json architecture_to_json(const Architecture& arch, const ModelConfig& config) {
  json constants = json::array();
  for (const Constant& k : resolve_constants(arch, config)) {
    constants.push_back({{"name", k.name}, {"value", k.value}, {"formula", k.formula}, {"unit", k.unit}});
  }
  json aliases = json::array();
  for (const auto alias : arch.aliases) aliases.push_back(std::string(alias));
  json streams = json::array();
  for (const auto name : arch.streams) streams.push_back(std::string(name));
  json out = {{"id", std::string(arch.id)},
              {"aliases", aliases},
              {"update_rule", std::string(arch.update_rule)},
              {"final_norm", std::string(arch.final_norm)},
              {"constants", constants},
              {"citation", std::string(arch.citation)},
              {"provisional", arch.provisional},
              {"streams", streams},
              {"additive_stream", arch.additive_stream},
              {"expected_growth_class", std::string(arch.expected_growth)}};
  if (arch.provisional) out["provisional_note"] = std::string(arch.provisional_note);
  return out;
}

}  // namespace gradflow
