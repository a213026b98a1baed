// A persistent pool of worker threads for the forward pass.
//
// Decode runs a few hundred parallel regions per token, so waking workers must
// cost microseconds: workers spin briefly on a generation counter before
// sleeping on a condition variable. Work is handed out in chunks from an
// atomic counter (fixed, or guided: shrinking as the work runs out); which
// thread computes a chunk never changes the result,
// because every output element is computed whole by one call (DESIGN.md:
// split across rows/heads, never across a reduction).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ctx {

class ThreadPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Index of the calling thread inside the pool running it: 0 for the thread
  // that called parallel_for, 1..size()-1 for workers. For per-thread scratch.
  static int thread_index();

  // Calls fn(begin, end) over [0, n) in chunks of at most `grain`, on every
  // thread including the caller; returns when all chunks are done. Not
  // re-entrant: one parallel_for at a time per pool (the model serializes).
  void parallel_for(int64_t n, int64_t grain, const RangeFn& fn);
  // The same with chunks that shrink as the work runs out: each takes
  // 1 / (2 * size()) of what is left, rounded up to a multiple of `grain`
  // (and at least `grain`). A thread's first chunk is a long run of
  // consecutive units (weights stream from memory best that way), and the
  // last ones are short (a slow thread holds the others up by little).
  void parallel_for_guided(int64_t n, int64_t grain, const RangeFn& fn);

 private:
  void worker_loop(int index);
  void stop_and_join();  // wake every worker to leave, and join them
  void run_chunks();
  void run(int64_t n, int64_t grain, bool guided, const RangeFn& fn);

  int n_threads_;
  std::vector<std::thread> workers_;

  // The current job, published by bumping generation_.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  bool guided_ = false;
  std::atomic<int64_t> next_{0};
  std::atomic<int> n_active_{0};      // workers still inside the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace ctx
