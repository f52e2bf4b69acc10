#pragma once
// The CPU backend's thread pool, built for many small parallel steps (a decode step is some 300
// of them): persistent workers, a job handed over with one atomic store and its chunks claimed
// with one fetch_add each. An idle worker spins briefly (kSpinUs) before it sleeps, except while
// the machine has more runnable threads than CPUs and the pool runs at the normal scheduling
// policy: then it sleeps at once, since spinning would only take CPU time from the threads with
// work. Real-time threads (SCHED_FIFO/RR) are not preempted by that load, so they spin.

#include <cstddef>
#include <type_traits>
#include <utility>

namespace wick::cpu {

/// Threads used by the CPU backend, the calling thread included: WICK_NUM_THREADS if set, else
/// the hardware count.
size_t num_threads();

/// True when set_cpu_threads (include/wick/cpu.h) chose the count.
bool threads_forced();

/// fn(ctx, begin, end) for the chunks of [0, n): the type-erased form of parallel_for.
using RangeFn = void (*)(void* ctx, size_t begin, size_t end);
void parallel_for_raw(size_t n, size_t grain, RangeFn fn, void* ctx);

/// Runs fn(begin, end) over [0, n) split into chunks of at least `grain` items (a few per
/// thread, claimed by whichever thread is free, so that a thread the OS runs late holds up only
/// its own chunk); runs inline when n < 2 * grain, from inside a worker, or while another thread's
/// job has the pool. Exceptions are rethrown here (the first one).
template <class F>
void parallel_for(size_t n, size_t grain, F&& fn) {
  using Fn = std::remove_reference_t<F>;
  parallel_for_raw(
      n, grain, [](void* ctx, size_t begin, size_t end) { (*static_cast<Fn*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace wick::cpu
