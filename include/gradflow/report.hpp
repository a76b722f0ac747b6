// Reporters: one function per output format, each writing a finished analysis to a stream.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "gradflow/analysis.hpp"

namespace gradflow {

inline constexpr int kSchemaVersion = 1;

struct AnalysisReport {
  std::vector<ArchResult> results;
  int threads = 1;
  double total_seconds = 0.0;
};

// The resolved configuration of one placement's run (every default explicit, constants included).
nlohmann::ordered_json config_to_json(const ArchResult& result);
nlohmann::ordered_json report_to_json(const AnalysisReport& report);
void write_json(const AnalysisReport& report, std::ostream& out);
void write_csv(const AnalysisReport& report, std::ostream& out);
// A summary for people: one row per placement (mean and spread across seeds), aligned in
// columns; ANSI colour only when `colour` is set (the caller knows whether stdout is a terminal).
void write_table(const AnalysisReport& report, std::ostream& out, bool colour);
// The same rows as a GitHub Markdown table.
void write_markdown(const AnalysisReport& report, std::ostream& out);

// A placement's registry entry (gradflow archs), with constants at `config`'s depth.
nlohmann::ordered_json architecture_to_json(const Architecture& arch, const ModelConfig& config);

// safetensors: 8-byte little-endian header size, JSON header, raw little-endian data.
void write_safetensors(const std::vector<NamedTensor>& tensors, Precision precision,
                       const nlohmann::ordered_json& metadata, std::ostream& out);

}  // namespace gradflow
