#include "tensor/files.h"
#include "tensor/text.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <random>

#include "tensor/error.h"
#include "tensor/tensor.h"  // host_memory_total

namespace cast::files {

namespace fs = std::filesystem;

namespace {
bool g_standard_output_closed = false;
// read as the process starts, before any write could meet a terminal that went away
const bool g_standard_output_was_terminal = ::isatty(STDOUT_FILENO) != 0;
}

void note_standard_output_closed_at_start() { g_standard_output_closed = true; }
bool standard_output_was_terminal() { return g_standard_output_was_terminal; }

bool is_mount_point(const std::string& path) {
  std::error_code ec;
  const std::string at = fs::weakly_canonical(fs::absolute(path, ec), ec).string();
  if (ec) return false;
  std::ifstream info("/proc/self/mountinfo");
  for (std::string line; std::getline(info, line);) {
    // "36 35 98:0 /mnt1 /mnt2 rw ...": the fifth field is the mount point, a space as \040
    std::istringstream fields(line);
    std::string id, parent, device, root, point;
    fields >> id >> parent >> device >> root >> point;
    for (size_t escape; (escape = point.find("\\040")) != std::string::npos;) point.replace(escape, 4, " ");
    if (point == at) return true;
  }
  return false;
}

std::string standard_output_failure(int err) {
  if (g_standard_output_closed) return "it was closed when cast started";
  // a terminal that went away (its window closed, a dropped session) whose hangup signal never
  // came to cast: a wrapper that ignores SIGHUP keeps it from the processes it started
  if (err == EIO && g_standard_output_was_terminal)
    return "input/output error: a terminal that went away, whose hangup (SIGHUP) did not reach cast";
  return reason(err);
}

std::string reason(int err) {
  switch (err) {
    case ENOENT: return "no such file or folder";
    case EACCES:
    case EPERM: return "permission denied";
    case ELOOP: return "a symbolic link loop (or too many links)";
    case EISDIR: return "is a folder, not a file";
    case ENOTDIR: return "a part of the path is not a folder";
    case ENOSPC: return "no space left on the disk";
    case EROFS: return "read-only file system";
    case EBUSY: return "busy (something is mounted there)";
    case ENAMETOOLONG: return "the name is too long";
    case ENXIO: return "a FIFO or device with nothing on the other end";
    case EFBIG: return "file too large (beyond the file-size limit, ulimit -f)";
    case EPIPE: return "broken pipe (the reader has gone)";
    default: return std::strerror(err);
  }
}

static std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string odd_kind(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? kind_of(st.st_mode) : "";
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool modified_after(const std::string& path, const std::string& reference, double slack_seconds) {
  struct stat sp {
  }, sr{};
  if (::stat(path.c_str(), &sp) != 0 || ::stat(reference.c_str(), &sr) != 0) return false;
  const auto seconds = [](const struct timespec& t) { return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9; };
  return seconds(sp.st_mtim) > seconds(sr.st_mtim) + slack_seconds;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool same_path(const std::string& a, const std::string& b) {
  if (same_file(a, b)) return true;
  std::error_code ea, eb;  // a link loop or an unreadable folder: compared as spelled
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a), ea);
  const auto cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b), eb);
  if (ea || eb)
    return std::filesystem::absolute(a).lexically_normal() == std::filesystem::absolute(b).lexically_normal();
  return ca == cb;
}

void check_not_an_input(const std::string& output, const std::string& what, const std::vector<std::string>& inputs) {
  for (const std::string& in : inputs)
    if (!in.empty() && same_file(output, in))
      throw UsageError(fmt::format("{} {} is the input {}: an output never replaces an input of the same command", what,
                                   output, in));
}

void check_not_inside(const std::string& output, const std::string& what, const std::string& folder,
                      const std::string& folder_what) {
  if (output.empty() || folder.empty()) return;
  std::error_code out_ec, folder_ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output), out_ec),
                 canonical_folder = fs::weakly_canonical(fs::absolute(folder), folder_ec);
  if (out_ec || folder_ec) return;
  const fs::path root = canonical_folder.filename().empty() ? canonical_folder.parent_path() : canonical_folder;
  const auto mismatch = std::mismatch(root.begin(), root.end(), out.begin(), out.end());
  if (mismatch.first != root.end()) return;
  throw UsageError(
      fmt::format("{} {} is inside the {} {}, which this command reads: an output never goes among "
                  "its inputs; choose a path outside it",
                  what, output, folder_what, folder));
}

// stat() that names the file and the reason when it fails.
// Why stat() of `path` failed with `err`, in words. A link whose target is missing is named with
// that target: the name is there, what it points to is not.
static std::string unreachable(const std::string& path, int err) {
  struct stat link {};
  char to[4096];
  const ssize_t n = err == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)
                        ? ::readlink(path.c_str(), to, sizeof to - 1)
                        : -1;
  if (n <= 0) return reason(err);
  return fmt::format("a symbolic link to {}, which does not exist", std::string(to, static_cast<size_t>(n)));
}

// A path of the wrong kind (a link loop, a FIFO or a device where a file is read, a file where
// a folder is) is the command's to fix as given: a usage error (exit 2). A missing one is not.
static struct stat stat_or_throw(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message = fmt::format("{} {}: {}", what, path, unreachable(path, err));
    if (err == ELOOP) throw UsageError(message);
    throw Error(message);
  }
  return st;
}

void require_folder(const std::string& path, const std::string& what) {
  const struct stat st = stat_or_throw(path, what);
  CAST_CHECK_USAGE(S_ISDIR(st.st_mode), "{} {}: is {}, not a folder", what, path,
                   S_ISREG(st.st_mode) ? "a file" : kind_of(st.st_mode));
}

