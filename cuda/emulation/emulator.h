#pragma once
// The CUDA execution model on the CPU, for running the kernels of cuda/ in tests without a GPU.
//
// A launch runs its blocks one after another. The threads of a block are fibers (an assembly
// context switch on x86-64, ucontext elsewhere)
// scheduled cooperatively on the calling thread: each runs until it reaches __syncthreads(),
// a warp collective or its end. __syncthreads() releases the block when every live thread waits
// at the same barrier; a warp collective completes when every lane of its mask has arrived at
// the same call. Anything else is reported as an error naming the kernel, block and threads:
// threads waiting at a barrier while others exited or wait elsewhere (divergence), a warp
// collective that can never complete, a shared-memory race (two threads touching one address
// between two barriers, one of them writing), a shared-memory index out of bounds.
#include <cstdint>
#include <functional>
#include <string>

namespace cast::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// What a running CUDA thread sees: its indices and its block's shape.
struct ThreadView {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
};

// The view of the fiber that is running now (valid only inside a kernel).
const ThreadView& current();

// Runs `kernel` (a closure calling the __global__ function `kernel_id` with its arguments) on
// every thread of every block. Throws cast::Error on the first check that fails.
void launch(const char* kernel_name, const void* kernel_id, Dim3 grid, Dim3 block, size_t dynamic_shared_bytes,
            const std::function<void()>& kernel);

// The most dynamic shared memory `kernel_id` may ask for: 48 KiB, or what the kernel opted in
// to with cudaFuncSetAttribute (at most 227 KiB, as on sm_90).
size_t max_dynamic_shared(const void* kernel_id);

// A pointer argument of a launch must be null or point into memory the device can reach: a
// cudaMalloc block (or one past its end) or mapped host memory. A GPU would fault on a host
// pointer; here device memory is host memory, so the check is made at the launch instead.
// Throws, naming the kernel and the argument.
void check_kernel_pointer(const char* kernel_name, int argument, const void* pointer);

// __syncthreads() at file:line.
void barrier(const char* file, int line);

// Warp collectives. Each lane passes its 64-bit payload; the result is computed once every lane
// of `mask` has arrived at the same call site.
enum class WarpOp { shfl, shfl_xor, shfl_down, shfl_up, ballot, any, all, sync, exchange };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t payload, int arg, int width, const char* file, int line);

// A warp-wide instruction over the registers of every lane at once (mma.sync, ldmatrix; the
// models are in cuda/emulation/tensor_core.cpp). Each lane of `mask` passes a pointer to its own
// registers; once every lane has arrived at the same call site, the last one runs `apply` once
// with the 32 pointers (null for a lane outside the mask), and then every lane goes on.
using WarpApply = void (*)(void* const* lanes);
void warp_exchange(unsigned mask, void* registers, WarpApply apply, const char* file, int line);

// cp.async: a copy this thread issues reaches shared memory only when the thread waits for its
// committed group (cp.async.wait_group), as the PTX ISA promises no earlier; until then the
// destination holds what it held, so a read before the wait sees stale data. `write` performs
// the copy through the checked shared accessor, so the race checker sees it at the wait.
void async_copy_issue(std::function<void()> write);
void async_copy_commit();
void async_copy_wait(int newest_groups_left);

// Shared memory checks, called by SharedArray (cuda/emulation/shared_array.h).
enum class SharedAccess { read, write, atomic };
void shared_access(const void* base, int64_t index, int64_t size, SharedAccess kind, const char* name);
void* dynamic_shared_memory();
size_t dynamic_shared_bytes();

// Lane and linear thread index of the running fiber within its block.
int linear_thread_index();

// Counters for tests of the emulator itself.
struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, barriers = 0, warp_collectives = 0;
};
Stats stats();

}  // namespace cast::emu
