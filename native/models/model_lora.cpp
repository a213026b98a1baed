// The LoRA part of a matmul (models/lora.h), all inside the base product's own
// parallel region: its first tasks compute t = A x, then each chunk of output
// rows gets its base values and, right after, each row's adapters add s * B t
// to them in the order its batch item lists them (so y = W x, then the terms
// in order, per element, on one thread, as before). Chunks are claimed in
// order, so every A task is claimed before any base chunk; a thread about to
// add B t waits only for A tasks still running on another thread, never for a
// barrier, and the adapter costs no parallel region of its own.
#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/lora/lora_kernels.h"
#include "models/model.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ctx {

namespace {

// Rows of one term per A task, so a lone term (wo, down) in prefill still
// keeps every thread busy.
constexpr int kRowBlock = 16;
// Pause-spins before a thread waiting for A tasks yields its core instead (on
// a loaded machine the thread it waits for may need this very core).
constexpr int kYieldAfter = 2000;

// Asks for [p, p + bytes) a cache line at a time, into L1 (kLevel 1) or L2
// (2); no value depends on it, and off x86 it does nothing. The adapter's
// matrices are read once a matmul, so they come cold from memory.
template <int kLevel>
void prefetch(const void* p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  for (size_t off = 0; off < bytes; off += 64)
    _mm_prefetch(static_cast<const char*>(p) + off, kLevel == 1 ? _MM_HINT_T0 : _MM_HINT_T1);
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace

// Runs of consecutive rows of this chunk that share an item with adapters
// (an item's rows are contiguous, so a run is one item's rows).
void Model::lora_runs(const std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, int n) {
  lora_runs_.clear();
  for (int r = 0; r < n;) {
    const int item = rows[r0 + r].item;
    int end = r + 1;
    while (end < n && rows[r0 + end].item == item) ++end;
    if (!items[item].loras.empty()) lora_runs_.push_back({r, end, &items[item].loras});
    r = end;
  }
}

int64_t Model::lora_prepare(int layer, std::initializer_list<MatmulJob> jobs) {
  lora_terms_.clear();
  lora_tasks_.clear();
  lora_a_done_.store(0, std::memory_order_relaxed);
  if (lora_runs_.empty()) return 0;
  // One term per (job, run, adapter touching the job's matrix), in the order
  // each row adds them: by job, then run, then the item's adapter order.
  size_t t_size = 0;
  int job = 0;
  for (const MatmulJob& j : jobs) {
    for (const LoraRun& run : lora_runs_)
      for (const LoraUse& use : *run.loras)
        if (const LoraPair* p = use.adapter->get(layer, j.target)) {
          lora_terms_.push_back({job, p, use.adapter->factor(*p, use.scale), run.r0, run.r1, t_size});
          t_size += static_cast<size_t>(run.r1 - run.r0) * p->rank;
        }
    ++job;
  }
  if (s_.lora_t.size() < t_size) s_.lora_t.resize(t_size);
  for (int ti = 0; ti < static_cast<int>(lora_terms_.size()); ++ti)
    for (int b = 0; b * kRowBlock < lora_terms_[ti].r1 - lora_terms_[ti].r0; ++b) lora_tasks_.push_back({ti, b});
  return static_cast<int64_t>(lora_tasks_.size());
}

// t = A x for task i's rows of its term: (rows, rank), each element whole, by
// matmul_f, whichever thread runs it.
void Model::lora_down(int64_t i, const float* x, int n_in) {
  const LoraTerm& t = lora_terms_[lora_tasks_[i].term];
  // The next term's A is asked for while this one computes.
  if (i + 1 < static_cast<int64_t>(lora_tasks_.size()) && lora_tasks_[i + 1].term != lora_tasks_[i].term) {
    const std::vector<uint8_t>& a = lora_terms_[lora_tasks_[i + 1].term].p->a;
    prefetch<1>(a.data(), a.size());
  }
  const int b0 = t.r0 + lora_tasks_[i].block * kRowBlock, b1 = std::min(t.r1, b0 + kRowBlock);
  matmul_f(t.p->atype, t.p->a.data(), n_in, 0, t.p->rank, x + static_cast<size_t>(b0) * n_in, b1 - b0,
           s_.lora_t.data() + t.t_off + static_cast<size_t>(b0 - t.r0) * t.p->rank, static_cast<size_t>(t.p->rank));
  lora_a_done_.fetch_add(1, std::memory_order_release);
}

// Asks for B's rows of this chunk's outputs [o0, o1) (one run of memory in
// lora::up's blocks) before the base rows are computed, so that they arrive in
// L2 while the base product runs instead of stalling B t when it starts.
void Model::lora_prefetch(int job, int64_t o0, int64_t o1) const {
  for (const LoraTerm& t : lora_terms_) {
    if (t.job != job) continue;
    const LoraPair& p = *t.p;
    // From o0's block to the end of o1 - 1's, in bt or in bt16 (f16 and bf16 bits).
    const int o_end = static_cast<int>(o1 + lora::kBlock - 1) / lora::kBlock * lora::kBlock;
    const size_t begin = lora::blocked_index(0, static_cast<int>(o0), p.rank);
    const size_t n = lora::blocked_index(0, o_end, p.rank) - begin;
    if (p.btype == DType::F16 || p.btype == DType::BF16) prefetch<2>(p.bt16.data() + begin, n * sizeof(uint16_t));
    else prefetch<2>(p.bt.data() + begin, n * sizeof(float));
  }
}

void Model::lora_up_range(const MatmulJob& j, int job, int64_t o0, int64_t o1) {
  const int64_t n_tasks = static_cast<int64_t>(lora_tasks_.size());
  for (int i = 0; lora_a_done_.load(std::memory_order_acquire) < n_tasks; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    if (i < kYieldAfter) _mm_pause();
    else
#endif
      std::this_thread::yield();
  }
  const int n_out = j.w->n_out;
  const Kernels& kern = kernels();
  for (const LoraTerm& t : lora_terms_) {
    if (t.job != job) continue;
    const float* tt = s_.lora_t.data() + t.t_off;
    float* y = j.y + static_cast<size_t>(t.r0) * n_out;
    auto up = [&](auto kernel, const auto* bt) {
      kernel(bt, t.p->rank, n_out, static_cast<int>(o0), static_cast<int>(o1), tt, t.r1 - t.r0, t.factor, y,
             static_cast<size_t>(n_out));
    };
    switch (t.p->btype) {
      case DType::F16: up(kern.lora_up_f16, t.p->bt16.data()); break;
      case DType::BF16: up(kern.lora_up_bf16, t.p->bt16.data()); break;
      default: up(kern.lora_up, t.p->bt.data());
    }
  }
}

}  // namespace ctx
