#pragma once
// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then raw data.
// Reading checks every bound, so a truncated or corrupt file is one clear error.
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cast {

struct TensorFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;

  // The tensor `name`, checked to exist and (when given) to have this dtype and shape.
  const Tensor& get(const std::string& name) const;
  const Tensor& get(const std::string& name, DType dtype, const Shape& shape) const;
  bool has(const std::string& name) const { return tensors.count(name) > 0; }
  std::string source;  // the file it came from, for error messages
};

TensorFile parse_safetensors(const std::vector<char>& bytes, const std::string& source);
TensorFile read_safetensors(const std::string& path);
std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});
// Writes to `path + ".tmp"` then renames, so a crash never leaves a half-written file.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The file a write to `path` replaces: the target of a symlink, refused unless it is a regular
// file or does not exist.
std::string output_path(const std::string& path);
// Writes a file atomically (temporary file, flush, rename).
void write_file_atomic(const std::string& path, const std::vector<char>& bytes);
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace cast
