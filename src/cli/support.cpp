// CLI helpers: all-or-nothing output files, the machine's free memory, the progress bar.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
  if (path_.empty() || path_ == "-") return;
  const std::filesystem::path target(path_);
  if (std::filesystem::is_directory(target)) {
    throw InputError(
        fmt::format("-o {} is a directory; give a file name such as {}/result.json", path_, path_));
  }
  std::random_device entropy;
  temporary_ = fmt::format("{}.tmp.{}.{:x}", path_, ::getpid(), entropy());
  file_.open(temporary_, std::ios::binary | std::ios::trunc);
  if (!file_) {
    const auto parent = target.has_parent_path() ? target.parent_path().string() : std::string(".");
    throw InputError(fmt::format("-o {} is not writable (cannot create a file in {}); choose a writable path",
                                 path_, parent));
  }
}

AtomicOutput::~AtomicOutput() {
  if (!committed_ && !temporary_.empty()) {
    file_.close();
    std::remove(temporary_.c_str());
  }
}

std::ostream& AtomicOutput::stream() {
  return temporary_.empty() ? static_cast<std::ostream&>(buffer_) : file_;
}

void AtomicOutput::commit() {
  if (temporary_.empty()) {
    std::cout << buffer_.str() << std::flush;
  } else {
    file_.close();
    if (!file_ || std::rename(temporary_.c_str(), path_.c_str()) != 0) {
      throw InputError(fmt::format("could not write -o {}; check the disk space and permissions", path_));
    }
  }
  committed_ = true;
}

std::string resolve_output_format(const std::string& format, const CLI::Option* output_flag,
                                  const std::string& output, const std::vector<std::string>& allowed,
                                  const std::string& terminal_format) {
  const bool to_file = output_flag && output_flag->count() > 0 && output != "-";
  if (to_file && output.empty()) {
    throw InputError(
        "-o '' is an empty file name; give a file name (e.g. -o result.json) or omit -o for stdout");
  }
  std::string named;  // the format the file's extension names
  const std::string extension = to_file ? std::filesystem::path(output).extension().string() : "";
  if (extension == ".json") named = "json";
  if (extension == ".csv") named = "csv";
  if (extension == ".md") named = "markdown";
  const auto allowed_list = fmt::format("{}", fmt::join(allowed, ", "));
  if (!format.empty()) {
    if (!named.empty() && named != format) {
      throw InputError(
          fmt::format("-o {} names {} output but --format is {}; drop --format, or give the file "
                      "a name that matches it",
                      output, named, format));
    }
    return format;
  }
  if (!named.empty()) {
    if (std::find(allowed.begin(), allowed.end(), named) == allowed.end()) {
      throw InputError(fmt::format("-o {}: this subcommand writes {}, not {}; name the file .json or .csv",
                                   output, allowed_list, named));
    }
    return named;
  }
  if (to_file) return "json";
  return stdout_is_terminal() ? terminal_format : "json";
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return std::nullopt;
  return text.str();
}

nlohmann::ordered_json read_json_file(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw InputError(fmt::format("{} is a directory, not a JSON file", path));
  const auto text = read_text_file(path);
  if (!text) throw InputError(fmt::format("{}: cannot read the file (missing or not readable)", path));
  try {
    return nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::json::parse_error& error) {
    throw InputError(fmt::format("{}: malformed JSON ({})", path, error.what()));
  }
}

// The field where two JSON objects first differ ("model.seq: 16 vs 32"), empty when equal.
std::string first_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                             const std::string& prefix) {
  for (const auto& [key, value] : a.items()) {
    if (!b.contains(key)) return fmt::format("{}{}: {} vs absent", prefix, key, value.dump());
    if (value != b.at(key)) return fmt::format("{}{}: {} vs {}", prefix, key, value.dump(), b.at(key).dump());
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) return fmt::format("{}{}: absent vs {}", prefix, key, value.dump());
  }
  return {};
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicOutput output(path);
  output.stream() << text;
  output.commit();
}

std::uint64_t available_memory_bytes() {
  std::FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (!meminfo) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, meminfo)) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  std::fclose(meminfo);
  return static_cast<std::uint64_t>(kib) * 1024;
}

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}
bool stdout_is_terminal() {
  return ::isatty(STDOUT_FILENO) == 1;
}

ProgressBar::ProgressBar(bool enabled, std::string label)
    : enabled_(enabled), label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::finish() {
  if (enabled_ && last_permille_ >= 0) {
    fmt::print(stderr, "\r\033[2K");
    std::fflush(stderr);
  }
  enabled_ = false;
}

void ProgressBar::set_label(std::string label) {
  label_ = std::move(label);
}

void ProgressBar::update(long long done, long long total) {
  if (!enabled_ || total <= 0) return;
  if (last_permille_ < 0 && std::chrono::steady_clock::now() - start_ < kDelay) return;
  const int permille = static_cast<int>(1000 * done / total);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  // The remaining time at the average rate so far; shown once 1% is done, so it is not a guess.
  std::string eta;
  if (permille >= 10 && done < total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const long long left =
        std::llround(elapsed * static_cast<double>(total - done) / static_cast<double>(done));
    eta = left >= 3600 ? fmt::format("  ETA {}h{:02}m", left / 3600, left % 3600 / 60)
                       : fmt::format("  ETA {}m{:02}s", left / 60, left % 60);
  }
  fmt::print(stderr, "\r\033[2K{} [{}{}] {:5.1f}%{}", label_, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), permille / 10.0, eta);
  std::fflush(stderr);
}

}  // namespace gradflow::cli
