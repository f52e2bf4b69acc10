#!/usr/bin/env bash
# Checks a built libwick (static or shared) for AVX-512 code outside the AVX-512 kernels: every
# instruction that needs AVX-512 (EVEX-encoded, or a mask-register k* instruction) must sit in a
# function of namespace wick::cpu::avx512 (or one instantiated for its types). Anything else could
# run on an AVX2-only CPU (a weak inline function the linker may pick from the AVX-512 objects).
#
#   scripts/check-isa.sh build/src/libwick.a
set -euo pipefail
lib=${1:?usage: check-isa.sh path/to/libwick.a}
objdump -d -C --no-addresses "$lib" 2>/dev/null | awk '
  # A function header: "<name>:"
  /^<.*>:$/ { fn = $0; next }
  # An instruction line: "\tbytes \tmnemonic operands" (continuation lines hold bytes only).
  /^\t/ {
    n = split($0, part, "\t")
    if (n < 3) next
    split(part[2], bytes, " ")
    b = 1
    while (bytes[b] ~ /^(2e|36|3e|26|64|65|67)$/) b++   # segment and address-size prefixes
    split(part[3], m, " ")
    if (bytes[b] == "62" || m[1] ~ /^k(mov|and|or|xor|xnor|not|test|ortest|shift|add|unpck)/) {
      total++
      if (fn !~ /avx512/) { bad[fn]++; nbad++ }
    }
  }
  END {
    printf "AVX-512 instructions: %d, outside wick::cpu::avx512: %d\n", total, nbad
    for (f in bad) printf "  %d in %s\n", bad[f], f
    if (total == 0) { print "no AVX-512 instruction at all: the AVX-512 kernels are missing"; exit 1 }
    exit nbad > 0
  }'
