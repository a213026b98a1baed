// The LoRA part of a matmul (models/lora.h): t = A x before the base product,
// then, in the base product's own parallel region, right after each chunk of
// output rows, each row's adapters add s * B t to them in the order its batch
// item lists them (so y = W x, then the terms in order, per element, on one
// thread, as before; B t costs no region of its own).
#include <algorithm>
#include <vector>

#include "kernels/kernels.h"
#include "models/model.h"

namespace ctx {

namespace {

// Below this many multiply-adds of A x (a decode step's share) the products run
// on the calling thread: another wake-up and barrier per matmul would cost
// more than the work. Either way each element is computed the same way.
constexpr int64_t kSerialWork = 1 << 18;

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

bool Model::lora_prepare(int layer, std::initializer_list<MatmulJob> jobs, const float* x) {
  lora_terms_.clear();
  if (lora_runs_.empty()) return false;
  // One term per (job, run, adapter touching the job's matrix), in the order
  // each row adds them: by job, then run, then the item's adapter order.
  std::vector<LoraTerm>& terms = lora_terms_;
  size_t t_size = 0;
  int job = 0, n_in = 0;
  int64_t work = 0;
  for (const MatmulJob& j : jobs) {
    n_in = j.w->n_in;
    for (const LoraRun& run : lora_runs_)
      for (const LoraUse& use : *run.loras)
        if (const LoraPair* p = use.adapter->get(layer, j.target)) {
          terms.push_back({job, p, use.adapter->factor(*p, use.scale), run.r0, run.r1, t_size});
          t_size += static_cast<size_t>(run.r1 - run.r0) * p->rank;
          work += static_cast<int64_t>(run.r1 - run.r0) * p->rank * p->n_in;
        }
    ++job;
  }
  if (terms.empty()) return false;
  if (s_.lora_t.size() < t_size) s_.lora_t.resize(t_size);
  // t = A x for each term's rows: (rows, rank), in tasks of up to kRowBlock
  // rows of one term, so a lone term (wo, down) still keeps every thread busy.
  constexpr int kRowBlock = 16;
  int64_t n_tasks = 0;
  for (const LoraTerm& t : terms) n_tasks += (t.r1 - t.r0 + kRowBlock - 1) / kRowBlock;
  auto products = [&](int64_t i0, int64_t i1) {
    int64_t first = 0;  // the first task of term ti
    size_t ti = 0;
    for (int64_t i = i0; i < i1; ++i) {
      while (i >= first + (terms[ti].r1 - terms[ti].r0 + kRowBlock - 1) / kRowBlock)
        first += (terms[ti].r1 - terms[ti].r0 + kRowBlock - 1) / kRowBlock, ++ti;
      const LoraTerm& t = terms[ti];
      const int b0 = t.r0 + static_cast<int>(i - first) * kRowBlock, b1 = std::min(t.r1, b0 + kRowBlock);
      const void* a = t.p->half ? static_cast<const void*>(t.p->a16.data()) : t.p->a.data();
      matmul_f(t.p->half ? DType::F16 : DType::F32, a, n_in, 0, t.p->rank, x + static_cast<size_t>(b0) * n_in, b1 - b0,
               s_.lora_t.data() + t.t_off + static_cast<size_t>(b0 - t.r0) * t.p->rank,
               static_cast<size_t>(t.p->rank));
    }
  };
  if (work < kSerialWork)
    products(0, n_tasks);
  else
    pool_.parallel_for(n_tasks, 1, products);
  return true;
}

void Model::lora_up_range(const MatmulJob& j, int job, int64_t o0, int64_t o1) {
  const int n_out = j.w->n_out;
  const Kernels& kern = kernels();
  for (const LoraTerm& t : lora_terms_) {
    if (t.job != job) continue;
    const float* tt = s_.lora_t.data() + t.t_off;
    float* y = j.y + static_cast<size_t>(t.r0) * n_out;
    if (t.p->half)
      kern.lora_up_f16(t.p->bt16.data(), t.p->rank, n_out, static_cast<int>(o0), static_cast<int>(o1), tt,
                       t.r1 - t.r0, t.factor, y, static_cast<size_t>(n_out));
    else
      kern.lora_up(t.p->bt.data(), t.p->rank, n_out, static_cast<int>(o0), static_cast<int>(o1), tt, t.r1 - t.r0,
                   t.factor, y, static_cast<size_t>(n_out));
  }
}

}  // namespace ctx
