// Paged KV: a pool of fixed-size pages with reference counts, and per-sequence
// page tables that share pages copy-on-write.
//
// A page holds the KV of PAGE_TOKENS consecutive positions for every layer, in
// the KV dtype the model was loaded with (PageLayout below has the byte
// layout; docs/design-notes.md the arithmetic). A full page is immutable;
// only a sequence's last, partly filled page is written, and only after
// copy-on-write when it is shared. Slots past a sequence's length are kept
// zero (values and scales), so a page's bytes depend only on the tokens in it
// (identical prefixes give identical pages, which the store deduplicates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ctx {

using PageId = int32_t;

// How a page stores K and V. q8: K and V as int8 with one f16 scale per
// KV_BLOCK values (ggml q8_0 numerics, quant.h quantize_row_kv8); vq8: K f16,
// V int8.
enum class KVDType : int { f16 = 0, q8 = 1, vq8 = 2 };
constexpr int KV_BLOCK = 32;  // values per scale, along kv_dim (blocks never cross a head)

const char* kv_dtype_name(KVDType t);                 // "f16", "q8", "vq8"
KVDType kv_dtype_from_name(const std::string& name);  // throws std::invalid_argument

// Per layer, a page holds four arrays in this order (the scale arrays only
// when that side is quantized):
//   K values  [kv_dim][slot]          f16, or int8 (q8)   dimension-major, so
//   K scales  [kv_dim / 32][slot]     f16 (q8)            attention scores a page of
//                                                         keys with one vector op per dimension
//   V values  [slot][kv_dim]          f16, or int8 (q8, vq8)   a row per position,
//   V scales  [slot][kv_dim / 32]     f16 (q8, vq8)            for the weighted sum
struct PageLayout {
  int n_layer = 0;
  int page_tokens = 16;
  int kv_dim = 0;  // n_head_kv * head_dim
  KVDType dtype = KVDType::f16;

  bool k_quantized() const { return dtype == KVDType::q8; }
  bool v_quantized() const { return dtype != KVDType::f16; }
  size_t k_elem_bytes() const { return k_quantized() ? 1 : 2; }
  size_t v_elem_bytes() const { return v_quantized() ? 1 : 2; }
  int n_blocks() const { return kv_dim / KV_BLOCK; }  // scales per key or value row

  size_t k_bytes() const { return static_cast<size_t>(kv_dim) * page_tokens * k_elem_bytes(); }
  size_t k_scale_bytes() const { return k_quantized() ? static_cast<size_t>(n_blocks()) * page_tokens * 2 : 0; }
  size_t v_row_bytes() const { return static_cast<size_t>(kv_dim) * v_elem_bytes(); }
  size_t v_scale_row_bytes() const { return v_quantized() ? static_cast<size_t>(n_blocks()) * 2 : 0; }
  size_t layer_bytes() const {
    return k_bytes() + k_scale_bytes() + static_cast<size_t>(page_tokens) * (v_row_bytes() + v_scale_row_bytes());
  }
  size_t page_bytes() const { return static_cast<size_t>(n_layer) * layer_bytes(); }

  // K values of a layer: kv_dim rows of page_tokens elements.
  size_t k_offset(int layer) const { return static_cast<size_t>(layer) * layer_bytes(); }
  // K scales of a layer: n_blocks rows of page_tokens f16.
  size_t k_scale_offset(int layer) const { return k_offset(layer) + k_bytes(); }
  // V row of (layer, slot): kv_dim elements.
  size_t v_offset(int layer, int slot) const {
    return k_scale_offset(layer) + k_scale_bytes() + static_cast<size_t>(slot) * v_row_bytes();
  }
  // V scales of (layer, slot): n_blocks f16.
  size_t v_scale_offset(int layer, int slot) const {
    return v_offset(layer, page_tokens) + static_cast<size_t>(slot) * v_scale_row_bytes();
  }

  bool operator==(const PageLayout& o) const {
    return n_layer == o.n_layer && page_tokens == o.page_tokens && kv_dim == o.kv_dim && dtype == o.dtype;
  }
  bool operator!=(const PageLayout& o) const { return !(*this == o); }
};

class PagePool;

// The released copies (SwaRelease below) made of full pages: the forks that
// share a page and release it one after another take the copy the first one
// made, so they go on sharing their released prefix (one copy in memory, one
// page for the attention to read) instead of holding one copy each. An entry
// is used only for the same full pool and kept layers, and only while both
// pages are at the versions it saw: the full page unchanged since it was
// copied, the copy not freed since.
class ReleasedCopies {
 public:
  // A new reference to the copy of page `id` of `full` made into `trim` with
  // these kept layers, or -1.
  PageId find(const PagePool& full, PageId id, PagePool& trim, const std::vector<int>& kept);
  void remember(const PagePool& full, PageId id, const PagePool& trim, PageId copy, const std::vector<int>& kept);

 private:
  struct Entry {
    uint64_t full_serial, full_version;
    PageId copy;
    uint64_t copy_version;
    std::vector<int> kept;  // the layers the copy holds (one model's sequences all keep the same)
  };
  std::mutex mu_;
  std::unordered_map<PageId, Entry> map_;  // by the full page's id
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
  // A page's version: new with every alloc of its id, and with every touch
  // (the page is about to be written in place). While it is unchanged, the
  // page holds the bytes it held then.
  uint64_t version(PageId id) const;
  void touch(PageId id);
  // incref, if the page is in use at that version; false (and nothing done) otherwise.
  bool incref_if(PageId id, uint64_t version);
  // Which pool this is, unique in the process (never reused, unlike an address).
  uint64_t serial() const { return serial_; }
  // The released copies made into this pool (when it is a trim pool: SwaRelease).
  ReleasedCopies& released_copies() { return released_copies_; }

