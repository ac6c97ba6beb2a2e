// The C ABI over torch's c10d (the engine under torch.distributed): stores, Gloo process groups,
// blocking collectives, and two autograd functions (all-gather <-> reduce-scatter). See
// crates/rsd-dist/src/ for the Rust side.
//
// Conventions: every function returns 0 on success, or 1 with a message in `err` (see
// shim.h's guard); tensors cross as `at::Tensor*` (tch's C_tensor); a returned `at::Tensor*` is
// owned by the caller (tch's Tensor::from_ptr); handles are freed with their `_free` function.
// Collectives block until done or until `timeout_ms`, and run with autograd recording off.
#include "shim.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using at::Tensor;
using Ms = std::chrono::milliseconds;

enum Op : int { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

c10d::ReduceOp to_c10d(int op) {
  switch (op) {
    case kSum:
      return c10d::ReduceOp::SUM;
    case kAvg:
      return c10d::ReduceOp::AVG;
    case kMax:
      return c10d::ReduceOp::MAX;
    case kMin:
      return c10d::ReduceOp::MIN;
  }
  TORCH_CHECK(false, "unknown reduce op ", op);
}

using BackendPtr = c10::intrusive_ptr<c10d::Backend>;

// Gloo runs a collective on a worker thread that holds the work, and with it the collective's
// tensors, for a moment after wait() returns. Waiting for it to let go makes "the collective
// returned" mean "its buffers are the caller's alone": freeing them then frees them, and memory
// counted on CPU does not depend on that thread's timing. Bounded: a worker slow to let go only
// delays the free.
void finish(const c10::intrusive_ptr<c10d::Work>& work, int64_t timeout_ms) {
  work->wait(Ms(timeout_ms));
  if (dynamic_cast<c10d::ProcessGroupGloo::AsyncWork*>(work.get()) == nullptr) return;
  for (int i = 0; i < 100000 && work.use_count() > 1; ++i) std::this_thread::yield();
}

// AVG is SUM then a division where the backend has no AVG (Gloo).
c10d::ReduceOp backend_op(int op, bool native_avg) {
  return op == kAvg && !native_avg ? c10d::ReduceOp(c10d::ReduceOp::SUM) : to_c10d(op);
}

void finish_avg(Tensor& t, int op, bool native_avg, int size) {
  if (op == kAvg && !native_avg) t.div_(size);
}

// Dim 0 of the result is `size` times the input's (a 0-dim input counts as one row).
Tensor gather_dim0(const BackendPtr& b, const Tensor& input, int64_t timeout_ms) {
  Tensor x = input.dim() == 0 ? input.reshape({1}) : input.contiguous();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[0] *= b->getSize();
  Tensor out = at::empty(sizes, x.options());
  c10d::AllgatherOptions o;
  o.timeout = Ms(timeout_ms);
  finish(b->_allgather_base(out, x, o), timeout_ms);
  return out;
}

void check_divisible(const Tensor& x, int size, const char* op) {
  TORCH_CHECK(x.dim() >= 1 && x.size(0) % size == 0, op, ": dim 0 of the input (shape ",
              x.sizes(), ") must be a multiple of the group size ", size);
}

// Starts a reduce-scatter of `input` along dim 0; wait_reduce_scatter returns its result. The
// blocking one, the autograd one and rsd_reduce_scatter_start are all this pair.
RsdPending start_reduce_scatter(const BackendPtr& b, bool native_avg, const Tensor& input, int op,
                                int64_t timeout_ms) {
  int size = b->getSize();
  check_divisible(input, size, "reduce_scatter");
  RsdPending p;
  p.input = input.contiguous();
  std::vector<int64_t> sizes = p.input.sizes().vec();
  sizes[0] /= size;
  p.output = at::empty(sizes, p.input.options());
  p.op = op;
  p.native_avg = native_avg;
  p.size = size;
  c10d::ReduceScatterOptions o;
  o.reduceOp = backend_op(op, native_avg);
  o.timeout = Ms(timeout_ms);
  p.work = b->_reduce_scatter_base(p.output, p.input, o);
  return p;
}

Tensor wait_reduce_scatter(RsdPending& p, int64_t timeout_ms) {
  TORCH_CHECK(p.work, "the collective was already waited for");
  finish(p.work, timeout_ms);
  p.work.reset();
  p.input = Tensor();
  finish_avg(p.output, p.op, p.native_avg, p.size);
  return std::move(p.output);
}

Tensor reduce_scatter_dim0(const BackendPtr& b, bool native_avg, const Tensor& input, int op,
                           int64_t timeout_ms) {
  RsdPending p = start_reduce_scatter(b, native_avg, input, op, timeout_ms);
  return wait_reduce_scatter(p, timeout_ms);
}

// Differentiable collectives for context parallelism: the gradient of an all-gather is the
// reduce-scatter (sum) of the output's gradient, and the other way round. The backend is kept
// alive in the graph (a capsule in saved_data), so backward works even if the Rust handle is gone.
c10::IValue capsule(const BackendPtr& b) {
  return c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(b));
}

