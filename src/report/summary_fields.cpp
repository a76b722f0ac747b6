// A seed's summary figures as the documents record them (metrics.md, "Per run"): the one list that
// the per-seed JSON, the across-seed aggregate, a sweep's rows and CSV, the document check and
// `check`'s comparison all loop over, as config_fields() is for the configuration.
#include <cmath>

#include "gradflow/app/report.hpp"
#include "gradflow/statistics.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {
json growth_to_json(const GrowthFit& fit) {
  return {{"exponent", json_number(fit.exponent)},
          {"standard_error", json_number(fit.standard_error)},
          {"class", fit.growth_class},
          {"fitted_states", {fit.first_state, fit.first_state + fit.points - 1}}};
}

json extremum_to_json(const Extremum& extremum) {
  return {{"value", json_number(extremum.value)}, {"sublayer", extremum.sublayer}};
}

// --update: one object per learning rate (metrics.md, "The model update").
json updates_to_json(const std::vector<UpdateStep>& updates) {
  json out = json::array();
  for (const UpdateStep& step : updates) {
    json step_rel = json::object();
    for (int m = 0; m < kMatrixKindCount; ++m) {
      if (!std::isnan(step.step_rel[m])) step_rel[kMatrixKinds[m]] = json_number(step.step_rel[m]);
    }
    if (!std::isnan(step.step_rel_norm_gain)) step_rel["norm_gain"] = json_number(step.step_rel_norm_gain);
    out.push_back({{"learning_rate", step.learning_rate},
                   {"output_update_rel", json_number(step.output_update_rel)},
                   {"delta_loss", json_number(step.delta_loss)},
                   {"delta_loss_first_order", json_number(step.delta_loss_first_order)},
                   {"step_rel", step_rel},
                   {"diverged_state", step.diverged_state < 0 ? json(nullptr) : json(step.diverged_state)}});
  }
  return out;
}

// The seeds' class when they agree (a collapsed stream is "vanishing" though its exponent may be
// unfit), else the class of the mean exponent.
std::string_view common_growth_class(const std::vector<SeedResult>& seeds) {
  for (const auto& seed : seeds) {
    if (seed.growth.growth_class != seeds.front().growth.growth_class) {
      std::vector<double> exponents;
      for (const auto& s : seeds) exponents.push_back(s.growth.exponent);
      return growth_class(spread(exponents).mean);
    }
  }
  return seeds.front().growth.growth_class;
}

}  // namespace

