// The phase clock's C++ face (phase_clock.cpp), for the shims that time their own work: the
// attention's forward and backward. Both calls do nothing while the clock is off.
#pragma once

namespace rsd {

void phase_begin(const char* name);
void phase_end();

// A span for the life of a scope.
struct PhaseScope {
  explicit PhaseScope(const char* name) { phase_begin(name); }
  ~PhaseScope() { phase_end(); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};

}  // namespace rsd