BackendPtr from_capsule(const c10::IValue& v) {
  return c10::static_intrusive_pointer_cast<c10d::Backend>(v.toCapsule());
}

// Saves what a backward needs: the backend, the group's counter and the timeout.
void save_group(torch::autograd::AutogradContext* ctx, const RsdGroup* g, int64_t timeout_ms) {
  ctx->saved_data["backend"] = capsule(g->backend);
  ctx->saved_data["counter"] = c10::IValue::make_capsule(
      c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(g->backward));
  ctx->saved_data["native_avg"] = g->native_avg;
  ctx->saved_data["timeout_ms"] = timeout_ms;
}

// Runs a backward collective on `grad`, counting it as the Rust side counts a forward one: one
// call, the bytes of the tensor this rank hands over (the whole gradient in every case here), the
// time blocked.
template <typename F>
Tensor counted_backward(torch::autograd::AutogradContext* ctx, const Tensor& grad, F&& f) {
  auto counter =
      c10::static_intrusive_pointer_cast<RsdCounter>(ctx->saved_data["counter"].toCapsule());
  auto start = std::chrono::steady_clock::now();
  Tensor out = f(from_capsule(ctx->saved_data["backend"]), ctx->saved_data["timeout_ms"].toInt());
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  counter->calls += 1;
  counter->bytes += static_cast<int64_t>(grad.numel()) * static_cast<int64_t>(grad.element_size());
  counter->nanos += static_cast<int64_t>(ns);
  return out;
}

struct AllGatherFn : public torch::autograd::Function<AllGatherFn> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const RsdGroup* g,
                        int64_t timeout_ms) {
    save_group(ctx, g, timeout_ms);
    return gather_dim0(g->backend, x, timeout_ms);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    bool native_avg = ctx->saved_data["native_avg"].toBool();
    Tensor g = counted_backward(ctx, grads[0], [&](const BackendPtr& b, int64_t ms) {
      return reduce_scatter_dim0(b, native_avg, grads[0], kSum, ms);
    });
    return {g, Tensor(), Tensor()};
  }
};

struct ReduceScatterFn : public torch::autograd::Function<ReduceScatterFn> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const RsdGroup* g,
                        int64_t timeout_ms) {
    save_group(ctx, g, timeout_ms);
    return reduce_scatter_dim0(g->backend, g->native_avg, x, kSum, timeout_ms);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    Tensor g = counted_backward(ctx, grads[0], [&](const BackendPtr& b, int64_t ms) {
      return gather_dim0(b, grads[0], ms);
    });
    return {g, Tensor(), Tensor()};
  }
};

Tensor all_to_all_dim0(const BackendPtr& b, const Tensor& input, int64_t timeout_ms) {
  check_divisible(input, b->getSize(), "all_to_all");
  Tensor x = input.contiguous();
  Tensor out = at::empty_like(x);
  std::vector<int64_t> counts;
  c10d::AllToAllOptions o;
  o.timeout = Ms(timeout_ms);
  finish(b->alltoall_base(out, x, counts, counts, o), timeout_ms);
  return out;
}

// An all-to-all of equal blocks is its own inverse: the gradient of the block that came from
// rank i goes back to rank i, into the block it was sent from.
struct AllToAllFn : public torch::autograd::Function<AllToAllFn> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const RsdGroup* g,
                        int64_t timeout_ms) {
    save_group(ctx, g, timeout_ms);
    return all_to_all_dim0(g->backend, x, timeout_ms);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    Tensor g = counted_backward(ctx, grads[0], [&](const BackendPtr& b, int64_t ms) {
      return all_to_all_dim0(b, grads[0], ms);
    });
    return {g, Tensor(), Tensor()};
  }
};