const std::vector<SummaryField>& summary_fields() {
  using K = SummaryKind;
  using S = FigureScale;
  // In document order.
  static const std::vector<SummaryField> fields = {
      {.key = "log10_grad_ratio",
       .kind = K::number,
       .value = [](const SeedResult& s) { return json_number(s.log10_grad_ratio); },
       .sample = [](const SeedResult& s) { return s.log10_grad_ratio; },
       .in_sweep_cell = true,
       .scale = S::log_space},
      {.key = "gain_min",
       .kind = K::extremum,
       .value = [](const SeedResult& s) { return extremum_to_json(s.gain_min); },
       .sample = [](const SeedResult& s) { return s.gain_min.value; },
       .in_sweep_cell = true,
       .scale = S::linear},
      {.key = "gain_max",
       .kind = K::extremum,
       .value = [](const SeedResult& s) { return extremum_to_json(s.gain_max); },
       .sample = [](const SeedResult& s) { return s.gain_max.value; },
       .in_sweep_cell = true,
       .scale = S::linear},
      {.key = "growth_exponent",
       .kind = K::number,
       .value = [](const SeedResult& s) { return json_number(s.growth.exponent); },
       .sample = [](const SeedResult& s) { return s.growth.exponent; },
       .in_sweep_cell = true,
       .scale = S::exponent},
      {.key = "growth_exponent_se",
       .kind = K::number,
       .value = [](const SeedResult& s) { return json_number(s.growth.standard_error); },
       .in_sweep_cell = true,
       .scale = S::exponent},
      {.key = "growth_class",
       .kind = K::word,
       .value = [](const SeedResult& s) { return json(s.growth.growth_class); },
       .across_seeds = [](const std::vector<SeedResult>& seeds) { return json(common_growth_class(seeds)); },
       .in_sweep_cell = true},
      // Its exponent and class are growth_exponent's and growth_class's, gated there.
      {.key = "growth_fit",
       .kind = K::structure,
       .value = [](const SeedResult& s) { return growth_to_json(s.growth); }},
      // One fit per stream; a multi-stream placement's per-stream states are gated column by column.
      {.key = "stream_growth",
       .kind = K::structure,
       .value =
           [](const SeedResult& s) {
             json out = json::object();
             for (const auto& stream : s.streams) out[stream.name] = growth_to_json(stream.growth);
             return out;
           }},
      {.key = "effective_depth",
       .kind = K::number,
       .value = [](const SeedResult& s) { return json_number(s.effective_depth); },
       .sample = [](const SeedResult& s) { return s.effective_depth; },
       .in_sweep_cell = true,
       .scale = S::linear},
      // A share that may be near or below zero: compared by absolute difference, as an exponent is
      // (a ratio would jump where the sign changes and magnify noise in tiny shares).
      {.key = "stream_decomposition_input",
       .kind = K::number,
       .value = [](const SeedResult& s) { return json_number(s.stream_decomposition_input); },
       .sample = [](const SeedResult& s) { return s.stream_decomposition_input; },
       .in_sweep_cell = true,
       .scale = S::exponent},
      {.key = "diverged",
       .kind = K::event,
       .value =
           [](const SeedResult& s) {
             if (!s.diverged) return json(nullptr);
             return json{{"sublayer", s.diverged->sublayer},
                         {"phase", s.diverged->phase},
                         {"reason", s.diverged->reason}};
           },
       .in_sweep_cell = true},
      // Per learning rate; a sweep row carries output_update_rel from it (sweep_reporter.cpp). Not
      // compared itself: the per-state and per-sublayer update columns (update_rms, update_loss,
      // ...) are, with the states and sublayers; output_update_rel, delta_loss and step_rel are not.
      {.key = "update",
       .kind = K::structure,
       .value = [](const SeedResult& s) { return updates_to_json(s.updates); },
       .present = [](const SeedResult& s) { return !s.updates.empty(); }},
  };
  return fields;
}

json summary_to_json(const SeedResult& seed, const std::vector<SummaryField>& fields) {
  json summary = json::object();
  for (const SummaryField& field : fields) {
    if (!field.present || field.present(seed)) summary[std::string(field.key)] = field.value(seed);
  }
  return summary;
}

json spread_to_json(const std::vector<double>& samples) {
  const Spread sp = spread(samples);
  return {{"mean", json_number(sp.mean)},
          {"std", json_number(sp.std)},
          {"ci95_low", json_number(sp.ci95_low)},
          {"ci95_high", json_number(sp.ci95_high)}};
}

json aggregate_summary_to_json(const std::vector<SeedResult>& seeds,
                               const std::vector<SummaryField>& fields) {
  json summary = json::object();
  for (const SummaryField& field : fields) {
    if (field.across_seeds) {
      summary[std::string(field.key)] = field.across_seeds(seeds);
      continue;
    }
    if (!field.sample) continue;
    std::vector<double> samples;
    for (const SeedResult& seed : seeds) samples.push_back(field.sample(seed));
    summary[std::string(field.key)] = spread_to_json(samples);
  }
  return summary;
}

const SummaryField* find_summary_field(std::string_view key, const std::vector<SummaryField>& fields) {
  for (const SummaryField& field : fields) {
    if (field.key == key) return &field;
  }
  return nullptr;
}

}  // namespace gradflow
