// Paged KV: a pool of fixed-size pages with reference counts, and per-sequence
// page tables that share pages copy-on-write.
//
// A page holds the KV of PAGE_TOKENS consecutive positions for every layer:
//   page bytes = n_layer * 2 (K, V) * page_tokens * kv_dim * elem_bytes
//   layout, per layer: K as [kv_dim][slot] (dimension-major, so attention
//   scores a whole page of keys with one vector op per dimension), then V as
//   [slot][kv_dim] (row per position, for the weighted sum).
// A full page is immutable; only a sequence's last, partly filled page is
// written, and only after copy-on-write when it is shared. Slots past a
// sequence's length are kept zero, so a page's bytes depend only on the
// tokens in it (identical prefixes give identical pages, which the store
// deduplicates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ctx {

using PageId = int32_t;

struct PageLayout {
  int n_layer = 0;
  int page_tokens = 16;
  int kv_dim = 0;       // n_head_kv * head_dim
  int elem_bytes = 2;   // f16
  size_t row_bytes() const { return static_cast<size_t>(kv_dim) * elem_bytes; }
  size_t page_bytes() const { return static_cast<size_t>(n_layer) * 2 * page_tokens * row_bytes(); }
  size_t layer_bytes() const { return 2 * static_cast<size_t>(page_tokens) * row_bytes(); }
  // K block of a layer: kv_dim rows of page_tokens elements.
  size_t k_offset(int layer) const { return static_cast<size_t>(layer) * layer_bytes(); }
  // V row of (layer, slot): kv_dim elements.
  size_t v_offset(int layer, int slot) const {
    return k_offset(layer) + static_cast<size_t>(page_tokens) * row_bytes() + static_cast<size_t>(slot) * row_bytes();
  }
};

class PagePool {
 public:
  PagePool(PageLayout layout, int64_t max_pages);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const PageLayout& layout() const { return layout_; }
  size_t page_bytes() const { return page_bytes_; }
  int64_t max_pages() const { return max_pages_; }
  int64_t n_used() const;                 // pages with refcount > 0
  int64_t n_allocated() const;            // pages backed by memory (used + free list)

  PageId alloc();                         // zeroed, refcount 1; throws when the pool is full
  void incref(PageId id);
  void decref(PageId id);                 // returns the page to the free list at zero
  int refcount(PageId id) const;
  PageId copy(PageId id);                 // new page (refcount 1) with the same bytes

  uint8_t* data(PageId id);               // caller must hold a reference
  const uint8_t* data(PageId id) const;

 private:
  uint8_t* slot_ptr(PageId id) const;
  void check(PageId id) const;

  PageLayout layout_;
  size_t page_bytes_;
  int64_t max_pages_;
  static constexpr int kSlabPages = 16;   // memory grows a slab at a time, never moves
  std::vector<std::unique_ptr<uint8_t[]>> slabs_;
  std::vector<int> refcounts_;
  std::vector<PageId> free_ids_;
  int64_t n_used_ = 0;
  mutable std::mutex mu_;
};

// A sequence's page table: ordered page ids plus its token count.
class KVSeq {
 public:
  explicit KVSeq(std::shared_ptr<PagePool> pool);
  ~KVSeq();
  KVSeq(const KVSeq&) = delete;
  KVSeq& operator=(const KVSeq&) = delete;

  std::unique_ptr<KVSeq> fork() const;   // O(pages): shares every page, copies no KV bytes

  int64_t n_tokens() const { return n_tokens_; }
  const std::vector<PageId>& pages() const { return pages_; }
  PagePool& pool() const { return *pool_; }
  const std::shared_ptr<PagePool>& pool_ptr() const { return pool_; }

  // Make positions [n_tokens, n_tokens + n) writable: copy-on-write the shared
  // last page, allocate new pages. Does not change n_tokens.
  void prepare_append(int64_t n);
  void commit_append(int64_t n) { n_tokens_ += n; }
  // Keep the first n tokens [0, n); drop the rest (rewind). Zeroes the tail of
  // the new last page, copying it first if it is shared.
  void truncate(int64_t n);
  // Append a whole page given by the caller (restore from a snapshot). The
  // sequence must end on a page boundary; n_valid tokens of it count.
  void append_page(PageId id, int n_valid);

  // Base address of every page, in order (pages never move once allocated):
  // the forward pass resolves them once per step instead of once per read.
  void page_ptrs(std::vector<uint8_t*>& out) const;

 private:
  std::shared_ptr<PagePool> pool_;
  std::vector<PageId> pages_;
  int64_t n_tokens_ = 0;
};

}  // namespace ctx
