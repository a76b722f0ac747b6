// Subcommands (one file each, CLI11's subcom_in_files pattern) and the helpers they share.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

namespace gradflow::cli {

// setup_x registers subcommand x on the app; `run` executes it once parsed and returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
Command setup_analyze(CLI::App& app);
Command setup_archs(CLI::App& app);

// Output that appears whole or not at all: a temporary file beside the target, renamed on
// commit(); removed if never committed. An empty path means stdout (written at commit()).
class AtomicOutput {
 public:
  explicit AtomicOutput(std::string path);  // throws InputError when the path is not writable
  ~AtomicOutput();
  std::ostream& stream();
  void commit();

 private:
  std::string path_, temporary_;
  std::ofstream file_;
  std::ostringstream buffer_;
  bool committed_ = false;
};

// Bytes of memory this machine can give a new process (MemAvailable), 0 if unknown.
std::uint64_t available_memory_bytes();

// A one-line progress bar on stderr, shown only when stderr is a terminal and not --quiet, and
// only once the run has taken longer than kDelay: short runs never flash a bar.
class ProgressBar {
 public:
  static constexpr std::chrono::milliseconds kDelay{1000};
  ProgressBar(bool enabled, std::string label);
  ~ProgressBar();
  void update(long long done, long long total);
  void set_label(std::string label);
  void finish();  // erase the bar (if drawn) and draw no more

 private:
  bool enabled_;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  int last_permille_ = -1;
};
bool stderr_is_terminal();
bool stdout_is_terminal();

}  // namespace gradflow::cli
