// The app side of the placement registry: placement files read from disk (the shipped
// data/placements, GRADFLOW_PLACEMENTS, --arch PATH.toml) and the process's PlacementRegistry.
#include "gradflow/app/placements.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>

#include "gradflow/errors.hpp"
#include "gradflow/placement_file.hpp"

namespace gradflow {

namespace {
constexpr std::size_t kMaxFileBytes = 1 << 20;  // a placement file is a few kilobytes

std::string why_not_opened(int error) {
  if (error == ELOOP) return "a symbolic link loop (too many levels of symbolic links); fix the link";
  return fmt::format("cannot read the placement file ({}); check the path", std::strerror(error));
}

std::string what_it_is(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void refuse_if_too_large(const std::string& path, std::size_t size) {
  if (size > kMaxFileBytes)
    throw InputError(
        fmt::format("{}: {} bytes, more than the {} bytes (1 MiB) a placement file may have; "
                    "check the path (a placement file is a few kilobytes)",
                    path, size, kMaxFileBytes));
}

// Closes the descriptor on every path out.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

// Opened without blocking (a FIFO would wait for a writer forever) and then refused unless it is a
// regular file; symbolic links are followed, a loop among them refused by name.
std::string read_placement_text(const std::string& path) {
  const Descriptor file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  struct stat info {};
  if (file.fd < 0 || ::fstat(file.fd, &info) != 0)
    throw InputError(fmt::format("{}: {}", path, why_not_opened(errno)));
  if (!S_ISREG(info.st_mode))
    throw InputError(fmt::format("{}: {}, not a placement file; give the path of a regular .toml file", path,
                                 what_it_is(info.st_mode)));
  refuse_if_too_large(path, static_cast<std::size_t>(info.st_size));
  std::string text;
  char buffer[65536];
  for (ssize_t got = 0; (got = ::read(file.fd, buffer, sizeof buffer)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(fmt::format("{}: {}", path, why_not_opened(errno)));
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > kMaxFileBytes) break;  // it grew since fstat
  }
  refuse_if_too_large(path, text.size());
  return text;
}

Architecture load_placement_file(const std::string& path) {
  return load_placement_text(path, read_placement_text(path));
}

std::vector<std::string> placement_directories() {
  std::vector<std::string> dirs = {GRADFLOW_PLACEMENTS_DIR};
  if (const char* extra = std::getenv("GRADFLOW_PLACEMENTS")) {
    std::string_view list(extra);
    while (!list.empty()) {
      const std::size_t colon = std::min(list.find(':'), list.size());
      if (colon > 0) dirs.emplace_back(list.substr(0, colon));
      list.remove_prefix(std::min(colon + 1, list.size()));
    }
  }
  return dirs;
}

namespace {
[[noreturn]] void refuse_directory(const std::string& directory, const std::error_code& error) {
  const std::string why = error == std::errc::too_many_symbolic_link_levels
                              ? "a symbolic link loop (too many levels of symbolic links)"
                              : error.message();
  throw InputError(
      fmt::format("{}: cannot list this placement directory ({}); fix it or remove it from "
                  "GRADFLOW_PLACEMENTS",
                  directory, why));
}

// The *.toml entries of one directory, in name order; a missing directory has none. Subdirectories
// are not entered, so a link loop among them cannot trap the walk. Entries are not filtered by
// type: a *.toml that is a link loop, a dangling link, a FIFO or a directory is then refused by
// name when read (read_placement_text), not skipped, since it was put there to be loaded. Only
// error codes here: a filesystem_error (an entry's status on a link loop) ended in terminate.
std::vector<std::string> placement_files(const std::string& directory) {
  std::vector<std::string> files;
  std::error_code error;
  std::filesystem::directory_iterator entries(directory, error);
  if (error == std::errc::no_such_file_or_directory) return files;
  for (; !error && entries != std::filesystem::directory_iterator(); entries.increment(error)) {
    if (entries->path().extension() == ".toml") files.push_back(entries->path().string());
  }
  if (error) refuse_directory(directory, error);
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

PlacementRegistry read_placement_registry(const std::vector<std::string>& directories) {
  PlacementRegistry registry;
  for (const std::string& directory : directories) {
    for (const std::string& file : placement_files(directory)) registry.add(load_placement_file(file));
  }
  return registry;
}

namespace {
// The process's placements: the registry (read at first use: a broken file in a placement
// directory is then an error of the command line that needs it), and every file ever named by path
// (never shrinks, so that results keep their pointers) with the text it had when loaded, by
// canonical path.
struct ProcessPlacements {
  std::optional<PlacementRegistry> registry;
  std::deque<Architecture> loaded_files;
  std::map<std::string, std::pair<std::string, const Architecture*>> loaded_unchanged;
};
ProcessPlacements& process_placements() {
  static ProcessPlacements process;
  return process;
}

// A placement file named by path, loaded once per path and command line.
const Architecture& architecture_from_path(std::string_view path) {
  ProcessPlacements& process = process_placements();
  PlacementRegistry& registry = placements();
  if (const Architecture* known = registry.named_file(path)) return *known;
  // Read first: a FIFO, device, directory, link loop or oversized file is refused here by name.
  const std::string text = read_placement_text(std::string(path));
  std::error_code error;
  const std::string absolute = std::filesystem::weakly_canonical(std::string(path), error).string();
  for (const Architecture* arch : registry.all()) {
    std::error_code ignored;
    if (arch->source != "built-in" && !absolute.empty() &&
        std::filesystem::weakly_canonical(std::string(arch->source), ignored) == absolute) {
      registry.add_named_file(std::string(path), *arch);
      return *arch;
    }
  }
  // A file loaded by an earlier command line and unchanged since is reused: a process that names
  // the same file in every call (a notebook's loop) does not grow.
  const Architecture* arch = nullptr;
  if (const auto cached = process.loaded_unchanged.find(absolute);
      cached != process.loaded_unchanged.end() && cached->second.first == text) {
    arch = cached->second.second;
    registry.check_unique(*arch);
  } else {
    Architecture loaded = load_placement_text(std::string(path), text);
    registry.check_unique(loaded);
    process.loaded_files.push_back(std::move(loaded));
    arch = &process.loaded_files.back();
    process.loaded_unchanged[absolute] = {text, arch};
  }
  registry.add_named_file(std::string(path), *arch);
  return *arch;
}
}  // namespace

PlacementRegistry& placements() {
  std::optional<PlacementRegistry>& registry = process_placements().registry;
  if (!registry) registry.emplace(read_placement_registry(placement_directories()));
  return *registry;
}

std::vector<const Architecture*> architectures() {
  return placements().all();
}

void forget_placement_files() {
  if (std::optional<PlacementRegistry>& registry = process_placements().registry)
    registry->forget_named_files();
}

const Architecture& find_architecture(std::string_view id) {
  if (is_placement_path(id)) return architecture_from_path(id);
  return placements().find(id);
}

std::vector<const Architecture*> parse_architecture_list(std::string_view list) {
  return placements().parse_list(list, find_architecture);
}

std::vector<const PlacementOption*> placement_options() {
  return placements().options();
}

std::vector<std::string_view> placements_declaring(std::string_view key) {
  return placements().declaring(key);
}

void validate(const ModelConfig& config) {
  validate(config, placements());
}

}  // namespace gradflow
