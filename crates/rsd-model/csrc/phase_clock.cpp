// The phase clock: named, nested spans of a training step timed on the device that runs it
// (see crates/rsd-model/src/phases.rs for what it is for and how the names nest).
//
// On CUDA a span is two c10::Events with timing enabled (EventFlag::BACKEND_DEFAULT), recorded
// on the device's current stream: recording costs microseconds and never waits, so the step runs
// as it would unprofiled, and the host reads the times once, at the end of the step. On the CPU,
// where every op has finished when it returns, a span is two steady_clock readings. c10::Event and
// the device guard are device-generic: this file needs only c10 headers, like device_alloc.cpp.
//
// The clock is process-wide and guarded by a mutex: the Rust thread opens the step's phases, and
// on CUDA the autograd engine runs the attention backward (which opens spans of its own) on its
// device thread while the Rust thread waits for it, so spans never interleave.
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "phase_clock.h"

namespace {

struct Mark {
  std::unique_ptr<c10::Event> event;  // CUDA
  std::chrono::steady_clock::time_point at;  // CPU
};

struct Span {
  std::string name;  // the full path, "backward/attention backward"
  Mark start;
  Mark end;
  bool closed = false;
};

struct Clock {
  std::mutex mu;
  bool enabled = false;
  int device = -1;  // CUDA device index, or -1 for the CPU
  std::vector<std::string> open;  // names of the open spans, outermost first
  std::vector<size_t> open_at;    // their indices in `spans`
  std::vector<Span> spans;
};

Clock& phase_clock() {
  static Clock c;
  return c;
}

Mark mark_now(int device) {
  Mark m;
  if (device < 0) {
    m.at = std::chrono::steady_clock::now();
    return m;
  }
  const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  m.event = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  m.event->record(guard.getStream(dev));
  return m;
}

// Milliseconds from `a` to `b`; waits for `b` on CUDA.
double elapsed_ms(const Mark& a, const Mark& b) {
  if (a.event == nullptr) {
    return std::chrono::duration<double, std::milli>(b.at - a.at).count();
  }
  b.event->synchronize();
  return a.event->elapsedTime(*b.event);
}

void write_error(const std::exception& e, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, e.what(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

namespace rsd {

void phase_begin(const char* name) {
  Clock& c = phase_clock();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.enabled) return;
  std::string path;
  for (const auto& n : c.open) path += n + "/";
  path += name;
  c.open.emplace_back(name);
  c.open_at.push_back(c.spans.size());
  c.spans.push_back(Span{path, mark_now(c.device), Mark{}, false});
}

void phase_end() {
  Clock& c = phase_clock();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.enabled || c.open.empty()) return;
  Span& s = c.spans[c.open_at.back()];
  s.end = mark_now(c.device);
  s.closed = true;
  c.open.pop_back();
  c.open_at.pop_back();
}

}  // namespace rsd

extern "C" {

// Starts recording on `device` (a CUDA index, or -1 for the CPU), dropping anything recorded.
// Returns 0, or 1 with the message in `err`.
int rsd_phase_enable(int device, char* err, size_t err_len) {
  try {
    if (device >= 0) {
      // Fails here, with the reason, if this libtorch has no CUDA device `device`; the clock is
      // then left as it was.
      mark_now(device);
    }
    Clock& c = phase_clock();
    std::lock_guard<std::mutex> lock(c.mu);
    c.enabled = true;
    c.device = device;
    c.open.clear();
    c.open_at.clear();
    c.spans.clear();
    return 0;
  } catch (const std::exception& e) {
    write_error(e, err, err_len);
    return 1;
  }
}

int rsd_phase_enabled() {
  Clock& c = phase_clock();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.enabled ? 1 : 0;
}

void rsd_phase_begin(const char* name) {
  try {
    rsd::phase_begin(name);
  } catch (const std::exception&) {
    // A span that cannot be recorded is left out of the profile; the step goes on.
  }
}

void rsd_phase_end() {
  try {
    rsd::phase_end();
  } catch (const std::exception&) {
  }
}

// Waits for the device, sums the closed spans by name and clears them. Calls `each(ctx, name,
// milliseconds, count)` once per name, in order of first appearance. Returns 0, or 1 with the
// message in `err` (spans still open are an error: a phase was not closed).
int rsd_phase_take(void* ctx, void (*each)(void*, const char*, double, uint64_t), char* err,
                   size_t err_len) {
  try {
    Clock& c = phase_clock();
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.open.empty()) {
      std::string names;
      for (const auto& n : c.open) names += (names.empty() ? "" : ", ") + n;
      c.open.clear();
      c.open_at.clear();
      c.spans.clear();
      throw std::runtime_error("phases still open at the end of the step: " + names);
    }
    std::vector<std::string> order;
    std::map<std::string, std::pair<double, uint64_t>> sums;
    for (const Span& s : c.spans) {
      if (!s.closed) continue;
      auto [it, fresh] = sums.try_emplace(s.name, 0.0, 0);
      if (fresh) order.push_back(s.name);
      it->second.first += elapsed_ms(s.start, s.end);
      it->second.second += 1;
    }
    c.spans.clear();
    for (const auto& name : order) {
      const auto& [ms, n] = sums[name];
      each(ctx, name.c_str(), ms, n);
    }
    return 0;
  } catch (const std::exception& e) {
    write_error(e, err, err_len);
    return 1;
  }
}

}  // extern "C"
