#!/bin/sh
# tests/emu/run_serve.sh — runs the batched step's own kernels (src/cuda/serve_kernels.cu: paged q/k norm + RoPE +
# KV append, paged attention, the DeltaNet step over state slots, its gated norm, the row gather) on the CPU through
# the host emulation of tests/emu/emu.h, against a double-precision reference (tests/emu/serve_emu.cpp). The kernels
# and the device helpers they share with the decode step and the prefill (src/cuda/deltanet.cuh, attn_prep.cuh,
# common.cuh) are compiled unchanged
# except for the shared-memory declarations (sed below). Needs nvcc's headers (cuda_runtime_api.h, for the vector
# types). Usage: tests/emu/run_serve.sh [seed]; B=DIR puts the objects there (default build/emu). Built with
# __CUDA_ARCH_FEAT_SM90_ALL: the whole-head state pass (bulk copies, mbarriers) is sm_90a code.
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
{ sed -n '/^__device__ __forceinline__ float bf_lo/,/^__device__ __forceinline__ float bf16u/p' src/cuda/common.cuh
  sed -n '/^\/\* Dot product of 8 bf16/,/^static inline int ceil_div/p' src/cuda/common.cuh; } > "$B/sv_common.inc"
sed -e '/#include "cuda\//d' src/cuda/deltanet.cuh > "$B/sv_deltanet.inc"
sed -e '/#include "cuda\//d' src/cuda/attn_prep.cuh > "$B/sv_attn_prep.inc"
sed -e '/#include "cuda\//d' -e 's/extern __shared__ float sm\[\];/float *sm = (float *)emu_smem();/' \
    -e 's/^    __shared__ /    static /' src/cuda/serve_kernels.cu > "$B/sv_kernels.inc"
grep -q 'emu_smem()' "$B/sv_kernels.inc" && ! grep -q '__shared__\|asm' "$B/sv_kernels.inc" &&
    grep -q 'conv_history' "$B/sv_deltanet.inc" ||
    { echo "run_serve.sh: the sed edits no longer match src/cuda/serve_kernels.cu / deltanet.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -D__CUDA_ARCH_FEAT_SM90_ALL -Isrc -I"$B" \
    -Itests/emu -I"$CUDA_HOME/include" -o "$B/serve_emu" tests/emu/serve_emu.cpp -lm
"$B/serve_emu" "$@"