void require_file(const std::string& path, const std::string& what) {
  const struct stat st = stat_or_throw(path, what);
  CAST_CHECK_USAGE(S_ISREG(st.st_mode), "{} {}: is {}, not a regular file", what, path, kind_of(st.st_mode));
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd open_input(const std::string& path, const std::string& what) {
  require_file(path, what);  // before open: opening a FIFO or a device may block or act
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw Error(fmt::format("{} {}: cannot open: {}", what, path, reason(errno)));
  struct stat st {};
  CAST_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode), "{} {}: is {}, not a regular file", what, path,
             kind_of(st.st_mode));
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  Fd fd = open_input(path, what);
  struct stat st {};
  ::fstat(fd.get(), &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  CAST_CHECK(size <= max_bytes, "{} {}: {} bytes, more than the {} bytes such a file may have", what, path, size,
             max_bytes);
  const uint64_t memory = host_memory_total();
  CAST_CHECK(memory == 0 || size <= memory, "{} {}: {} bytes, more than this machine's {} bytes of memory", what, path,
             size, memory);
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {  // a file larger than the memory (a sparse file, say): named
    throw Error(fmt::format("{} {}: {} bytes, more than this machine's memory can hold", what, path, size));
  }
  // read to the end, not to the size stat gave: a file that grew while read, or one whose size
  // the system does not know (/proc's files say 0 bytes), is read whole, within max_bytes
  const auto read_some = [&](char* to, size_t n) -> size_t {
    while (true) {
      const ssize_t got = ::read(fd.get(), to, n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(fmt::format("{} {}: read failed: {}", what, path, reason(errno)));
      return static_cast<size_t>(got);
    }
  };
  size_t done = 0;
  while (true) {
    if (done == bytes.size()) {  // the size stat gave is read: more only if the read says so
      char more[4096];
      const size_t n = read_some(more, sizeof more);
      if (n == 0) break;
      CAST_CHECK(done + n <= max_bytes, "{} {}: more than the {} bytes such a file may have", what, path, max_bytes);
      bytes.append(more, n);
      done += n;
      continue;
    }
    const size_t n = read_some(bytes.data() + done, bytes.size() - done);
    if (n == 0) break;  // the end (a file that shrank while read: what is there)
    done += n;
  }
  bytes.resize(done);
  return bytes;
}

void for_each_line(const std::string& path, const std::string& what,
                   const std::function<void(std::string& line, int64_t number)>& fn) {
  Fd fd = open_input(path, what);
  std::unique_ptr<FILE, int (*)(FILE*)> file(::fdopen(fd.get(), "r"), std::fclose);
  CAST_CHECK(file, "{} {}: cannot open: {}", what, path, reason(errno));
  fd.release();    // the FILE owns it now
  struct Buffer {  // getline's buffer, grown by realloc, freed even when fn throws
    char* data = nullptr;
    size_t capacity = 0;
    ~Buffer() { std::free(data); }
  } buffer;
  std::string line;
  // a line longer than the memory holds (a file of one huge line): named by its number
  const auto out_of_memory = [&](int64_t number, size_t bytes) {
    return Error(fmt::format("{} {}: line {}: out of memory reading it (a line of {} bytes or more)", what, path,
                             number, bytes));
  };
  for (int64_t number = 1;; ++number) {
    errno = 0;
    const ssize_t n = ::getline(&buffer.data, &buffer.capacity, file.get());
    if (n < 0 && errno == ENOMEM) throw out_of_memory(number, buffer.capacity);
    if (n < 0) break;
    try {
      line.assign(buffer.data, static_cast<size_t>(n));
      if (!line.empty() && line.back() == '\n') line.pop_back();
      fn(line, number);
    } catch (const std::bad_alloc&) {
      throw out_of_memory(number, static_cast<size_t>(n));
    }
  }
  CAST_CHECK(!std::ferror(file.get()), "{} {}: read failed: {}", what, path, reason(errno));
}

std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  // A parse error in short: "at line L, column C: what the parser met" (the library's own
  // "parse error ...: syntax error while parsing <part> - ...; last read: '...'" says it at length)
  if (m.rfind("parse error", 0) == 0) {
    const size_t at = m.find("at line "), colon = m.find(": ", at == std::string::npos ? 0 : at);
    const size_t dash = m.find(" - ");
    std::string what = dash != std::string::npos ? m.substr(dash + 3) : colon != std::string::npos ? m.substr(colon + 2) : m;
    what = what.substr(0, what.find("; last read"));
    if (what.rfind("syntax error while parsing ", 0) == 0) what = "a syntax error in a " + what.substr(27);
    if (const size_t end = what.find("unexpected end of input"); end != std::string::npos)
      what.replace(end, 23, "the text ends early");
    m = at != std::string::npos && colon != std::string::npos ? m.substr(at, colon - at) + ": " + what : what;
  }
  if (m.rfind("number overflow parsing ", 0) == 0) m = "a number out of range: " + m.substr(24);
  // the library quotes the bytes it last read: a control byte or one past ASCII is shown as
  // \xHH, not written raw to the terminal
  std::string shown;
  for (const char ch : m) {
    const auto u = static_cast<unsigned char>(ch);
    shown += text::is_control(u) || u >= 0x80 ? fmt::format("\\x{:02x}", u) : std::string(1, ch);
  }
  return shown;
}

namespace {
// The SAX pass of parse_json_checking_keys: each open object's keys, the depth; no value is built.
class KeyChecker final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit KeyChecker(JsonKeys& found) : found_(found) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return enter();
  }
  bool key(string_t& name) override {
    if (!open_.back().insert(name).second && found_.duplicate.empty())
      found_.duplicate = name, found_.duplicate_depth = depth_;
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    syntax_error = true;
    return false;
  }
  bool syntax_error = false;

 private:
  bool enter() {
    if (++depth_ > kMaxJsonDepth) found_.too_deep = true;
    return !found_.too_deep;  // stops the pass: nothing deeper is walked
  }
  JsonKeys& found_;
  std::vector<std::set<std::string>> open_;
  int depth_ = 0;
};
}  // namespace

