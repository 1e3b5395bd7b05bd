#pragma once
// Checks of device data that the host reads later instead of waiting for them.
//
// An index range check on the GPU used to copy the indices' min and max back: one blocking
// round trip per check, a dozen per training step. Now a failing kernel thread writes the check's
// id and the value it found into a word of mapped host memory, and the host reads that word
// whenever it waits for the device anyway (every copy to the host, every synchronize): the
// error is raised there, naming the op, the value and the allowed range. Kernels that use
// indices skip out-of-range ones, so nothing reads or writes out of bounds meanwhile.
#include <cstdint>

namespace cast::cuda {

struct PendingCheck {
  unsigned long long* fault = nullptr;  // device address of the fault word
  uint32_t id = 0;                      // a failing thread writes (id << 48) | (value & 0xFFFFFFFFFFFF) into the word
};

// Registers a check of values in [lo, hi) for `op` (a string literal) and returns where its
// kernel reports a failure.
PendingCheck register_index_check(const char* op, int64_t lo, int64_t hi);

// Called after the host has waited for the device: throws cast::Error for the failed check (if
// any) and forgets the checks registered so far.
void report_failed_checks();

}  // namespace cast::cuda
