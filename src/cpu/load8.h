#pragma once
// Eight f32, f16 or bf16 values as an AVX2 vector of f32 (the baseline's AVX2 + F16C): the
// widening load of the fixed-order dot products (paged_attention.cpp, row_matmul_kernels.cpp).

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <type_traits>

#include "wick/half.h"

namespace wick::cpu {

template <class T>
inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, f16>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    static_assert(std::is_same_v<T, bf16>, "load8: f32, f16 or bf16");
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

}  // namespace wick::cpu

#endif
