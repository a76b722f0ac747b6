// CSV reporter: tidy RFC 4180 rows, one per (arch, blocks, seed, state index), with the main
// configuration repeated as columns so that concatenated files stay self-describing. Sublayer
// figures on row l describe sublayer l (x_l -> x_{l+1}) and are empty on the last row.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "gradflow/app/report.hpp"

namespace gradflow {

namespace {
std::string cell(double value) {
  return std::isfinite(value) ? fmt::format("{}", value) : std::string();
}

// Union of the multi-stream names across the report, in first-seen order.
std::vector<std::string> stream_names(const AnalysisReport& report) {
  std::vector<std::string> names;
  for (const auto& result : report.results) {
    if (result.arch->streams.size() < 2) continue;
    for (const auto name : result.arch->streams) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
    }
  }
  return names;
}
}  // namespace

void write_csv(const AnalysisReport& report, std::ostream& out, const WriteOptions& /*options*/) {
  if (report.results.empty()) return;
  const SeedResult& first = report.results.front().seeds.front();
  const auto streams = stream_names(report);
  out << "arch,blocks,sublayers,width,heads,seq,norm,init,precision,seed,index,kind,block";
  for (const auto& name : first.states.names) out << ',' << name;
  for (const auto& name : first.sublayers.names) out << ',' << name;
  for (const auto& stream : streams) out << ",rms_" << stream << ",log10_grad_" << stream;
  // --update: the run's figures per learning rate, repeated on every row like the configuration
  for (std::size_t i = 1; i <= first.updates.size(); ++i) {
    out << ",learning_rate_" << i << ",output_update_rel_" << i << ",delta_loss_" << i
        << ",delta_loss_first_order_" << i;
    for (const char* kind : kMatrixKinds) out << ",step_rel_" << kind << '_' << i;
    out << ",step_rel_norm_gain_" << i << ",diverged_state_" << i;
  }
  // --checkpoint: the loss on every row, and layer i's angular distance on its attention row (2i)
  const bool checkpoint = first.checkpoint.has_value();
  if (checkpoint) out << ",loss,layer_angular_distance";
  out << "\r\n";
  for (const ArchResult& result : report.results) {
    const int sublayers = result.config.sublayers();
    for (const SeedResult& seed : result.seeds) {
      for (int l = 0; l <= sublayers; ++l) {
        const bool has_sublayer = l < sublayers;
        const ModelConfig& c = result.config;
        out << result.arch->id << ',' << c.blocks << ',' << sublayers << ',' << c.width << ',' << c.heads
            << ',' << c.seq << ',' << to_string(c.norm) << ',' << init_text(c) << ','
            << to_string(c.precision) << ',' << seed.seed << ',' << l << ','
            << (has_sublayer ? to_string(seed.kinds[l]) : "") << ','
            << (has_sublayer ? fmt::format("{}", seed.blocks[l]) : "");
        for (const auto& column : seed.states.values) out << ',' << cell(column[l]);
        for (const auto& column : seed.sublayers.values) out << ',' << (has_sublayer ? cell(column[l]) : "");
        for (const auto& name : streams) {
          const StreamFigures* match = nullptr;
          for (const auto& s : seed.streams) {
            if (s.name == name && seed.streams.size() > 1) match = &s;
          }
          out << ',' << (match ? cell(match->states.values[0][l]) : "") << ','
              << (match ? cell(match->states.values[1][l]) : "");
        }
        for (std::size_t i = 0; i < first.updates.size(); ++i) {
          const UpdateStep step = i < seed.updates.size() ? seed.updates[i] : UpdateStep{};
          out << ',' << cell(step.learning_rate) << ',' << cell(step.output_update_rel) << ','
              << cell(step.delta_loss) << ',' << cell(step.delta_loss_first_order);
          for (const double step_rel : step.step_rel) out << ',' << cell(step_rel);
          out << ',' << cell(step.step_rel_norm_gain) << ','
              << (step.diverged_state >= 0 ? fmt::format("{}", step.diverged_state) : "");
        }
        if (checkpoint && seed.checkpoint) {
          const auto& angular = seed.checkpoint->angular_distance;
          const bool layer_row =
              has_sublayer && l % 2 == 0 && static_cast<std::size_t>(l / 2) < angular.size();
          out << ',' << cell(seed.checkpoint->loss) << ',' << (layer_row ? cell(angular[l / 2]) : "");
        }
        out << "\r\n";
      }
    }
  }
}

}  // namespace gradflow
