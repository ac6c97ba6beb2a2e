// One AdamW update of many tensors in one fused kernel per device and dtype (libtorch's
// `_fused_adamw_`, the kernel behind `torch.optim.AdamW(fused=True)`; CUDA and CPU).
//
// Why C++: tch does not generate bindings for ops that take several tensor lists and return
// nothing. Why fused: written as tensor ops, one update is ~15 elementwise passes over the fp32
// state (about 150 bytes of memory traffic per parameter); the fused kernel reads and writes each
// tensor once (about 28 bytes), which at 1.9 B parameters is tens of milliseconds a step on a
// GPU.
//
// The C ABI takes tch's C_tensor, which is a `torch::Tensor*`.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <exception>
#include <vector>

namespace {

std::vector<at::Tensor> list(at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

}  // namespace

extern "C" {

// `params`, `grads`, `exp_avgs`, `exp_avg_sqs`: `n` tensors each, pairwise of one shape, dtype
// and device. `step` is a 0-dim fp32 tensor on their device holding the update's number (1-based),
// read by the kernel for the bias corrections. The decoupled weight decay is applied as
// `p -= lr * weight_decay * p` before the moments. Returns 0, or 1 with the message in `err`.
int rsd_fused_adamw(at::Tensor* const* params, at::Tensor* const* grads,
                    at::Tensor* const* exp_avgs, at::Tensor* const* exp_avg_sqs, size_t n,
                    const at::Tensor* step, double lr, double beta1, double beta2,
                    double weight_decay, double eps, char* err, size_t err_len) {
  try {
    if (n == 0) return 0;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> steps(n, *step);
    at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n),
                      {}, steps, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                      /*maximize=*/false, std::nullopt, std::nullopt);
    return 0;
  } catch (const std::exception& e) {
    if (err != nullptr && err_len > 0) {
      std::strncpy(err, e.what(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return 1;
  }
}

}  // extern "C"