nlohmann::json parse_json_checking_keys(const char* begin, const char* end, JsonKeys& keys) {
  KeyChecker checker(keys);
  nlohmann::json::sax_parse(begin, end, &checker);
  if (keys.too_deep || (!checker.syntax_error && !keys.duplicate.empty())) return nullptr;
  return nlohmann::json::parse(begin, end);  // a syntax error throws here, with the parser's message
}

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  // The parser keeps the last of two equal keys without a word: {"steps": 2, "steps": 3000}
  // would train 3000 steps. The keys of each object are checked before the value is built.
  using json = nlohmann::json;
  // a NUL byte ends the text for some readers and not for others: no JSON file of ours has one
  const size_t nul = text.find('\0');
  CAST_CHECK(nul == std::string::npos, "{}: a NUL byte at offset {}: not a JSON text", where, nul);
  CAST_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos, "{}: empty, not a JSON text", where);
  JsonKeys keys;
  json j;
  try {
    j = parse_json_checking_keys(text.data(), text.data() + text.size(), keys);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", where, json_message(e)));
  }
  CAST_CHECK(!keys.too_deep, "{}: a value nested more than {} levels deep", where, kMaxJsonDepth);
  CAST_CHECK(keys.duplicate.empty(), "{}: the key '{}' is given twice", where, keys.duplicate);
  return j;
}

std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) {
    text.resize(57);
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xc0) == 0x80) text.pop_back();  // whole characters
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xc0) text.pop_back();
    text += "...";
  }
  return text;
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  return parse_json(read_file(path, what, uint64_t{1} << 28), fmt::format("{} {}", what, path));
}

// ---------------------------------------------------------------- writing

static std::string folder_of(const std::string& path) {
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// The folder a new file goes into must exist, be a folder, and not be read-only. Write bits are
// checked by hand because root ignores them: a folder made read-only is respected even by root.
// The file's or folder's immutable or append-only attribute (chattr +i, +a), which no write
// permission overrides, root's neither: "" where it has neither, or they cannot be read (not this
// file system's).
static std::string fixed_attribute(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  int flags = 0;
  if (fd.get() < 0 || ::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags) != 0) return "";
  return flags & FS_IMMUTABLE_FL ? "immutable (chattr +i)" : flags & FS_APPEND_FL ? "append-only (chattr +a)" : "";
}

static void check_folder_takes_files(const std::string& folder, const std::string& what, const std::string& path) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0)
    throw Error(fmt::format("{} {}: folder {}: {}", what, path, folder, reason(errno)));
  CAST_CHECK(S_ISDIR(st.st_mode), "{} {}: {} is {}, not a folder", what, path, folder,
             S_ISREG(st.st_mode) ? "a file" : kind_of(st.st_mode));
  CAST_CHECK((st.st_mode & 0222) != 0 && ::access(folder.c_str(), W_OK) == 0,
             "{} {}: folder {} is read-only (permission denied); nothing was written", what, path, folder);
  // an append-only folder takes new files but lets none be renamed over or removed: every
  // atomic write would fail after the work, leaving its temporary file
  const std::string fixed = fixed_attribute(folder);
  CAST_CHECK(fixed.empty(), "{} {}: folder {} is {}, so no file in it can be replaced; nothing was written (chattr -a "
             "or -i, or write elsewhere)", what, path, folder, fixed);
}

// A file nobody may write (mode without a w bit) was made read-only by its owner, who meant it to
// stay: no output replaces or appends to it, even as root, whom the bits do not stop; nor one
// made immutable or append-only.
static void check_not_read_only(const std::string& path, const struct stat& st, const std::string& what) {
  if (!S_ISREG(st.st_mode)) return;
  CAST_CHECK_USAGE((st.st_mode & 0222) != 0,
                   "{} {}: is read-only (mode {:04o}); not writing to a file made read-only (make it writable, or "
                   "write elsewhere)",
                   what, path, st.st_mode & 07777);
  const std::string fixed = fixed_attribute(path);
  CAST_CHECK_USAGE(fixed.empty(), "{} {}: is {}, so it cannot be replaced; not writing to it (chattr -i or -a, or "
                   "write elsewhere)",
                   what, path, fixed);
}

void check_name_fits(const std::string& path, const std::string& what, size_t room) {
  constexpr size_t kNameMax = 255, kPathMax = 4096;  // Linux's NAME_MAX and PATH_MAX
  size_t longest = 0;
  for (const fs::path& part : fs::path(path)) longest = std::max(longest, part.native().size());
  CAST_CHECK_USAGE(longest <= kNameMax,
                   "{} {}: the name is too long (a part of {} bytes; a file or folder name holds at most {})", what,
                   path, longest, kNameMax);
  CAST_CHECK_USAGE(path.size() + room < kPathMax, "{} {}: the name is too long (a path holds at most {} bytes)", what,
                   path, kPathMax - 1 - room);
}

std::string output_target(const std::string& path, const std::string& what, Link link) {
  CAST_CHECK(!path.empty(), "{}: no path given", what);
  // the lock of the folder's owner: replaced, it would let a second process in beside it
  CAST_CHECK_USAGE(fs::path(path).filename() != ".cast.lock",
                   "{} {}: is a folder's lock file (.cast.lock), which no output replaces; choose another name", what,
                   path);
  std::string target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    CAST_CHECK_USAGE(link == Link::follow_once,
               "{} {}: is a symbolic link; files in a run or data folder are never written "
               "through a link (remove it)",
               what, path);
    char buffer[4096];
    const ssize_t n = ::readlink(path.c_str(), buffer, sizeof(buffer) - 1);
    CAST_CHECK(n > 0, "{} {}: cannot read the symbolic link: {}", what, path, reason(errno));
    const fs::path to(std::string(buffer, static_cast<size_t>(n)));
    target = (to.is_absolute() ? to : fs::path(folder_of(path)) / to).string();
    struct stat tt {};
    if (::lstat(target.c_str(), &tt) != 0)
      throw UsageError(
          fmt::format("{} {}: a symbolic link to {}: {}; nothing was written", what, path, target, reason(errno)));
    CAST_CHECK_USAGE(!S_ISLNK(tt.st_mode),
               "{} {}: a symbolic link to another link ({}): a chain or a loop; only a link "
               "straight to a regular file is written through",
               what, path, target);
    CAST_CHECK_USAGE(S_ISREG(tt.st_mode), "{} {}: a symbolic link to {}, which is {}; not replacing it", what, path,
                     target,
               kind_of(tt.st_mode));
    check_not_read_only(target, tt, what);
  } else if (::stat(path.c_str(), &st) == 0) {
    CAST_CHECK_USAGE(S_ISREG(st.st_mode), "{} {}: exists and is {}; not replacing it", what, path,
                     kind_of(st.st_mode));
    check_not_read_only(path, st, what);
  } else if (errno != ENOENT) {
    throw Error(fmt::format("{} {}: {}", what, path, reason(errno)));
  }
  check_folder_takes_files(folder_of(target), what, path);
  return target;
}

