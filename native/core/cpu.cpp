#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <string>

namespace ctx {

namespace {

// Must list every -m flag CMakeLists.txt gives the path's files: a kernel
// compiled with a feature the CPU lacks dies with SIGILL (tests/test_cpu.py
// compares the two lists).
const std::vector<IsaFeature> kAvx2 = {{"avx2", "avx2"}, {"fma", "fma"}, {"f16c", "f16c"}};
const std::vector<IsaFeature> kAvx512 = {
    {"avx512f", "avx512f"},       {"avx512bw", "avx512bw"},       {"avx512vl", "avx512vl"},
    {"avx512dq", "avx512dq"},     {"avx512vnni", "avx512_vnni"},  {"avx512bf16", "avx512_bf16"},
    {"fma", "fma"},               {"f16c", "f16c"},               {"avx2", "avx2"}};
const std::vector<IsaFeature> kScalar = {};

#if defined(__x86_64__) || defined(__i386__)
// __builtin_cpu_supports takes only string literals, so the names above are
// matched to calls here; it also checks that the OS saves the vector state.
bool cpu_has(const std::string& f) {
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "f16c") return __builtin_cpu_supports("f16c");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
  if (f == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
  if (f == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
  if (f == "avxvnni") return __builtin_cpu_supports("avxvnni");
  return false;  // a feature nobody taught this function: never assume it
}

bool cpu_has_all(Isa isa) {
  for (const IsaFeature& f : isa_features(isa))
    if (!cpu_has(f.compiler)) return false;
  return true;
}
#endif

Isa probe() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (cpu_has_all(Isa::avx512)) return Isa::avx512;
  if (cpu_has_all(Isa::avx2)) return Isa::avx2;
#endif
  return Isa::scalar;
}

}  // namespace

Isa detect_isa() {
  static const Isa best = probe();
  return best;
}

bool whole_512_bit_units() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool whole = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return false;  // no 512-bit units at all
    if (!__builtin_cpu_is("amd")) return true;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    const unsigned family = ((eax >> 8) & 0xF) + ((eax >> 20) & 0xFF);  // base + extended (base is 0xF on AMD)
    return family >= 0x1A;
  }();
  return whole;
#else
  return false;
#endif
}

bool has_avx_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  // The *_avxvnni.cpp files are built with the AVX2 path's flags and -mavxvnni.
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_all(Isa::avx2) && cpu_has("avxvnni");
  }();
  return has;
#else
  return false;
#endif
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

const std::vector<IsaFeature>& isa_features(Isa isa) {
  switch (isa) {
    case Isa::avx2: return kAvx2;
    case Isa::avx512: return kAvx512;
    case Isa::scalar: break;
  }
  return kScalar;
}

}  // namespace ctx
