// The block scheduler of the CUDA emulation: fibers, barriers, warp collectives and the
// shared-memory checker. See emulator.h for what it models and docs/engine.md for what it cannot.
#include "cuda/emulation/emulator.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <unordered_map>
#include <vector>

#include "tensor/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CAST_EMU_ASAN 1
#endif

// ---------------------------------------------------------------- context switch
// x86-64 (System V): a fiber switch saves the callee-saved registers and the FP control words
// on the old stack and restores them from the new one. No system call, where ucontext's
// swapcontext makes two (signal masks) and made the emulated tests several times slower.
#if defined(__x86_64__)
extern "C" void cast_emu_switch(void** save_sp, void* new_sp);
asm(R"(
  .text
  .globl cast_emu_switch
  .type cast_emu_switch, @function
cast_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cast_emu_switch, .-cast_emu_switch
)");
#else
#include <ucontext.h>
#endif

namespace cast::emu {

namespace {

enum class State { runnable, at_barrier, at_warp, done };

struct Fiber {
#if defined(__x86_64__)
  void* sp = nullptr;  // saved stack pointer while suspended
#else
  ucontext_t context{};
#endif
  std::vector<char> stack;
#if defined(CAST_EMU_ASAN)
  // The lowest address ASan may have left poisoned: the frames alive when the fiber last switched
  // away lie above it (frames that returned unpoisoned their own redzones). Null: a fresh stack.
  char* poisoned_from = nullptr;
#endif
  ThreadView view;
  int tid = 0;
  State state = State::done;
  const char* file = nullptr;  // where it waits
  int line = 0;
  uint64_t awaited = 0;  // the warp generation it waits to see completed
  // cp.async copies issued and not yet waited for: the committed groups, oldest first, and the
  // copies issued since the last commit
  std::vector<std::vector<std::function<void()>>> async_groups;
  std::vector<std::function<void()>> async_open;
};

struct WarpState {
  int arrived = 0;
  unsigned mask = 0;
  WarpOp op = WarpOp::sync;
  WarpApply apply = nullptr;  // WarpOp::exchange
  int width = 32;
  const char* file = nullptr;
  int line = 0;
  uint64_t payload[32] = {}, result[32] = {};
  int arg[32] = {};
  uint64_t generation = 0;
};

// Who touched one shared element since the last barrier.
struct Shadow {
  uint32_t epoch = 0;
  int32_t writer = -1, reader = -1;
  bool many_readers = false;
  int32_t atomic_by = -1;  // a thread that updated it atomically this epoch
  bool many_atomics = false;
};

struct Block {
  const char* kernel = "";
  Dim3 grid, dim, idx;
  int threads = 0;
  std::vector<WarpState> warps;
  uint32_t epoch = 1;  // barrier phase: shadows of an earlier phase are stale
  std::unordered_map<const void*, std::vector<Shadow>> shadows;
  std::vector<unsigned char> dynamic_shared;
  std::string error;  // the first failure found inside a fiber
};

#if defined(CAST_EMU_ASAN)
constexpr size_t kStackBytes = 512 * 1024;  // ASan's redzones and fake frames
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

thread_local Block* g_block = nullptr;
thread_local Fiber* g_fiber = nullptr;
#if defined(__x86_64__)
thread_local void* g_main_sp = nullptr;
#else
thread_local ucontext_t g_main;
#endif
thread_local const std::function<void()>* g_kernel = nullptr;
thread_local std::vector<Fiber> g_fibers;
#if defined(CAST_EMU_ASAN)
thread_local const void* g_main_stack_bottom = nullptr;
thread_local size_t g_main_stack_size = 0;
#endif
Stats g_stats;

std::string coords(const Dim3& d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }

std::string where() {
  if (!g_block) return "outside a kernel";
  std::string s = fmt::format("kernel {}, block {}", g_block->kernel, coords(g_block->idx));
  if (g_fiber) s += fmt::format(", thread {}", coords(g_fiber->view.thread_idx));
  return s;
}

// "0-31, 64, 70-71": a compact list of thread numbers
std::string thread_list(const std::vector<int>& tids) {
  std::string s;
  for (size_t i = 0; i < tids.size();) {
    size_t j = i;
    while (j + 1 < tids.size() && tids[j + 1] == tids[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + (j == i ? std::to_string(tids[i]) : fmt::format("{}-{}", tids[i], tids[j]));
    i = j + 1;
  }
  return s;
}

// ---------------------------------------------------------------- switching
void raw_switch_to(Fiber& f) {
#if defined(__x86_64__)
  cast_emu_switch(&g_main_sp, f.sp);
#else
  swapcontext(&g_main, &f.context);
#endif
}

void raw_switch_back(Fiber& f) {
#if defined(__x86_64__)
  cast_emu_switch(&f.sp, g_main_sp);
#else
  swapcontext(&f.context, &g_main);
#endif
}

void switch_to_fiber(Fiber& f) {
  g_fiber = &f;
#if defined(CAST_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.data(), f.stack.size());
  raw_switch_to(f);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  raw_switch_to(f);
#endif
  g_fiber = nullptr;
}

// From the running fiber back to the scheduler; returns when the fiber is resumed.
void yield_to_scheduler(bool dying = false) {
  Fiber& f = *g_fiber;
#if defined(CAST_EMU_ASAN)
  void* fake = nullptr;
  // this frame's redzones lie within a few dozen bytes below `fake`; the slack is generous
  const uintptr_t below_this_frame = reinterpret_cast<uintptr_t>(&fake) - 1024;
  f.poisoned_from = std::max(f.stack.data(), reinterpret_cast<char*>(below_this_frame));
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, g_main_stack_bottom, g_main_stack_size);
  raw_switch_back(f);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)dying;
  raw_switch_back(f);
#endif
}

// Unwinds a failing fiber's own stack (so its frames' destructors run) up to fiber_entry.
struct KernelStop {};

// A failure inside a fiber: recorded, the fiber ends, and the scheduler throws the error.
[[noreturn]] void fail(const std::string& message) {
  if (g_block->error.empty()) g_block->error = "CUDA emulation: " + message + " (" + where() + ")";
  throw KernelStop{};
}

// A fiber's first frame. An exception thrown by kernel code (a check of the emulation's own
// helpers) cannot unwind across stacks: it is recorded and reported by the scheduler.
void fiber_entry() {
#if defined(CAST_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &g_main_stack_bottom, &g_main_stack_size);
#endif
  try {
    (*g_kernel)();
  } catch (const KernelStop&) {  // the error is recorded
  } catch (const std::exception& e) {
    if (g_block->error.empty()) g_block->error = std::string(e.what()) + " (" + where() + ")";
  }
  g_fiber->state = State::done;
  yield_to_scheduler(true);
  __builtin_unreachable();
}

// ---------------------------------------------------------------- one block
void start_fibers(Block& b) {
  if (g_fibers.size() < static_cast<size_t>(b.threads)) g_fibers.resize(b.threads);
  for (int t = 0; t < b.threads; ++t) {
    Fiber& f = g_fibers[t];
    if (f.stack.empty()) f.stack.resize(kStackBytes);
    f.tid = t;
    f.state = State::runnable;
    f.async_groups.clear();
    f.async_open.clear();
    f.view.thread_idx = {static_cast<unsigned>(t % b.dim.x), static_cast<unsigned>(t / b.dim.x % b.dim.y),
                         static_cast<unsigned>(t / (b.dim.x * b.dim.y))};
    f.view.block_idx = b.idx;
    f.view.block_dim = b.dim;
    f.view.grid_dim = b.grid;
#if defined(CAST_EMU_ASAN)
    // Redzones of the frames its last run left alive. Only that top part: the whole 512 KiB
    // stack's shadow, cleared for every thread of every block, took 70% of an emulated step.
    if (f.poisoned_from) {
      char* const end = f.stack.data() + f.stack.size();
      ASAN_UNPOISON_MEMORY_REGION(f.poisoned_from, static_cast<size_t>(end - f.poisoned_from));
      f.poisoned_from = nullptr;
    }
#endif
#if defined(__x86_64__)
    // A fresh stack as cast_emu_switch leaves it: FP control words, six callee-saved registers,
    // then the "return address" fiber_entry, placed so that it starts with the alignment of a
    // called function.
    auto top = reinterpret_cast<uintptr_t>(f.stack.data() + f.stack.size()) & ~uintptr_t{15};
    auto* frame = reinterpret_cast<uint64_t*>(top) - 10;
    frame[9] = 0;  // fiber_entry never returns
    frame[8] = reinterpret_cast<uint64_t>(&fiber_entry);
    for (int r = 2; r < 8; ++r) frame[r] = 0;  // rbp rbx r12 r13 r14 r15 (popped in reverse)
    uint32_t mxcsr = 0;
    uint16_t fpu_cw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu_cw));
    std::memcpy(&frame[1], &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(&frame[1]) + 4, &fpu_cw, 2);
    f.sp = &frame[1];
#else
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_entry, 0);
#endif
  }
}

