// Asking for cache lines before they are read: the attention's K and V, whose
// pages lie far apart (model_attention.cpp, kernels/attention/attention_simd.h),
// and what a decode step reads next, asked for by the kernels that run before
// it (ReadAhead). The functions are in an anonymous namespace, as everything
// the ISA units include: each keeps its own copy, so none built with wider
// flags stands in for the others (docs/architecture.md).
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ctx {

// Bytes another part of the step will read soon (the next layer's K and V,
// Model::plan_kv_ahead), which a kernel asks for a line at a time while it
// computes (read_ahead_lines, between its tiles): the reads then overlap the
// arithmetic, where a burst of prefetches stalls the core as loads do. The
// ranges are claimed one at a time by whichever thread asks next (`next`,
// shared); `at` and `end` are this thread's place in its current one. Only
// prefetches: no result depends on it.
struct ReadRange {
  const uint8_t* p;
  size_t bytes;
};
struct ReadAhead {
  const ReadRange* ranges;
  size_t n;
  std::atomic<size_t>* next;
  const uint8_t* at = nullptr;
  const uint8_t* end = nullptr;
  bool done = false;
};
// The calling thread's reader (nullptr: none; kernels.cpp), set for a scope.
void set_read_ahead(ReadAhead* r);
ReadAhead* read_ahead();
struct ReadAheadScope {
  explicit ReadAheadScope(ReadAhead* r) { set_read_ahead(r); }
  ~ReadAheadScope() { set_read_ahead(nullptr); }
  ReadAheadScope(const ReadAheadScope&) = delete;
  ReadAheadScope& operator=(const ReadAheadScope&) = delete;
};

namespace {

// Asks for every cache line of [a, e) to be read into L1.
inline void prefetch_lines(const void* a, const void* e) {
  const auto end = reinterpret_cast<uintptr_t>(e);
  for (auto line = reinterpret_cast<uintptr_t>(a) & ~uintptr_t{63}; line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// Decode's few-row tiles (quant_rows_*) stream their weights from memory
// once, a tile being a few consecutive weight rows. While a tile multiplies
// its blocks in order, it asks for the tile this many tiles on, block b's
// share of it as it reaches block b: one stream in address order, about 4 KB
// ahead with up to 4 activation rows, where the tile keeps the memory's pace
// and a request must be out for as long as memory takes (asking for the next
// tile's rows one by one, four streams a row apart, held Gemma 3's 168 MB
// output matrix to half the read rate at 2-4 rows); with more rows the tile
// computes long enough per byte for the next tile to do (farther measured
// 2-3% slower at 16 rows).
inline size_t weight_tiles_ahead(int x_rows, size_t tile_bytes) {
  constexpr size_t kFewRowsAhead = 4096;
  return x_rows <= 4 ? std::max<size_t>(1, (kFewRowsAhead + tile_bytes - 1) / tile_bytes) : 1;
}

// The reader's next line, or nullptr once every range is claimed.
inline const uint8_t* next_line(ReadAhead& r) {
  if (r.at >= r.end) {
    if (r.done) return nullptr;
    const size_t i = r.next->fetch_add(1, std::memory_order_relaxed);
    if (i >= r.n) return r.done = true, nullptr;
    r.at = r.ranges[i].p, r.end = r.ranges[i].p + r.ranges[i].bytes;
  }
  const uint8_t* l = r.at;
  r.at += 64;
  return l;
}

// Asks for n lines of the reader's (if any) into L2. Callers ask a few at a
// time between their tiles, not inside a tile's inner loop: a branch there
// cost quant_rows_avx512.cpp's block loop 18-25% at 4-8 rows, taken or not.
inline void read_ahead_lines(ReadAhead* r, int n) {
  if (r)
    for (int i = 0; i < n; ++i)
      if (const uint8_t* l = next_line(*r)) _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T1);
}

}  // namespace

}  // namespace ctx