// Gloo transport devices as torch.distributed makes them: one per interface named in
// GLOO_SOCKET_IFNAME (comma-separated), else the one for this host's name.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices() {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifnames != nullptr && ifnames[0] != '\0') {
    std::stringstream list(ifnames);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  }
  if (devices.empty()) devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return devices;
}

}  // namespace

extern "C" {

// ---- stores ----

// A TCPStore client of `host:port`, or its server when `is_server` (then `host` is unused for
// listening: the server listens on every interface, as in torch). Connecting retries until
// `timeout_ms`, which is also the store's default timeout for later calls.
int rsd_store_tcp(const char* host, uint16_t port, int is_server, int64_t world_size,
                  int64_t timeout_ms, RsdStore** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = is_server != 0;
    if (world_size > 0) o.numWorkers = static_cast<size_t>(world_size);
    // The Rust side counts arrivals itself, to tell a missing rank from a world-size mismatch.
    o.waitWorkers = false;
    o.timeout = Ms(timeout_ms);
    *out = new RsdStore{c10::make_intrusive<c10d::TCPStore>(host, o)};
  });
}

int rsd_store_prefix(const RsdStore* s, const char* prefix, RsdStore** out, char* err,
                     size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    *out = new RsdStore{c10::make_intrusive<c10d::PrefixStore>(prefix, s->store)};
  });
}

void rsd_store_free(RsdStore* s) { delete s; }

int rsd_store_set(const RsdStore* s, const char* key, const uint8_t* data, size_t len, char* err,
                  size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    s->store->set(key, std::vector<uint8_t>(data, data + len));
  });
}

// Waits up to `timeout_ms` for `key`, then returns its value in a buffer the caller frees with
// rsd_bytes_free.
int rsd_store_get(const RsdStore* s, const char* key, int64_t timeout_ms, uint8_t** data,
                  size_t* len, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    s->store->wait({key}, Ms(timeout_ms));
    std::vector<uint8_t> v = s->store->get(key);
    *len = v.size();
    *data = new uint8_t[v.size() == 0 ? 1 : v.size()];
    std::memcpy(*data, v.data(), v.size());
  });
}

void rsd_bytes_free(uint8_t* data) { delete[] data; }

int rsd_store_add(const RsdStore* s, const char* key, int64_t delta, int64_t* out, char* err,
                  size_t err_len) {
  return rsd::guard(err, err_len, [&] { *out = s->store->add(key, delta); });
}

int rsd_store_check(const RsdStore* s, const char* key, int* out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] { *out = s->store->check({key}) ? 1 : 0; });
}

// ---- groups ----

// A Gloo group of `size` ranks meeting in `s` under `prefix`; blocks until every rank has
// connected (or `timeout_ms`, also the default for its collectives).
int rsd_group_gloo(const RsdStore* s, const char* prefix, int rank, int size, int64_t timeout_ms,
                   RsdGroup** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, s->store);
    auto opts = c10d::ProcessGroupGloo::Options::create(Ms(timeout_ms));
    opts->devices = gloo_devices();
    opts->threads = static_cast<int>(opts->devices.size()) * 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    *out = new RsdGroup{pg, false, c10::make_intrusive<RsdCounter>()};
  });
}

// Shut the backend down before it is destroyed: ProcessGroupNCCL's destructor without a prior
// shutdown() warns ("destroy_process_group() was not called") and, seen on an H200 with torch
// 2.11, then crashes the process. Gloo's shutdown is the Backend default (nothing to do).
void rsd_group_free(RsdGroup* g) {
  if (g == nullptr) return;
  try {
    g->backend->shutdown();
  } catch (...) {
    // A failed shutdown at the end of a process leaves nothing to clean up for.
  }
  delete g;
}

// What the group's backward collectives (inside autograd) have done so far.
void rsd_group_backward_stats(const RsdGroup* g, int64_t* calls, int64_t* bytes, int64_t* nanos) {
  *calls = g->backward->calls.load();
  *bytes = g->backward->bytes.load();
  *nanos = g->backward->nanos.load();
}

// ---- collectives (blocking) ----

int rsd_all_reduce(const RsdGroup* g, Tensor* t, int op, int64_t timeout_ms, char* err,
                   size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    std::vector<Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = backend_op(op, g->native_avg);
    o.timeout = Ms(timeout_ms);
    finish(g->backend->allreduce(ts, o), timeout_ms);
    finish_avg(*t, op, g->native_avg, g->backend->getSize());
  });
}