// Every live thread waits at a barrier and none can move: release them, or report divergence.
void release_barrier(Block& b) {
  std::vector<int> exited, first, other;
  const Fiber* site = nullptr;
  for (int t = 0; t < b.threads; ++t) {
    const Fiber& f = g_fibers[t];
    if (f.state == State::done) {
      exited.push_back(t);
      continue;
    }
    if (!site) site = &f;
    if (f.file == site->file && f.line == site->line) first.push_back(t);
    else other.push_back(t);
  }
  const std::string at = fmt::format("{}:{}", site->file, site->line);
  if (!other.empty()) {
    const Fiber& o = g_fibers[other.front()];
    throw Error(
        fmt::format("CUDA emulation: barrier divergence in kernel {}, block {}: threads {} wait at "
                    "__syncthreads() {} while threads {} wait at {}:{}",
                    b.kernel, coords(b.idx), thread_list(first), at, thread_list(other), o.file, o.line));
  }
  if (!exited.empty())
    throw Error(
        fmt::format("CUDA emulation: barrier divergence in kernel {}, block {}: threads {} wait at "
                    "__syncthreads() {} but threads {} have exited",
                    b.kernel, coords(b.idx), thread_list(first), at, thread_list(exited)));
  for (int t = 0; t < b.threads; ++t) g_fibers[t].state = State::runnable;
  ++b.epoch;
  ++g_stats.barriers;
}

