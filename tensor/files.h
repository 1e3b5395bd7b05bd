#pragma once
// Every file the engine reads or writes goes through here, so that the rules hold everywhere:
//  - an input is a regular file (or, where a folder is asked for, a folder), checked before it is
//    read: a FIFO, socket or device is one clear error and never blocks;
//  - an output is written to `<target>.tmp` (created with O_EXCL | O_NOFOLLOW: a planted symlink
//    is refused, never followed), flushed to disk and renamed over the target, so a crash or an
//    error never leaves half a file and never replaces anything else;
//  - an output is never one of the same command's inputs (compared by device and inode);
//  - messages name what the file is for, its path as the user gave it, and the reason.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace cast::files {

// How a write treats a symbolic link at the output path itself. `follow_once`: a path the user
// named (--out) may be a link straight to a regular file, which is replaced and the link kept;
// a link to a link (a chain or a loop), a dangling link or a link to anything else is refused.
// `refuse`: files the engine names itself in a run or data folder are never written through a
// link.
enum class Link { follow_once, refuse };

// A readable description of errno for messages ("permission denied", "no such file or folder").
std::string reason(int err);

// Why a write to standard output failed: reason(err), or, where it was closed when the command
// started (and reopened on /dev/full so that its writes fail as a closed one's would, and no file
// takes descriptor 1), that.
void note_standard_output_closed_at_start();
std::string standard_output_failure(int err);
bool standard_output_was_terminal();  // as the process started
// Whether something is mounted at `path` (a mount point in /proc/self/mountinfo): a file or folder
// there is not the one the path named before.
bool is_mount_point(const std::string& path);

// True when both paths name existing files that are one file (same device and inode; links
// followed), whatever their spelling.
bool same_file(const std::string& a, const std::string& b);
// True when both paths name one file, or would once written: same_file, or the same absolute
// path once links and `.`/`..` are resolved (a file not made yet: "o.st", "./o.st", "d/../o.st").
bool same_path(const std::string& a, const std::string& b);
// A usage error when `output` is the same file as one of `inputs`: `what` names the output.
void check_not_an_input(const std::string& output, const std::string& what, const std::vector<std::string>& inputs);
// Refuses an output inside `folder` (however spelled, through links), a data folder the same
// command reads: its files are inputs whatever their names, so --overwrite cannot replace them.
void check_not_inside(const std::string& output, const std::string& what, const std::string& folder,
                      const std::string& folder_what);

// The path's kind for messages: "a folder", "a FIFO (named pipe)", "a socket", "a device", ...
// or "" for a regular file or a path that does not exist.
std::string odd_kind(const std::string& path);

// `path` is an existing folder (links followed), else an error naming `what`.
void require_folder(const std::string& path, const std::string& what);
// `path` exists (links followed) and is a regular file; no bytes are read.
void require_file(const std::string& path, const std::string& what);
bool exists(const std::string& path);  // anything there, a dangling link included
// Whether the file at `path` was modified later than `slack_seconds` after `reference` was: a cast
// output changed by hand (or copied in) after the file that marks its set complete was written
// (which is written last, so an untouched output is never the newer).
// False where either cannot be read.
bool modified_after(const std::string& path, const std::string& reference, double slack_seconds = 0.0);

// An open file descriptor, closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Opens an input: a regular file (links followed), opened without blocking (a FIFO that slipped
// in between the check and the open is refused too). The descriptor is blocking again on return.
Fd open_input(const std::string& path, const std::string& what);
// The whole of a regular file, read to its end; refused when larger than `max_bytes` (before
// reading where its size is known, else once the bytes read pass it).
constexpr uint64_t kDefaultMaxBytes = uint64_t{1} << 32;
std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes = kDefaultMaxBytes);
// Calls fn(line, number) for each line of a regular file (without its '\n'; numbers from 1), read
// as a stream: a data file is never held whole in memory.
void for_each_line(const std::string& path, const std::string& what,
                   const std::function<void(std::string& line, int64_t number)>& fn);