  uint8_t* data(PageId id);               // caller must hold a reference
  const uint8_t* data(PageId id) const;

 private:
  uint8_t* slot_ptr(PageId id) const;
  void check(PageId id) const;

  PageLayout layout_;
  size_t page_bytes_;
  size_t slot_bytes_;  // pages' distance in a slab: page_bytes_ rounded up to whole cache lines
  static constexpr size_t kLine = 64;
  int64_t max_pages_;
  static constexpr int kSlabPages = 16;   // memory grows a slab at a time, never moves
  struct SlabFree {
    void operator()(uint8_t* p) const;
  };
  using Slab = std::unique_ptr<uint8_t[], SlabFree>;
  static Slab new_slab(size_t bytes);
  std::vector<Slab> slabs_;
  std::vector<int> refcounts_;
  std::vector<uint64_t> versions_;
  std::vector<PageId> free_ids_;
  int64_t n_used_ = 0;
  uint64_t serial_;
  ReleasedCopies released_copies_;
  mutable std::mutex mu_;
};

// Sliding-window release (gemma3). The local layers of a sliding-window model
// never look further back than `window` positions, so once a page lies wholly
// outside every future window only its full-attention layers are still read.
// Such a page is *released*: its keep_layers slices move to a page of
// `trim_pool` (a layout of keep_layers.size() layers) and the full page is
// dropped. Released pages are always a sequence's leading pages. One page of
// slack is kept, so a sequence can always step back up to page_tokens
// positions (Context._sync re-forwards the last token that way).
struct SwaRelease {
  int window = 0;                       // positions a sliding-window layer sees
  std::vector<int> keep_layers;         // the full-attention layers, ascending
  std::shared_ptr<PagePool> trim_pool;  // pages of keep_layers.size() layers
};

// A sequence's page table: ordered page ids plus its token count.
class KVSeq {
 public:
  explicit KVSeq(std::shared_ptr<PagePool> pool, std::shared_ptr<const SwaRelease> swa = nullptr);
  ~KVSeq();
  KVSeq(const KVSeq&) = delete;
  KVSeq& operator=(const KVSeq&) = delete;

  std::unique_ptr<KVSeq> fork() const;   // O(pages): shares every page, copies no KV bytes

  int64_t n_tokens() const { return n_tokens_; }
  const std::vector<PageId>& pages() const { return pages_; }
  // Leading pages held released (in the trim pool, keep_layers only).
  int64_t n_released() const { return n_released_; }
  const SwaRelease* swa() const { return swa_.get(); }
  // Pages a sequence of n tokens keeps released: those wholly before its
  // window, less one page of slack; 0 without sliding-window release.
  int64_t release_target(int64_t n) const;
  // Whether truncate(n) keeps every page the window at n needs.
  bool can_truncate(int64_t n) const;
  // Rows that may be taken back (a speculative verify's drafts): while deferred,
  // appends release nothing, so truncating them away leaves the pages released
  // that a sequence which never held them would have (a release cannot be undone).
  // Ending the deferral releases what the length then calls for.
  void defer_release(bool defer);
  bool release_deferred() const { return defer_release_; }
  PagePool& pool() const { return *pool_; }
  const std::shared_ptr<PagePool>& pool_ptr() const { return pool_; }

  // Make positions [n_tokens, n_tokens + n) writable: copy-on-write the shared
  // last page, allocate new pages. Does not change n_tokens.
  void prepare_append(int64_t n);
  void commit_append(int64_t n);
  // Keep the first n tokens [0, n); drop the rest (rewind). Zeroes the tail of
  // the new last page, copying it first if it is shared. Strongly exception-safe:
  // the copy is made before anything changes, so a full pool throws with the
  // sequence as it was.
  void truncate(int64_t n);
  // Pages truncate(n) takes from the pool (0 or 1): its copy-on-write page, unless
  // a page it drops that no other holder has is overwritten with the copy instead.
  // The caller makes room for them first (a context table's reserve_pages).
  int64_t pages_to_truncate(int64_t n) const;
  // Append a whole page given by the caller (restore from a snapshot). The
  // sequence must end on a page boundary; n_valid tokens of it count. A
  // released page (from the trim pool) may only follow released pages.
  void append_page(PageId id, int n_valid, bool released = false);

  // Base address of every page, in order (pages never move once allocated):
  // the forward pass resolves them once per step instead of once per read.
  void page_ptrs(std::vector<uint8_t*>& out) const;
  // Raw bytes of page `index` (a released page is the trim pool's size).
  const uint8_t* page_data(size_t index, size_t* n_bytes) const;

 private:
  void release_outside_window();
  // Where truncate(n) copies the new last page to: -1, no copy (unshared, or no
  // partly kept page); the index of a dropped page no one else holds; or
  // pages_.size(), a new page.
  int64_t copy_slot(int64_t n) const;
  PagePool& pool_of(size_t index) const { return index < static_cast<size_t>(n_released_) ? *swa_->trim_pool : *pool_; }

  std::shared_ptr<PagePool> pool_;
  std::shared_ptr<const SwaRelease> swa_;
  std::vector<PageId> pages_;  // [0, n_released_) in swa_->trim_pool, the rest in pool_
  int64_t n_tokens_ = 0;
  int64_t n_released_ = 0;
  bool defer_release_ = false;
};

}  // namespace ctx