[[noreturn]] void report_stuck_warp(Block& b) {
  for (int t = 0; t < b.threads; ++t) {
    const Fiber& f = g_fibers[t];
    if (f.state != State::at_warp) continue;
    const WarpState& w = b.warps[t / 32];
    std::vector<int> missing;
    for (int lane = 0; lane < 32; ++lane) {
      const int u = t / 32 * 32 + lane;
      if ((w.mask >> lane & 1u) && (u >= b.threads || g_fibers[u].state != State::at_warp)) missing.push_back(u);
    }
    throw Error(
        fmt::format("CUDA emulation: warp collective at {}:{} never completes in kernel {}, block {}: "
                    "thread {} waits for threads {} of its mask 0x{:08x}, which exited, do not exist or "
                    "wait elsewhere",
                    f.file, f.line, b.kernel, coords(b.idx), t, thread_list(missing), w.mask));
  }
  throw Error(fmt::format("CUDA emulation: kernel {} block {} cannot progress", b.kernel, coords(b.idx)));
}

void run_block(Block& b) {
  g_block = &b;
  start_fibers(b);
  for (;;) {
    bool ran = false, live = false;
    for (int t = 0; t < b.threads; ++t) {
      Fiber& f = g_fibers[t];
      if (f.state == State::at_warp && b.warps[t / 32].generation > f.awaited) f.state = State::runnable;
      if (f.state != State::runnable) {
        live = live || f.state != State::done;
        continue;
      }
      switch_to_fiber(f);
      ran = true;
      if (!b.error.empty()) throw Error(b.error);
      live = live || f.state != State::done;
    }
    if (!live) break;
    if (ran) continue;
    bool any_warp = false;
    for (int t = 0; t < b.threads; ++t) any_warp = any_warp || g_fibers[t].state == State::at_warp;
    if (any_warp) report_stuck_warp(b);
    release_barrier(b);
  }
  g_block = nullptr;
}

struct BlockGuard {  // g_block is cleared however the block ends
  ~BlockGuard() {
    g_block = nullptr;
    g_fiber = nullptr;
  }
};

}  // namespace

const ThreadView& current() {
  if (!g_fiber) throw Error("CUDA emulation: threadIdx/blockIdx used outside a kernel");
  return g_fiber->view;
}

int linear_thread_index() { return g_fiber ? g_fiber->tid : 0; }