// The first 4 KiB of an existing output ("" for none).
static std::string head_of(const std::string& path, const std::string& what) {
  const std::string target = output_target(path, what, Link::follow_once);
  if (!exists(target)) return "";
  Fd fd = open_input(target, what);
  std::string head(4096, '\0');
  const ssize_t n = ::read(fd.get(), head.data(), head.size());
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return head;
}

// ---------------------------------------------------------------- what an output may replace
// check_may_replace decides before the command's work; the write comes after it, minutes later
// perhaps. What the check found at each output's path (no file, or which file) is kept here, and
// the write replaces only that: a file made or changed there meanwhile is moved aside first.
namespace {
struct Found {
  bool existed = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Found& o) const {
    return existed == o.existed && dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};
std::mutex g_found_mutex;
std::map<std::string, Found> g_found;  // by the written file's absolute path

std::string found_key(const std::string& target) {
  std::error_code ec;
  const fs::path p = fs::absolute(target, ec);
  return (ec ? fs::path(target) : p).lexically_normal().string();
}
Found found_at(const std::string& target) {
  struct stat st {};
  Found f;
  if (::lstat(target.c_str(), &st) != 0) return f;
  f.existed = true, f.dev = st.st_dev, f.ino = st.st_ino, f.size = st.st_size;
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return f;
}
void remember_found(const std::string& target) {
  const std::lock_guard<std::mutex> guard(g_found_mutex);
  g_found[found_key(target)] = found_at(target);
}

// `path` to `<path>.kept` (or `.kept-2`, ...; never over a file); the name it took.
std::string move_aside(const std::string& path) {
  for (int n = 1;; ++n) {
    const std::string kept = n == 1 ? path + ".kept" : fmt::format("{}.kept-{}", path, n);
    if (::link(path.c_str(), kept.c_str()) == 0) {  // fails where the name is taken: nothing replaced
      if (::unlink(path.c_str()) != 0) {
        const int err = errno;
        ::unlink(kept.c_str());
        throw Error(fmt::format("{}: cannot move it aside to {}: {}", path, kept, reason(err)));
      }
      return kept;
    }
    if (errno != EEXIST) throw Error(fmt::format("{}: cannot move it aside to {}: {}", path, kept, reason(errno)));
  }
}

// Before `target` is replaced: where the check saw another state there (a file made, or the one
// it saw changed), that file is moved aside and named in a note. Nothing where the check did not
// see the path (a run's own files), or the file has gone.
void keep_what_came_since_the_check(const std::string& target, const std::string& what, const std::string& path) {
  Found then;
  {
    const std::lock_guard<std::mutex> guard(g_found_mutex);
    const auto it = g_found.find(found_key(target));
    if (it == g_found.end()) return;
    then = it->second;
  }
  const Found now = found_at(target);
  if (!now.existed || now == then) return;
  const std::string kept = move_aside(target);
  fmt::print("note: {} {} was {} while cast ran: it is kept as {}, and cast's {} is written in its place\n", what, path,
             then.existed ? "changed" : "made", kept, what);
  std::fflush(stdout);
}
void remember_written(const std::string& target) {
  const std::lock_guard<std::mutex> guard(g_found_mutex);
  const auto it = g_found.find(found_key(target));
  if (it != g_found.end()) it->second = found_at(target);  // the next write of it replaces this one
}
}  // namespace

void check_may_replace(const std::string& path, const std::string& what, const std::string& kind, std::string_view mark,
                       bool overwrite, std::string_view remedy, Digest digest) {
  // where it goes is checked now when its folder exists (a read-only folder, a FIFO): no work first
  if (overwrite || !exists(path)) {
    remember_found(exists(folder_of(path)) ? output_target(path, what, Link::follow_once) : path);
    return;
  }
  remember_found(output_target(path, what, Link::follow_once));
  const std::string head = head_of(path, what);
  if (head.empty()) return;
  if (head.find(mark) == std::string::npos)
    throw UsageError(fmt::format("{} {}: exists and is not {}; not replacing it ({})", what, path, kind, remedy));
  if (digest == Digest::none) return;
  const std::string target = output_target(path, what, Link::follow_once), text = read_file(target, what);
  CAST_CHECK_USAGE(text.find(kDigestTag) != std::string::npos,
                   "{} {}: is {} without its digest (written by a cast before digests, or the digest was removed), "
                   "so a change by hand cannot be ruled out; not replacing it ({})",
                   what, path, kind, remedy);
  CAST_CHECK_USAGE(digest_matches(text),
                   "{} {}: is {}, changed since cast wrote it (its digest no longer matches); not replacing it ({})",
                   what, path, kind, remedy);
}

void Fnv1a::add(std::string_view bytes) {
  uint64_t h = value;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  value = h;
}

