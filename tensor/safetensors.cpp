#include "tensor/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <set>
#include <vector>
#include <tuple>

namespace cast {

using json = nlohmann::json;

static const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::bf16: return "BF16";
  }
  return "?";
}

static DType st_dtype_from(const std::string& s, const std::string& source, const std::string& name) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  if (s == "BF16") return DType::bf16;
  throw Error(
      fmt::format("{}: tensor '{}' has unsupported dtype '{}' (F32, F64, I32, I64, BF16 are read)", source, name, s));
}

const Tensor& TensorFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  CAST_CHECK(it != tensors.end(), "{}: missing tensor '{}'", source, name);
  return it->second;
}

const Tensor& TensorFile::get(const std::string& name, DType dtype, const Shape& shape) const {
  const Tensor& t = get(name);
  CAST_CHECK(t.dtype() == dtype, "{}: tensor '{}' must be {}, got {}", source, name, dtype_name(dtype),
             dtype_name(t.dtype()));
  CAST_CHECK(t.shape() == shape, "{}: tensor '{}' must have shape {}, got {}", source, name, shape_str(shape),
             shape_str(t.shape()));
  return t;
}

namespace {

// The header as JSON. nlohmann keeps the last of two equal keys without a word, so every key of
// every object is checked first: a tensor name, or a key of the metadata or of a tensor's entry,
// given twice is refused, not silently dropped.
json parse_header(const char* text, size_t size, const std::string& source) {
  files::JsonKeys keys;
  json header;
  try {
    header = files::parse_json_checking_keys(text, text + size, keys);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: corrupt safetensors header: {}", source, files::json_message(e)));
  }
  CAST_CHECK(!keys.too_deep, "{}: corrupt safetensors header: a value nested more than {} levels deep", source,
             files::kMaxJsonDepth);
  const std::string& duplicate = keys.duplicate;
  CAST_CHECK(duplicate.empty() || keys.duplicate_depth != 1 || duplicate == "__metadata__",
             "{}: tensor name '{}' appears twice in the header", source, duplicate);
  CAST_CHECK(duplicate.empty(), "{}: corrupt safetensors header: key '{}' appears twice in one of its objects", source,
             duplicate);
  CAST_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", source);
  return header;
}

// Tensors own disjoint byte ranges that leave no hole (the format's rule): two tensors sharing
// bytes, or bytes no tensor holds, make a corrupt (or crafted) file.
void check_disjoint(std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges, const std::string& source) {
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint64_t before = i == 0 ? 0 : std::get<1>(ranges[i - 1]);
    if (i > 0)
      CAST_CHECK(std::get<0>(ranges[i]) >= before,
                 "{}: tensors '{}' and '{}' overlap in the data section ([{}, {}) and [{}, {}))", source,
                 std::get<2>(ranges[i - 1]), std::get<2>(ranges[i]), std::get<0>(ranges[i - 1]),
                 std::get<1>(ranges[i - 1]), std::get<0>(ranges[i]), std::get<1>(ranges[i]));
    CAST_CHECK(std::get<0>(ranges[i]) == before, "{}: the data bytes [{}, {}) before tensor '{}' belong to no tensor",
               source, before, std::get<0>(ranges[i]), std::get<2>(ranges[i]));
  }
}

void check_no_tail(uint64_t data_size, uint64_t used, const std::string& source) {
  CAST_CHECK(data_size <= used, "{}: {} bytes follow the last tensor's data, which no tensor of its header holds", source,
             data_size - used);
}

// A header entry's shape: an array of dimensions, each in [0, 2^40).
Shape entry_shape(const json& js, const std::string& source, const std::string& name) {
  CAST_CHECK(js.is_array(), "{}: tensor '{}': shape is not an array", source, name);
  Shape shape;
  for (const json& d : js) {
    CAST_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
               "{}: tensor '{}': bad dimension {}", source, name, files::json_excerpt(d));
    // compared as read, before any conversion: 2^63 and above would wrap to a negative int64
    CAST_CHECK(d.get<uint64_t>() < (uint64_t{1} << 40), "{}: tensor '{}': dimension {} too large", source, name,
               files::json_excerpt(d));
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

}  // namespace

