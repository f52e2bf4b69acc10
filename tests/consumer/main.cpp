// A consumer of the installed package: a matmul checked against its known result, and one f16
// rounding done by the header (this program's flags) and by the library (its own), which agree.

#include <wick/cpu.h>
#include <wick/wick.h>

#include <cstdio>
#include <vector>

int main() {
  auto dev = wick::Device::cpu();
  auto a = wick::Tensor::arange(0.0f, 6.0f, dev).reshape({2, 3});
  auto b = wick::Tensor::arange(0.0f, 6.0f, dev).reshape({3, 2});
  auto c = a.matmul(b).to_vec2<float>();  // [[10, 13], [28, 40]]
  const std::vector<std::vector<float>> want{{10, 13}, {28, 40}};
  if (c != want) {
    std::printf("consumer: matmul gave [[%g, %g], [%g, %g]], expected [[10, 13], [28, 40]]\n",
                c[0][0], c[0][1], c[1][0], c[1][1]);
    return 1;
  }
  const float x = 0.1f;  // not a half: rounds
  auto h = wick::Tensor::from_vec(std::vector<float>{x}, {1}, dev).to_dtype(wick::DType::F16);
  const uint16_t lib_bits = h.to_vec1<wick::f16>()[0].bits;
  const uint16_t header_bits = wick::f16(x).bits;
  if (lib_bits != header_bits) {
    std::printf("consumer: f16(0.1) is %04x in the library, %04x in the header\n", lib_bits,
                header_bits);
    return 1;
  }
  std::printf("consumer: matmul and f16 ok (CPU kernels: %s)\n", wick::cpu_isa().c_str());
  return 0;
}
