// CLI helpers: all-or-nothing output files, the machine's free memory, the progress bar.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

// ---- temporary files removed on SIGINT and SIGTERM
// A fixed table of slots, so that the signal handler touches no allocator and no lock: a slot's
// path is written before its `state` becomes kUsed and is read by the handler only then.
namespace {
constexpr int kTemporarySlots = 64;
constexpr std::size_t kTemporaryPathMax = 4096;
enum SlotState : int { kFree = 0, kClaimed = 1, kUsed = 2 };
struct TemporarySlot {
  std::atomic<int> state{kFree};
  char path[kTemporaryPathMax] = {};
};
std::array<TemporarySlot, kTemporarySlots> temporary_slots;

int register_temporary(const std::string& path) {
  if (path.size() >= kTemporaryPathMax) return -1;
  for (int i = 0; i < kTemporarySlots; ++i) {
    int expected = kFree;
    if (temporary_slots[i].state.compare_exchange_strong(expected, kClaimed)) {
      std::memcpy(temporary_slots[i].path, path.c_str(), path.size() + 1);
      temporary_slots[i].state.store(kUsed);
      return i;
    }
  }
  return -1;  // more files open at once than slots: still removed by ~AtomicOutput, not on a signal
}

void unregister_temporary(int slot) {
  if (slot >= 0) temporary_slots[slot].state.store(kFree);
}

extern "C" void remove_temporaries_and_exit(int signal_number) {
  for (auto& slot : temporary_slots) {
    if (slot.state.load() == kUsed) ::unlink(slot.path);
  }
  if (stderr_is_terminal()) {
    static const char kClearLine[] = "\r\033[2K";
    [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kClearLine, sizeof kClearLine - 1);
  }
  ::_exit(128 + signal_number);  // the shell's convention: 130 for SIGINT, 143 for SIGTERM
}

// What an existing -o target is when it is not a regular file; empty when it is one or absent.
std::string special_kind(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) return {};
  if (S_ISLNK(status.st_mode)) return "a symbolic link";
  if (S_ISDIR(status.st_mode)) return "a directory";
  if (S_ISFIFO(status.st_mode)) return "a FIFO";
  if (S_ISCHR(status.st_mode) || S_ISBLK(status.st_mode)) return "a device";
  if (S_ISSOCK(status.st_mode)) return "a socket";
  return {};
}
}  // namespace

void install_signal_cleanup() {
  struct sigaction action {};
  action.sa_handler = remove_temporaries_and_exit;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal_number, &action, nullptr);
  // Over the file-size limit (ulimit -f) a write would kill the process with SIGXFSZ and leave the
  // temporary behind; ignored, the write fails with EFBIG and AtomicOutput reports it and cleans up.
  std::signal(SIGXFSZ, SIG_IGN);
}

AtomicOutput::AtomicOutput(std::string path, std::string option)
    : path_(std::move(path)), option_(std::move(option)) {
  if (path_.empty() || path_ == "-") return;
  const std::filesystem::path target(path_);
  const std::string kind = special_kind(path_);
  if (kind == "a directory") {
    throw InputError(
        fmt::format("{} is a directory; give a file name such as {}/result.json", named(), path_));
  }
  if (!kind.empty()) {
    // Replacing the link or device by a regular file (rename) would surprise; writing through it
    // would not be all-or-nothing. Shell redirection is the way to reach a device or a pipe.
    throw InputError(fmt::format("{} is {}; gradflow writes regular files only{}", named(), kind,
                                 option_ == "-o" ? " (omit -o and redirect stdout to reach it)" : ""));
  }
  std::random_device entropy;
  temporary_ = fmt::format("{}.tmp.{}.{:x}.{}", path_, ::getpid(), entropy(), host_tag());
  slot_ = register_temporary(temporary_);
  file_.open(temporary_, std::ios::binary | std::ios::trunc);
  if (!file_) {
    const int error = errno;
    unregister_temporary(slot_);
    slot_ = -1;
    temporary_.clear();
    const auto parent = target.has_parent_path() ? target.parent_path().string() : std::string(".");
    throw InputError(
        fmt::format("{} is not writable (cannot create a file in {}: {}); choose a writable path", named(),
                    parent, std::strerror(error)));
  }
}

