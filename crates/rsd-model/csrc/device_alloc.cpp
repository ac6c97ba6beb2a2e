// Bytes the CUDA caching allocator holds for tensors (allocated) and from the driver (reserved),
// current and peak, for measuring a training step on a GPU (see crates/rsd-model/src/alloc.rs).
//
// c10::getDeviceAllocator is the device-generic face of the caching allocator (torch >= 2.8): it
// needs only c10 headers, so this file builds against any torch wheel, with or without CUDA on
// the machine. Where no CUDA allocator is registered (a CPU-only libtorch) or the device index is
// out of range, the calls throw; the C functions below turn that into a 0 return.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <exception>
#include <limits>

namespace {

// The allocator, or null where there is none or `device` cannot name a device (c10's index is
// 8 bits; a wider value would wrap onto another device).
c10::DeviceAllocator* cuda_allocator(int device) {
  if (device < 0 || device > std::numeric_limits<c10::DeviceIndex>::max()) {
    return nullptr;
  }
  c10::DeviceAllocator* a = c10::getDeviceAllocator(c10::DeviceType::CUDA);
  return a != nullptr && a->initialized() ? a : nullptr;
}

}  // namespace

extern "C" {

// out[0..4]: allocated current, allocated peak, reserved current, reserved peak (all pools,
// bytes). Returns 1, or 0 when there is no CUDA allocator or `device` is not a CUDA device.
int rsd_cuda_memory(int device, uint64_t* out) {
  try {
    c10::DeviceAllocator* a = cuda_allocator(device);
    if (a == nullptr) {
      return 0;
    }
    const auto stats = a->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr size_t all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = static_cast<uint64_t>(stats.allocated_bytes[all].current);
    out[1] = static_cast<uint64_t>(stats.allocated_bytes[all].peak);
    out[2] = static_cast<uint64_t>(stats.reserved_bytes[all].current);
    out[3] = static_cast<uint64_t>(stats.reserved_bytes[all].peak);
    return 1;
  } catch (const std::exception&) {
    return 0;
  }
}

// Starts new peaks from the current values. Returns 1, or 0 as above.
int rsd_cuda_reset_peak(int device) {
  try {
    c10::DeviceAllocator* a = cuda_allocator(device);
    if (a == nullptr) {
      return 0;
    }
    a->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 1;
  } catch (const std::exception&) {
    return 0;
  }
}
}
