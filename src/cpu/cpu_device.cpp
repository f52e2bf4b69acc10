#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "dispatch.h"
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

}  // namespace

void CpuStorage::FreeDeleter::operator()(void* p) const {
  std::free(p);
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
  if (bytes <= kMallocBytes) {
    p = std::malloc(bytes);
  } else {
    // Rounded up to the alignment (aligned_alloc requires it).
    p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  }
  if (!p) {
    throw BackendError(str("cpu alloc: out of memory allocating ", bytes, " bytes (", count,
                           " elements of ", dtype, ")"));
  }
  data_.reset(p);
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
