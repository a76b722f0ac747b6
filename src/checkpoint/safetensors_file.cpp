// One safetensors file, memory-mapped and validated (the format: an 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian
// data; huggingface/safetensors, docs "Format"). Nothing is read from the data section here.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <set>

#include "gradflow/app/checkpoint_files.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

std::string_view to_string(TensorDtype value) {
  constexpr std::array names{"F64", "F32", "F16", "BF16", "other"};
  return names[static_cast<int>(value)];
}

namespace {

// The official reader's bound on the header (safetensors' MAX_HEADER_SIZE).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// A header is a flat object of objects: anything nested deeper is not a safetensors header, and is
// refused before the recursive JSON parser sees it.
constexpr int kMaxHeaderNesting = 8;
constexpr std::int64_t kMaxDimension = std::int64_t{1} << 40;

// dtypes the format defines that gradflow does not convert, with their bytes per element: a file
// may hold them for buffers gradflow does not read (old GPT-2 saves' U8 or BOOL masks).
constexpr std::array<std::pair<std::string_view, std::size_t>, 11> kOtherDtypes{{{"BOOL", 1},
                                                                                 {"U8", 1},
                                                                                 {"I8", 1},
                                                                                 {"I16", 2},
                                                                                 {"U16", 2},
                                                                                 {"I32", 4},
                                                                                 {"U32", 4},
                                                                                 {"I64", 8},
                                                                                 {"U64", 8},
                                                                                 {"F8_E4M3", 1},
                                                                                 {"F8_E5M2", 1}}};

std::size_t dtype_bytes(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::f64:
      return 8;
    case TensorDtype::f32:
      return 4;
    default:
      return 2;
  }
}
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 50;

int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

MappedRange::MappedRange(int fd, std::uint64_t offset, std::uint64_t length, const std::string& path) {
  if (length == 0) return;
  // mmap needs a page-aligned file offset: map from the page holding `offset`.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = offset / page * page;
  mapped_ = static_cast<std::size_t>(offset - start + length);
  mapping_ = ::mmap(nullptr, mapped_, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(start));
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw InputError(
        fmt::format("{}: {} bytes of it cannot be mapped into memory ({}); raise the address-space "
                    "limit (ulimit -v) or free memory",
                    path, length, std::strerror(errno)));
  }
  data_ = static_cast<const unsigned char*>(mapping_) + (offset - start);
}

MappedRange::~MappedRange() {
  if (mapping_) ::munmap(mapping_, mapped_);
}

SafetensorsFile::Descriptor::~Descriptor() {
  if (fd >= 0) ::close(fd);
}

