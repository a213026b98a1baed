// Asking for cache lines before they are read: the attention's K and V, whose
// pages lie far apart (model_attention.cpp, kernels/attention/attention_simd.h).
// In an anonymous namespace, as everything the ISA units include: each keeps
// its own copy, so none built with wider flags stands in for the others
// (docs/architecture.md).
#pragma once

#include <xmmintrin.h>

#include <cstdint>

namespace ctx {

namespace {

// Asks for every cache line of [a, e) to be read into L1.
inline void prefetch_lines(const void* a, const void* e) {
  const auto end = reinterpret_cast<uintptr_t>(e);
  for (auto line = reinterpret_cast<uintptr_t>(a) & ~uintptr_t{63}; line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

}  // namespace

}  // namespace ctx
