#include "kv/page_pool.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace ctx {

const char* kv_dtype_name(KVDType t) {
  switch (t) {
    case KVDType::f16: return "f16";
    case KVDType::q8: return "q8";
    case KVDType::vq8: return "vq8";
  }
  return "unknown";
}

KVDType kv_dtype_from_name(const std::string& name) {
  for (KVDType t : {KVDType::f16, KVDType::q8, KVDType::vq8})
    if (name == kv_dtype_name(t)) return t;
  throw std::invalid_argument("unknown KV dtype '" + name + "' (f16, q8, vq8)");
}

namespace {
std::atomic<uint64_t> next_pool_serial{1};
}  // namespace

PagePool::PagePool(PageLayout layout, int64_t max_pages)
    : layout_(layout),
      page_bytes_(layout.page_bytes()),
      slot_bytes_((page_bytes_ + kLine - 1) / kLine * kLine),
      max_pages_(max_pages),
      serial_(next_pool_serial.fetch_add(1)) {
  if (page_bytes_ == 0) throw std::invalid_argument("page layout has zero size");
  if (layout.v_quantized() && layout.kv_dim % KV_BLOCK != 0)
    throw std::invalid_argument(std::string("a ") + kv_dtype_name(layout.dtype) + " KV needs kv_dim to be a multiple of " +
                                std::to_string(KV_BLOCK));
  if (max_pages < 1) throw std::invalid_argument("page pool needs at least one page");
}

int64_t PagePool::n_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_used_;
}

int64_t PagePool::n_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(refcounts_.size());
}

uint8_t* PagePool::slot_ptr(PageId id) const {
  return slabs_[id / kSlabPages].get() + static_cast<size_t>(id % kSlabPages) * slot_bytes_;
}

// A slab aligned to a cache line, and its pages whole lines apart, so that a
// page's K and V blocks and V rows (multiples of 64 bytes from its start)
// begin lines: new[] gave 16 bytes past one, and every 64-byte read of a V
// row then touched two.
PagePool::Slab PagePool::new_slab(size_t bytes) {  // bytes: whole lines (slot_bytes_)
  void* p = std::aligned_alloc(kLine, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return Slab(static_cast<uint8_t*>(p));
}

void PagePool::SlabFree::operator()(uint8_t* p) const { std::free(p); }

void PagePool::check(PageId id) const {
  if (id < 0 || id >= static_cast<PageId>(refcounts_.size()))
    throw std::out_of_range("page id " + std::to_string(id) + " out of range");
}

PageId PagePool::alloc() {
  std::lock_guard<std::mutex> lock(mu_);
  PageId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    if (static_cast<int64_t>(refcounts_.size()) >= max_pages_)
      throw std::length_error("KV page pool is full (" + std::to_string(max_pages_) + " pages)");
    id = static_cast<PageId>(refcounts_.size());
    if (id % kSlabPages == 0) slabs_.push_back(new_slab(slot_bytes_ * kSlabPages));
    refcounts_.push_back(0);
    versions_.push_back(0);
  }
  assert(refcounts_[id] == 0);
  refcounts_[id] = 1;
  ++versions_[id];
  ++n_used_;
  std::memset(slot_ptr(id), 0, page_bytes_);
  return id;
}

void PagePool::incref(PageId id) {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  if (refcounts_[id] <= 0) throw std::logic_error("incref of a free page");
  ++refcounts_[id];
}

void PagePool::decref(PageId id) {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  if (refcounts_[id] <= 0) throw std::logic_error("double free of page " + std::to_string(id));
  if (--refcounts_[id] == 0) {
    free_ids_.push_back(id);
    --n_used_;
  }
}

int PagePool::refcount(PageId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  return refcounts_[id];
}

uint64_t PagePool::version(PageId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  return versions_[id];
}

void PagePool::touch(PageId id) {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  ++versions_[id];
}

bool PagePool::incref_if(PageId id, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  if (refcounts_[id] <= 0 || versions_[id] != version) return false;
  ++refcounts_[id];
  return true;
}

PageId PagePool::copy(PageId src) {
  PageId dst = alloc();
  std::memcpy(data(dst), data(src), page_bytes_);
  return dst;
}

uint8_t* PagePool::data(PageId id) {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  return slot_ptr(id);
}

const uint8_t* PagePool::data(PageId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  check(id);
  return slot_ptr(id);
}

// ---------------------------------------------------------------------------

PageId ReleasedCopies::find(const PagePool& full, PageId id, PagePool& trim, const std::vector<int>& kept) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = map_.find(id);
  if (it == map_.end()) return -1;
  const Entry& e = it->second;
  if (e.full_serial == full.serial() && e.kept == kept && full.version(id) == e.full_version &&
      trim.incref_if(e.copy, e.copy_version))
    return e.copy;
  map_.erase(it);  // stale: another pool or layers, the full page written or reused, or the copy freed
  return -1;
}

