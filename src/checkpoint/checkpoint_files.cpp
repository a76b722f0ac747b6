// A checkpoint directory: config.json, the safetensors files (one, or the shards an index names),
// every tensor checked against the config before any is read, and conversion on request.
#include "gradflow/app/checkpoint_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "gradflow/errors.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {

// A regular file's whole text; refuses directories and FIFOs (which would block) by name.
std::string read_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot be read ({})", path, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{}: is not a regular file", path));
  }
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t count = ::read(fd, buffer, sizeof buffer);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) {
      const int error = errno;
      ::close(fd);
      throw InputError(fmt::format("{}: cannot be read ({})", path, std::strerror(error)));
    }
    if (count == 0) break;
    text.append(buffer, static_cast<std::size_t>(count));
  }
  ::close(fd);
  return text;
}

// Parsed with a callback that sees every key, since the JSON library keeps only the last of two
// equal keys in one object: a tensor listed twice in an index is refused, naming it.
json read_json(const std::string& path) {
  const std::string text = read_regular_file(path);
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json doc;
  try {
    doc = json::parse(text, [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) open_objects.emplace_back();
      if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
      if (event == json::parse_event_t::key && !open_objects.empty() &&
          !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{}: malformed JSON ({})", path, error.what()));
  }
  if (!duplicate.empty())
    throw InputError(
        fmt::format("{}: the key '{}' appears twice in one object (which value is meant?)", path, duplicate));
  return doc;
}

bool is_file(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error) && !error;
}

// IEEE half -> float (exact): sign, 5-bit exponent, 10-bit mantissa; subnormals and inf/NaN kept.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

template <typename T>
T load(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));  // the data may sit at any byte offset
  return value;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

