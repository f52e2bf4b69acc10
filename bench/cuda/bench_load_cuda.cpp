// Loading a 1 GB f32 safetensors file to the GPU: wick's File::get(name, cuda) (pinned staging,
// chunked, the host copy of chunk i + 1 overlapping the DMA of chunk i) beside the host-to-device
// bandwidth measured in the same run: cudaMemcpy from pinned memory (the ceiling) and from
// pageable memory. The file is in the page cache (read once before timing). Exits 2 without a GPU.

#include <cuda_runtime.h>

#include "../load_file.h"
#include "check_exit.h"
#include "wick/formats.h"
#include "wick/wick.h"

using namespace wick;

int main() {
  if (!cuda_is_available()) {
    std::fprintf(stderr, "bench_load_cuda: no CUDA device, skipped\n");
    return 2;
  }
  size_t bytes = bench::load_bench_bytes();
  std::printf("== safetensors load to cuda:0: %zu MB f32 (median of 7)\n", bytes >> 20);
  std::string path = bench::write_load_bench_file(bytes);
  Device gpu = Device::cuda(0);
  constexpr int kReps = 7;

  void* dev = nullptr;
  void* pinned = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::vector<char> pageable(bytes, 1);
  std::memset(pinned, 1, bytes);
  double t_pinned = bench::median_seconds(
      kReps, [&] { CHECK_CUDA(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice)); });
  double t_pageable = bench::median_seconds(
      kReps, [&] { CHECK_CUDA(cudaMemcpy(dev, pageable.data(), bytes, cudaMemcpyHostToDevice)); });
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(dev));
  pageable = {};

  auto file = safetensors::File::open(path);
  (void)file.get("w").sum_all().to_scalar<float>();  // the file into the page cache
  (void)file.get("w", gpu);                          // staging buffers allocated
  gpu.synchronize();
  double t_wick = bench::median_seconds(kReps, [&] {
    Tensor w = safetensors::File::open(path).get("w", gpu);
    gpu.synchronize();
  });
  Tensor w = file.get("w", gpu);
  float probe = w.narrow(0, 12345, 1).to_vec1<float>()[0];
  double gb = static_cast<double>(bytes) / 1e9;
  std::printf("%-44s %8.2f GB/s\n", "peer: cudaMemcpy H2D from pinned memory", gb / t_pinned);
  std::printf("%-44s %8.2f GB/s\n", "peer: cudaMemcpy H2D from pageable memory", gb / t_pageable);
  std::printf("%-44s %8.2f GB/s  (%.0f%% of pinned; value[12345] = %g)\n",
              "wick: File::open + get(\"w\", cuda)", gb / t_wick, 100.0 * t_pinned / t_wick, probe);
  std::printf("RESULT load_cuda_GBps %.6g\nRESULT load_cuda_pinned_GBps %.6g\n", gb / t_wick,
              gb / t_pinned);
  std::printf("RESULT load_cuda_pageable_GBps %.6g\nRESULT load_cuda_vs_pinned %.6g\n",
              gb / t_pageable, t_pinned / t_wick);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  return 0;
}
