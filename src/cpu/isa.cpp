// The choice of the CPU kernels' instruction set, made once, and the CpuStorage ops that go
// through it.

#include <cstdlib>
#include <string>

#include "cpu/kernels.h"
#include "settings.h"
#include "util.h"
#include "wick/cpu.h"
#include "wick/error.h"

namespace wick::cpu {

namespace {

enum class Isa { Avx2, Avx512 };

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(WICK_NO_AVX512_KERNELS)
  __builtin_cpu_init();
  // These builtins also check that the OS saves the AVX-512 registers.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

Isa choose_isa() {
  const bool has_avx512 = cpu_has_avx512();
  const std::string& forced = settings::cpu_isa();  // throws on an unknown value
  if (forced.empty()) return has_avx512 ? Isa::Avx512 : Isa::Avx2;
  if (forced == "avx2") return Isa::Avx2;
  if (forced == "avx512") {
    if (!has_avx512) {
#if defined(WICK_NO_AVX512_KERNELS)
      throw Error(
          "WICK_CPU_ISA=avx512: this build has no AVX-512 kernels (WICK_AVX512_KERNELS=OFF); "
          "unset WICK_CPU_ISA or set it to avx2");
#else
      throw Error(
          "WICK_CPU_ISA=avx512: this CPU lacks AVX-512 (F, BW, DQ and VL are needed); unset "
          "WICK_CPU_ISA or set it to avx2");
#endif
    }
    return Isa::Avx512;
  }
  throw Error(str("WICK_CPU_ISA=", forced, ": unknown instruction set (avx2 or avx512)"));
}

Isa active_isa() {
  static const Isa isa = choose_isa();  // a throw leaves it unset: the next call throws again
  return isa;
}

}  // namespace

const Kernels& kernels() {
  [[maybe_unused]] const Isa isa = active_isa();  // checks WICK_CPU_ISA in every build
#if !defined(WICK_NO_AVX512_KERNELS)
  if (isa == Isa::Avx512) return kAvx512Kernels;
#endif
  return kAvx2Kernels;
}

void CpuStorage::copy_to_host(const Layout& layout, void* dst) const {
  kernels().copy_bytes(data(), layout, dst, Layout::contiguous(layout.shape()),
                       size_in_bytes(dtype_));
}

void CpuStorage::copy_into(const Layout& src_layout, BackendStorage& dst,
                           const Layout& dst_layout) const {
  kernels().copy_bytes(data(), src_layout, as_cpu(dst).data(), dst_layout, size_in_bytes(dtype_));
}

StoragePtr CpuStorage::to_dtype(const Layout& layout, DType dtype) const {
  return kernels().to_dtype(*this, layout, dtype);
}

StoragePtr CpuStorage::unary(const UnaryOp& op, const Layout& layout) const {
  return kernels().unary(*this, op, layout);
}

StoragePtr CpuStorage::binary(BinaryKind op, const Layout& layout, const BackendStorage& rhs,
                              const Layout& rhs_layout) const {
  return kernels().binary(*this, op, layout, as_cpu(rhs), rhs_layout);
}

StoragePtr CpuStorage::cmp(CmpKind op, const Layout& layout, const BackendStorage& rhs,
                           const Layout& rhs_layout) const {
  return kernels().cmp(*this, op, layout, as_cpu(rhs), rhs_layout);
}

StoragePtr CpuStorage::where_cond(const Layout& layout, const BackendStorage& on_true,
                                  const Layout& true_layout, const BackendStorage& on_false,
                                  const Layout& false_layout) const {
  return kernels().where_cond(*this, layout, as_cpu(on_true), true_layout, as_cpu(on_false),
                              false_layout);
}

StoragePtr CpuStorage::reduce(ReduceKind op, const Layout& layout,
                              const std::vector<size_t>& dims) const {
  return kernels().reduce(*this, op, layout, dims);
}

StoragePtr CpuStorage::softmax_last_dim(const Layout& layout) const {
  return kernels().softmax_last_dim(*this, layout);
}

}  // namespace wick::cpu

namespace wick {

std::string cpu_isa() {
  return &cpu::kernels() == &cpu::kAvx2Kernels ? "avx2" : "avx512";
}

}  // namespace wick
