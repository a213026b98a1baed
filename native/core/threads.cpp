#include "core/threads.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CTX_PAUSE() _mm_pause()
#else
#define CTX_PAUSE() std::this_thread::yield()
#endif

namespace ctx {

namespace {
// About 50-100 microseconds of spinning before a worker goes to sleep: long
// enough to bridge the gap between the matmuls of one token, short enough not
// to burn a core when the engine is idle.
constexpr int kSpinIters = 20000;
// Pause-spins before a waiting thread starts yielding its core instead.
constexpr int kYieldAfter = 2000;
thread_local int tls_index = 0;
}  // namespace

int ThreadPool::thread_index() { return tls_index; }

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  try {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::system_error& err) {
    // The OS refused a thread (a pids limit, a small address space): the ones started
    // are stopped and joined (a joinable thread destroyed would std::terminate), and
    // the caller gets an error it can report.
    const size_t started = workers_.size();
    stop_and_join();
    throw std::runtime_error("cannot start " + std::to_string(n_threads_) + " threads (the system refused thread " +
                             std::to_string(started + 2) + ": " + err.what() + "); ask for fewer");
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t begin, end;
    if (guided_) {
      begin = next_.load(std::memory_order_relaxed);
      do {
        if (begin >= n_) return;
        const int64_t share = (n_ - begin + 2 * n_threads_ - 1) / (2 * n_threads_);
        end = std::min(n_, begin + std::max(grain_, (share + grain_ - 1) / grain_ * grain_));
      } while (!next_.compare_exchange_weak(begin, end, std::memory_order_relaxed));
    } else {
      begin = next_.fetch_add(grain_, std::memory_order_relaxed);
      if (begin >= n_) return;
      end = std::min(n_, begin + grain_);
    }
    (*fn_)(begin, end);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const RangeFn& fn) { run(n, grain, false, fn); }

void ThreadPool::parallel_for_guided(int64_t n, int64_t grain, const RangeFn& fn) { run(n, grain, true, fn); }

void ThreadPool::run(int64_t n, int64_t grain, bool guided, const RangeFn& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  guided_ = guided;
  next_.store(0, std::memory_order_relaxed);
  n_active_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the publication against a worker deciding to sleep.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (n_sleeping_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  run_chunks();
  // Spin briefly, then yield: on a loaded machine the worker we wait for may
  // need this very core to finish.
  for (int i = 0; n_active_.load(std::memory_order_acquire) > 0; ++i) {
    if (i < kYieldAfter) CTX_PAUSE();
    else std::this_thread::yield();
  }
  fn_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  // The index is set at the first job, not here: tls_index lives in this dlopen'd
  // module's dynamic TLS, whose first touch mallocs, and glibc aborts the process when
  // that fails. A pool whose constructor the OS refused a thread has its address space
  // spent; its workers must leave without touching it.
  bool indexed = false;
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIters; ++i) {
      if (i < kYieldAfter) CTX_PAUSE();
      else std::this_thread::yield();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      n_sleeping_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      n_sleeping_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    if (!indexed) {
      tls_index = index;
      indexed = true;
    }
    run_chunks();
    n_active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace ctx