CheckpointFiles::CheckpointFiles(const std::string& directory) : directory_(directory) {
  std::error_code error;
  const auto status = std::filesystem::status(directory, error);
  if (!std::filesystem::exists(status))
    throw InputError(
        fmt::format("--checkpoint {}: no such directory; give the directory that holds the "
                    "model's config.json and .safetensors files",
                    directory));
  if (!std::filesystem::is_directory(status))
    throw InputError(
        fmt::format("--checkpoint {}: is not a directory; give the directory that holds "
                    "config.json and the .safetensors files",
                    directory));
  const std::string config_path = (std::filesystem::path(directory) / "config.json").string();
  if (!is_file(config_path))
    throw InputError(
        fmt::format("{}: missing; a Hugging Face checkpoint directory holds its config.json", config_path));
  config_json_ = read_json(config_path);
  spec_ = read_hf_model_spec(config_json_, config_path);

  // The files: the shards an index names, or model.safetensors.
  const std::string index_path = (std::filesystem::path(directory) / "model.safetensors.index.json").string();
  const std::string single_path = (std::filesystem::path(directory) / "model.safetensors").string();
  std::map<std::string, std::string> index_map;  // tensor -> shard file name
  std::string listing;                           // the file a missing tensor is reported against
  // Hugging Face's loader tries model.safetensors first, then the index (modeling_utils.py).
  if (!is_file(single_path) && is_file(index_path)) {
    listing = index_path;
    const json index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw InputError(fmt::format(
          "{}: must be an object with a \"weight_map\" object (tensor -> shard file)", index_path));
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos || file.get<std::string>() == "..")
        throw InputError(fmt::format("{}: tensor '{}' maps to {}, not a file name in the directory",
                                     index_path, tensor, file.dump()));
      index_map[tensor] = file.get<std::string>();
      shard_names.insert(file.get<std::string>());
    }
    for (const std::string& shard : shard_names) {
      const std::string path = (std::filesystem::path(directory) / shard).string();
      if (!is_file(path))
        throw InputError(
            fmt::format("{}: names shard {}, which is not in {} (a shard missing from the download?)",
                        index_path, shard, directory));
      files_.push_back(std::make_unique<SafetensorsFile>(path));
    }
  } else if (is_file(single_path)) {
    if (is_file(index_path))
      throw InputError(
          fmt::format("--checkpoint {}: holds both model.safetensors and model.safetensors.index.json; "
                      "remove the one that is stale (Hugging Face would read model.safetensors)",
                      directory));
    listing = single_path;
    files_.push_back(std::make_unique<SafetensorsFile>(single_path));
  } else if (is_file((std::filesystem::path(directory) / "pytorch_model.bin").string()) ||
             is_file((std::filesystem::path(directory) / "pytorch_model.bin.index.json").string())) {
    // A pickle runs code when it is loaded; gradflow reads tensors only from safetensors.
    throw InputError(fmt::format(
        "--checkpoint {}: holds pytorch_model.bin (a Python pickle, which gradflow does not load) and no "
        "safetensors; convert it once with transformers: AutoModelForCausalLM.from_pretrained(DIR)"
        ".save_pretrained(OUT, safe_serialization=True)",
        directory));
  } else {
    throw InputError(
        fmt::format("--checkpoint {}: holds neither model.safetensors nor model.safetensors.index.json "
                    "with its shards",
                    directory));
  }

  // Every tensor once, in the file the index says.
  for (std::size_t f = 0; f < files_.size(); ++f) {
    for (TensorEntry entry : files_[f]->tensors()) {
      entry.file = static_cast<int>(f);
      if (const auto found = by_name_.find(entry.name); found != by_name_.end())
        throw InputError(fmt::format("{}: tensor '{}' is also in {}", files_[f]->path(), entry.name,
                                     files_[entries_[found->second].file]->path()));
      if (!index_map.empty()) {
        const auto listed = index_map.find(entry.name);
        const std::string shard = std::filesystem::path(files_[f]->path()).filename().string();
        if (listed == index_map.end())
          throw InputError(
              fmt::format("{}: tensor '{}' is not listed in {}", files_[f]->path(), entry.name, index_path));
        if (listed->second != shard)
          throw InputError(fmt::format("{}: lists tensor '{}' in {}, but it is in {}", index_path, entry.name,
                                       listed->second, shard));
      }
      by_name_[entry.name] = entries_.size();
      entries_.push_back(std::move(entry));
    }
  }
  for (const auto& [tensor, shard] : index_map) {
    if (!by_name_.count(tensor))
      throw InputError(
          fmt::format("{}: lists tensor '{}' in {}, which does not hold it", index_path, tensor, shard));
  }

  // Against the config: GPT-2's names with or without the "transformer." prefix; every expected
  // tensor present with its shape; nothing else but the known buffers.
  if (spec_.family == HfFamily::gpt2 && by_name_.count("transformer.wte.weight"))
    spec_.tensor_prefix = "transformer.";
  std::set<std::string> expected_names;
  for (const ExpectedTensor& expected : expected_tensors(spec_)) {
    expected_names.insert(expected.name);
    const auto found = by_name_.find(expected.name);
    if (found == by_name_.end())
      throw InputError(
          fmt::format("{}: tensor '{}' is missing; a {} model with this config.json has it, shape {}",
                      listing, expected.name, spec_.model_type, shape_text(expected.shape)));
    const TensorEntry& entry = entries_[found->second];
    if (entry.dtype == TensorDtype::other)
      throw InputError(
          fmt::format("{}: tensor '{}': dtype {} is not one gradflow reads as weights (F32, F16, BF16, "
                      "F64)",
                      files_[entry.file]->path(), entry.name, entry.dtype_name));
    if (entry.shape != expected.shape)
      throw InputError(fmt::format("{}: tensor '{}' has shape {}, but config.json implies {}",
                                   files_[entry.file]->path(), entry.name, shape_text(entry.shape),
                                   shape_text(expected.shape)));
    // the tables read in chunks of rows (embeddings, the LM head) are never mapped whole
    const bool chunked = expected.name.find("embed_tokens") != std::string::npos ||
                         expected.name.find("wte.") != std::string::npos || expected.name == "lm_head.weight";
    if (!chunked) largest_bytes_ = std::max(largest_bytes_, entry.end - entry.begin);
  }
  for (const TensorEntry& entry : entries_) {
    if (expected_names.count(entry.name)) continue;
    if (ignorable_tensor(spec_, entry.name)) {
      ignored_.push_back(entry.name);
      continue;
    }
    throw InputError(
        fmt::format("{}: tensor '{}' is not part of a {} model with this config.json (an unexpected "
                    "tensor: another model's file, or a config.json that does not match?)",
                    files_[entry.file]->path(), entry.name, spec_.model_type));
  }
}

