// Table reporter: one row per placement with the run's key figures, aligned for a terminal
// (optionally in ANSI colour) or as a GitHub Markdown table. With several seeds a row shows the
// mean across seeds, and `±` the standard deviation across them where it is informative.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradflow/app/report.hpp"

namespace gradflow {

namespace {

// ANSI SGR sequences; only used when the caller says stdout is a terminal.
constexpr std::string_view kBold = "\033[1m", kRed = "\033[31m", kGreen = "\033[32m", kYellow = "\033[33m",
                           kReset = "\033[0m";

enum class Align { left, right };

struct Column {
  std::string header;
  Align align;
};

struct Cell {
  std::string text;
  std::string_view colour;  // empty: default colour
};

const std::vector<Column>& columns() {
  static const std::vector<Column> list = {
      {"arch", Align::left},        {"S", Align::right},        {"log10 ratio", Align::right},
      {"gain min@l", Align::right}, {"gain max", Align::right}, {"log10 skip", Align::right},
      {"rms(x_S)", Align::right},   {"growth p", Align::right}, {"class", Align::left},
      {"diverged", Align::left},
  };
  return list;
}

// Terminal columns of UTF-8 text (every character here is one column wide).
std::size_t display_width(std::string_view text) {
  std::size_t width = 0;
  for (const char c : text) width += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return width;
}

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  std::string text = fmt::format("{:.{}f}", value, decimals);
  // A tiny negative value rounds to "-0.00": print it as "0.00".
  if (text.front() == '-' && text.find_first_not_of("-0.") == std::string::npos) text.erase(0, 1);
  return text;
}

// `significant` digits, with short exponents ("1.23e-5", not "1.23e-05") to keep columns narrow.
std::string compact(double value, int significant) {
  if (!std::isfinite(value)) return "-";
  std::string text = fmt::format("{:.{}g}", value, significant);
  const auto e = text.find('e');
  if (e == std::string::npos) return text;
  std::string exponent = text.substr(e + 1);
  const bool negative = exponent.front() == '-';
  exponent.erase(0, exponent.find_first_not_of("+-0"));
  return text.substr(0, e + 1) + (negative ? "-" : "") + (exponent.empty() ? "0" : exponent);
}

// Gains and norms can span many decades in diverging stacks: fixed point in a moderate range,
// short scientific notation elsewhere.
std::string moderate_or_scientific(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  const double magnitude = std::abs(value);
  return magnitude >= 1e-3 && magnitude < 1e4 ? fixed(value, decimals) : compact(value, 3);
}

std::string gain(double value) {
  return moderate_or_scientific(value, 4);
}

// "mean±std", the std with the mean's decimals (two significant digits when large or the mean
// is scientific); the std only for several seeds.
std::string with_spread(const std::string& mean, double std, int seeds, int decimals) {
  if (seeds < 2 || !std::isfinite(std) || mean == "-") return mean;
  const bool scientific = mean.find('e') != std::string::npos;
  return fmt::format("{}±{}", mean, scientific || std >= 10 ? compact(std, 2) : fixed(std, decimals));
}

std::string_view class_colour(std::string_view growth_class) {
  if (growth_class == "bounded") return kGreen;
  if (growth_class == "sqrt") return kYellow;
  if (growth_class == "linear" || growth_class == "other" || growth_class == "vanishing") return kRed;
  return {};
}

double log10_skip_product(const SeedResult& seed) {
  const auto* skip = seed.sublayers.find(Figure::skip_gain);
  if (!skip) return std::nan("");
  double sum = 0.0;
  for (const double g : *skip) sum += std::log10(g);  // NaN or -inf propagate to "-"
  return sum;
}

std::vector<Cell> row_for(const ArchResult& result) {
  const auto& seeds = result.seeds;
  const int count = static_cast<int>(seeds.size());
  std::vector<double> ratios, skips, rms_top, exponents;
  Extremum gain_min{std::numeric_limits<double>::infinity(), -1},
      gain_max{-std::numeric_limits<double>::infinity(), -1};
  int diverged = 0;
  for (const SeedResult& seed : seeds) {
    ratios.push_back(seed.log10_grad_ratio);
    skips.push_back(log10_skip_product(seed));
    rms_top.push_back(seed.states.at(Figure::rms).back());
    exponents.push_back(seed.growth.exponent);
    // Across seeds: the smallest minimum and the largest maximum, with their sublayer.
    if (seed.gain_min.value < gain_min.value) gain_min = seed.gain_min;
    if (seed.gain_max.value > gain_max.value) gain_max = seed.gain_max;
    diverged += seed.diverged.has_value();
  }
  const Spread ratio = spread(ratios), skip = spread(skips), rms = spread(rms_top),
               exponent = spread(exponents);
  const auto extremum = [](const Extremum& e) {
    return e.sublayer < 0 || !std::isfinite(e.value) ? std::string("-")
                                                     : fmt::format("{}@{}", gain(e.value), e.sublayer);
  };
  // One seed: the fit's standard error; several: the spread of the fitted exponents.
  const std::string exponent_text =
      count == 1 ? with_spread(fixed(exponent.mean, 3), seeds.front().growth.standard_error, 2, 3)
                 : with_spread(fixed(exponent.mean, 3), exponent.std, count, 3);
  // The seeds' class when they agree (a collapsed stream has no fitted exponent), else the mean's.
  std::string_view growth = seeds.front().growth.growth_class;
  for (const SeedResult& seed : seeds) {
    if (seed.growth.growth_class != growth) growth = growth_class(exponent.mean);
  }
  if (growth == "undetermined") growth = "-";  // no exponent to classify; "-" keeps the column narrow

  std::string diverged_text = "no";
  if (count == 1 && seeds.front().diverged) {
    const Divergence& d = *seeds.front().diverged;
    diverged_text = fmt::format("{}@{}", d.phase == "forward" ? "fwd" : "bwd", d.sublayer);
  } else if (diverged > 0) {
    diverged_text = fmt::format("{}/{}", diverged, count);
  }
  return {
      {std::string(result.arch->id), {}},
      {fmt::format("{}", result.config.sublayers()), {}},
      {with_spread(fixed(ratio.mean, 2), ratio.std, count, 2), {}},
      {extremum(gain_min), {}},
      {gain(gain_max.value), {}},
      {fixed(skip.mean, 2), {}},  // nearly seed-independent: a std would only widen the table
      {with_spread(moderate_or_scientific(rms.mean, 3), rms.std, count, 3), {}},
      {exponent_text, {}},
      {std::string(growth), class_colour(growth)},
      {diverged_text, diverged > 0 ? kRed : std::string_view{}},
  };
}

std::string configuration_line(const AnalysisReport& report) {
  const ArchResult& first = report.results.front();
  const ModelConfig& c = first.config;
  const int seeds = static_cast<int>(first.seeds.size());
  const std::string seed_text =
      seeds == 1 ? fmt::format("seed {}", first.seeds.front().seed)
                 : fmt::format("seeds {}..{}", first.seeds.front().seed, first.seeds.back().seed);
  if (!first.seeds.empty() && first.seeds.front().checkpoint &&
      report.checkpoint.is_object()) {  // --checkpoint: the model, not an init
    const CheckpointFigures& figures = *first.seeds.front().checkpoint;
    const auto& described = report.checkpoint;
    const auto& angular = figures.angular_distance;
    const auto [lowest, highest] = std::minmax_element(angular.begin(), angular.end());
    return fmt::format(
        "checkpoint {} ({}, {} layers), width {}, heads {}, {} tokens ({}), {}\n"
        "{} loss {:.6g}; layers' angular distance at the last token: min {:.4f}@{}, max {:.4f}@{}",
        described.value("directory", ""), described.value("model_type", ""), c.blocks, c.width, c.heads,
        c.seq,
        figures.random_tokens ? fmt::format("drawn by seed {}", first.seeds.front().seed) : "from --tokens",
        to_string(c.precision), figures.loss_kind == LossKind::lm ? "LM" : "probe", figures.loss, *lowest,
        lowest - angular.begin(), *highest, highest - angular.begin());
  }
  return fmt::format("depth {} blocks ({}), width {}, heads {}, seq {}, norm {}, init {}, {}{}, {}", c.blocks,
                     to_string(c.block), c.width, c.heads, c.seq, to_string(c.norm), init_text(c),
                     to_string(c.precision), c.branch == BranchKind::rotation ? ", ideal branch" : "",
                     seed_text);
}

// Two lines explaining the columns, each within 120 columns.
std::string legend(const AnalysisReport& report) {
  const std::size_t seeds = report.results.front().seeds.size();
  const std::string spread_note =
      seeds > 1 ? fmt::format(
                      "a±b: mean±std over {} seeds; log10 skip: mean; gain min/max: over all seeds; "
                      "diverged: seeds",
                      seeds)
                : std::string("growth p: exponent±SE of the fit; diverged: phase@sublayer");
  return fmt::format(
      "log10 ratio: log10 |dL/dx_0|/|dL/dx_S|; log10 skip: log10 of prod_l skip_gain_l; growth p: rms(x_l) ~ "
      "l^p\n{}\n",
      spread_note);
}

// --update: one line per placement and learning rate with the step's figures (mean over seeds):
// how far one optimizer step moves the output, and the loss change beside its first-order
// prediction (metrics.md, "The model update"). Empty without --update.
std::string update_lines(const AnalysisReport& report) {
  const ModelConfig& config = report.results.front().config;
  if (config.update == UpdateRule::none) return {};
  std::size_t arch_width = 0;
  for (const ArchResult& result : report.results) arch_width = std::max(arch_width, result.arch->id.size());
  const auto& seeds = report.results.front().seeds;
  const bool lm =
      !seeds.empty() && seeds.front().checkpoint && seeds.front().checkpoint->loss_kind == LossKind::lm;
  std::string text = fmt::format("one {} step on the {} loss (mean over seeds):\n", to_string(config.update),
                                 lm ? "language-model" : "probe");
  for (const ArchResult& result : report.results) {
    for (std::size_t i = 0; i < config.learning_rates.size(); ++i) {
      std::vector<double> moved, measured, predicted;
      int diverged = 0;
      for (const SeedResult& seed : result.seeds) {
        const UpdateStep& step = seed.updates.at(i);
        moved.push_back(step.output_update_rel);
        measured.push_back(step.delta_loss);
        predicted.push_back(step.delta_loss_first_order);
        diverged += step.diverged_state >= 0;
      }
      text +=
          fmt::format("  {:<{}}  lr {:<7}  |dy|/|y| {:<9}  dL {} (first order {}){}\n", result.arch->id,
                      arch_width, compact(config.learning_rates[i], 3), compact(spread(moved).mean, 3),
                      compact(spread(measured).mean, 3), compact(spread(predicted).mean, 3),
                      diverged > 0 ? fmt::format("  diverged in {}/{} seeds", diverged, result.seeds.size())
                                   : std::string());
    }
  }
  return text;
}

}  // namespace

