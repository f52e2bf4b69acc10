#pragma once
// The CPU kernels built once per instruction set: unary.cpp, binary.cpp, copy.cpp, reduce.cpp,
// attention_f32.cpp and varlen_attention_f32.cpp are compiled twice, into wick::cpu::avx2 (the
// baseline) and wick::cpu::avx512, and each build fills one Kernels table (isa_kernels.cpp).
// isa.cpp picks the table once, at first use.

#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/isa_ns.h"

namespace wick::cpu {

struct AttentionParams;  // cpu/attention.h

struct Kernels {
  void (*copy_bytes)(const void* src, const Layout& src_layout, void* dst, const Layout& dst_layout,
                     size_t elem);
  StoragePtr (*to_dtype)(const CpuStorage& in, const Layout& layout, DType dtype);
  StoragePtr (*unary)(const CpuStorage& in, const UnaryOp& op, const Layout& layout);
  StoragePtr (*binary)(const CpuStorage& lhs, BinaryKind op, const Layout& lhs_layout,
                       const CpuStorage& rhs, const Layout& rhs_layout);
  StoragePtr (*cmp)(const CpuStorage& lhs, CmpKind op, const Layout& lhs_layout,
                    const CpuStorage& rhs, const Layout& rhs_layout);
  StoragePtr (*where_cond)(const CpuStorage& cond, const Layout& cond_layout,
                           const CpuStorage& on_true, const Layout& true_layout,
                           const CpuStorage& on_false, const Layout& false_layout);
  StoragePtr (*reduce)(const CpuStorage& in, ReduceKind op, const Layout& layout,
                       const std::vector<size_t>& dims);
  StoragePtr (*softmax_last_dim)(const CpuStorage& in, const Layout& layout);
  void (*attention_f32)(const AttentionParams& params, const std::vector<KernelOperand>& operands,
                        float* out);
  void (*varlen_attention_f32)(const float* qkv, const uint32_t* offsets, size_t n, size_t heads,
                               size_t d, float scale, float* out);
};

/// The tables of the two builds (isa_kernels.cpp).
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;

/// The kernels for this CPU: AVX-512 when it has AVX-512 F, BW, DQ and VL, else AVX2; the
/// WICK_CPU_ISA environment variable (avx2 or avx512) forces one. Throws Error when WICK_CPU_ISA
/// is not one of these, or asks for AVX-512 on a CPU without it.
const Kernels& kernels();

// The entry points of the file being compiled (names as in Kernels).
inline namespace WICK_ISA_NS {
void copy_bytes(const void* src, const Layout& src_layout, void* dst, const Layout& dst_layout,
                size_t elem);
StoragePtr to_dtype(const CpuStorage& in, const Layout& layout, DType dtype);
StoragePtr unary(const CpuStorage& in, const UnaryOp& op, const Layout& layout);
StoragePtr binary(const CpuStorage& lhs, BinaryKind op, const Layout& lhs_layout,
                  const CpuStorage& rhs, const Layout& rhs_layout);
StoragePtr cmp(const CpuStorage& lhs, CmpKind op, const Layout& lhs_layout, const CpuStorage& rhs,
               const Layout& rhs_layout);
StoragePtr where_cond(const CpuStorage& cond, const Layout& cond_layout, const CpuStorage& on_true,
                      const Layout& true_layout, const CpuStorage& on_false,
                      const Layout& false_layout);
StoragePtr reduce(const CpuStorage& in, ReduceKind op, const Layout& layout,
                  const std::vector<size_t>& dims);
StoragePtr softmax_last_dim(const CpuStorage& in, const Layout& layout);
void attention_f32(const AttentionParams& params, const std::vector<KernelOperand>& operands,
                   float* out);
/// fused::VarlenAttentionOp on f32: qkv (t, 3 heads d) rows, sequence i at rows
/// [offsets[i], offsets[i + 1]) of the n, out (t, heads d).
void varlen_attention_f32(const float* qkv, const uint32_t* offsets, size_t n, size_t heads,
                          size_t d, float scale, float* out);
}  // namespace WICK_ISA_NS

}  // namespace wick::cpu