CheckpointFiles::~CheckpointFiles() = default;

std::vector<std::string> CheckpointFiles::file_names() const {
  std::vector<std::string> names;
  for (const auto& file : files_) names.push_back(file->path());
  return names;
}

const TensorEntry& CheckpointFiles::entry(const std::string& name) const {
  const auto found = by_name_.find(name);
  if (found == by_name_.end()) throw std::logic_error("checkpoint tensor not validated: " + name);
  return entries_[found->second];
}

std::vector<std::int64_t> CheckpointFiles::shape(const std::string& name) const {
  return entry(name).shape;
}

template <typename Scalar>
void CheckpointFiles::convert(const std::string& name, std::int64_t first_row, std::int64_t rows,
                              Scalar* out) const {
  const TensorEntry& found = entry(name);
  std::int64_t row_length = 1;
  for (std::size_t i = 1; i < found.shape.size(); ++i) row_length *= found.shape[i];
  const std::int64_t total_rows = found.shape.empty() ? 1 : found.shape[0];
  if (first_row < 0 || rows < 0 || first_row + rows > total_rows)
    throw std::logic_error("checkpoint rows out of range: " + name);
  const std::size_t size = found.dtype == TensorDtype::f64 ? 8 : found.dtype == TensorDtype::f32 ? 4 : 2;
  const std::int64_t count = rows * row_length;
  const std::uint64_t first_byte = found.begin + static_cast<std::uint64_t>(first_row * row_length) * size;
  const MappedRange mapped =
      files_[found.file]->map(first_byte, first_byte + static_cast<std::uint64_t>(count) * size);
  const unsigned char* bytes = mapped.data();
  for (std::int64_t i = 0; i < count; ++i, bytes += size) {
    double value;
    switch (found.dtype) {
      case TensorDtype::f64:
        value = load<double>(bytes);
        break;
      case TensorDtype::f32:
        value = load<float>(bytes);
        break;
      case TensorDtype::f16:
        value = half_to_float(load<std::uint16_t>(bytes));
        break;
      default: {  // bfloat16: the upper half of a float32
        const std::uint32_t bits = static_cast<std::uint32_t>(load<std::uint16_t>(bytes)) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        value = f;
      }
    }
    if (!std::isfinite(value)) {
      const std::int64_t flat = first_row * row_length + i;
      throw InputError(
          fmt::format("{}: tensor '{}' holds {} at entry {} (row {}, column {}); the checkpoint is "
                      "damaged or was saved mid-divergence",
                      files_[found.file]->path(), name, std::isnan(value) ? "a NaN" : "an infinity", flat,
                      flat / row_length, flat % row_length));
    }
    out[i] = static_cast<Scalar>(value);
  }
}

void CheckpointFiles::read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                                float* out) const {
  convert(name, first_row, rows, out);
}
void CheckpointFiles::read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                                double* out) const {
  convert(name, first_row, rows, out);
}

std::vector<std::int64_t> read_token_file(const std::string& path, int vocab) {
  const std::string text = read_regular_file(path);
  std::vector<std::int64_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    const std::string_view word(text.data() + i, end - i);
    std::int64_t id = 0;
    const auto [stop, error] = std::from_chars(word.data(), word.data() + word.size(), id);
    const std::size_t position = ids.size();
    if (error != std::errc() || stop != word.data() + word.size() || (word.size() > 1 && word[0] == '+'))
      throw InputError(
          fmt::format("{}: the token at position {} is \"{}\", not a token id (whitespace-separated "
                      "integers in [0, {}))",
                      path, position, word.substr(0, 40), vocab));
    if (id < 0 || id >= vocab)
      throw InputError(
          fmt::format("{}: the token at position {} is {}, outside the model's vocabulary [0, {}) "
                      "(a file made with another tokenizer?)",
                      path, position, id, vocab));
    ids.push_back(id);
    i = end;
  }
  if (ids.empty())
    throw InputError(
        fmt::format("{}: holds no token ids; give whitespace-separated integers in [0, {}) (docs/"
                    "checkpoints.md shows how to make the file with the model's tokenizer)",
                    path, vocab));
  return ids;
}

}  // namespace gradflow