void ReleasedCopies::remember(const PagePool& full, PageId id, const PagePool& trim, PageId copy,
                              const std::vector<int>& kept) {
  std::lock_guard<std::mutex> lock(mu_);
  map_[id] = {full.serial(), full.version(id), copy, trim.version(copy), kept};
}

// ---------------------------------------------------------------------------

KVSeq::KVSeq(std::shared_ptr<PagePool> pool, std::shared_ptr<const SwaRelease> swa)
    : pool_(std::move(pool)), swa_(std::move(swa)) {
  if (swa_) {
    const PageLayout& a = pool_->layout();
    const PageLayout& b = swa_->trim_pool->layout();
    if (swa_->window < 1 || b.n_layer != static_cast<int>(swa_->keep_layers.size()) || b.page_tokens != a.page_tokens ||
        b.kv_dim != a.kv_dim || b.dtype != a.dtype)
      throw std::invalid_argument("the trim pool's layout does not match the kept layers");
    for (int l : swa_->keep_layers)
      if (l < 0 || l >= a.n_layer) throw std::invalid_argument("kept layer outside the model");
  }
}

KVSeq::~KVSeq() {
  for (size_t i = 0; i < pages_.size(); ++i) pool_of(i).decref(pages_[i]);
}

std::unique_ptr<KVSeq> KVSeq::fork() const {
  auto child = std::make_unique<KVSeq>(pool_, swa_);
  for (size_t i = 0; i < pages_.size(); ++i) pool_of(i).incref(pages_[i]);
  child->pages_ = pages_;
  child->n_tokens_ = n_tokens_;
  child->n_released_ = n_released_;
  return child;
}

int64_t KVSeq::release_target(int64_t n) const {
  if (!swa_) return 0;
  const int pt = pool_->layout().page_tokens;
  const int64_t first_visible = n - swa_->window + 1;  // the next query's oldest key
  return first_visible - pt > 0 ? (first_visible - pt) / pt : 0;
}

bool KVSeq::can_truncate(int64_t n) const {
  if (n < 0 || n > n_tokens_) return false;
  if (n_released_ == 0) return true;
  const int pt = pool_->layout().page_tokens;
  const int64_t first_visible = n - swa_->window + 1;
  return first_visible > 0 && first_visible / pt >= n_released_;
}

void KVSeq::commit_append(int64_t n) {
  n_tokens_ += n;
  if (!defer_release_) release_outside_window();
}

void KVSeq::defer_release(bool defer) {
  defer_release_ = defer;
  if (!defer) release_outside_window();
}

void KVSeq::release_outside_window() {
  const int64_t target = std::min<int64_t>(release_target(n_tokens_), static_cast<int64_t>(pages_.size()));
  if (target <= n_released_) return;
  const PageLayout& lay = pool_->layout();
  const size_t layer_bytes = lay.layer_bytes();
  PagePool& trim = *swa_->trim_pool;
  ReleasedCopies& copies = trim.released_copies();
  for (int64_t i = n_released_; i < target; ++i) {
    // A fork that released this page first made its copy: share it.
    PageId released = copies.find(*pool_, pages_[i], trim, swa_->keep_layers);
    if (released < 0) {
      released = trim.alloc();
      const uint8_t* src = pool_->data(pages_[i]);
      uint8_t* dst = trim.data(released);
      // A layer's arrays are contiguous (page_pool.h), so each kept layer is one copy.
      for (size_t k = 0; k < swa_->keep_layers.size(); ++k)
        std::memcpy(dst + k * layer_bytes, src + lay.k_offset(swa_->keep_layers[k]), layer_bytes);
      if (pool_->refcount(pages_[i]) > 1) copies.remember(*pool_, pages_[i], trim, released, swa_->keep_layers);
    }
    pool_->decref(pages_[i]);
    pages_[i] = released;
    n_released_ = i + 1;  // page i now lives in the trim pool (pool_of relies on it)
  }
}

void KVSeq::prepare_append(int64_t n) {
  if (n <= 0) return;
  const int pt = pool_->layout().page_tokens;
  // The last page is partly filled and we will write into it: own it first.
  // (It is never released: a released page lies wholly before the window.)
  if (n_tokens_ % pt != 0) {
    PageId& last = pages_.back();
    if (pool_->refcount(last) > 1) {
      PageId own = pool_->copy(last);
      pool_->decref(last);
      last = own;
    } else {
      pool_->touch(last);  // written in place: a released copy made of it no longer holds its bytes
    }
  }
  const int64_t need = (n_tokens_ + n + pt - 1) / pt;
  while (static_cast<int64_t>(pages_.size()) < need) pages_.push_back(pool_->alloc());
}

