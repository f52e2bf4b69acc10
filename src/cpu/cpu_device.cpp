#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "dispatch.h"
#include "settings.h"
#include "util.h"

namespace wick::cpu {

namespace {

constexpr size_t kAlign = 64;

// Random numbers are drawn in blocks of this many elements, each block from its own generator
// seeded by the device's generator: the result depends on the seed only, not on the thread count.
constexpr size_t kRandomBlock = 65536;

// A uniform double in [0, 1) from the top 53 bits.
inline double unit_double(std::mt19937_64& g) {
  return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0);
}

// A uniform float in [0, 1) from the top 24 bits.
inline float unit_float(std::mt19937_64& g) {
  return static_cast<float>(g() >> 40) * (1.0f / 16777216.0f);
}

// The largest T strictly below hi (hi itself when rounding T(hi) lands below it).
template <class T>
T largest_below(double hi) {
  if constexpr (std::is_same_v<T, double>) {
    return std::nextafter(hi, -std::numeric_limits<double>::infinity());
  } else {
    T t = T(static_cast<float>(hi));
    if (static_cast<double>(static_cast<float>(t)) < hi) return t;
    if constexpr (std::is_same_v<T, float>) {
      return std::nextafter(t, -std::numeric_limits<float>::infinity());
    } else {
      // Two-byte floats: one step down in bits (toward -inf).
      uint16_t b = t.bits;
      if ((b & 0x7fff) == 0) return T::from_bits(0x8001);
      return T::from_bits((b & 0x8000) ? b + 1 : b - 1);
    }
  }
}

// Freed large buffers, kept for the next allocation of their size class. A model's layers ask
// for the same few sizes over and over; glibc hands such buffers back to the kernel whenever the
// free space at the heap top passes its trim threshold, and every later op then pays page faults
// on fresh pages (5% of a BERT forward on the CPU). Classes are 1/16 of a power of two wide (at
// most 6% unused); the cache holds at most WICK_CPU_CACHE_MB (default 256) MiB, 0 turns it off.
// Builds with AddressSanitizer skip it, so that a use after free still shows.
class BufferCache {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;

  static BufferCache& instance() {
    // Never destroyed: tensors in static storage may be freed after it would be.
    static BufferCache* cache = new BufferCache(limit_from_env());
    return *cache;
  }

  bool enabled() const { return limit_ > 0; }

  /// The size class of a buffer of `bytes` (>= kMinBytes).
  static size_t size_class(size_t bytes) {
    size_t step = std::bit_floor(bytes) / 16;
    return (bytes + step - 1) / step * step;
  }

  /// A cached buffer of class `cls`, or nullptr.
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = free_.size(); i-- > 0;) {
      if (free_[i].first == cls) {
        void* p = free_[i].second;
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        held_ -= cls;
        return p;
      }
    }
    return nullptr;
  }

  /// Keeps `p` (class `cls`), dropping the oldest buffers to stay within the limit.
  void give(void* p, size_t cls) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cls > limit_) {
        drop.push_back(p);
      } else {
        free_.emplace_back(cls, p);
        held_ += cls;
        size_t oldest = 0;
        while (held_ > limit_) {
          held_ -= free_[oldest].first;
          drop.push_back(free_[oldest++].second);
        }
        free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(oldest));
      }
    }
    for (void* d : drop) std::free(d);
  }

 private:
  explicit BufferCache(size_t limit) : limit_(limit) {}

  static size_t limit_from_env() {
    const size_t bytes = settings::cpu_cache_mb() << 20;  // read (and checked) in every build
#if defined(__SANITIZE_ADDRESS__)
    return 0 * bytes;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 0 * bytes;
#endif
#endif
    return bytes;
  }

  const size_t limit_;
  std::mutex mutex_;
  std::vector<std::pair<size_t, void*>> free_;  // oldest first
  size_t held_ = 0;
};

}  // namespace

void CpuStorage::FreeDeleter::operator()(void* p) const {
  if (cached_bytes) {
    BufferCache::instance().give(p, cached_bytes);
  } else {
    std::free(p);
  }
}

CpuStorage::CpuStorage(size_t count, DType dtype) : count_(count), dtype_(dtype) {
  size_t elem = size_in_bytes(dtype);
  if (count > (std::numeric_limits<size_t>::max() - kAlign) / elem) {
    throw BackendError(str("cpu alloc: ", count, " elements of ", dtype, " overflow size_t"));
  }
  size_t bytes = count * elem;
  if (bytes <= kInlineBytes) {
    data_ptr_ = inline_;  // an empty buffer too, so that data() is never null
    return;
  }
  void* p;
  size_t cached_bytes = 0;
  if (bytes <= kMallocBytes) {
    p = std::malloc(bytes);
  } else if (bytes >= BufferCache::kMinBytes && BufferCache::instance().enabled()) {
    cached_bytes = BufferCache::size_class(bytes);  // a multiple of the alignment
    p = BufferCache::instance().take(cached_bytes);
    if (!p) p = std::aligned_alloc(kAlign, cached_bytes);
  } else {
    // Rounded up to the alignment (aligned_alloc requires it).
    p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  }
  if (!p) {
    throw BackendError(str("cpu alloc: out of memory allocating ", bytes, " bytes (", count,
                           " elements of ", dtype, ")"));
  }
  data_ = std::unique_ptr<void, FreeDeleter>(p, FreeDeleter{cached_bytes});
  data_ptr_ = p;
}

