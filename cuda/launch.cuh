#pragma once
// Every kernel launch goes through CAST_LAUNCH, so one kernel source serves the GPU build
// (a triple-chevron launch) and the emulation build (cuda/emulation/: the blocks run as fiber
// threads on the CPU, with barrier, race and bounds checks).
//   CAST_LAUNCH(kernel, grid, block, shared_bytes, args...);
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/error.h"

#if defined(CAST_CUDA_EMULATION)
#include "cuda/emulation/emulator.h"
#endif

namespace cast::cuda {

#if defined(CAST_CUDA_EMULATION)
template <class Param, class Arg>
void check_argument(const char* kernel_name, int argument, const Arg& arg) {
  if constexpr (std::is_pointer_v<Param>)
    emu::check_kernel_pointer(kernel_name, argument, static_cast<const void*>(static_cast<Param>(arg)));
}
#endif

// Appends the kernel's name to the launch log a test set (set_launch_log, cuda/runtime.h).
void record_launch(const char* name);

template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   Args&&... args) {
  record_launch(name);
#if defined(CAST_CUDA_EMULATION)
  int argument = 0;  // every pointer argument must be one the device can reach
  (check_argument<Params>(name, argument++, args), ...);
  emu::launch(name, reinterpret_cast<const void*>(kernel), {grid.x, grid.y, grid.z}, {block.x, block.y, block.z},
              shared_bytes, [&] { kernel(static_cast<Params>(args)...); });
#elif defined(__CUDACC__)
  (void)name;
  kernel<<<grid, block, shared_bytes>>>(std::forward<Args>(args)...);
#else
  static_assert(sizeof...(Params) < 0, "kernels are launched from .cu files (or the emulation build)");
#endif
}

// A grid's y extent is at most 65535: a launch over more batch-heads (CAST's clusters at a large
// batch are batch-heads of its intra-cluster attention) goes in chunks of whole batch rows of
// `heads` each, fn(first, count) per chunk, the caller offsetting its pointers to batch-head
// `first` (so the kernels are unchanged: a chunk is a smaller batch).
inline int64_t g_grid_y_limit = 65535;  // the hardware's; tests lower it to run several chunks on small shapes
template <class Fn>
void for_grid_y_chunks(int64_t total, int64_t heads, Fn&& fn) {
  CAST_CHECK(heads >= 1 && heads <= g_grid_y_limit, "a launch over {} heads exceeds a grid's {} in y", heads,
             g_grid_y_limit);
  const int64_t most = g_grid_y_limit / heads * heads;
  for (int64_t first = 0; first < total; first += most) fn(first, total - first < most ? total - first : most);
}

}  // namespace cast::cuda

#define CAST_LAUNCH(kernel, grid, block, shared_bytes, ...) \
  ::cast::cuda::launch_kernel(#kernel, kernel, grid, block, shared_bytes, __VA_ARGS__)
