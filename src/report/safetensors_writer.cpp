// safetensors writer (huggingface/safetensors format): u64 header length, JSON header, raw data.
#include <bit>
#include <cstring>

#include "gradflow/app/report.hpp"

namespace gradflow {

void write_safetensors(const std::vector<NamedTensor>& tensors, Precision precision,
                       const nlohmann::ordered_json& metadata, std::ostream& out) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  const std::size_t scalar_bytes = precision == Precision::f32 ? 4 : 8;
  nlohmann::ordered_json header = {{"__metadata__", metadata}};
  std::size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const std::size_t bytes = t.values.size() * scalar_bytes;
    header[t.name] = {{"dtype", precision == Precision::f32 ? "F32" : "F64"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const std::uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), sizeof length);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const NamedTensor& t : tensors) {
    if (precision == Precision::f64) {
      out.write(reinterpret_cast<const char*>(t.values.data()),
                static_cast<std::streamsize>(t.values.size() * 8));
    } else {
      std::vector<float> narrow(t.values.begin(), t.values.end());
      out.write(reinterpret_cast<const char*>(narrow.data()),
                static_cast<std::streamsize>(narrow.size() * 4));
    }
  }
}

}  // namespace gradflow
