// A Hugging Face checkpoint directory on disk (issue 28): config.json, and model.safetensors or the
// shards a model.safetensors.index.json names, memory-mapped. Every header, offset, dtype and shape
// is validated against the file sizes and the config before any tensor is read; tensors are
// converted on request from a mapping of just their rows, unmapped after (TensorStore), so that a
// pass over the model holds one sublayer's weights.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "gradflow/checkpoint.hpp"

namespace gradflow {

// The element types the reader converts; `other` (integers, booleans, 8-bit floats) is accepted
// in a file only for tensors gradflow does not read (buffers), and refused naming the tensor else.
enum class TensorDtype { f64, f32, f16, bf16, other };
std::string_view to_string(TensorDtype value);

// One tensor of a mapped safetensors file.
struct TensorEntry {
  std::string name;
  TensorDtype dtype = TensorDtype::f32;
  std::string dtype_name;  // as the header writes it ("BF16", "I64")
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // offsets into the data section
  int file = 0;                      // index into the checkpoint's files
};

// Bytes of a file mapped read-only for as long as the object lives (munmap drops the pages).
class MappedRange {
 public:
  MappedRange(int fd, std::uint64_t offset, std::uint64_t length, const std::string& path);
  ~MappedRange();
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  const unsigned char* data() const { return data_; }

 private:
  void* mapping_ = nullptr;
  std::size_t mapped_ = 0;
  const unsigned char* data_ = nullptr;
};

// One safetensors file: header read and checked (offsets inside the file, contiguous, without
// overlap or gap, byte counts matching shape x dtype). The data section is memory-mapped a range at
// a time (map), so that neither the address space nor the resident set ever holds the whole file.
class SafetensorsFile {
 public:
  // Throws InputError naming `path` (and the tensor) for anything malformed.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  // Bytes [begin, end) of the data section, mapped until the returned object is destroyed.
  MappedRange map(std::uint64_t begin, std::uint64_t end) const;

 private:
  // The descriptor validated, kept open: the file is never reopened by path, and a change of its
  // size since validation is an InputError at the next read instead of a SIGBUS.
  struct Descriptor {
    int fd = -1;
    ~Descriptor();
  };
  std::string path_;
  Descriptor descriptor_;
  std::uint64_t size_ = 0, data_offset_ = 0;
  std::vector<TensorEntry> tensors_;
};

// The checkpoint: its spec, its files and every tensor by name, validated against the spec.
class CheckpointFiles : public TensorStore {
 public:
  // Reads DIR/config.json and the safetensors files; throws InputError naming the file and
  // tensor at fault.
  explicit CheckpointFiles(const std::string& directory);
  ~CheckpointFiles() override;

  const HfModelSpec& spec() const { return spec_; }
  const std::string& directory() const { return directory_; }
  const nlohmann::ordered_json& config_json() const { return config_json_; }
  std::vector<std::string> file_names() const;
  const std::vector<TensorEntry>& entries() const { return entries_; }
  std::vector<std::string> ignored_tensors() const { return ignored_; }
  // The largest tensor read whole (embeddings and the LM head are read in chunks), in file bytes.
  std::uint64_t largest_tensor_bytes() const { return largest_bytes_; }

  void read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                 float* out) const override;
  void read_rows(const std::string& name, std::int64_t first_row, std::int64_t rows,
                 double* out) const override;
  std::vector<std::int64_t> shape(const std::string& name) const override;

 private:
  const TensorEntry& entry(const std::string& name) const;
  template <typename Scalar>
  void convert(const std::string& name, std::int64_t first_row, std::int64_t rows, Scalar* out) const;

  std::string directory_;
  nlohmann::ordered_json config_json_;
  HfModelSpec spec_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<std::string> ignored_;
  std::uint64_t largest_bytes_ = 0;
};

// --tokens FILE: whitespace-separated token ids, each in [0, vocab); throws InputError naming the
// file, the position (0-based) and the id at fault, and an empty file.
std::vector<std::int64_t> read_token_file(const std::string& path, int vocab);

// ---- what a checkpoint directory holds (src/report/checkpoint_reporter.cpp): archs --checkpoint,
// and analyze --checkpoint's config.checkpoint.
struct CheckpointContents {
  std::string directory;
  HfModelSpec spec;
  std::vector<std::string> file_names;  // as found, paths
  std::vector<TensorEntry> tensors;
  std::vector<std::string> ignored_tensors;
};
CheckpointContents checkpoint_contents(const CheckpointFiles& files);
// {"directory", "model_type", "placement", "layers", ..., "files", "tensor_count", "dtypes"}.
nlohmann::ordered_json checkpoint_to_json(const CheckpointContents& contents);
// archs --checkpoint: the above with the update rule and every tensor, indented by two; or for people.
void write_checkpoint_json(const CheckpointContents& contents, std::ostream& out);
void write_checkpoint_table(const CheckpointContents& contents, std::ostream& out);

}  // namespace gradflow
