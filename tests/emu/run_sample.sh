#!/bin/sh
# tests/emu/run_sample.sh — runs the on-device sampler (src/cuda/sample.cu) on the CPU through the host emulation of
# tests/emu/emu.h against the sampling rules over a full sort (tests/emu/sample_emu.cpp). The kernel file is compiled
# unchanged except for three mechanical edits (sed below: the cuda/ includes, the launchers, and the dynamic shared
# memory declaration, which becomes the emulated CTA's shared memory). Needs nvcc's headers
# (cuda_runtime_api.h, for the vector types). Usage: tests/emu/run_sample.sh [seed]  (~10 s).
set -e
cd "$(dirname "$0")/../.."
B=build/emu
mkdir -p "$B"
sed -e '/#include "cuda\//d' -e '/^extern "C" size_t cuda_sample_scratch_bytes/,$d' \
    -e 's/extern __shared__ unsigned s_cnt\[\];/unsigned *s_cnt = (unsigned *)emu_smem();/' src/cuda/sample.cu > "$B/sample.inc"
grep -q 'sample_pick_bf16' "$B/sample.inc" && grep -q 'emu_smem()' "$B/sample.inc" || { echo "run_sample.sh: the sed edits no longer match src/cuda/sample.cu"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-sign-compare -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/sample_emu" tests/emu/sample_emu.cpp -lm
"$B/sample_emu" "$@"
