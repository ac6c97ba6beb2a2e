// What dist.cpp and nccl.cpp share: the opaque handles behind the C ABI and the exception guard.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

// A store handle: a TCPStore, or a PrefixStore over one.
struct RsdStore {
  c10::intrusive_ptr<c10d::Store> store;
};

// The traffic of the collectives that run inside libtorch's autograd (the backward of the
// differentiable collectives), which the Rust side never sees: the autograd nodes hold it (a
// capsule) and add to it; the Rust side reads it with rsd_group_backward_stats.
struct RsdCounter : torch::CustomClassHolder {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> nanos{0};
};

// A process group handle: one c10d backend (Gloo or NCCL) over `size` ranks.
struct RsdGroup {
  c10::intrusive_ptr<c10d::Backend> backend;
  // Gloo has no AVG: the shim sums and divides instead.
  bool native_avg;
  c10::intrusive_ptr<RsdCounter> backward = c10::make_intrusive<RsdCounter>();
};

// A reduce-scatter in flight (rsd_reduce_scatter_start): the work, the input it reads and the
// output it writes, both kept alive here until it has been waited for.
struct RsdPending {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor input;
  at::Tensor output;
  int op;
  bool native_avg;
  int size;
};

namespace rsd {

inline void write_error(const char* what, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, what, err_len - 1);
  err[err_len - 1] = '\0';
}

// Runs `f`, returning 0, or 1 with the exception's message (without c10's C++ backtrace) in
// `err`. Nothing thrown on this side ever unwinds into Rust.
template <typename F>
int guard(char* err, size_t err_len, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    write_error(e.what_without_backtrace(), err, err_len);
  } catch (const std::exception& e) {
    write_error(e.what(), err, err_len);
  } catch (...) {
    write_error("unknown C++ exception", err, err_len);
  }
  return 1;
}

}  // namespace rsd
