// NCCL process groups (compiled only with the `nccl` cargo feature). The collectives themselves
// are dist.cpp's: they call the c10d Backend interface, which ProcessGroupNCCL implements.
#include "shim.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

// ProcessGroupNCCL::Options embeds ncclConfig_t, whose size changes between NCCL releases, and
// this file builds Options (and destroys them) with the layout of the nccl.h it was compiled
// against. torch's own code uses the layout of the NCCL torch was built with, which
// torch::cuda::nccl::version() reports as major << 32 | minor << 16 | patch. Different major or
// minor versions: refuse, rather than corrupt memory (a crash in ProcessGroupNCCL's destructor
// was the symptom).
void check_nccl_layout() {
  constexpr uint64_t ours = (static_cast<uint64_t>(NCCL_MAJOR) << 32) |
                            (static_cast<uint64_t>(NCCL_MINOR) << 16) |
                            static_cast<uint64_t>(NCCL_PATCH);
  const uint64_t torchs = torch::cuda::nccl::version();
  if ((ours >> 16) != (torchs >> 16)) {
    auto text = [](uint64_t v) {
      return std::to_string(v >> 32) + "." + std::to_string((v >> 16) & 0xffff) + "." +
             std::to_string(v & 0xffff);
    };
    throw std::runtime_error(
        "rsd was built against NCCL " + text(ours) + "'s headers, this torch was built with NCCL " +
        text(torchs) + ": rebuild rsd (cargo build --features rsd-dist/nccl) against the torch "
        "it runs with, with nvidia-nccl==" + text(torchs) + "'s headers");
  }
}

}  // namespace

extern "C" {

// An NCCL group of `size` ranks meeting in `s` under `prefix`, on CUDA device `device` (made
// the current device, as torchrun users do with LOCAL_RANK). Communicators are created lazily,
// at the first collective, as in torch.
int rsd_group_nccl(const RsdStore* s, const char* prefix, int rank, int size, int64_t timeout_ms,
                   int device, RsdGroup** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    check_nccl_layout();
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, s->store);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    *out = new RsdGroup{pg, true, c10::make_intrusive<RsdCounter>()};
  });
}

}  // extern "C"