int64_t KVSeq::copy_slot(int64_t n) const {
  const int pt = pool_->layout().page_tokens;
  if (n <= 0 || n % pt == 0) return -1;
  const size_t last = static_cast<size_t>((n - 1) / pt);  // never released: can_truncate(n) holds
  if (pool_->refcount(pages_[last]) <= 1) return -1;
  for (size_t i = last + 1; i < pages_.size(); ++i)
    if (pool_->refcount(pages_[i]) == 1) return static_cast<int64_t>(i);  // ours alone, dropped anyway
  return static_cast<int64_t>(pages_.size());
}

int64_t KVSeq::pages_to_truncate(int64_t n) const {
  if (n < 0 || n >= n_tokens_ || !can_truncate(n)) return 0;
  return copy_slot(n) == static_cast<int64_t>(pages_.size()) ? 1 : 0;
}

void KVSeq::truncate(int64_t n) {
  if (n < 0 || n > n_tokens_) throw std::out_of_range("truncate past the sequence end");
  if (n == n_tokens_) return;
  if (!can_truncate(n))
    throw std::domain_error("cannot step back to " + std::to_string(n) +
                            " tokens: the sliding-window KV before that point was released");
  const PageLayout& lay = pool_->layout();
  const int pt = lay.page_tokens;
  const size_t keep_pages = static_cast<size_t>((n + pt - 1) / pt);
  const int used = static_cast<int>(n % pt);
  // Own the new last page first (copy-on-write), before anything changes: the
  // only step that can fail (a full pool) then leaves the sequence as it was.
  const int64_t slot = copy_slot(n);
  if (slot == static_cast<int64_t>(pages_.size())) {
    const PageId own = pool_->copy(pages_[keep_pages - 1]);
    pool_->decref(pages_[keep_pages - 1]);
    pages_[keep_pages - 1] = own;
  } else if (slot >= 0) {
    // A page being dropped that only we hold takes the copy: no allocation.
    pool_->touch(pages_[slot]);  // its bytes change: a released copy made of it no longer holds them
    std::memcpy(pool_->data(pages_[slot]), pool_->data(pages_[keep_pages - 1]), pool_->page_bytes());
    std::swap(pages_[slot], pages_[keep_pages - 1]);  // the shared page is dropped below instead
  } else if (used != 0) {
    pool_->touch(pages_[keep_pages - 1]);  // written in place (below)
  }
  while (pages_.size() > keep_pages) {
    pool_->decref(pages_.back());
    pages_.pop_back();
  }
  n_tokens_ = n;
  if (used == 0) return;
  // Zero slots [used, pt) of every array of every layer (page_pool.h layout).
  uint8_t* base = pool_->data(pages_.back());
  auto zero_columns = [&](uint8_t* rows, int n_rows, size_t eb) {  // [n_rows][slot] arrays
    for (int r = 0; r < n_rows; ++r) std::memset(rows + (static_cast<size_t>(r) * pt + used) * eb, 0, (pt - used) * eb);
  };
  for (int layer = 0; layer < lay.n_layer; ++layer) {
    zero_columns(base + lay.k_offset(layer), lay.kv_dim, lay.k_elem_bytes());
    if (lay.k_quantized()) zero_columns(base + lay.k_scale_offset(layer), lay.n_blocks(), 2);
    std::memset(base + lay.v_offset(layer, used), 0, (pt - used) * lay.v_row_bytes());
    std::memset(base + lay.v_scale_offset(layer, used), 0, (pt - used) * lay.v_scale_row_bytes());
  }
}

void KVSeq::append_page(PageId id, int n_valid, bool released) {
  const int pt = pool_->layout().page_tokens;
  if (n_tokens_ % pt != 0) throw std::logic_error("append_page needs a page-aligned sequence");
  if (n_valid < 1 || n_valid > pt) throw std::out_of_range("n_valid outside 1..page_tokens");
  if (released) {
    if (!swa_) throw std::invalid_argument("a released page needs a sliding-window sequence");
    if (static_cast<int64_t>(pages_.size()) != n_released_)
      throw std::logic_error("released pages must come before every full page");
    if (n_valid != pt) throw std::invalid_argument("a released page must be full");
    swa_->trim_pool->incref(id);
    pages_.push_back(id);
    ++n_released_;
  } else {
    pool_->incref(id);
    pages_.push_back(id);
  }
  n_tokens_ += n_valid;
}

const uint8_t* KVSeq::page_data(size_t index, size_t* n_bytes) const {
  if (index >= pages_.size()) throw std::out_of_range("page index out of range");
  PagePool& p = pool_of(index);
  *n_bytes = p.page_bytes();
  return p.data(pages_[index]);
}

void KVSeq::page_ptrs(std::vector<uint8_t*>& out) const {
  out.resize(pages_.size());
  for (size_t i = 0; i < pages_.size(); ++i) out[i] = pool_of(i).data(pages_[i]);
}

}  // namespace ctx
