// Run-time choice of the SIMD path. Every path computes bit-identical results
// (see quant/quant.h for the canonical reduction orders), so the choice only
// changes speed; tests force each path in turn and compare against scalar.
#pragma once

namespace ctx {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

Isa detect_isa();          // best path this CPU supports (CPUID, once)
Isa active_isa();          // path in use now (defaults to detect_isa())
void set_isa(Isa isa);     // force a path; throws if the CPU lacks it
const char* isa_name(Isa isa);

}  // namespace ctx