uint64_t file_fnv1a(const std::string& path, const std::string& what) {
  Fd fd = open_input(path, what);
  Fnv1a h;
  thread_local std::vector<char> chunk(size_t{1} << 20);  // one buffer for the many files of a set
  for (;;) {
    const ssize_t n = ::read(fd.get(), chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    CAST_CHECK(n >= 0, "{} {}: read failed: {}", what, path, reason(errno));
    if (n == 0) return h.value;
    h.add(std::string_view(chunk.data(), static_cast<size_t>(n)));
  }
}

// The hash of `bytes` with the 16 digits at `at` read as '0': FNV-1a over the three pieces.
static uint64_t content_digest(std::string_view bytes, size_t at) {
  Fnv1a h;
  h.add(bytes.substr(0, at));
  h.add("0000000000000000");
  h.add(bytes.substr(at + 16));
  return h.value;
}

std::string with_digest(std::string_view bytes) {
  std::string out(bytes);
  const size_t slot = bytes.find(kDigestSlot);
  if (slot != std::string_view::npos) {
    const size_t at = slot + kDigestTag.size();
    out.replace(at, 16, fmt::format("{:016x}", content_digest(bytes, at)));
  }
  return out;
}

bool digest_matches(std::string_view bytes) {
  size_t tag = bytes.find(kDigestTag);
  if (tag == std::string_view::npos) return true;
  // every tag is tried: one in a path or a command may come before the digest itself
  for (; tag != std::string_view::npos; tag = bytes.find(kDigestTag, tag + 1)) {
    const size_t at = tag + kDigestTag.size();
    if (at + 16 <= bytes.size() && bytes.substr(at, 16) == fmt::format("{:016x}", content_digest(bytes, at)))
      return true;
  }
  return false;
}

bool is_unchanged_cast_output(std::string_view text, std::string_view mark) {
  return text.find(mark) != std::string_view::npos && text.find(kDigestTag) != std::string_view::npos &&
         digest_matches(text);
}

std::string set_aside_if_changed(const std::string& path, std::string_view mark) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec))) return "";
  if (is_unchanged_cast_output(read_file(path, "output"), mark)) return "";
  return move_aside(path);
}

// Creates a temporary file for writing beside `stem` ("<stem>.tmp", else "<stem>.1.tmp", ...):
// exclusively, without following a link, and without removing anything already there. A file
// of that name may be a user's own (an input named like our temporary file) or one a crash
// left: neither is ours to delete, so the next free name is taken. `tmp` receives the name.
// A name the file system takes but whose temporary name it does not (a name of 252 to 255 bytes)
// is written through a short one in the same folder, ".cast-<pid>.tmp".
// A file written in place of `old` keeps its permission bits (not setuid, setgid or sticky), and,
// written by root, its owner: a user's private 0600 file stays private and stays the user's.
static void keep_mode_and_owner(int fd, const struct stat& old) {
  if (::geteuid() == 0) (void)!::fchown(fd, old.st_uid, old.st_gid);
  ::fchmod(fd, old.st_mode & 0777);
}

// `dir`: the folder's descriptor where the file goes into a folder this process holds (the names
// then relative to it), else AT_FDCWD.
static Fd create_exclusive(const std::string& stem, std::string& tmp, const std::string& what,
                           const std::string& path, int dir = AT_FDCWD) {
  std::string base = stem;
  // the first hundred names in turn; past them (a folder full of temporaries that killed writes
  // left), numbers drawn at random, so that leftovers never make a write fail
  std::minstd_rand draw(static_cast<uint32_t>(::getpid()) * 2654435761u ^
                        static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0;; ++attempt) {
    const uint64_t number = attempt < 100 ? static_cast<uint64_t>(attempt) : 100 + draw() % 999999900;
    tmp = attempt == 0 ? base + ".tmp" : fmt::format("{}.{}.tmp", base, number);
    const std::string name = dir == AT_FDCWD ? tmp : fs::path(tmp).filename().string();
    Fd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() >= 0) return fd;
    const int err = errno;
    if (err == ENAMETOOLONG && base == stem) {
      base = fmt::format("{}/.cast-{}", folder_of(stem), ::getpid());
      attempt = -1;
      continue;
    }
    if ((err != EEXIST && err != ELOOP) || attempt >= 1100)
      throw Error(fmt::format("{} {}: cannot create {}: {}", what, path, tmp, reason(err)));
  }
}

static void write_all(int fd, std::string_view bytes, const std::string& what, const std::string& path) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(fmt::format("{} {}: write failed: {}", what, path, reason(n < 0 ? errno : ENOSPC)));
    done += static_cast<size_t>(n);
  }
}

namespace {
// The temporary files being written, in fixed slots that a signal handler may read, so that a
// process ended at once (remove_temporaries_now) leaves none of them behind.
constexpr size_t kTempSlots = 32, kTempPathBytes = 4096;
struct TempSlot {
  std::atomic<int> state{0};  // 0: free, 1: being filled, 2: names a file being written
  char path[kTempPathBytes];
};
TempSlot g_temps[kTempSlots];
static_assert(std::atomic<int>::is_always_lock_free);

// Names `path` in a free slot while it lives (a path too long, or no slot free: not named).
class TemporaryInFlight {
 public:
  explicit TemporaryInFlight(const std::string& path) {
    if (path.size() >= kTempPathBytes) return;
    for (size_t i = 0; i < kTempSlots; ++i) {
      int free = 0;
      if (!g_temps[i].state.compare_exchange_strong(free, 1)) continue;
      std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
      g_temps[i].state.store(2);
      slot_ = static_cast<int>(i);
      return;
    }
  }
  ~TemporaryInFlight() {
    if (slot_ >= 0) g_temps[slot_].state.store(0);
  }
  TemporaryInFlight(const TemporaryInFlight&) = delete;
  TemporaryInFlight& operator=(const TemporaryInFlight&) = delete;

 private:
  int slot_ = -1;
};
}  // namespace

void remove_temporaries_now() {
  for (TempSlot& t : g_temps)
    if (t.state.load() == 2) ::unlink(t.path);
}

int held_folder_descriptor(const std::string& folder);  // below, with the folder locks