void launch(const char* kernel_name, const void* kernel_id, Dim3 grid, Dim3 block, size_t dynamic_shared_bytes,
            const std::function<void()>& kernel) {
  CAST_CHECK(!g_block, "CUDA emulation: kernel {} launched from inside kernel {} (not supported)", kernel_name,
             g_block ? g_block->kernel : "");
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  CAST_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0 && block.x > 0 && block.y > 0 && block.z > 0,
             "CUDA emulation: kernel {} launched with grid {} and block {}: every dimension must be positive "
             "(invalid configuration)",
             kernel_name, coords(grid), coords(block));
  CAST_CHECK(threads <= 1024 && block.z <= 64,
             "CUDA emulation: kernel {} launched with block {}: at most 1024 "
             "threads per block (invalid configuration)",
             kernel_name, coords(block));
  CAST_CHECK(grid.y <= 65535 && grid.z <= 65535, "CUDA emulation: kernel {} grid {} exceeds 65535 in y or z",
             kernel_name, coords(grid));
  CAST_CHECK(dynamic_shared_bytes <= max_dynamic_shared(kernel_id),
             "CUDA emulation: kernel {} asks for {} bytes "
             "of dynamic shared memory, more than its {} (48 KiB without an opt-in by cudaFuncSetAttribute)",
             kernel_name, dynamic_shared_bytes, max_dynamic_shared(kernel_id));
  ++g_stats.launches;
  BlockGuard guard;
  g_kernel = &kernel;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.kernel = kernel_name;
        b.grid = grid;
        b.dim = block;
        b.idx = {x, y, z};
        b.threads = static_cast<int>(threads);
        b.warps.resize((threads + 31) / 32);
        b.dynamic_shared.assign(dynamic_shared_bytes, 0xCD);  // garbage, as on a GPU
        run_block(b);
        ++g_stats.blocks;
        g_stats.threads += threads;
      }
}

void barrier(const char* file, int line) {
  if (!g_fiber) throw Error(fmt::format("CUDA emulation: __syncthreads() at {}:{} outside a kernel", file, line));
  g_fiber->state = State::at_barrier;
  g_fiber->file = file;
  g_fiber->line = line;
  yield_to_scheduler();
}

namespace {

// The calling lane arrives at a warp-wide call site (a warp function or instruction): checked
// against the lanes of its warp already waiting there. Returns the warp's state.
WarpState& join_warp(WarpOp op, unsigned mask, WarpApply apply, int width, const char* what, const char* file,
                     int line) {
  if (!g_fiber) throw Error(fmt::format("CUDA emulation: {} at {}:{} outside a kernel", what, file, line));
  const int lane = g_fiber->tid % 32, warp = g_fiber->tid / 32;
  WarpState& w = g_block->warps[warp];
  if (!(mask >> lane & 1u))
    fail(fmt::format("{} at {}:{} called by lane {} outside its mask 0x{:08x}", what, file, line, lane, mask));
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail(fmt::format("{} at {}:{}: width {} is not a power of two up to 32", what, file, line, width));
  if (w.arrived == 0) {
    w.mask = mask, w.op = op, w.apply = apply, w.width = width, w.file = file, w.line = line;
  } else if (w.mask != mask || w.op != op || w.apply != apply || w.file != file || w.line != line) {
    fail(fmt::format("lanes of warp {} meet at different warp {}s: {}:{} (mask 0x{:08x}) and {}:{} (mask 0x{:08x})",
                     warp, what, w.file, w.line, w.mask, file, line, mask));
  }
  return w;
}

// After the lane has left its payload: the last lane of the mask runs `complete` for all (the
// others' stacks stay live while they wait); the others wait until it has.
template <class Complete>
void complete_or_wait(WarpState& w, unsigned mask, const char* file, int line, Complete&& complete) {
  const uint64_t generation = w.generation;
  if (++w.arrived == std::popcount(mask)) {
    complete();
    w.arrived = 0;
    ++w.generation;
    ++g_stats.warp_collectives;
  } else {
    Fiber& f = *g_fiber;
    f.state = State::at_warp;
    f.awaited = generation;
    f.file = file;
    f.line = line;
    yield_to_scheduler();
  }
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t payload, int arg, int width, const char* file, int line) {
  WarpState& w = join_warp(op, mask, nullptr, width, "warp function", file, line);
  const int lane = g_fiber->tid % 32;
  w.payload[lane] = payload;
  w.arg[lane] = arg;
  complete_or_wait(w, mask, file, line, [&] {  // every lane's result
    uint64_t vote = 0;
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) vote |= uint64_t{w.payload[l] != 0} << l;
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      const int base = l / width * width, a = w.arg[l];
      int src = l;
      switch (op) {
        case WarpOp::shfl: src = base + ((a % width) + width) % width; break;
        case WarpOp::shfl_xor: src = (l ^ a) / width == l / width ? (l ^ a) : l; break;
        case WarpOp::shfl_down: src = l % width + a < width ? l + a : l; break;
        case WarpOp::shfl_up: src = l % width >= a ? l - a : l; break;
        default: break;
      }
      if ((op == WarpOp::shfl || op == WarpOp::shfl_xor || op == WarpOp::shfl_down || op == WarpOp::shfl_up) &&
          !(mask >> src & 1u))
        fail(fmt::format("warp shuffle at {}:{}: lane {} reads lane {}, which is not in the mask 0x{:08x}", file, line,
                         l, src, mask));
      switch (op) {
        case WarpOp::ballot: w.result[l] = vote; break;
        case WarpOp::any: w.result[l] = vote != 0; break;
        case WarpOp::all: w.result[l] = vote == (mask & 0xffffffffull); break;
        case WarpOp::sync: w.result[l] = 0; break;
        default: w.result[l] = w.payload[src];
      }
    }
  });
  return w.result[lane];
}

