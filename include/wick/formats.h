#pragma once
// Model files in and out: safetensors (memory-mapped), npy/npz and GGUF (with dequantisation).
// Every loader throws wick::FormatError naming the file and the offset or tensor for a malformed
// file; savers write a temporary file next to the target and rename it.

#include <cstdint>

#include "wick/gguf.h"
#include "wick/npy.h"
#include "wick/quantized.h"
#include "wick/safetensors.h"

namespace wick {

/// Bytes the loaders handed out as views of a file mapping (no copy) and bytes they copied
/// (unaligned data, CUDA uploads, npz members, dequantised outputs), since the process started
/// or the last reset. For checking that a CPU load is copy-free.
struct FormatLoadStats {
  uint64_t bytes_viewed = 0;
  uint64_t bytes_copied = 0;
};
FormatLoadStats format_load_stats();
void reset_format_load_stats();

}  // namespace wick
