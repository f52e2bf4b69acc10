#pragma once
// Dynamic batching of embeddings requests: one thread takes the texts of every request that
// arrives within a short window (or until a batch is full) and embeds them in one call, so that
// concurrent small requests share the encoder's passes.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "wick/bert.h"

namespace wick::serve_http {

class EmbedBatcher {
 public:
  /// `window`: how long the thread waits for more requests after the first; `max_texts`: the
  /// texts that end the wait at once; `text_by_text`: each text through the encoder alone (where
  /// the encoder's bits would depend on the batch: wick-serve --deterministic on CUDA).
  EmbedBatcher(const SentenceEmbedder& embedder, std::chrono::microseconds window, size_t max_texts,
               bool text_by_text = false)
      : embedder_(embedder),
        window_(window),
        max_texts_(max_texts),
        text_by_text_(text_by_text),
        thread_([this] { loop(); }) {}
  ~EmbedBatcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  EmbedBatcher(const EmbedBatcher&) = delete;
  EmbedBatcher& operator=(const EmbedBatcher&) = delete;

  /// The embeddings of `texts`, one row of dim() floats each; rethrows the embedder's error.
  std::vector<std::vector<float>> embed(std::vector<std::string> texts) {
    Job job{std::move(texts), {}};
    std::future<std::vector<std::vector<float>>> result = job.promise.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
    return result.get();
  }

  /// Embedder calls made so far (fewer than the requests when batching happened).
  uint64_t batches() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return batches_;
  }

 private:
  struct Job {
    std::vector<std::string> texts;
    std::promise<std::vector<std::vector<float>>> promise;
  };

  std::vector<std::vector<float>> run(const std::vector<std::string>& texts) const {
    if (!text_by_text_) {
      return embedder_.embed(texts).to_device(Device::cpu()).template to_vec2<float>();
    }
    std::vector<std::vector<float>> rows;
    for (const std::string& t : texts) {
      rows.push_back(embedder_.embed({t}).to_device(Device::cpu()).template to_vec2<float>()[0]);
    }
    return rows;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto deadline = std::chrono::steady_clock::now() + window_;
      auto pending = [this] {
        size_t n = 0;
        for (const Job& j : jobs_) n += j.texts.size();
        return n;
      };
      while (!stop_ && pending() < max_texts_ &&
             cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
      }
      std::vector<Job> batch;
      size_t n = 0;
      while (!jobs_.empty() && (batch.empty() || n + jobs_.front().texts.size() <= max_texts_)) {
        n += jobs_.front().texts.size();
        batch.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
      ++batches_;
      lock.unlock();
      std::vector<std::string> texts;
      for (const Job& j : batch) texts.insert(texts.end(), j.texts.begin(), j.texts.end());
      try {
        std::vector<std::vector<float>> rows = run(texts);
        size_t at = 0;
        for (Job& j : batch) {
          std::vector<std::vector<float>> mine(rows.begin() + at,
                                               rows.begin() + at + j.texts.size());
          at += j.texts.size();
          j.promise.set_value(std::move(mine));
        }
      } catch (...) {
        // One bad request must not fail the others batched with it: each alone.
        for (Job& j : batch) {
          try {
            j.promise.set_value(run(j.texts));
          } catch (...) {
            j.promise.set_exception(std::current_exception());
          }
        }
      }
      lock.lock();
    }
  }

  const SentenceEmbedder& embedder_;
  std::chrono::microseconds window_;
  size_t max_texts_;
  bool text_by_text_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  uint64_t batches_ = 0;
  std::thread thread_;
};

}  // namespace wick::serve_http
