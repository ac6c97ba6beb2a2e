// Drops a tensor's `.grad` (leaves it undefined), as PyTorch's `p.grad = None` does.
//
// Why C++: tch can read a gradient and zero it in place, but not undefine it, and a zeroed
// gradient keeps its memory. The sharded optimizer frees each bucket's gradients as soon as they
// are reduce-scattered (crates/rsd-train/src/sharded.rs), so that at most about one layer's
// gradients exist at a time. The next backward then allocates them afresh.
//
// The C ABI takes tch's C_tensor, which is a `torch::Tensor*`.
#include <ATen/core/Tensor.h>

extern "C" void rsd_free_grad(at::Tensor* t) {
  if (t != nullptr && t->defined()) {
    t->mutable_grad().reset();
  }
}