MappedRange SafetensorsFile::map(std::uint64_t begin, std::uint64_t end) const {
  struct stat info {};
  if (::fstat(descriptor_.fd, &info) != 0 || static_cast<std::uint64_t>(info.st_size) != size_)
    throw InputError(
        fmt::format("{}: changed size since it was checked ({} bytes, now {}); was the checkpoint "
                    "rewritten during the run?",
                    path_, size_, static_cast<std::uint64_t>(info.st_size)));
  return MappedRange(descriptor_.fd, data_offset_ + begin, end - begin, path_);
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: a FIFO given as a checkpoint file is refused below instead of blocking the open.
  descriptor_.fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const int fd = descriptor_.fd;  // closed by descriptor_ on every throw below
  if (fd < 0) throw InputError(fmt::format("{}: cannot be opened ({})", path_, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))
    throw InputError(
        fmt::format("{}: is not a regular file; a checkpoint's tensors are .safetensors files", path_));
  size_ = static_cast<std::uint64_t>(info.st_size);
  const auto fail_closed = [](const std::string& message) { throw InputError(message); };
  if (size_ < 8)
    fail_closed(
        fmt::format("{}: is {} bytes, shorter than the 8-byte header length of a safetensors file "
                    "(truncated?)",
                    path_, size_));
  unsigned char length[8];
  if (::pread(fd, length, 8, 0) != 8)
    fail_closed(fmt::format("{}: cannot be read ({})", path_, std::strerror(errno)));
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];  // little-endian
  if (header_bytes < 2 || header_bytes > size_ - 8 || header_bytes > kMaxHeaderBytes) {
    fail_closed(
        fmt::format("{}: the header length {} does not fit: the file has {} bytes after the "
                    "length, and a header is 2 to {} bytes of JSON (truncated or not safetensors?)",
                    path_, header_bytes, size_ - 8, kMaxHeaderBytes));
  }
  std::string header_text(header_bytes, '\0');
  std::uint64_t got = 0;
  while (got < header_bytes) {
    const ssize_t count =
        ::pread(fd, header_text.data() + got, header_bytes - got, static_cast<off_t>(8 + got));
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) fail_closed(fmt::format("{}: cannot read its header ({})", path_, std::strerror(errno)));
    got += static_cast<std::uint64_t>(count);
  }
  data_offset_ = 8 + header_bytes;
  const std::string_view header(header_text);
  const std::uint64_t data_bytes = size_ - 8 - header_bytes;
  if (nesting_depth(header) > kMaxHeaderNesting)
    throw InputError(fmt::format("{}: the header nests deeper than a safetensors header does", path_));

  // Parsed with a callback that sees every top-level key, since the JSON library keeps only the
  // last of two equal keys: a tensor named twice is refused, naming it.
  std::set<std::string> seen;
  std::string duplicate;
  json doc;
  try {
    doc = json::parse(header, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{}: the header is not valid JSON ({})", path_, error.what()));
  }
  if (!duplicate.empty())
    throw InputError(fmt::format("{}: tensor '{}' is listed twice in the header", path_, duplicate));
  if (!doc.is_object())
    throw InputError(
        fmt::format("{}: the header must be a JSON object of tensors, not {}", path_, doc.type_name()));

  for (const auto& [name, value] : doc.items()) {
    if (name == "__metadata__") continue;
    const auto fail = [&](const std::string& problem) {
      throw InputError(fmt::format("{}: tensor '{}': {}", path_, name, problem));
    };
    if (!value.is_object()) fail("its header entry must be an object with dtype, shape and data_offsets");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!value.contains(key)) fail(fmt::format("its header entry has no {}", key));
    TensorEntry entry;
    entry.name = name;
    const json& dtype = value["dtype"];
    if (!dtype.is_string()) fail(fmt::format("dtype must be a string, not {}", dtype.dump()));
    const std::string dtype_name = dtype.get<std::string>();
    entry.dtype_name = dtype_name;
    std::size_t element_bytes = 0;
    if (dtype_name == "F64")
      entry.dtype = TensorDtype::f64;
    else if (dtype_name == "F32")
      entry.dtype = TensorDtype::f32;
    else if (dtype_name == "F16")
      entry.dtype = TensorDtype::f16;
    else if (dtype_name == "BF16")
      entry.dtype = TensorDtype::bf16;
    else
      entry.dtype = TensorDtype::other;
    if (entry.dtype != TensorDtype::other) {
      element_bytes = dtype_bytes(entry.dtype);
    } else {
      for (const auto& [name, bytes] : kOtherDtypes)
        if (name == dtype_name) element_bytes = bytes;
      if (element_bytes == 0)
        fail(fmt::format("unknown dtype \"{}\" (safetensors' floating-point dtypes: F32, F16, BF16, F64)",
                         dtype_name));
    }
    const json& shape = value["shape"];
    if (!shape.is_array()) fail(fmt::format("shape must be an array of sizes, not {}", shape.dump()));
    std::uint64_t elements = 1;
    for (const json& size : shape) {
      if (!size.is_number_integer() || size.get<std::int64_t>() < 0 ||
          size.get<std::int64_t>() > kMaxDimension)
        fail(fmt::format("shape {} must hold sizes in [0, 2^40]", shape.dump()));
      entry.shape.push_back(size.get<std::int64_t>());
      const auto extent = static_cast<std::uint64_t>(entry.shape.back());
      if (extent != 0 && elements > kMaxElements / extent)  // checked before it can wrap
        fail(fmt::format("shape {} is too large", shape.dump()));
      elements *= extent;
    }
    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(fmt::format("data_offsets must be [begin, end] in bytes, not {}", offsets.dump()));
    entry.begin = offsets[0].get<std::uint64_t>();
    entry.end = offsets[1].get<std::uint64_t>();
    if (entry.end < entry.begin)
      fail(fmt::format("data_offsets [{}, {}] end before they begin", entry.begin, entry.end));
    if (entry.end > data_bytes)
      fail(fmt::format("data_offsets [{}, {}] reach past the data section's {} bytes (truncated file?)",
                       entry.begin, entry.end, data_bytes));
    const std::uint64_t expected = elements * element_bytes;
    if (entry.end - entry.begin != expected)
      fail(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", entry.begin,
                       entry.end, entry.end - entry.begin, shape_text(entry.shape), dtype_name, expected));
    tensors_.push_back(std::move(entry));
  }

  // The data section is covered exactly once: no overlap, no gap, nothing after the last tensor.
  std::vector<const TensorEntry*> order;
  for (const TensorEntry& entry : tensors_) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* entry : order) {
    if (entry->begin < covered)
      throw InputError(fmt::format("{}: tensors '{}' and '{}' overlap (bytes {} to {} of the data section)",
                                   path_, previous->name, entry->name, entry->begin, covered));
    if (entry->begin > covered)
      throw InputError(
          fmt::format("{}: bytes {} to {} of the data section, before tensor '{}', belong to no "
                      "tensor",
                      path_, covered, entry->begin, entry->name));
    covered = entry->end;
    previous = entry;
  }
  if (covered != data_bytes)
    throw InputError(fmt::format("{}: the data section has {} bytes after the last tensor{}", path_,
                                 data_bytes - covered,
                                 previous ? fmt::format(" ('{}')", previous->name) : std::string()));
}

SafetensorsFile::~SafetensorsFile() = default;

}  // namespace gradflow
