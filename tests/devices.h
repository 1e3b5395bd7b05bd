#pragma once
// The devices this build and machine run tests on: the CPU, and CUDA (or its emulation) when
// there is one.
#include <vector>

#include "tensor/device_memory.h"
#include "tensor/dtype.h"

namespace cast::testing {

inline std::vector<Device> devices_here() {
  std::vector<Device> devices{Device::cpu};
  if (device_memory::cuda_built() && device_memory::cuda_available()) devices.push_back(Device::cuda);
  return devices;
}

}  // namespace cast::testing