void write_atomic(const std::string& path, std::string_view bytes, const std::string& what, Link link, Flush flush,
                  const std::string& mode_like) {
  // a file or link made at the path itself since the check (a link is refused by output_target)
  keep_what_came_since_the_check(path, what, path);
  const std::string target = output_target(path, what, link);
  // Into a folder this process holds (a run's), the file is made and renamed relative to the
  // folder's descriptor, not its path: a folder moved, or hidden by one mounted at its path,
  // between the holder's check and this write gets the file, and whatever now has the path
  // gets nothing. Elsewhere, by path.
  const int held = held_folder_descriptor(folder_of(target));
  const int dir = held >= 0 ? held : AT_FDCWD;
  const std::string name = held >= 0 ? fs::path(target).filename().string() : target;
  std::string tmp;
  Fd fd = create_exclusive(target, tmp, what, path, dir);
  const std::string tmp_name = held >= 0 ? fs::path(tmp).filename().string() : tmp;
  const TemporaryInFlight in_flight(tmp);
  try {  // on any failure the temporary file goes and the old file stays as it was
    // the replacement keeps the old file's mode (a private 0600 stays private)
    struct stat old {};
    if (::fstatat(dir, name.c_str(), &old, 0) == 0 && S_ISREG(old.st_mode)) keep_mode_and_owner(fd.get(), old);
    else if (!mode_like.empty() && ::stat(mode_like.c_str(), &old) == 0 && S_ISREG(old.st_mode))
      keep_mode_and_owner(fd.get(), old);
    write_all(fd.get(), bytes, what, path);
    CAST_CHECK(flush == Flush::with_folder || ::fsync(fd.get()) == 0, "{} {}: flush to disk failed: {}", what, path,
               reason(errno));
    CAST_CHECK(::close(fd.release()) == 0, "{} {}: close failed: {}", what, path, reason(errno));
    keep_what_came_since_the_check(target, what, path);
    CAST_CHECK(::renameat(dir, tmp_name.c_str(), dir, name.c_str()) == 0, "{} {}: cannot move the new file into place: {}",
               what, path, reason(errno));
    remember_written(target);
  } catch (...) {
    ::unlinkat(dir, tmp_name.c_str(), 0);
    throw;
  }
  if (flush == Flush::with_folder) return;
  if (held >= 0) {
    ::fsync(held);  // the rename itself reaches the disk
    return;
  }
  Fd folder(::open(folder_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder.get() >= 0) ::fsync(folder.get());
}

void write_stamped(const std::string& path, std::string_view bytes, const std::string& what, Link link,
                   const std::string& mode_like) {
  write_atomic(path, with_digest(bytes), what, link, Flush::now, mode_like);
}

void flush_file_system(const std::string& folder, const std::string& what) {
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CAST_CHECK(dir.get() >= 0, "{} {}: cannot open it to flush it to disk: {}", what, folder, reason(errno));
  CAST_CHECK(::syncfs(dir.get()) == 0, "{} {}: flush to disk failed: {}", what, folder, reason(errno));
}

// The nearest folder above `path` that exists: where a new folder chain would start.
static std::string existing_ancestor(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  while (true) {
    if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();  // "a/b/" → "a/b"
    p = p.parent_path();
    if (p.empty()) return ".";
    if (exists(p.string())) return p.string();
  }
}

namespace {
// "a/../b" with no folder a: the system climbs out of no missing folder, and making a only to
// climb out of it would leave an empty folder behind
void check_no_climb_out_of_missing(const std::string& folder, const std::string& what) {
  fs::path so_far;
  for (const fs::path& part : fs::path(folder)) {
    if (part == ".." && !so_far.empty() && !exists(so_far.string()))
      throw UsageError(fmt::format("{} {}: '{}' does not exist, so the '..' after it leads nowhere; give the path "
                                   "without them",
                                   what, folder, so_far.string()));
    so_far /= part;
  }
}
}  // namespace

void check_output_folder(const std::string& folder, const std::string& what) {
  struct stat link {};
  if (::lstat(folder.c_str(), &link) != 0) return check_no_climb_out_of_missing(folder, what);  // it will be made
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    const int err = errno;
    // something is there (lstat found it): a loop, or a link to nothing, names no folder
    if (err == ELOOP) throw UsageError(fmt::format("{} {}: {}", what, folder, reason(err)));
    if (err == ENOENT)
      throw UsageError(
          fmt::format("{} {}: {}; make that folder or give another path", what, folder, unreachable(folder, err)));
    throw Error(fmt::format("{} {}: {}", what, folder, reason(err)));
  }
  CAST_CHECK_USAGE(S_ISDIR(st.st_mode), "{} {}: is {}, not a folder", what, folder,
                   S_ISREG(st.st_mode) ? "a file" : kind_of(st.st_mode));
  // the root holds the whole system's folders: what cast writes (and may replace) goes in a folder of its own
  struct stat root {};
  CAST_CHECK_USAGE(::stat("/", &root) != 0 || st.st_dev != root.st_dev || st.st_ino != root.st_ino,
                   "{} {}: is the root folder of the file system; give a folder of its own", what, folder);
}


void check_folder_can_be_made(const std::string& folder, const std::string& what) {
  check_output_folder(folder, what);
  check_folder_takes_files(exists(folder) ? folder : existing_ancestor(folder), what, folder);
}

void make_writable_folder(const std::string& folder, const std::string& what) {
  check_output_folder(folder, what);  // a FIFO, a file or a link loop is refused by name
  if (!exists(folder)) {
    // never made inside a folder another cast process holds (a run training, a comparison, a
    // command writing an output there), however deep
    for (const std::string& above : cast_folders_above(existing_ancestor(folder)))
      check_not_held_elsewhere(above, fmt::format("{} {}: folder", what, folder));
    // nothing is created under a read-only folder, even by root
    check_folder_takes_files(existing_ancestor(folder), what, folder);
    std::error_code ec;
    fs::create_directories(folder, ec);
    if (ec) throw Error(fmt::format("{} {}: cannot create the folder: {}", what, folder, reason(ec.value())));
  }
  std::string probe;
  check_folder_takes_files(folder, what, folder);
  Fd fd = create_exclusive(folder + "/.write_test", probe, what, folder);
  try {
    write_all(fd.get(), "ok", what, folder);
  } catch (const Error& e) {  // a full disk: nothing of the folder's own has changed yet
    ::unlink(probe.c_str());
    throw Error(fmt::format("{} {}: takes no new file (a test write of 2 bytes failed: {}); nothing in it was "
                            "changed",
                            what, folder, std::string(e.what()).substr(std::string(e.what()).rfind(": ") + 2)));
  } catch (...) {
    ::unlink(probe.c_str());
    throw;
  }
  ::unlink(probe.c_str());
}

