#include "datasets/png.h"

#include <png.h>

#include <cstring>
#include <string>

#include "tensor/error.h"
#include "tensor/files.h"

namespace cast::png {

namespace {
[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* where = static_cast<std::string*>(png_get_error_ptr(png));
  throw Error(fmt::format("{}: PNG error: {}", where ? *where : "png", message));
}
void on_warning(png_structp, png_const_charp) {}

// What a read has to say: where, for errors; libpng's warnings, of which "Too much image data"
// and "Extra compressed data" (an image stream longer than its header's size, inflated and
// thrown away) make the file a bad one.
struct ReadState {
  std::string where;
  std::string too_much;
};
[[noreturn]] void on_read_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<ReadState*>(png_get_error_ptr(png));
  throw Error(fmt::format("{}: a damaged or unsupported PNG image (the decoder says: {})", state->where, message));
}
void on_read_warning(png_structp png, png_const_charp message) {
  auto* state = static_cast<ReadState*>(png_get_error_ptr(png));
  const std::string said = message;
  if (state->too_much.empty() &&
      (said.find("Too much image data") != std::string::npos || said.find("Extra compressed data") != std::string::npos))
    state->too_much = said;
}

// libpng reads from and writes to memory here: the file itself goes through files:: (a regular
// file checked before it is read; written atomically, never through a planted link).
struct Reader {
  const std::string* bytes;
  size_t at;
};
void read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<Reader*>(png_get_io_ptr(png));
  if (n > r->bytes->size() - r->at) png_error(png, "the file ends early (truncated?)");
  std::memcpy(out, r->bytes->data() + r->at, n);
  r->at += n;
}
void write_bytes(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
void flush_nothing(png_structp) {}

std::string encode(const Image& image, std::string& where) {
  std::string bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &where, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  try {
    if (!png || !info) throw Error(fmt::format("{}: out of memory for the PNG writer", where));
    png_set_write_fn(png, &bytes, write_bytes, flush_nothing);
    png_set_IHDR(png, info, image.width, image.height, 8,
                 image.channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < image.height; ++y)
      png_write_row(png,
                    const_cast<png_bytep>(image.pixels.data() + static_cast<size_t>(y) * image.width * image.channels));
    png_write_end(png, nullptr);
  } catch (...) {
    png_destroy_write_struct(&png, &info);
    throw;
  }
  png_destroy_write_struct(&png, &info);
  return bytes;
}
}  // namespace

void write(const std::string& path, const Image& image, files::Link link, files::Flush flush) {
  std::string where = path;
  files::write_atomic(path, encode(image, where), "PNG file", link, flush);
}

constexpr png_uint_32 kMaxSide = 4096;

Image read_gray(const std::string& path) {
  const std::string bytes = files::read_file(path, "PNG file", uint64_t{1} << 28);
  CAST_CHECK(bytes.size() >= 8 && !png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8),
             "PNG file {}: not a PNG file", path);
  ReadState state{"PNG file " + path, ""};
  const std::string& where = state.where;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, on_read_error, on_read_warning);
  png_infop info = png_create_info_struct(png);
  Reader reader{&bytes, 8};
  Image image;
  try {
    png_set_read_fn(png, &reader, read_bytes);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    // the header's size is input: checked before a row is allocated (Path-X, the largest task, is 128 x 128)
    const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    CAST_CHECK(w >= 1 && h >= 1 && w <= kMaxSide && h <= kMaxSide,
               "{}: the image is {} x {} pixels; at most {} x {} "
               "are read",
               where, w, h, kMaxSide, kMaxSide);
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    png_set_expand(png);
    const int color = png_get_color_type(png, info);
    if (color == PNG_COLOR_TYPE_RGB || color == PNG_COLOR_TYPE_RGB_ALPHA || color == PNG_COLOR_TYPE_PALETTE)
      png_set_rgb_to_gray_fixed(png, 1, -1, -1);
    // An interlaced (Adam7) image arrives in 7 passes over the rows; libpng merges them into the
    // rows when every pass reads every row. Without this the rows come out scrambled.
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    image.width = static_cast<int>(png_get_image_width(png, info));
    image.height = static_cast<int>(png_get_image_height(png, info));
    CAST_CHECK(png_get_channels(png, info) == 1, "{}: could not convert to gray", where);
    image.pixels.resize(static_cast<size_t>(image.width) * image.height);
    for (int pass = 0; pass < passes; ++pass)
      for (int y = 0; y < image.height; ++y)
        png_read_row(png, image.pixels.data() + static_cast<size_t>(y) * image.width, nullptr);
    png_read_end(png, nullptr);  // the rest of the image stream: more than the header's size is refused
    CAST_CHECK(state.too_much.empty(), "{}: its image data is more than its header's {} x {} pixels ({})", where,
               image.width, image.height, state.too_much);
  } catch (...) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw;
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

}  // namespace cast::png
