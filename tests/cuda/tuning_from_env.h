#pragma once
// CTest runs some GPU tests again with benchmark variables set (tests/CMakeLists.txt: WICK_PDL=0,
// WICK_GEMV_ROWS=8, WICK_ROW_KERNEL=...): the test binary takes them through the private tuning
// header before its first GPU op, since the library reads none of them.

#include "cuda/tuning_env.h"

namespace wick::testing {
[[maybe_unused]] inline const bool tuning_from_env = (cuda::apply_tuning_env(), true);
}  // namespace wick::testing