namespace {
// The folders this process holds, by their absolute, normalised path.
std::mutex g_held_mutex;
std::multiset<std::string> g_held;
std::multimap<std::string, int> g_held_dirs;  // each held folder's descriptor, by key

std::string held_key(const std::string& folder) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(folder, ec), ec);
  return ec ? folder : p.string();
}
}  // namespace

// The descriptor of a folder this process holds (FolderLock), by its path as it is now, or -1.
int held_folder_descriptor(const std::string& folder) {
  const std::string key = held_key(folder);
  const std::lock_guard<std::mutex> guard(g_held_mutex);
  const auto it = g_held_dirs.find(key);
  return it == g_held_dirs.end() ? -1 : it->second;
}

bool held_here(const std::string& folder) {
  const std::string key = held_key(folder);
  const std::lock_guard<std::mutex> guard(g_held_mutex);
  return g_held.contains(key);
}

namespace {
// The folders this process writes an output into while another cast process may own them: a
// shared lock on each folder, kept to the end of the process (by key, as g_held).
std::map<std::string, Fd> g_shared;

// "another cast process (pid N)": the pid the lock file names where its holder wrote one (a
// FolderLock), "unknown" where the folder is held by an output's writer (share_folder)
std::string holder_of(const std::string& folder) {
  Fd fd(::open((folder + "/.cast.lock").c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return "unknown";
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return "unknown";  // nobody holds the file: a writer of outputs
  char holder[32] = {};
  const ssize_t n = ::pread(fd.get(), holder, sizeof holder - 1, 0);
  std::string pid(holder, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  pid = pid.substr(0, pid.find_first_not_of("0123456789"));
  return pid.empty() ? "unknown" : pid;
}

Error in_use_error(const std::string& what, const std::string& folder) {
  return Error(fmt::format("{} {} is in use by another cast process (pid {}): wait for it to end, or choose another "
                           "folder",
                           what, folder, holder_of(folder)));
}

// flock(`op`, without waiting) on `fd`, the folder or (`lock_file`) its lock file: where another
// process's lock stands in the way, the in-use line; any other failure named as such.
void lock_or_refuse(int fd, int op, const std::string& what, const std::string& folder,
                    const std::string& lock_file = "") {
  if (::flock(fd, op | LOCK_NB) == 0) return;
  const int err = errno;
  CAST_CHECK(err == EWOULDBLOCK, "{} {}: cannot lock it{}: {}", what, folder,
             lock_file.empty() ? "" : " (" + lock_file + ")", reason(err));
  throw in_use_error(what, folder);
}
}  // namespace

std::vector<std::string> cast_folders_above(const std::string& folder) {
  std::vector<std::string> found;
  const auto look = [&](const fs::path& p) {
    if (exists((p / ".cast.lock").string())) found.push_back(p.string());
  };
  fs::path p = fs::path(folder.empty() ? "." : folder).lexically_normal();
  if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();  // "a/b/" → "a/b"
  // as the user spelled it while it goes down from here ("C/run" and "C"), then from the
  // working folder up, as absolute paths
  if (p.is_relative() && *p.begin() != "..") {
    for (; !p.empty() && p != "."; p = p.parent_path()) look(p);
    std::error_code ec;
    p = fs::current_path(ec);
    if (ec) return found;
  } else {
    std::error_code ec;
    p = fs::absolute(p, ec).lexically_normal();
    if (ec) return found;
  }
  for (;; p = p.parent_path()) {
    look(p);
    if (!p.has_relative_path()) break;  // the root
  }
  // and the folders it really lies in, its links resolved (a link into a held folder, "link/.."),
  // where the spelled path did not pass them
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::absolute(folder.empty() ? "." : folder, ec), ec);
  if (ec) return found;
  std::set<std::string> seen;
  for (const std::string& f : found) seen.insert(held_key(f));
  for (;; real = real.parent_path()) {
    if (exists((real / ".cast.lock").string()) && seen.insert(held_key(real.string())).second)
      found.push_back(real.string());
    if (!real.has_relative_path()) break;
  }
  return found;
}

void check_not_held_elsewhere(const std::string& folder, const std::string& what) {
  if (held_here(folder)) return;
  {
    const std::lock_guard<std::mutex> guard(g_held_mutex);
    if (g_shared.contains(held_key(folder))) return;  // shared here: a probe would meet this process's own lock
  }
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) lock_or_refuse(dir.get(), LOCK_EX, what, folder);  // let go with `dir`
}

void share_folder(const std::string& folder, const std::string& what) {
  if (held_here(folder)) return;
  const std::string key = held_key(folder);
  const std::lock_guard<std::mutex> guard(g_held_mutex);
  if (g_shared.contains(key)) return;
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return;  // no folder to hold: the write names what is wrong with it
  lock_or_refuse(dir.get(), LOCK_SH, what, folder);
  g_shared.emplace(key, std::move(dir));
}

bool FolderLock::still_at(const std::string& path) const {
  if (dir_.get() < 0) return true;
  struct stat held {}, there {};
  if (::fstat(dir_.get(), &held) != 0) return true;  // cannot tell: the write says what is wrong
  return ::stat(path.c_str(), &there) == 0 && there.st_dev == held.st_dev && there.st_ino == held.st_ino;
}

std::string FolderLock::path_now() const {
  if (dir_.get() < 0) return "";
  std::error_code failed;
  const std::filesystem::path now = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(dir_.get()), failed);
  return failed ? "" : now.string();
}

