// NCCL process groups (compiled only with the `nccl` cargo feature). The collectives themselves
// are dist.cpp's: they call the c10d Backend interface, which ProcessGroupNCCL implements.
#include "shim.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>

extern "C" {

// An NCCL group of `size` ranks meeting in `s` under `prefix`, on CUDA device `device` (made
// the current device, as torchrun users do with LOCAL_RANK). Communicators are created lazily,
// at the first collective, as in torch.
int rsd_group_nccl(const RsdStore* s, const char* prefix, int rank, int size, int64_t timeout_ms,
                   int device, RsdGroup** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, s->store);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    *out = new RsdGroup{pg, true, c10::make_intrusive<RsdCounter>()};
  });
}

}  // extern "C"
