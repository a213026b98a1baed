#include "core/cpu.h"

#include <atomic>
#include <stdexcept>
#include <string>

namespace ctx {

namespace {

Isa probe() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
  if (avx512) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Isa::avx2;
#endif
  return Isa::scalar;
}

std::atomic<int> g_active{-1};

}  // namespace

Isa detect_isa() {
  static const Isa best = probe();
  return best;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_relaxed);
  return v < 0 ? detect_isa() : static_cast<Isa>(v);
}

void set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detect_isa()))
    throw std::invalid_argument(std::string("this CPU does not support the ") + isa_name(isa) + " path");
  g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

}  // namespace ctx