FolderLock::FolderLock(FolderLock&& other) noexcept
    : fd_(std::move(other.fd_)), dir_(std::move(other.dir_)), held_(std::exchange(other.held_, std::string())) {}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    forget();
    fd_ = std::move(other.fd_);  // closes this one's file and folder, letting go of their locks
    dir_ = std::move(other.dir_);
    held_ = std::exchange(other.held_, std::string());
  }
  return *this;
}

FolderLock::~FolderLock() { forget(); }

void FolderLock::forget() {
  if (held_.empty()) return;
  const std::lock_guard<std::mutex> guard(g_held_mutex);
  if (auto it = g_held.find(held_); it != g_held.end()) g_held.erase(it);
  for (auto it = g_held_dirs.find(held_); it != g_held_dirs.end() && it->first == held_; ++it)
    if (it->second == dir_.get()) {
      g_held_dirs.erase(it);
      break;
    }
  held_.clear();
}

FolderLock::FolderLock(const std::string& folder, const std::string& what) {
  const std::string path = folder + "/.cast.lock";
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (fd.get() < 0 && errno == ELOOP)  // O_NOFOLLOW's answer for any link, not only a loop
    throw Error(
        fmt::format("{} {}: its lock file {} is a symbolic link; not following it (remove it)", what, folder, path));
  if (fd.get() < 0)
    throw Error(fmt::format("{} {}: cannot open its lock file {}: {}", what, folder, path, reason(errno)));
  struct stat st {};
  CAST_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode), "{} {}: its lock file {} is {}", what, folder, path,
             kind_of(st.st_mode));
  {  // a folder this process shares for an output it writes there (share_folder) it now holds alone
    const std::lock_guard<std::mutex> guard(g_held_mutex);
    g_shared.erase(held_key(folder));
  }
  // The folder itself is locked too: a lock file deleted under a running process (a clean-up of
  // dot files) would otherwise let a second one in beside it.
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CAST_CHECK(dir.get() >= 0, "{} {}: cannot open it to lock it: {}", what, folder, reason(errno));
  lock_or_refuse(dir.get(), LOCK_EX, what, folder);
  lock_or_refuse(fd.get(), LOCK_EX, what, folder, path);
  const std::string pid = std::to_string(::getpid());
  // the pid, for the message only, and only over a pid or nothing: a file of another kind under
  // this name (a checkpoint copied there, a user's note) is locked as it is, never rewritten
  char held[24] = {};
  const ssize_t n = ::pread(fd.get(), held, sizeof held, 0);
  std::string before(held, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  while (!before.empty() && std::isspace(static_cast<unsigned char>(before.back()))) before.pop_back();  // "1\n"
  if (st.st_size <= 20 && before.find_first_not_of("0123456789") == std::string::npos && ::ftruncate(fd.get(), 0) == 0)
    (void)!::pwrite(fd.get(), pid.data(), pid.size(), 0);
  fd_ = std::move(fd);
  dir_ = std::move(dir);
  held_ = held_key(folder);
  const std::lock_guard<std::mutex> guard(g_held_mutex);
  g_held.insert(held_);
  g_held_dirs.emplace(held_, dir_.get());
}

AppendFile::AppendFile(const std::string& path, bool truncate, const std::string& what) : path_(path), what_(what) {
  check_folder_takes_files(folder_of(path), what, path);
  struct stat old {};
  const bool there = ::lstat(path.c_str(), &old) == 0;
  if (there) check_not_read_only(path, old, what);
  const bool fresh = truncate && there && S_ISREG(old.st_mode);
  // A new file replaces an old regular file by unlinking it, never by emptying it: the old
  // inode may have other names (a hard link) whose content must survive.
  if (fresh) CAST_CHECK(::unlink(path.c_str()) == 0, "{} {}: cannot replace it: {}", what, path, reason(errno));
  // O_NOFOLLOW: a planted link is refused; O_NONBLOCK: a FIFO with no reader fails, never waits
  const int flags = truncate ? O_EXCL : O_APPEND;
  fd_ = Fd(::open(path.c_str(), O_WRONLY | O_CREAT | flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (fd_.get() >= 0 && fresh) keep_mode_and_owner(fd_.get(), old);  // the new file in the old one's place
  if (fd_.get() < 0) {
    const int err = errno;
    struct stat st {};
    const bool link = err == ELOOP || (err == EEXIST && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode));
    throw Error(fmt::format("{} {}: cannot open for writing: {}", what, path,
                            link            ? "is a symbolic link; not following it (remove it)"
                            : err == EEXIST ? "exists and is not a regular file; not replacing it"
                                            : reason(err)));
  }
  struct stat st {};
  CAST_CHECK(::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode), "{} {}: is {}, not a regular file", what, path,
             kind_of(st.st_mode));
  ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_NONBLOCK);
}

void AppendFile::append(std::string_view text) {
  // made read-only since it was opened (chmod a-w): the open descriptor could still write, but
  // a read-only file is never appended to, as at the start
  struct stat st {}, there {};
  // removed, or something else put at its name: the records would go into a file nobody sees
  const bool same = ::fstat(fd_.get(), &st) == 0 && ::lstat(path_.c_str(), &there) == 0 && S_ISREG(there.st_mode) &&
                    there.st_dev == st.st_dev && there.st_ino == st.st_ino;
  if (!same)
    throw Error(fmt::format("{} {}: was removed or replaced while it was written; nothing more is appended to it",
                            what_, path_));
  if (S_ISREG(st.st_mode) && (st.st_mode & 0222) == 0)
    throw Error(fmt::format("{} {}: was made read-only (mode {:04o}) while it was written; nothing more is appended "
                            "to it (make it writable again)",
                            what_, path_, st.st_mode & 07777));
  // a write cut short (a full disk, a file-size limit) is taken back: no torn last line
  const off_t before = ::lseek(fd_.get(), 0, SEEK_END);
  try {
    write_all(fd_.get(), text, what_, path_);
  } catch (...) {
    if (before >= 0 && ::ftruncate(fd_.get(), before) != 0) {
    }
    throw;
  }
}

}  // namespace cast::files