void warp_exchange(unsigned mask, void* registers, WarpApply apply, const char* file, int line) {
  WarpState& w = join_warp(WarpOp::exchange, mask, apply, 32, "warp instruction", file, line);
  w.payload[g_fiber->tid % 32] = reinterpret_cast<uintptr_t>(registers);
  complete_or_wait(w, mask, file, line, [&] {
    void* lanes[32];
    for (int l = 0; l < 32; ++l) lanes[l] = mask >> l & 1u ? reinterpret_cast<void*>(w.payload[l]) : nullptr;
    apply(lanes);
  });
}

void async_copy_issue(std::function<void()> write) {
  if (!g_fiber) throw Error("CUDA emulation: cp.async outside a kernel");
  g_fiber->async_open.push_back(std::move(write));
}

void async_copy_commit() {
  if (!g_fiber) throw Error("CUDA emulation: cp.async.commit_group outside a kernel");
  g_fiber->async_groups.push_back(std::move(g_fiber->async_open));
  g_fiber->async_open.clear();
}

void async_copy_wait(int newest_groups_left) {
  if (!g_fiber) throw Error("CUDA emulation: cp.async.wait_group outside a kernel");
  auto& groups = g_fiber->async_groups;
  const size_t keep = static_cast<size_t>(newest_groups_left < 0 ? 0 : newest_groups_left);
  while (groups.size() > keep) {
    for (auto& write : groups.front()) write();
    groups.erase(groups.begin());
  }
}

void shared_access(const void* base, int64_t index, int64_t size, SharedAccess kind, const char* name) {
  if (!g_fiber) return;  // host code touching the storage: nothing to check
  if (index < 0 || index >= size)
    fail(fmt::format("shared memory '{}' index {} out of bounds [0, {})", name, index, size));
  std::vector<Shadow>& shadow = g_block->shadows[base];
  if (static_cast<int64_t>(shadow.size()) < size) shadow.resize(size);
  Shadow& s = shadow[index];
  if (s.epoch != g_block->epoch) s = Shadow{g_block->epoch, -1, -1, false, -1, false};
  const int t = g_fiber->tid;
  auto race = [&](const char* what, int other) {
    fail(fmt::format("shared-memory race on '{}'[{}]: thread {} {} since the last __syncthreads()", name, index, other,
                     what));
  };
  // Atomic updates may meet each other; a plain access by another thread may meet none.
  if (kind == SharedAccess::atomic) {
    if (s.writer >= 0 && s.writer != t) race("wrote it, and this thread updates it atomically", s.writer);
    if ((s.reader >= 0 && s.reader != t) || s.many_readers)
      race("read it, and this thread updates it atomically", s.reader);
    if (s.atomic_by >= 0 && s.atomic_by != t) s.many_atomics = true;
    s.atomic_by = t;
    return;
  }
  if (s.many_atomics || (s.atomic_by >= 0 && s.atomic_by != t))
    race("updated it atomically, and this thread accesses it plainly", s.atomic_by);
  const bool write = kind == SharedAccess::write;
  if (write) {
    if (s.writer >= 0 && s.writer != t) race("wrote it, and this thread writes it", s.writer);
    if (s.reader >= 0 && s.reader != t) race("read it, and this thread writes it", s.reader);
    if (s.many_readers) race("and others read it, and this thread writes it", s.reader);
    s.writer = t;
  } else {
    if (s.writer >= 0 && s.writer != t) race("wrote it, and this thread reads it", s.writer);
    if (s.reader < 0) s.reader = t;
    else if (s.reader != t) s.many_readers = true;
  }
}

void* dynamic_shared_memory() {
  if (!g_block) throw Error("CUDA emulation: dynamic shared memory used outside a kernel");
  return g_block->dynamic_shared.data();
}

size_t dynamic_shared_bytes() { return g_block ? g_block->dynamic_shared.size() : 0; }

Stats stats() { return g_stats; }

}  // namespace cast::emu
