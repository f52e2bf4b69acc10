#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "settings.h"

namespace wick::cpu {

namespace {

// Set while a thread runs a chunk, so that nested parallel_for calls run inline instead of
// queueing work that could wait on the thread that queued it.
thread_local bool in_parallel_region = false;

// One parallel_for call: chunks are claimed with an atomic counter by the caller and the workers.
struct Job {
  const std::function<void(size_t, size_t)>* fn;
  size_t n;
  size_t chunks;
  size_t chunk_size;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::mutex mutex;  // guards error and the completion wait
  std::condition_variable finished;
  std::exception_ptr error;

  // Runs chunks until none are left; returns when this thread has nothing more to claim.
  void run_chunks() {
    for (;;) {
      size_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      size_t begin = c * chunk_size;
      size_t end = std::min(n, begin + chunk_size);
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads) : size_(threads) {
    // The calling thread takes part in every job, so the pool needs threads - 1 workers.
    for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t size() const { return size_; }

  void run(size_t n, size_t chunks, const std::function<void(size_t, size_t)>& fn) {
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    job->chunks = chunks;
    job->chunk_size = (n + chunks - 1) / chunks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(job);
    }
    wake_.notify_all();

    in_parallel_region = true;
    job->run_chunks();
    in_parallel_region = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = std::find(queue_.begin(), queue_.end(), job);
      if (it != queue_.end()) queue_.erase(it);
    }
    // Chunks taken by workers may still run: wait for them, spinning briefly first because the
    // chunks are balanced and usually finish together.
    for (int spin = 0; spin < 2000 && job->done.load(std::memory_order_acquire) < chunks; ++spin) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(job->mutex);
      job->finished.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == chunks; });
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  void worker_loop() {
    in_parallel_region = true;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
          // Jobs whose chunks are all claimed leave the queue; their callers wait for them.
          while (!queue_.empty() &&
                 queue_.front()->next.load(std::memory_order_relaxed) >= queue_.front()->chunks) {
            queue_.pop_front();
          }
          if (stop_) return;
          if (!queue_.empty()) break;
          wake_.wait(lock);
        }
        job = queue_.front();
      }
      job->run_chunks();
    }
  }

  size_t size_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
};

ThreadPool& pool() {
  static ThreadPool p(settings::num_threads());
  return p;
}

}  // namespace

size_t num_threads() {
  return pool().size();
}

void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  if (n < 2 * grain || in_parallel_region) {
    fn(0, n);
    return;
  }
  ThreadPool& p = pool();
  size_t chunks = std::min(p.size(), n / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  p.run(n, chunks, fn);
}

}  // namespace wick::cpu
