#include "tensor/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace cast {

using json = nlohmann::json;

static const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

static DType st_dtype_from(const std::string& s, const std::string& source, const std::string& name) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  throw Error(fmt::format("{}: tensor '{}' has unsupported dtype '{}' (F32, F64, I32, I64 are read)", source, name, s));
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

TensorFile parse_safetensors(const std::vector<char>& bytes, const std::string& source) {
  TensorFile file;
  file.source = source;
  CAST_CHECK(bytes.size() >= 8, "{}: not a safetensors file (only {} bytes)", source, bytes.size());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  CAST_CHECK(header_len <= bytes.size() - 8, "{}: header length {} exceeds the file size {} (truncated?)", source,
             header_len, bytes.size());
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: corrupt safetensors header: {}", source, e.what()));
  }
  CAST_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", source);
  const size_t data_begin = 8 + header_len;
  const size_t data_size = bytes.size() - data_begin;

  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      CAST_CHECK(entry.is_object(), "{}: __metadata__ is not an object", source);
      for (auto& [k, v] : entry.items()) {
        CAST_CHECK(v.is_string(), "{}: metadata '{}' is not a string", source, k);
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    CAST_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                   entry.contains("data_offsets"),
               "{}: tensor '{}' lacks dtype, shape or data_offsets", source, name);
    CAST_CHECK(entry["dtype"].is_string(), "{}: tensor '{}': dtype is not a string", source, name);
    DType dtype = st_dtype_from(entry["dtype"].get<std::string>(), source, name);
    const json& js = entry["shape"];
    CAST_CHECK(js.is_array(), "{}: tensor '{}': shape is not an array", source, name);
    Shape shape;
    for (const json& d : js) {
      CAST_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 "{}: tensor '{}': bad dimension {}", source, name, d.dump());
      shape.push_back(d.get<int64_t>());
      CAST_CHECK(shape.back() < (int64_t(1) << 40), "{}: tensor '{}': dimension too large", source, name);
    }
    const json& off = entry["data_offsets"];
    CAST_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
               "{}: tensor '{}': data_offsets must be two non-negative integers", source, name);
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    CAST_CHECK(begin <= end && end <= data_size, "{}: tensor '{}': data [{}, {}) outside the {} data bytes (truncated?)",
               source, name, begin, end, data_size);
    // numel * size computed in a way that cannot overflow silently
    long double expect = static_cast<long double>(dtype_size(dtype));
    for (int64_t d : shape) expect *= static_cast<long double>(d);
    CAST_CHECK(expect == static_cast<long double>(end - begin),
               "{}: tensor '{}': {} bytes do not hold {} {}", source, name, end - begin, dtype_name(dtype),
               shape_str(shape));
    Tensor t = Tensor::empty(shape, dtype, Device::cpu);
    if (end > begin) std::memcpy(t.raw_data(), bytes.data() + data_begin + begin, end - begin);
    file.tensors[name] = t;
  }
  return file;
}

TensorFile read_safetensors(const std::string& path) {
  // A regular file of known size, read once: a device such as /dev/zero never ends, and its
  // bytes would be read until memory ran out.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  CAST_CHECK(!ec && std::filesystem::exists(status), "{}: cannot open file", path);
  CAST_CHECK(std::filesystem::is_regular_file(status), "{}: not a regular file", path);
  const uintmax_t size = std::filesystem::file_size(path, ec);
  CAST_CHECK(!ec, "{}: cannot read its size: {}", path, ec.message());
  CAST_CHECK(size <= (uintmax_t{1} << 40), "{}: {} bytes is larger than any file this reads (1 TiB)", path, size);
  std::ifstream in(path, std::ios::binary);
  CAST_CHECK(in.good(), "{}: cannot open file", path);
  std::vector<char> bytes(static_cast<size_t>(size));
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  CAST_CHECK(static_cast<uintmax_t>(in.gcount()) == size, "{}: read {} of {} bytes", path, in.gcount(), size);
  return parse_safetensors(bytes, path);
}

std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted names, a stable layout
    header[name] = {{"dtype", st_dtype_name(t.dtype())}, {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
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

std::string output_path(const std::string& path) {
  // A symlink is followed on purpose: its target is replaced and the link stays a link. The file
  // to replace must be a regular file or not exist yet: a device (/dev/full), a folder or a pipe
  // is refused, never replaced by a regular file.
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path link = fs::read_symlink(path, ec);
    CAST_CHECK(!ec, "{}: cannot read the symbolic link: {}", path, ec.message());
    target = (link.is_absolute() ? link : fs::path(path).parent_path() / link).string();
  }
  const auto status = fs::status(target, ec);
  CAST_CHECK(!fs::exists(status) || fs::is_regular_file(status), "{}: exists and is not a regular file; not replacing it",
             path);
  return target;
}

void write_file_atomic(const std::string& path, const std::vector<char>& bytes) {
  // The new content goes to a temporary file beside the target, is flushed to disk, and is
  // renamed over the target; the folder is flushed after. On any failure the temporary file
  // is removed and the old file stays as it was.
  const std::string target = output_path(path), tmp = target + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CAST_CHECK(fd >= 0, "{}: cannot open for writing: {}", tmp, std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: {}: {}", tmp, what, reason));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("flush to disk failed");
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: close failed: {}", tmp, reason));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: cannot move the new file into place: {}", target, reason));
  }
  const std::string folder = std::filesystem::path(target).parent_path().string();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {  // the rename itself reaches the disk
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, std::vector<char>(text.begin(), text.end()));
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

}  // namespace cast
