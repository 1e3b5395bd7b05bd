// Pathfinder / Path-X: a contour-image generator in the release layout and its loader.
// Each image holds two target snakes and shorter distractor snakes made of short line
// segments ("paddles") that turn by small angles, plus two round markers: on the two ends of
// one snake (label 1) or on ends of different snakes (label 0). Drawn at twice the size and
// averaged 2×2 down, which antialiases the strokes.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <sstream>
#include <string_view>

#include "tensor/files.h"
#include "tensor/philox.h"
#include "datasets/data.h"
#include "datasets/png.h"

namespace cast::data {

namespace fs = std::filesystem;

PathfinderSpec PathfinderSpec::pathfinder32() { return PathfinderSpec{}; }

// Path-X: the same contours on a 128 × 128 image (16384 tokens); paddles scale with the image,
// and the target snakes are longer (18 paddles: about the image's width end to end).
PathfinderSpec PathfinderSpec::pathx128() {
  PathfinderSpec s;
  s.side = 128;
  s.contour_length = 18;
  s.distractors = 12;
  return s;
}

namespace {

using Rng = philox::Stream;

struct Point {
  double x, y;
};

struct Canvas {
  int side;  // drawing resolution (2× the image)
  std::vector<double> ink;
  explicit Canvas(int s) : side(s), ink(static_cast<size_t>(s) * s, 0.0) {}
  void disc(double cx, double cy, double r) {
    for (int y = std::max(0, int(cy - r - 1)); y <= std::min(side - 1, int(cy + r + 1)); ++y)
      for (int x = std::max(0, int(cx - r - 1)); x <= std::min(side - 1, int(cx + r + 1)); ++x)
        if ((x + 0.5 - cx) * (x + 0.5 - cx) + (y + 0.5 - cy) * (y + 0.5 - cy) <= r * r) ink[y * side + x] = 1.0;
  }
  void segment(Point a, Point b, double half_width) {
    const int steps = std::max(2, int(std::hypot(b.x - a.x, b.y - a.y) * 2));
    for (int i = 0; i <= steps; ++i) disc(a.x + (b.x - a.x) * i / steps, a.y + (b.y - a.y) * i / steps, half_width);
  }
};

// A snake of `paddles` segments with small random turns between them; returns its two end
// points. A paddle that would leave the canvas steers instead: the turn sweeps wider to either
// side until the paddle stays inside, so a snake of any length fits (it coils, as the long
// contours of Path-X do). Returns false only if no direction fits, which a point inside the
// margin cannot meet.
bool draw_snake(Canvas& c, Rng& rng, int paddles, double paddle_len, double gap, Point& head, Point& tail, bool draw) {
  const double margin = 3;
  auto inside = [&](Point q) {
    return q.x >= margin && q.y >= margin && q.x <= c.side - margin && q.y <= c.side - margin;
  };
  // start in the middle 70% of the canvas, so long snakes meet the border less often
  Point p{c.side * (0.15 + 0.7 * rng.uniform()), c.side * (0.15 + 0.7 * rng.uniform())};
  double angle = rng.uniform() * 2 * 3.14159265358979;
  std::vector<std::pair<Point, Point>> parts;
  head = p;
  for (int i = 0; i < paddles; ++i) {
    double a = angle + (rng.uniform() - 0.5) * 0.9;  // continuity: small turns between paddles
    bool fits = false;
    Point q{};
    for (int k = 0; k < 26 && !fits; ++k) {  // a, a+0.27, a−0.27, a+0.54, ... around the circle
      q = {p.x + std::cos(a) * paddle_len, p.y + std::sin(a) * paddle_len};
      fits = inside(q) && inside({q.x + std::cos(a) * gap, q.y + std::sin(a) * gap});
      if (!fits) a += (k % 2 == 0 ? 1 : -1) * 0.27 * (k + 1);
    }
    if (!fits) return false;
    angle = a;
    parts.push_back({p, q});
    p = {q.x + std::cos(angle) * gap, q.y + std::sin(angle) * gap};
  }
  tail = parts.back().second;
  if (draw)
    for (auto& [a, b] : parts) c.segment(a, b, 0.5);
  return true;
}
// Every two of the snake ends (where markers may go) at least `d` apart, so neither label can
// be read off two markers that touch.
bool ends_apart(std::initializer_list<Point> ends, double d) {
  for (auto i = ends.begin(); i != ends.end(); ++i)
    for (auto j = i + 1; j != ends.end(); ++j)
      if (std::hypot(i->x - j->x, i->y - j->y) <= d) return false;
  return true;
}

}  // namespace

// Sample i of a set: its image and label, from its own stream (so samples are drawn in any order).
static png::Image draw_sample(const PathfinderSpec& spec, uint64_t seed, int64_t i, int& label) {
  const int hi = spec.side * 2;
  const double scale = spec.side / 32.0;
  const double paddle_len = 2.0 * 2 * scale * 0.9, gap = 1.2 * scale;
  Rng rng{seed * 1000003 + static_cast<uint64_t>(i)};
  label = rng.uniform() < 0.5 ? 1 : 0;
  Canvas c(hi);
  Point a0, a1, b0, b1, d0, d1;
  for (int tries = 0;; ++tries) {
    Rng attempt = rng;
    Canvas trial(hi);
    if (draw_snake(trial, attempt, spec.contour_length, paddle_len, gap, a0, a1, true) &&
        draw_snake(trial, attempt, spec.contour_length, paddle_len, gap, b0, b1, true) &&
        ends_apart({a0, a1, b0, b1}, 7 * scale)) {
      c = trial;
      rng = attempt;
      break;
    }
    rng.counter += 1000;
    CAST_CHECK(tries < 10000, "pathfinder: could not place the snakes on a {}x{} image", spec.side, spec.side);
  }
  for (int k = 0; k < spec.distractors; ++k)
    for (int tries = 0; tries < 50; ++tries)
      if (draw_snake(c, rng, std::max(1, spec.contour_length / 3), paddle_len, gap, d0, d1, true)) break;
  const double r = 1.5 * 2 * scale;
  c.disc(a0.x, a0.y, r);
  if (label == 1) c.disc(a1.x, a1.y, r);
  else c.disc(b1.x, b1.y, r);
  png::Image img{spec.side, spec.side, 1, std::vector<uint8_t>(static_cast<size_t>(spec.side) * spec.side)};
  for (int y = 0; y < spec.side; ++y)
    for (int x = 0; x < spec.side; ++x) {
      double s = c.ink[(2 * y) * hi + 2 * x] + c.ink[(2 * y) * hi + 2 * x + 1] + c.ink[(2 * y + 1) * hi + 2 * x] +
                 c.ink[(2 * y + 1) * hi + 2 * x + 1];
      img.pixels[y * spec.side + x] = static_cast<uint8_t>(std::lround(255.0 * s / 4));
    }
  return img;
}

// An earlier, larger set in this folder (cast data with a smaller --count) left images past the
// new count: its own files, sample_<i>.png with i ≥ count, are removed. With count < 0, the
// temporary files a stopped run left instead: sample_<i>.png.tmp and sample_<i>.png.<n>.tmp.
static void remove_stale_images(const std::string& folder, int64_t count) {
  const auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string file = entry.path().filename().string();
    std::string_view name = file;
    if (count < 0) {  // <image>.tmp or <image>.<n>.tmp: the image's own name is checked below
      if (!name.ends_with(".tmp")) continue;
      name.remove_suffix(4);
      const size_t dot = name.rfind('.');
      if (dot != std::string_view::npos && digits(name.substr(dot + 1))) name = name.substr(0, dot);
    }
    if (!name.starts_with("sample_") || !name.ends_with(".png")) continue;  // so at least 11 characters
    const std::string_view index = name.substr(7, name.size() - 7 - 4);
    if (!digits(index)) continue;
    if ((count < 0 || std::stoll(std::string(index)) >= count) && entry.is_regular_file(ec)) fs::remove(entry.path(), ec);
  }
}

