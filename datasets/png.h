#pragma once
// PNG read and write through libpng, with errors that name the file.
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/files.h"

namespace cast::png {

struct Image {
  int width = 0, height = 0, channels = 1;  // 1 = gray, 3 = RGB
  std::vector<uint8_t> pixels;              // row-major, channels interleaved
};

// Atomic (files::write_atomic); `link`: files::Link::refuse for files named by the engine.
void write(const std::string& path, const Image& image, files::Link link = files::Link::follow_once,
           files::Flush flush = files::Flush::now);
Image read_gray(const std::string& path);  // any PNG, converted to 8-bit gray

}  // namespace cast::png
