// What this CPU can run. Every SIMD path computes bit-identical results (see
// kernels/quant/quant.h for the canonical reduction orders), so the choice only
// changes speed; tests force each path in turn and compare against scalar.
#pragma once

#include <vector>

namespace ctx {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

// One CPU feature a path's translation units are compiled for: the name GCC
// uses (-m<compiler>, __builtin_cpu_supports) and the flag Linux prints in
// /proc/cpuinfo (they differ for some, e.g. avx512vnni / avx512_vnni).
struct IsaFeature {
  const char* compiler;
  const char* cpuinfo;
};

Isa detect_isa();          // best path this CPU supports (CPUID, once)
// Whether 512-bit vector operations run at full width: not on a CPU without
// AVX-512, nor on AMD's Zen 4
// (CPUID family 0x19), which splits each into two 256-bit halves; Intel's
// AVX-512 cores and AMD's Zen 5 servers and desktops (family 0x1A) run them
// whole. (Zen 5 laptop parts split them too but report family 0x1A: they are
// taken as whole, which costs them a few percent and no bits.)
bool whole_512_bit_units();
// Whether the CPU has AVX-VNNI (the VEX-encoded 256-bit vpdpbusd: Intel's
// cores since Alder Lake, its AVX2-only Xeons since Sierra Forest): the AVX2
// path's prefill uses it where it can (kernels/quant/quant_impl.h avx2_vnni).
bool has_avx_vnni();
// (The path in use, active_isa / set_isa, is the kernel table's: kernels/kernels.h.)
const char* isa_name(Isa isa);
// Every feature the *_<isa>.cpp files are compiled with (CMakeLists.txt);
// the path is chosen only if the CPU has all of them.
const std::vector<IsaFeature>& isa_features(Isa isa);

}  // namespace ctx