// The readers take every metadata/*.npy of a set as a part of it: after the set's own 0.npy is
// written, any other (a replaced set's, a hand-made one's: cast data was told to replace it) is
// removed, so the folder holds the generated set and no more.
static void remove_other_metadata(const std::string& folder) {
  std::error_code ec;
  std::vector<fs::path> other;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.path().extension() == ".npy" && entry.path().filename() != "0.npy" && entry.is_regular_file(ec))
      other.push_back(entry.path());
  for (const fs::path& path : other) {
    fs::remove(path, ec);
    CAST_CHECK(!ec, "Pathfinder metadata {}: cannot remove it: {}", path.string(), ec.message());
  }
}

// The images are drawn and written across the threads (each from its own stream: the same files
// on any thread count) and reach the disk together before the metadata, which completes the set,
// is written: one flush for the set instead of two per image.
void generate_pathfinder(const std::string& dir, const PathfinderSpec& spec, uint64_t seed, bool overwrite,
                         const StopCheck& stop_check, const std::string& rerun) {
  // a file where a folder of the set goes is refused before the set is claimed (marked unfinished)
  for (const char* folder : {"/imgs", "/imgs/0", "/metadata"}) files::check_output_folder(dir + folder, "Pathfinder folder");
  const std::string settings = fmt::format("{} images of {} × {}, snakes of {} paddles, {} distractors, seed {}",
                                           spec.count, spec.side, spec.side, spec.contour_length, spec.distractors,
                                           seed);
  const files::FolderLock lock = claim_data_folder(dir, overwrite, {dir + "/metadata/0.npy"}, "Pathfinder", settings, rerun);
  mark_data_unfinished(dir, "Pathfinder", settings, rerun);  // images are written as they are drawn
  files::make_writable_folder(dir + "/imgs/0", "Pathfinder folder");
  remove_stale_images(dir + "/imgs/0", -1);  // a stopped run's temporary files
  files::make_writable_folder(dir + "/metadata", "Pathfinder folder");
  std::vector<int> labels(static_cast<size_t>(spec.count));
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < spec.count; ++i) {
    try {
      if (stop_check) stop_check();
      const png::Image img = draw_sample(spec, seed, i, labels[static_cast<size_t>(i)]);
      png::write(fmt::format("{}/imgs/0/sample_{}.png", dir, i), img, files::Link::refuse, files::Flush::with_folder);
    } catch (...) {
#pragma omp critical(pathfinder_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  files::flush_file_system(dir, "Pathfinder folder");
  std::ostringstream meta;
  for (int64_t i = 0; i < spec.count; ++i)
    meta << "imgs/0 sample_" << i << ".png " << i << ' ' << labels[static_cast<size_t>(i)] << '\n';
  files::write_atomic(dir + "/metadata/0.npy", meta.str(), "Pathfinder metadata", files::Link::refuse);
  remove_stale_images(dir + "/imgs/0", spec.count);
  remove_other_metadata(dir + "/metadata");
  mark_data_folder(dir, "Pathfinder", settings, rerun);
}

// The image a metadata line names, which must lie inside the data folder: a relative path with no
// '..', and no link inside leading out of the folder.
static std::string image_inside(const std::string& dir, const std::string& subdir, const std::string& file,
                                const std::string& where) {
  const fs::path rel = fs::path(subdir) / file;
  bool up = false;
  for (const auto& part : rel) up = up || part == "..";
  CAST_CHECK(!rel.is_absolute() && !up, "{}: image path '{}' leaves the data folder {}", where, rel.string(), dir);
  const std::string path = (fs::path(dir) / rel).string();
  std::error_code real_ec, root_ec;  // a path that cannot be resolved (a link loop) is refused when read
  const fs::path real = fs::weakly_canonical(path, real_ec), root = fs::weakly_canonical(dir, root_ec);
  if (real_ec || root_ec) return path;
  const auto mismatch = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  CAST_CHECK(mismatch.first == root.end(), "{}: image path '{}' leads out of the data folder {} (through a link)",
             where, rel.string(), dir);
  return path;
}

// The release's metadata files are text lines under a .npy name; a real NumPy array saved there
// (np.save) would be read as lines of binary and refused for a field far from the cause.
static void check_not_numpy_binary(const std::string& path) {
  files::Fd fd = files::open_input(path, "Pathfinder metadata");
  char head[6] = {};
  const ssize_t got = ::read(fd.get(), head, sizeof head);
  CAST_CHECK(got != 6 || std::string_view(head, 6) != "\x93NUMPY",
             "Pathfinder metadata {}: is a NumPy binary array (np.save); cast reads the release's metadata, text lines "
             "of 'folder file index label' under a .npy name",
             path);
}

TaskData load_pathfinder(const std::string& dir, const std::string& task) {
  // the advice where the set or a file of it is missing: the generator of the task asked for
  const auto hint = [&] {
    return generate_hint(dir, [&](const std::string& out) { return "cast data " + task + " --out " + out; });
  };
  check_data_finished(dir);
  files::require_folder(dir, "Pathfinder data folder");
  const std::string meta_dir = dir + "/metadata";
  const std::string there = marked_kind(dir);
  CAST_CHECK(there.empty() || there == "Pathfinder",
             "Pathfinder data folder {}: it holds a {} set made by cast data, not Pathfinder: give --data a Pathfinder "
             "folder",
             dir, there);
  CAST_CHECK(files::exists(meta_dir), "Pathfinder data folder {}: it has no metadata folder ({})", dir, hint());
  files::require_folder(meta_dir, "Pathfinder metadata folder");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(meta_dir))
    if (e.path().extension() == ".npy") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  CAST_CHECK(!files.empty(), "{}: no metadata files ({})", meta_dir, hint());
  std::vector<Example> all;
  int side = 0;
  std::string first;  // where the first image, which set the side, was named
  std::map<std::string, std::string> named;  // each image's path, and where it was first named
  for (const std::string& f : files) {
    check_not_numpy_binary(f);
    for_each_line(f, "pathfinder metadata", [&](const std::string& line, const std::string& where) {
      // an editor's byte-order mark would become part of the first image's folder name
      CAST_CHECK(line.rfind("\xEF\xBB\xBF", 0) != 0, "{}: starts with a byte-order mark (U+FEFF): save the file "
                 "without one", where);
      std::istringstream fields(line);
      std::vector<std::string> cols;
      for (std::string w; fields >> w;) cols.push_back(w);
      CAST_CHECK(cols.size() >= 4, "{}: expected at least 4 fields (subdir file idx label), got {}", where,
                 cols.size());
      CAST_CHECK(cols[3] == "0" || cols[3] == "1", "{}: label '{}' is not 0 or 1", where, cols[3]);
      const std::string image = image_inside(dir, cols[0], cols[1], where);
      // an image named twice (a metadata file copied) would put a training image in validation or test
      const auto [earlier, fresh] = named.emplace(fs::path(image).lexically_normal().string(), where);
      CAST_CHECK(fresh, "{}: image {} is named again (first at {}): each image belongs to one split", where,
                 (fs::path(cols[0]) / cols[1]).string(), earlier->second);
      CAST_CHECK(files::exists(image), "{}: names image {}, which does not exist ({})", where, image, hint());
      png::Image img = png::read_gray(image);
      CAST_CHECK(img.width == img.height, "{}: image {}x{} is not square", where, img.width, img.height);
      if (side == 0) side = img.width, first = where + " (" + cols[1] + ")";
      CAST_CHECK(img.width == side,
                 "{}: image {} is {} pixels wide, the first image, at {}, {}: one of them is not of "
                 "this data set",
                 where, cols[1], img.width, first, side);
      Example e;
      e.label = cols[3][0] - '0';
      e.tokens.assign(img.pixels.begin(), img.pixels.end());
      all.push_back(std::move(e));
    });
  }
  CAST_CHECK(all.size() >= 3, "{}: fewer than 3 images", dir);
  TaskData t;
  t.name = side > 32 ? "pathx" : "pathfinder";
  t.vocab = 256;
  t.classes = 2;
  t.max_len = static_cast<int64_t>(side) * side;
  t.fixed_length = true;
  t.image_side = side;
  const size_t n_train = all.size() * 8 / 10, n_val = all.size() / 10;
  t.train.assign(all.begin(), all.begin() + n_train);
  t.val.assign(all.begin() + n_train, all.begin() + n_train + n_val);
  t.test.assign(all.begin() + n_train + n_val, all.end());
  return t;
}

}  // namespace cast::data
