#pragma once
// A small persistent thread pool for the CPU kernels (element-wise, reductions, batched matmul).

#include <cstddef>
#include <functional>

namespace wick::cpu {

/// Worker threads used by the CPU backend: WICK_NUM_THREADS if set, else the hardware count.
size_t num_threads();

/// True when set_cpu_threads (include/wick/cpu.h) chose the count.
bool threads_forced();

/// Runs fn(begin, end) over [0, n) split into at most num_threads() chunks of at least `grain`
/// items; runs inline when n < 2 * grain or from inside a worker. Exceptions are rethrown here.
void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

}  // namespace wick::cpu
