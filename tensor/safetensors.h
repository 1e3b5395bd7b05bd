#pragma once
// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then raw data.
// Reading checks every bound, so a truncated or corrupt file is one clear error.
#include <map>
#include <string>
#include <vector>

#include "tensor/files.h"
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

// Tensor names are unique and their byte ranges disjoint; every bound is checked.
TensorFile parse_safetensors(const char* bytes, size_t size, const std::string& source);
TensorFile parse_safetensors(const std::vector<char>& bytes, const std::string& source);
// `what` names the file in messages ("checkpoint", "input file").
TensorFile read_safetensors(const std::string& path, const std::string& what = "safetensors file");
std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});
// Writes atomically (files::write_atomic), so a crash never leaves a half-written file. A metadata
// "digest" of files::kDigestSlot is filled with the file's digest (files::write_stamped).
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, const std::string& what = "output file",
                       files::Link link = files::Link::follow_once);

}  // namespace cast