// A JSON document from a file (or text), errors naming the file and the place, without the JSON
// library's internals.
nlohmann::json read_json(const std::string& path, const std::string& what);
// A value nested deeper than kMaxJsonDepth (no file of ours nests past 4) is refused: printing
// or copying one a hundred thousand levels deep would overflow the stack.
constexpr int kMaxJsonDepth = 32;
nlohmann::json parse_json(const std::string& text, const std::string& where);
// What parse_json_checking_keys found besides the value: the first key given twice in one object
// (with its depth, 1 for the outermost object's keys), and nesting past kMaxJsonDepth.
struct JsonKeys {
  std::string duplicate;
  int duplicate_depth = 0;
  bool too_deep = false;
};
// The JSON text [begin, end) parsed, after one SAX pass that checks its keys and depth (the
// parser itself keeps the last of two equal keys without a word). Both passes take linear time:
// the parser's callback interface walks an object's members each time one of them ends, which is
// quadratic in the members (a safetensors header of 40 000 tensors took 37 s). Where `keys`
// reports a problem nothing is parsed and the value is null; a syntax error throws the parser's
// exception.
nlohmann::json parse_json_checking_keys(const char* begin, const char* end, JsonKeys& keys);
// A JSON value for an error line: at most 60 characters of it, "..." where it was cut.
std::string json_excerpt(const nlohmann::json& value);
// The JSON library's message without its "[json.exception.parse_error.101] " prefix.
std::string json_message(const std::exception& e);

// The file a write to `path` replaces, by the rule of `link` (see Link); refuses a folder, a
// FIFO, a device, a link chain or loop, and a missing or read-only folder. Nothing is created.
std::string output_target(const std::string& path, const std::string& what, Link link);
// The rule for every output that exists already (docs/training.md, "What a command replaces"):
// it is replaced only when the same kind of cast output made it, recognised by `mark` among its
// first 4 KiB, and nobody changed it since (its digest, where it has one, matches), or when the
// user said so (`overwrite`, the command's --overwrite). Else a usage error naming the option, the
// file, what it is not or that it was changed, and --overwrite. A missing or empty file passes.
// Whether an output of a kind carries a digest (every kind but a run's metrics.jsonl, which grows
// by appends): one of such a kind without it (cast wrote it before digests, or it was removed)
// may have been changed, and is refused as one that was.
enum class Digest { required, none };
void check_may_replace(const std::string& path, const std::string& what, const std::string& kind, std::string_view mark,
                       bool overwrite,
                       std::string_view remedy = "pass --overwrite to replace it, or choose another path",
                       Digest digest = Digest::required);
// The mark of every figure the engine draws (figures/plot.cpp puts it in each SVG).
constexpr std::string_view kFigureMark = "<!-- drawn by cast -->";

// A cast output's content digest, which tells it from a copy changed by hand: kDigestTag and 16
// hex digits, the 64-bit FNV-1a hash of the whole file read with those 16 digits as '0'. A writer
// places kDigestSlot in an output and writes it with write_stamped, which fills it.
// check_may_replace refuses a marked output whose digest no longer matches, or that has none.
constexpr std::string_view kDigestTag = "cast-digest-";
constexpr std::string_view kDigestSlot = "cast-digest-0000000000000000";
// The 64-bit FNV-1a hash, fed in pieces; and a file's, read 1 MiB at a time.
struct Fnv1a {
  uint64_t value = 0xcbf29ce484222325ull;
  void add(std::string_view bytes);
};
uint64_t file_fnv1a(const std::string& path, const std::string& what);
// `bytes` with their first digest slot (kDigestSlot exactly: a tag followed by other text, in a
// path or a command, is left alone) filled in.
std::string with_digest(std::string_view bytes);
// Whether `bytes` hold no digest tag, or one whose digits match them.
bool digest_matches(std::string_view bytes);
// Whether `text` is cast's output of the kind `mark` names, unchanged since cast wrote it: the
// mark, a digest, and the digest matching (what a command may replace or remove of its own).
bool is_unchanged_cast_output(std::string_view text, std::string_view mark);

// Before a command writes an output of its own folder again (a run's summary.json and curves.svg
// at its end): a regular file there that is not cast's unchanged output of that kind (`mark`
// missing, or its digest missing or not matching: changed by hand while the command ran) is moved
// aside, not replaced, to `<path>.kept` (or `.kept-2`, `.kept-3`, ...; never over a file), and
// that name is returned for the command's note. "" where nothing was moved: no file there, or
// anything but a regular file (the write's own rules refuse those), or cast's unchanged output.
std::string set_aside_if_changed(const std::string& path, std::string_view mark);

// When a written file reaches the disk: `now` (flushed with its folder before write_atomic
// returns), or `with_folder`: a file among thousands of one data set, flushed together by
// flush_file_system before the file that completes the set is written.
enum class Flush { now, with_folder };