AtomicOutput::~AtomicOutput() {
  if (!committed_ && !temporary_.empty()) {
    file_.close();
    std::remove(temporary_.c_str());
  }
  unregister_temporary(slot_);
}

std::string AtomicOutput::named() const {
  return option_.empty() ? path_ : fmt::format("{} {}", option_, path_);
}

std::ostream& AtomicOutput::stream() {
  return temporary_.empty() ? static_cast<std::ostream&>(buffer_) : file_;
}

void AtomicOutput::commit() {
  if (temporary_.empty()) {
    std::cout << buffer_.str();
    check_stdout();
  } else {
    errno = 0;
    file_.close();
    if (!file_ || std::rename(temporary_.c_str(), path_.c_str()) != 0) {
      // EFBIG: over the file-size limit (ulimit -f; SIGXFSZ is ignored so that it arrives here).
      const int error = errno;
      throw InputError(
          fmt::format("could not write {} ({}); check the disk space, the file-size limit "
                      "(ulimit -f) and permissions",
                      named(), error != 0 ? std::strerror(error) : "write error"));
    }
  }
  committed_ = true;
}

std::string resolve_output_format(const std::string& format, const CLI::Option* output_flag,
                                  const std::string& output, OutputKind kind,
                                  const std::string& terminal_format) {
  const bool to_file = output_flag && output_flag->count() > 0 && output != "-";
  if (to_file && output.empty()) {
    throw InputError(
        "-o '' is an empty file name; give a file name (e.g. -o result.json) or omit -o for stdout");
  }
  // The format the file's extension names.
  const std::string named =
      to_file ? format_of_extension(std::filesystem::path(output).extension().string()) : "";
  const std::vector<std::string> allowed = format_names(kind);
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
      const std::vector<std::string> extensions = format_extensions(kind);
      throw InputError(fmt::format("-o {}: this subcommand writes {}, not {}; name the file {} or {}", output,
                                   fmt::join(allowed, ", "), named,
                                   fmt::join(extensions.begin(), extensions.end() - 1, ", "),
                                   extensions.back()));
    }
    return named;
  }
  if (to_file) return "json";
  return stdout_is_terminal() ? terminal_format : "json";
}

CLI::Option* add_format_option(CLI::App* sub, std::string& format, OutputKind kind, const std::string& help) {
  return sub->add_option("--format", format, help)->check(CLI::IsMember(format_names(kind)));
}

std::string host_tag() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "host";
  std::string tag;
  for (const char c : std::string(name.data())) {
    if (tag.size() == 32) break;
    tag += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '-';
  }
  return tag.empty() ? "host" : tag;
}

void check_stdout() {
  std::cout.flush();
  const CliHooks* hooks = active_hooks();
  const bool captured = hooks && hooks->stdout_captured;
  const bool failed = !std::cout || (!captured && (std::fflush(stdout) != 0 || std::ferror(stdout)));
  if (failed) {
    const int error = errno;
    throw InputError(
        fmt::format("could not write the output to stdout ({}); check the disk space or the "
                    "pipe, or write to a file with -o",
                    error != 0 ? std::strerror(error) : "write error"));
  }
}