TensorFile parse_safetensors(const char* bytes, size_t size, const std::string& source) {
  TensorFile file;
  file.source = source;
  CAST_CHECK(size >= 8, "{}: not a safetensors file (only {} bytes)", source, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > size - 8) {
    // The header is a JSON object: where the ninth byte cannot begin one, the file is not a
    // safetensors file at all (its first 8 bytes read as any length), rather than one cut short.
    const char first = size > 8 ? bytes[8] : '{';
    const bool json_follows = first == '{' || first == ' ' || first == '\n' || first == '\r' || first == '\t';
    CAST_CHECK(json_follows, "{}: not a safetensors file (no JSON header follows its first 8 bytes)", source);
    throw Error(fmt::format("{}: header length {} exceeds the file size {} (truncated?)", source, header_len, size));
  }
  const json header = parse_header(bytes + 8, header_len, source);
  const size_t data_begin = 8 + header_len;
  const size_t data_size = size - data_begin;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;

  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      CAST_CHECK(entry.is_object(), "{}: __metadata__ is not an object", source);
      for (auto& [k, v] : entry.items()) {
        CAST_CHECK(v.is_string(), "{}: metadata '{}' is not a string", source, k);
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    CAST_CHECK(
        entry.is_object() && entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"),
        "{}: tensor '{}' lacks dtype, shape or data_offsets", source, name);
    CAST_CHECK(entry["dtype"].is_string(), "{}: tensor '{}': dtype is not a string", source, name);
    DType dtype = st_dtype_from(entry["dtype"].get<std::string>(), source, name);
    const Shape shape = entry_shape(entry["shape"], source, name);
    const json& off = entry["data_offsets"];
    CAST_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
               "{}: tensor '{}': data_offsets must be two non-negative integers", source, name);
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    CAST_CHECK(begin <= end && end <= data_size,
               "{}: tensor '{}': data [{}, {}) outside the {} data bytes (truncated?)", source, name, begin, end,
               data_size);
    // numel * size computed in a way that cannot overflow silently
    long double expect = static_cast<long double>(dtype_size(dtype));
    for (int64_t d : shape) expect *= static_cast<long double>(d);
    CAST_CHECK(expect == static_cast<long double>(end - begin), "{}: tensor '{}': {} bytes do not hold {} {}", source,
               name, end - begin, dtype_name(dtype), shape_str(shape));
    if (end > begin) ranges.emplace_back(begin, end, name);
  }
  check_disjoint(ranges, source);
  // the data section is the tensors' bytes and no more (as the format's own reader checks): bytes
  // past the last tensor are another file's appended, or a write gone wrong
  uint64_t used = 0;
  for (const auto& [begin, end, name] : ranges) used = std::max(used, end);
  check_no_tail(data_size, used, source);
  for (auto& [name, entry] : header.items()) {  // copied only once every entry is known good
    if (name == "__metadata__") continue;
    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>(), end = entry["data_offsets"][1].get<uint64_t>();
    Shape shape = entry["shape"].get<Shape>();
    Tensor t = Tensor::empty(shape, st_dtype_from(entry["dtype"].get<std::string>(), source, name), Device::cpu);
    if (end > begin) std::memcpy(t.raw_data(), bytes + data_begin + begin, end - begin);
    file.tensors[name] = t;
  }
  return file;
}

TensorFile parse_safetensors(const std::vector<char>& bytes, const std::string& source) {
  return parse_safetensors(bytes.data(), bytes.size(), source);
}

namespace {
// A file longer than its header's tensors (gigabytes appended, or a checkpoint padded with
// truncate) is refused from its header alone, before the whole file is read into memory. What
// else is wrong with the header, the whole file's parse says.
void check_no_tail_before_reading(const std::string& path, const std::string& what) {
  files::Fd fd = files::open_input(path, what);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char prefix[8];
  if (size < 8 || ::pread(fd.get(), prefix, 8, 0) != 8) return;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | prefix[i];
  if (header_len > size - 8 || header_len > (uint64_t{1} << 28)) return;
  std::string text(header_len, '\0');
  if (::pread(fd.get(), text.data(), header_len, 8) != static_cast<ssize_t>(header_len)) return;
  json header;
  try {
    header = parse_header(text.data(), header_len, path);
  } catch (const Error&) {
    return;
  }
  uint64_t used = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__" || !entry.is_object() || !entry.contains("data_offsets")) continue;
    const json& off = entry["data_offsets"];
    if (off.is_array() && off.size() == 2 && off[1].is_number_unsigned()) used = std::max(used, off[1].get<uint64_t>());
  }
  check_no_tail(size - 8 - header_len, used, path);
}
}  // namespace

TensorFile read_safetensors(const std::string& path, const std::string& what) {
  check_no_tail_before_reading(path, what);
  // A regular file of known size, read once: a device such as /dev/zero never ends, and its
  // bytes would be read until memory ran out.
  const std::string bytes = files::read_file(path, what, uint64_t{1} << 40);
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted names, a stable layout
    header[name] = {
        {"dtype", st_dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // align the data section
  std::vector<char> out(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  size_t pos = 8 + text.size();
  for (const auto& [name, t] : tensors) {
    Tensor host = t.to(Device::cpu);
    if (host.nbytes()) std::memcpy(out.data() + pos, host.raw_data(), host.nbytes());
    pos += host.nbytes();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& what, files::Link link) {
  const std::vector<char> bytes = serialize_safetensors(tensors, metadata);
  const std::string_view view(bytes.data(), bytes.size());
  // an output that asked for a digest (a metadata "digest" of files::kDigestSlot) gets it filled
  const auto digest = metadata.find("digest");
  if (digest != metadata.end() && digest->second == files::kDigestSlot) files::write_stamped(path, view, what, link);
  else files::write_atomic(path, view, what, link);
}

}  // namespace cast
