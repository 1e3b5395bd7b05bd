#include "train/png.h"

#include <png.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "tensor/error.h"
#include "tensor/safetensors.h"

namespace cast::png {

namespace {
struct File {
  FILE* f;
  ~File() {
    if (f) std::fclose(f);
  }
};
[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* where = static_cast<std::string*>(png_get_error_ptr(png));
  throw Error(fmt::format("{}: PNG error: {}", where ? *where : "png", message));
}
void on_warning(png_structp, png_const_charp) {}
}  // namespace

void write(const std::string& original_path, const Image& image) {
  const std::string path = output_path(original_path);  // a symlink's target; never a device or folder
  const std::string tmp = path + ".tmp";
  std::string where = original_path;
  {
    File file{std::fopen(tmp.c_str(), "wb")};
    CAST_CHECK(file.f, "{}: cannot open for writing", tmp);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &where, on_error, on_warning);
    png_infop info = png_create_info_struct(png);
    try {
      if (!png || !info) throw Error(fmt::format("{}: out of memory for the PNG writer", path));
      png_init_io(png, file.f);
      png_set_IHDR(png, info, image.width, image.height, 8, image.channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY,
                   PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
      png_write_info(png, info);
      for (int y = 0; y < image.height; ++y)
        png_write_row(png, const_cast<png_bytep>(image.pixels.data() + static_cast<size_t>(y) * image.width * image.channels));
      png_write_end(png, nullptr);
    } catch (...) {
      png_destroy_write_struct(&png, &info);
      std::fclose(file.f);
      file.f = nullptr;
      std::remove(tmp.c_str());
      throw;
    }
    png_destroy_write_struct(&png, &info);
    // a full disk shows up at the flush or the close: check both, and leave no partial file
    const bool written = std::fflush(file.f) == 0 && !std::ferror(file.f);
    const bool closed = std::fclose(file.f) == 0;
    file.f = nullptr;
    if (!written || !closed) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("{}: write failed (disk full?)", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot move the new file into place: {}", path, ec.message()));
  }
}

constexpr png_uint_32 kMaxSide = 4096;

Image read_gray(const std::string& path) {
  File file{std::fopen(path.c_str(), "rb")};
  CAST_CHECK(file.f, "{}: cannot open", path);
  unsigned char sig[8] = {};
  CAST_CHECK(std::fread(sig, 1, 8, file.f) == 8 && !png_sig_cmp(sig, 0, 8), "{}: not a PNG file", path);
  std::string where = path;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &where, on_error, on_warning);
  png_infop info = png_create_info_struct(png);
  Image image;
  try {
    png_init_io(png, file.f);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    // the header's size is input: checked before a row is allocated (Path-X, the largest task, is 128 x 128)
    const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    CAST_CHECK(w >= 1 && h >= 1 && w <= kMaxSide && h <= kMaxSide, "{}: the image is {} x {} pixels; at most {} x {} "
               "are read", path, w, h, kMaxSide, kMaxSide);
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    png_set_expand(png);
    const int color = png_get_color_type(png, info);
    if (color == PNG_COLOR_TYPE_RGB || color == PNG_COLOR_TYPE_RGB_ALPHA || color == PNG_COLOR_TYPE_PALETTE)
      png_set_rgb_to_gray_fixed(png, 1, -1, -1);
    png_read_update_info(png, info);
    image.width = static_cast<int>(png_get_image_width(png, info));
    image.height = static_cast<int>(png_get_image_height(png, info));
    CAST_CHECK(png_get_channels(png, info) == 1, "{}: could not convert to gray", path);
    image.pixels.resize(static_cast<size_t>(image.width) * image.height);
    for (int y = 0; y < image.height; ++y) png_read_row(png, image.pixels.data() + static_cast<size_t>(y) * image.width, nullptr);
  } catch (...) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw;
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

}  // namespace cast::png
