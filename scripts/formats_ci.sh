#!/usr/bin/env bash
# CI for the file formats, after scripts/test.sh has built build/: the Python round trip (Python
# writes safetensors/npy/npz/gguf files with numpy, safetensors and gguf from PyPI, pinned in
# scripts/requirements-formats.txt; wick reads and rewrites them, Python checks every byte), then
# a bounded fuzz run of each parser
# (WICK_FUZZ_SECONDS, default 60 per target; WICK_FUZZ_SECONDS=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WICK_BUILD:-build}

python3 -m venv "$build/formats-venv"
"$build/formats-venv/bin/pip" install -q -r scripts/requirements-formats.txt
py="$build/formats-venv/bin/python"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$py" scripts/make_format_refs.py roundtrip-make "$dir"
cmake --build "$build" --target test_formats_roundtrip
WICK_FORMAT_ROUNDTRIP_DIR="$dir" "$build/tests/test_formats_roundtrip"
"$py" scripts/make_format_refs.py roundtrip-check "$dir"

if [[ "${WICK_FUZZ_SECONDS:-60}" != 0 ]]; then
  bash scripts/fuzz.sh
fi
