#pragma once
// Quantized tensors in GGML's block formats (as GGUF files hold them): the raw blocks as a U8
// tensor on the CPU or a GPU, their type and the logical shape. Dequantisation gives f32.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "wick/device.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick {

class QTensor;

namespace detail {
/// Per-QTensor derived data (the CPU kernels' repacked blocks), made at first use and shared by
/// copies of the QTensor (src/qmatmul.cpp).
struct QCache;
std::shared_ptr<QCache> make_qcache();
/// The QTensor's cache, for the backends' kernels.
QCache& qcache_of(const QTensor& w);
}  // namespace detail

/// GGML tensor types, numbered as in GGUF files (ggml.h's enum ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

/// True for the type ids above (the ones whose block layout wick knows the size of).
bool ggml_type_known(uint32_t type);
/// "q4_0", "f16", ... ("type 99" for an unknown id).
std::string ggml_type_name(GgmlType type);
/// Values per block (1 for plain types, 32 for Q4_0, 256 for the K types).
size_t ggml_block_size(GgmlType type);
/// Bytes per block.
size_t ggml_type_size(GgmlType type);
/// True when wick can dequantise the type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
/// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
bool ggml_can_dequantize(GgmlType type);

/// Quantized blocks of a tensor of logical `shape` (row-major, the last dim is GGML's ne[0] and a
/// whole number of blocks). `data` is a rank-1 U8 tensor of exactly the blocks' bytes. Copies
/// share the blocks; immutable, so any thread may read or multiply with it (the derived cache is
/// built once, under std::call_once).
class QTensor {
 public:
  QTensor() = default;
  /// Throws ShapeMismatch when `data` does not hold exactly the bytes the shape needs.
  QTensor(GgmlType type, Shape shape, Tensor data);
  GgmlType type() const { return type_; }
  const Shape& shape() const { return shape_; }
  const Tensor& data() const { return data_; }
  Device device() const { return data_.device(); }
  size_t elem_count() const { return shape_.elem_count(); }
  /// Same blocks on another device.
  QTensor to_device(const Device& device) const;
  /// f32 tensor of `shape()` on the same device (one kernel on CUDA). UnsupportedDType for a
  /// type ggml_can_dequantize() rejects.
  Tensor dequantize() const;

 private:
  friend Tensor qmatmul(const Tensor& x, const QTensor& w);
  friend detail::QCache& detail::qcache_of(const QTensor& w);
  GgmlType type_ = GgmlType::F32;
  Shape shape_;
  Tensor data_;
  // The CPU qmatmul repacks the blocks once, at its first call; the blocks must not be modified
  // afterwards.
  std::shared_ptr<detail::QCache> cache_ = detail::make_qcache();
};

/// Bytes of `n` values of `type` (n a multiple of the block size; ShapeMismatch otherwise).
size_t ggml_bytes(GgmlType type, size_t n);

/// True when qmatmul() takes weights of `type`: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K and Q3_K,
/// IQ4_NL (the CPU's integer tile kernels; Q3_K's blocks rewritten exactly as Q6_K's, IQ4_NL's
/// as Q8_0's), Q5_1, Q2_K, Q5_K, IQ4_XS (on the CPU each weight row dequantised into a small
/// buffer as it is used, then f32 dots), and F32, F16, BF16 through dequantisation.
bool qmatmul_supports(GgmlType type);

/// How the CPU qmatmul takes the activations for weights of `type`: quantized to blocks of 32
/// values of 16 bits (the default for the types with tile kernels) or 8 bits (ggml's Q8_0, as
/// llama.cpp; WICK_QMATMUL_ACTIVATIONS=int8), or 0: f32 (F32, F16, BF16; all with
/// WICK_QMATMUL_ACTIVATIONS=f32).
int qmatmul_cpu_activation_bits(GgmlType type);

/// x (..., k) times the transposed quantized matrix w (n, k): (..., n), without dequantising w.
/// x is F32 on the CPU (F32, F16 or BF16 on CUDA; the result has x's dtype). On the CPU, for
/// the block types x is quantized on the fly to 16-bit blocks of 32 and the integer kernels
/// take the weights' blocks as they are (qmatmul_cpu_activation_bits; docs/NUMERICS.md gives the
/// error this adds). The first CPU call repacks w's blocks (kept for later calls). ShapeMismatch
/// for a w not of rank 2 or k not matching, DeviceMismatch for x and w on different devices,
/// UnsupportedDType for x's dtype or w's type.
Tensor qmatmul(const Tensor& x, const QTensor& w);

}  // namespace wick
