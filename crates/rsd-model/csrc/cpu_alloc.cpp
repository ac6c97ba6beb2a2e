// A counting wrapper over c10's CPU allocator: live and peak bytes of every CPU tensor storage,
// for measuring what a training step holds (see crates/rsd-model/src/alloc.rs).
//
// The wrapper keeps the wrapped allocator's DataPtr shape: the context is the data pointer itself,
// so `Allocator::raw_allocate` / `raw_deallocate` and `is_simple_data_ptr` stay valid. The size
// of each live allocation is kept in a table keyed by that pointer (the deleter only receives the
// pointer); the table is a mutex-guarded hash map, cheap next to the allocation itself.
//
// What this does not see: memory libtorch takes without the CPU allocator (oneDNN/mkldnn scratch
// pads and OpenMP thread stacks use their own malloc; direct `c10::alloc_cpu` calls bypass the
// registered allocator), the Gloo transport's own buffers, and storages allocated before
// `rsd_alloc_install` (freed through their original deleter, never counted).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {

std::atomic<uint64_t> g_live{0};
std::atomic<uint64_t> g_peak{0};
std::atomic<uint64_t> g_allocs{0};

void raise_peak(uint64_t live) {
  uint64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak &&
         !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

class CountingAllocator;
CountingAllocator* g_self = nullptr;

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner)
      : inner_(inner), inner_deleter_(inner->raw_deleter()) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr dp = inner_->allocate(n);
    void* data = dp.get();
    // A zero-size storage has no data (nothing to count); an allocator whose contexts are not
    // its data pointers cannot be wrapped this way: pass it through uncounted.
    if (data == nullptr || inner_deleter_ == nullptr || dp.get_context() != data) {
      return dp;
    }
    c10::Device device = dp.device();
    dp.release_context();
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = n;
    }
    uint64_t live = g_live.fetch_add(n, std::memory_order_relaxed) + n;
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    raise_peak(live);
    return {data, data, &CountingAllocator::deleter, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return inner_deleter_ ? &CountingAllocator::deleter : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void deleter(void* ptr) {
    CountingAllocator* self = g_self;
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->sizes_.find(ptr);
      if (it != self->sizes_.end()) {
        n = it->second;
        self->sizes_.erase(it);
      }
    }
    g_live.fetch_sub(n, std::memory_order_relaxed);
    self->inner_deleter_(ptr);
  }

 private:
  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_deleter_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
};

std::once_flag g_once;

}  // namespace

extern "C" {

// Installs the counting allocator over the current CPU allocator, once (later calls do nothing).
// Returns 1 when counting is active, 0 when the current allocator cannot be wrapped (its contexts
// are not its data pointers).
int rsd_alloc_install() {
  std::call_once(g_once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    if (inner->raw_deleter() == nullptr) {
      return;
    }
    // Never freed: storages made through it may outlive any owner we could give it.
    g_self = new CountingAllocator(inner);
    c10::SetCPUAllocator(g_self, /*priority=*/UINT8_MAX);
  });
  return g_self != nullptr && c10::GetCPUAllocator() == g_self ? 1 : 0;
}

uint64_t rsd_alloc_live() { return g_live.load(std::memory_order_relaxed); }

uint64_t rsd_alloc_peak() { return g_peak.load(std::memory_order_relaxed); }

uint64_t rsd_alloc_count() { return g_allocs.load(std::memory_order_relaxed); }

// Sets the peak to the bytes live now, and returns the peak it replaces.
uint64_t rsd_alloc_reset_peak() {
  uint64_t live = g_live.load(std::memory_order_relaxed);
  uint64_t old = g_peak.exchange(live, std::memory_order_relaxed);
  // An allocation between the two loads may have raised the peak above `live`: keep it.
  raise_peak(g_live.load(std::memory_order_relaxed));
  return old;
}

}  // extern "C"
