#include "kv/page_pool.h"

#include <cassert>
#include <cstring>
#include <stdexcept>
#include <string>

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

PagePool::PagePool(PageLayout layout, int64_t max_pages)
    : layout_(layout), page_bytes_(layout.page_bytes()), max_pages_(max_pages) {
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
  return slabs_[id / kSlabPages].get() + static_cast<size_t>(id % kSlabPages) * page_bytes_;
}

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
    if (id % kSlabPages == 0) slabs_.emplace_back(new uint8_t[page_bytes_ * kSlabPages]);
    refcounts_.push_back(0);
  }
  assert(refcounts_[id] == 0);
  refcounts_[id] = 1;
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

KVSeq::KVSeq(std::shared_ptr<PagePool> pool) : pool_(std::move(pool)) {}

KVSeq::~KVSeq() {
  for (PageId id : pages_) pool_->decref(id);
}

std::unique_ptr<KVSeq> KVSeq::fork() const {
  auto child = std::make_unique<KVSeq>(pool_);
  for (PageId id : pages_) pool_->incref(id);
  child->pages_ = pages_;
  child->n_tokens_ = n_tokens_;
  return child;
}

void KVSeq::prepare_append(int64_t n) {
  if (n <= 0) return;
  const int pt = pool_->layout().page_tokens;
  // The last page is partly filled and we will write into it: own it first.
  if (n_tokens_ % pt != 0) {
    PageId& last = pages_.back();
    if (pool_->refcount(last) > 1) {
      PageId own = pool_->copy(last);
      pool_->decref(last);
      last = own;
    }
  }
  const int64_t need = (n_tokens_ + n + pt - 1) / pt;
  while (static_cast<int64_t>(pages_.size()) < need) pages_.push_back(pool_->alloc());
}

void KVSeq::truncate(int64_t n) {
  if (n < 0 || n > n_tokens_) throw std::out_of_range("truncate past the sequence end");
  if (n == n_tokens_) return;
  const PageLayout& lay = pool_->layout();
  const int pt = lay.page_tokens;
  const size_t keep_pages = static_cast<size_t>((n + pt - 1) / pt);
  while (pages_.size() > keep_pages) {
    pool_->decref(pages_.back());
    pages_.pop_back();
  }
  n_tokens_ = n;
  const int used = static_cast<int>(n % pt);
  if (used == 0 || pages_.empty()) return;
  PageId& last = pages_.back();
  if (pool_->refcount(last) > 1) {
    PageId own = pool_->copy(last);
    pool_->decref(last);
    last = own;
  }
  // Zero slots [used, pt) of every array of every layer (page_pool.h layout).
  uint8_t* base = pool_->data(last);
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

void KVSeq::append_page(PageId id, int n_valid) {
  const int pt = pool_->layout().page_tokens;
  if (n_tokens_ % pt != 0) throw std::logic_error("append_page needs a page-aligned sequence");
  if (n_valid < 1 || n_valid > pt) throw std::out_of_range("n_valid outside 1..page_tokens");
  pool_->incref(id);
  pages_.push_back(id);
  n_tokens_ += n_valid;
}

void KVSeq::page_ptrs(std::vector<uint8_t*>& out) const {
  out.resize(pages_.size());
  for (size_t i = 0; i < pages_.size(); ++i) out[i] = pool_->data(pages_[i]);
}

}  // namespace ctx