int rsd_all_gather(const RsdGroup* g, const Tensor* t, int64_t timeout_ms, Tensor** out,
                   char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    *out = new Tensor(gather_dim0(g->backend, *t, timeout_ms));
  });
}

int rsd_reduce_scatter(const RsdGroup* g, const Tensor* t, int op, int64_t timeout_ms,
                       Tensor** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    *out = new Tensor(reduce_scatter_dim0(g->backend, g->native_avg, *t, op, timeout_ms));
  });
}

// ---- a collective in flight ----

// Starts the reduce-scatter of rsd_reduce_scatter and returns at once: the backend (Gloo's worker
// thread, NCCL's stream) runs it while the caller goes on. rsd_pending_wait returns its result.
int rsd_reduce_scatter_start(const RsdGroup* g, const Tensor* t, int op, int64_t timeout_ms,
                             RsdPending** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    *out = new RsdPending(start_reduce_scatter(g->backend, g->native_avg, *t, op, timeout_ms));
  });
}

// Waits for `p` and returns its result (once: the pending handle gives its output away).
int rsd_pending_wait(RsdPending* p, int64_t timeout_ms, Tensor** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] { *out = new Tensor(wait_reduce_scatter(*p, timeout_ms)); });
}

// Frees the handle; a collective never waited for goes on in the backend, which keeps its
// tensors alive until it ends.
void rsd_pending_free(RsdPending* p) { delete p; }

int rsd_broadcast(const RsdGroup* g, Tensor* t, int root, int64_t timeout_ms, char* err,
                  size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    std::vector<Tensor> ts{*t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = Ms(timeout_ms);
    finish(g->backend->broadcast(ts, o), timeout_ms);
  });
}

// Equal splits along dim 0: block j of the input goes to rank j; block i of the output came
// from rank i.
int rsd_all_to_all(const RsdGroup* g, const Tensor* t, int64_t timeout_ms, Tensor** out,
                   char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    *out = new Tensor(all_to_all_dim0(g->backend, *t, timeout_ms));
  });
}

int rsd_send(const RsdGroup* g, const Tensor* t, int dst, int tag, int64_t timeout_ms, char* err,
             size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    std::vector<Tensor> ts{t->contiguous()};
    finish(g->backend->send(ts, dst, tag), timeout_ms);
  });
}

// Receives into `t` (through a contiguous buffer when `t` is not contiguous).
int rsd_recv(const RsdGroup* g, Tensor* t, int src, int tag, int64_t timeout_ms, char* err,
             size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    at::NoGradGuard no_grad;
    std::vector<Tensor> ts{t->is_contiguous() ? *t : at::empty_like(*t, at::MemoryFormat::Contiguous)};
    finish(g->backend->recv(ts, src, tag), timeout_ms);
    if (!ts[0].is_same(*t)) t->copy_(ts[0]);
  });
}

int rsd_barrier(const RsdGroup* g, int64_t timeout_ms, char* err, size_t err_len) {
  return rsd::guard(err, err_len, [&] {
    c10d::BarrierOptions o;
    o.timeout = Ms(timeout_ms);
    finish(g->backend->barrier(o), timeout_ms);
  });
}

// ---- differentiable collectives (dim 0, sum) ----

int rsd_all_gather_autograd(const RsdGroup* g, const Tensor* t, int64_t timeout_ms, Tensor** out,
                            char* err, size_t err_len) {
  return rsd::guard(err, err_len,
                    [&] { *out = new Tensor(AllGatherFn::apply(*t, g, timeout_ms)); });
}

int rsd_reduce_scatter_autograd(const RsdGroup* g, const Tensor* t, int64_t timeout_ms,
                                Tensor** out, char* err, size_t err_len) {
  return rsd::guard(err, err_len,
                    [&] { *out = new Tensor(ReduceScatterFn::apply(*t, g, timeout_ms)); });
}

int rsd_all_to_all_autograd(const RsdGroup* g, const Tensor* t, int64_t timeout_ms, Tensor** out,
                            char* err, size_t err_len) {
  return rsd::guard(err, err_len,
                    [&] { *out = new Tensor(AllToAllFn::apply(*t, g, timeout_ms)); });
}

}  // extern "C"