CpuStorage::CpuStorage(void* data, size_t count, DType dtype, std::shared_ptr<const void> keepalive)
    : count_(count), dtype_(dtype), data_ptr_(data), keepalive_(std::move(keepalive)) {}

StoragePtr CpuDevice::alloc(size_t count, DType dtype) {
  return std::make_unique<CpuStorage>(count, dtype);
}

StoragePtr CpuDevice::filled(size_t count, DType dtype, const void* value) {
  auto out = std::make_unique<CpuStorage>(count, dtype);
  dispatch(dtype, [&]<class T>() {
    T v;
    std::memcpy(&v, value, sizeof(T));
    T* dst = out->as<T>();
    parallel_for(count, 1 << 16, [&](size_t b, size_t e) { std::fill(dst + b, dst + e, v); });
  });
  return out;
}

StoragePtr CpuDevice::from_host(const void* data, size_t count, DType dtype) {
  auto out = std::make_unique<CpuStorage>(count, dtype);
  if (count > 0) std::memcpy(out->data(), data, count * size_in_bytes(dtype));
  return out;
}

StoragePtr CpuDevice::rand_uniform(size_t count, DType dtype, double lo, double hi) {
  auto out = std::make_unique<CpuStorage>(count, dtype);
  dispatch_float(dtype, "rand", [&]<class T>() {
    size_t blocks = (count + kRandomBlock - 1) / kRandomBlock;
    std::vector<uint64_t> seeds(blocks);
    {
      std::lock_guard<std::mutex> lock(rng_mutex_);
      for (auto& s : seeds) s = rng_();
    }
    T* dst = out->as<T>();
    const T below_hi = largest_below<T>(hi);
    parallel_for(blocks, 1, [&](size_t b, size_t e) {
      for (size_t blk = b; blk < e; ++blk) {
        std::mt19937_64 g(seeds[blk]);
        size_t i0 = blk * kRandomBlock, i1 = std::min(count, i0 + kRandomBlock);
        for (size_t i = i0; i < i1; ++i) {
          // Rounding to T can land on hi: draw again (unbiased), and after a few tries (a range
          // narrower than T's spacing) take the value just below hi, to keep [lo, hi).
          T v{};
          bool ok = false;
          for (int attempt = 0; attempt < 4 && !ok; ++attempt) {
            if constexpr (std::is_same_v<T, double>) {
              v = lo + (hi - lo) * unit_double(g);
            } else {
              v = T(static_cast<float>(lo) + static_cast<float>(hi - lo) * unit_float(g));
            }
            ok = static_cast<double>(static_cast<compute_t<T>>(v)) < hi;
          }
          if (!ok && lo < hi) v = below_hi;
          dst[i] = v;
        }
      }
    });
  });
  return out;
}

StoragePtr CpuDevice::rand_normal(size_t count, DType dtype, double mean, double std) {
  auto out = std::make_unique<CpuStorage>(count, dtype);
  dispatch_float(dtype, "randn", [&]<class T>() {
    size_t blocks = (count + kRandomBlock - 1) / kRandomBlock;
    std::vector<uint64_t> seeds(blocks);
    {
      std::lock_guard<std::mutex> lock(rng_mutex_);
      for (auto& s : seeds) s = rng_();
    }
    T* dst = out->as<T>();
    parallel_for(blocks, 1, [&](size_t b, size_t e) {
      for (size_t blk = b; blk < e; ++blk) {
        std::mt19937_64 g(seeds[blk]);
        size_t i0 = blk * kRandomBlock, i1 = std::min(count, i0 + kRandomBlock);
        // Box-Muller in double: two samples per pair of uniforms.
        for (size_t i = i0; i < i1; i += 2) {
          double u1 = 1.0 - unit_double(g);  // (0, 1]: log stays finite
          double u2 = unit_double(g);
          double rad = std::sqrt(-2.0 * std::log(u1));
          double z0 = rad * std::cos(2.0 * M_PI * u2);
          double z1 = rad * std::sin(2.0 * M_PI * u2);
          if constexpr (std::is_same_v<T, double>) {
            dst[i] = mean + std * z0;
            if (i + 1 < i1) dst[i + 1] = mean + std * z1;
          } else {
            dst[i] = T(static_cast<float>(mean + std * z0));
            if (i + 1 < i1) dst[i + 1] = T(static_cast<float>(mean + std * z1));
          }
        }
      }
    });
  });
  return out;
}

void CpuDevice::set_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex_);
  rng_.seed(seed);
}

BackendDevice& device() {
  static CpuDevice dev;
  return dev;
}

}  // namespace wick::cpu