// Writes `bytes` to `path` atomically: a temporary file beside it (`<target>.tmp`, or the next
// free `<target>.N.tmp`: created exclusively, no link followed, nothing there removed), flush,
// rename, flush of the folder.
// The file replaced keeps its permission bits; a new one takes those of `mode_like` where given
// and there (a run's summary.json those of its checkpoint, which the user may have made private).
void write_atomic(const std::string& path, std::string_view bytes, const std::string& what,
                  Link link = Link::follow_once, Flush flush = Flush::now, const std::string& mode_like = "");
// write_atomic of an output that carries kDigestSlot, filled in first (with_digest).
void write_stamped(const std::string& path, std::string_view bytes, const std::string& what,
                   Link link = Link::follow_once, const std::string& mode_like = "");
// Removes the temporary files write_atomic is writing, on any thread: for a process about to end
// at once (a second Ctrl-C), which would leave them behind. Async-signal-safe.
void remove_temporaries_now();
// Flushes every file written on the file system that holds `folder` (syncfs).
void flush_file_system(const std::string& folder, const std::string& what);
// An output folder the command names: nothing there (it is made), or a folder; a file, a FIFO, a
// device, a link loop or a dangling link is a usage error naming what it is.
void check_output_folder(const std::string& folder, const std::string& what);
// A path the file system can name: no part longer than 255 bytes and the whole, with `room` bytes
// more for the files it will hold, under 4096. A usage error "<what> <path>: the name is too long"
// otherwise, said before any work where a later status() would fail with the library's words.
void check_name_fits(const std::string& path, const std::string& what, size_t room = 0);
// Creates `folder` (and its parents) when missing and checks that a file can be made in it, with
// a probe file created exclusively and removed again.
void make_writable_folder(const std::string& folder, const std::string& what);
// What make_writable_folder would refuse, said without making anything: the folder (or, where it
// is missing, the nearest folder above it) is a folder that takes files.
void check_folder_can_be_made(const std::string& folder, const std::string& what);

// Holds a folder for this process: an exclusive lock (flock) on `<folder>/.cast.lock`, taken
// before the folder's files are written and let go when the object goes or the process ends,
// however it ends. A folder another process holds is refused with one line naming the folder and
// the holder's pid; nothing in it is touched. The lock file stays (removing it would let two
// processes lock two different files of one name).
class FolderLock {
 public:
  FolderLock() = default;
  FolderLock(const std::string& folder, const std::string& what);
  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  ~FolderLock();
  // Where the held folder is now (it may have been moved while held): its absolute path, or ""
  // where that cannot be told (not held, or not on Linux's /proc).
  std::string path_now() const;
  // Whether `path` still names the held folder (not moved away, nor another folder put at its
  // name); true where nothing is held.
  bool still_at(const std::string& path) const;

 private:
  void forget();  // leaves held_here()'s list
  Fd fd_;   // the lock file, which names the holder's pid
  Fd dir_;  // the folder, locked as well: it holds even where the lock file was deleted
  std::string held_;  // the folder, as held_here() knows it
};
// True when this process holds `folder` (a FolderLock of it is alive here).
bool held_here(const std::string& folder);
// Takes a shared lock on `folder`, kept until the process ends, for an output this process writes
// into a folder cast holds for a run or a comparison: refused with one line naming the holder's
// pid while another cast process holds it (a FolderLock), and while it is kept, no other process
// takes the folder (a training started meanwhile is refused). Nothing where this process holds it.
void share_folder(const std::string& folder, const std::string& what);
// `folder` and the folders above it that hold `.cast.lock` (a run's, a comparison's or a data
// set's folder), nearest first: as spelled in `folder` where they are part of it, the others
// (above the working folder) as absolute paths.
std::vector<std::string> cast_folders_above(const std::string& folder);
// Refused with the line share_folder gives while any other cast process holds `folder`, shared or
// alone (nothing is made inside it); nothing is kept held.
void check_not_held_elsewhere(const std::string& folder, const std::string& what);

// A file written line by line (metrics.jsonl): opened without following a link and without
// blocking, a regular file only; each append is written whole or is an error.
class AppendFile {
 public:
  AppendFile(const std::string& path, bool truncate, const std::string& what);
  void append(std::string_view text);

 private:
  std::string path_, what_;
  Fd fd_;
};

}  // namespace cast::files