// ---- reading inputs: regular files only, bounded in size and in nesting
namespace {
// What a path that is not a regular file is, for the message.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

InputError too_large(const std::string& path, std::uint64_t bytes) {
  return InputError(
      fmt::format("{} is {:.2f} GB, more than the {:.2f} GB gradflow reads as one document; "
                  "split the run that wrote it (fewer placements, seeds or cells per file)",
                  path, static_cast<double>(bytes) / 1e9, static_cast<double>(kMaxDocumentBytes) / 1e9));
}

// A descriptor closed on every path out.
struct OpenFile {
  int fd = -1;
  OpenFile() = default;
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading when it is a regular file after following links; false (errno set) when
// it cannot be opened. O_NONBLOCK keeps the open of a FIFO from waiting for a writer, and fstat on
// the descriptor itself decides, so no rename between a check and the open can slip a FIFO in.
bool open_regular_file(const std::string& path, OpenFile& file, std::uint64_t& size) {
  file.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (file.fd < 0) return false;
  struct stat status {};
  if (::fstat(file.fd, &status) != 0) return false;
  if (!S_ISREG(status.st_mode)) {
    throw InputError(fmt::format("{} is {}, not a regular file; gradflow reads its inputs only from files",
                                 path, file_kind(status.st_mode)));
  }
  size = static_cast<std::uint64_t>(status.st_size);
  if (size > kMaxDocumentBytes) throw too_large(path, size);
  const int flags = ::fcntl(file.fd, F_GETFL);
  return flags >= 0 && ::fcntl(file.fd, F_SETFL, flags & ~O_NONBLOCK) == 0;
}

// The rest of an open file, refused once it passes kMaxDocumentBytes (a file growing while read).
std::optional<std::string> read_bounded(const OpenFile& file, std::uint64_t size_hint,
                                        const std::string& path) {
  std::string text;
  text.reserve(static_cast<std::size_t>(size_hint));
  std::array<char, 1 << 16> buffer{};
  for (;;) {
    const ssize_t got = ::read(file.fd, buffer.data(), buffer.size());
    if (got == 0) return text;
    if (got < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    text.append(buffer.data(), static_cast<std::size_t>(got));
    if (text.size() > kMaxDocumentBytes) throw too_large(path, text.size());
  }
}

// The offset where a JSON text first nests deeper than `limit` arrays and objects; npos when it
// never does. Brackets inside strings do not count. The parser stops at its first error, and up to
// there the text is a valid prefix whose nesting this counts exactly: a text that passes cannot
// take the parser, or the recursive copies, comparisons and dumps of the parsed document, deeper.
std::size_t first_excess_nesting(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}
}  // namespace

std::optional<std::string> read_text_file(const std::string& path) {
  OpenFile file;
  std::uint64_t size = 0;
  if (!open_regular_file(path, file, size)) return std::nullopt;
  return read_bounded(file, size, path);
}

void check_json_nesting(const std::string& text, const std::string& origin) {
  const std::size_t at = first_excess_nesting(text, kMaxDocumentDepth);
  if (at == std::string_view::npos) return;
  throw InputError(
      fmt::format("{}: JSON nested deeper than {} levels (at byte {}); gradflow's own documents "
                  "nest about 10, so this is not one of them",
                  origin, kMaxDocumentDepth, at));
}

nlohmann::ordered_json read_json_file(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);  // follows links; ELOOP comes back here
  if (error && error != std::errc::no_such_file_or_directory)
    throw InputError(fmt::format("{}: cannot read the file ({})", path, error.message()));
  if (std::filesystem::is_directory(status))
    throw InputError(fmt::format("{} is a directory, not a JSON file", path));
  const auto text = read_text_file(path);
  if (!text) throw InputError(fmt::format("{}: cannot read the file (missing or not readable)", path));
  check_json_nesting(*text, path);
  try {
    return nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::json::exception& error) {  // parse errors, and numbers out of range (1e400)
    throw InputError(fmt::format("{}: malformed JSON ({})", path, error.what()));
  }
}

void check_json_file_bounds(const std::string& path) {
  if (const auto text = read_text_file(path)) check_json_nesting(*text, path);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  // Both present: by identity (device and inode), so a hard link is the same file too.
  if (std::filesystem::exists(a, error) && std::filesystem::exists(b, error))
    return std::filesystem::equivalent(a, b, error) && !error;
  // One not there yet (an output about to be written): by its resolved path.
  const auto resolved_a = std::filesystem::weakly_canonical(std::filesystem::absolute(a), error);
  if (error) return a == b;
  const auto resolved_b = std::filesystem::weakly_canonical(std::filesystem::absolute(b), error);
  if (error) return a == b;
  return resolved_a == resolved_b;
}

bool path_exists(const std::string& path) {
  std::error_code error;
  const bool exists = std::filesystem::exists(path, error);
  if (error && error != std::errc::no_such_file_or_directory)
    throw InputError(fmt::format("{}: cannot be read ({})", path, error.message()));
  return exists;
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& option) {
  AtomicOutput output(path, option);
  output.stream() << text;
  output.commit();
}

namespace {
// A "Key: N kB" line of a /proc file, in bytes; 0 when absent.
std::uint64_t proc_kib_field(const char* file, const char* key) {
  std::FILE* stream = std::fopen(file, "r");
  if (!stream) return 0;
  char line[256];
  unsigned long long kib = 0;
  const std::size_t key_length = std::strlen(key);
  while (std::fgets(line, sizeof line, stream)) {
    if (std::strncmp(line, key, key_length) == 0 && line[key_length] == ':') {
      std::sscanf(line + key_length + 1, "%llu", &kib);
      break;
    }
  }
  std::fclose(stream);
  return static_cast<std::uint64_t>(kib) * 1024;
}

// The first line of a file as a number; nullopt when missing or not a number (e.g. "max").
std::optional<std::uint64_t> file_number(const std::string& path) {
  std::FILE* stream = std::fopen(path.c_str(), "r");
  if (!stream) return std::nullopt;
  unsigned long long value = 0;
  const int read = std::fscanf(stream, "%llu", &value);
  std::fclose(stream);
  if (read != 1) return std::nullopt;
  return static_cast<std::uint64_t>(value);
}

// The cgroup v2 directory of this process ("0::/path" in /proc/self/cgroup).
std::string cgroup_directory() {
  const auto text = read_text_file("/proc/self/cgroup");
  if (!text) return {};
  const auto at = text->find("0::");
  if (at == std::string::npos) return {};
  const auto end = text->find('\n', at);
  return "/sys/fs/cgroup" + text->substr(at + 3, end == std::string::npos ? std::string::npos : end - at - 3);
}
}  // namespace

MemoryLimits memory_limits() {
  MemoryLimits limits;
  limits.available = proc_kib_field("/proc/meminfo", "MemAvailable");
  struct rlimit address_space {};
  if (::getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
    limits.address_space = address_space.rlim_cur;
    limits.address_space_used = proc_kib_field("/proc/self/status", "VmSize");
  }
  const std::string cgroup = cgroup_directory();
  if (!cgroup.empty()) {
    if (const auto max = file_number(cgroup + "/memory.max")) {
      const std::uint64_t current = file_number(cgroup + "/memory.current").value_or(0);
      limits.cgroup_free = *max > current ? *max - current : 0;
      limits.has_cgroup_limit = true;
    }
  }
  return limits;
}

std::uint64_t available_memory_bytes() {
  const MemoryLimits limits = memory_limits();
  std::uint64_t available = limits.available;
  if (limits.has_cgroup_limit && (available == 0 || limits.cgroup_free < available))
    available = limits.cgroup_free;
  return available;
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

void ProgressBar::update(long long done, long long total) {
  if (!enabled_ || total <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_permille_ < 0 && now - start_ < kDelay) return;
  const int permille = static_cast<int>(1000 * done / total);
  if (permille == last_permille_) return;
  // Within kInterval of the last redraw only the completed state is drawn, so the bar ends full.
  if (last_permille_ >= 0 && done < total && now - last_draw_ < kInterval) return;
  last_permille_ = permille;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  // The remaining time at the average rate so far; shown once 1% is done, so it is not a guess.
  std::string eta;
  if (permille >= 10 && done < total) {
    const double elapsed = std::chrono::duration<double>(now - start_).count();
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