void write_table(const AnalysisReport& report, std::ostream& out, const WriteOptions& options) {
  if (report.results.empty()) return;
  const auto& cols = columns();
  std::vector<std::vector<Cell>> rows;
  for (const ArchResult& result : report.results) rows.push_back(row_for(result));
  std::vector<std::size_t> widths;
  for (const Column& column : cols) widths.push_back(display_width(column.header));
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], display_width(row[i].text));
  }
  const auto paint = [colour = options.colour](const std::string& text, std::string_view code) {
    return colour && !code.empty() ? fmt::format("{}{}{}", code, text, kReset) : text;
  };
  // Columns are joined by two spaces; the last one is not padded, so lines end without blanks.
  const auto emit = [&](const std::vector<Cell>& cells) {
    std::string line;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const bool last = i + 1 == cells.size();
      const std::string fill(widths[i] - display_width(cells[i].text), ' ');
      const std::string text = paint(cells[i].text, cells[i].colour);
      line += cols[i].align == Align::right ? fill + text : text + (last ? "" : fill);
      if (!last) line += "  ";
    }
    out << line << '\n';
  };
  std::vector<Cell> header;
  for (const Column& column : cols) header.push_back({column.header, kBold});
  out << configuration_line(report) << '\n';
  emit(header);
  for (const auto& row : rows) emit(row);
  out << legend(report) << update_lines(report);
}

void write_markdown(const AnalysisReport& report, std::ostream& out, const WriteOptions& /*options*/) {
  if (report.results.empty()) return;
  const auto& cols = columns();
  out << configuration_line(report) << "\n\n|";
  for (const Column& column : cols) out << ' ' << column.header << " |";
  out << "\n|";
  for (const Column& column : cols) out << (column.align == Align::left ? " --- |" : " ---: |");
  out << '\n';
  for (const ArchResult& result : report.results) {
    out << '|';
    for (const Cell& cell : row_for(result)) out << ' ' << cell.text << " |";
    out << '\n';
  }
  out << '\n' << legend(report);
  if (const std::string lines = update_lines(report); !lines.empty()) out << "\n```\n" << lines << "```\n";
}

}  // namespace gradflow
