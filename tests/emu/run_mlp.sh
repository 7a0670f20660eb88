#!/bin/sh
# tests/emu/run_mlp.sh — runs the fused MLP kernel (src/cuda/mlp.cu) on the CPU through the host
# emulation of tests/emu/emu.h against a double-precision reference (tests/emu/mlp_emu.cpp). The
# kernel and the common.cuh helpers it uses are compiled unchanged except for mechanical edits (sed
# below: the cuda/ includes, the shared-memory declarations, the asm helpers that mlp_emu.cpp
# emulates); the launchers are compiled too (cases run through cuda_mlp_fused where the shared memory
# fits; its refusals). bf16 and FP8 (e4m3 + per-row block scales) weights. Needs nvcc's headers
# (cuda_runtime_api.h, for the vector types).
# Usage: tests/emu/run_mlp.sh [1]  (1: also the 0.8B shape on 132 CTAs; ~30 s without);
# B=DIR puts the objects there (default build/emu).
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
{ sed -n '/^__device__ __forceinline__ float bf_lo/,/^__device__ __forceinline__ float bf16u/p' src/cuda/common.cuh
  sed -n '/^\/\* Dot product of 8 bf16/,/^static inline int ceil_div/p' src/cuda/common.cuh; } > "$B/mlp_common.inc"
sed -e '/#include "cuda\//d' \
    -e 's/extern __shared__ __align__(16) unsigned char smem\[\];/unsigned char *smem = reinterpret_cast<unsigned char *>(emu_smem());/' \
    -e 's/__shared__ float red\[32\];/float *red = emu_red;/' \
    -e '/^\/\* sm_90+: the W_dT rows by TMA bulk copies/,/^\/\* Shared memory: xs/{/^\/\* Shared memory: xs/!d}' \
    src/cuda/mlp.cu > "$B/mlp.inc"
grep -q 'emu_smem()' "$B/mlp.inc" && grep -q 'emu_red;' "$B/mlp.inc" && grep -q 'dot16_e4m3' "$B/mlp_common.inc" ||
    { echo "run_mlp.sh: the sed edits no longer match src/cuda/mlp.cu / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/mlp_emu" tests/emu/mlp_emu.cpp -lm
"$B/mlp_emu" "$@"
