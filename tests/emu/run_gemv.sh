#!/bin/sh
# tests/emu/run_gemv.sh — runs the GEMV family (src/cuda/gemv.cu: the bf16 and the fp8 e4m3 instantiation of its
# kernel, through its launcher cuda_matvec) on the CPU through the host emulation of tests/emu/emu.h against a
# double-precision reference on the dequantized weights (tests/emu/gemv_emu.cpp; the FP8 weights and scales come
# from src/util.c's fp8_quantize_blocks, compiled in). The kernel file and the common.cuh helpers it uses are
# compiled unchanged except for mechanical edits (sed below: the include, the dynamic shared-memory declaration).
# Needs nvcc's headers (cuda_runtime_api.h, for the vector types). Usage: tests/emu/run_gemv.sh [seed];
# B=DIR puts the objects there (default build/emu).
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
{ sed -n '/^__device__ __forceinline__ float bf_lo/,/^__device__ __forceinline__ float bf16u/p' src/cuda/common.cuh
  sed -n '/^\/\* Dot product of 8 bf16/,/^static inline int ceil_div/p' src/cuda/common.cuh
  sed -n '/^\/\* The GEMV.s input row/,/^}/p' src/cuda/common.cuh
  sed -n '/^\/\* The LM head.s grid argmax/,/^}/p' src/cuda/common.cuh; } > "$B/gv_common.inc"
sed -e '/#include "cuda\//d' -e 's/extern __shared__ float xs\[\];/float *xs = reinterpret_cast<float *>(emu_smem());/' \
    src/cuda/gemv.cu > "$B/gemv.inc"
grep -q 'emu_smem()' "$B/gemv.inc" && grep -q 'dot16_e4m3' "$B/gv_common.inc" && grep -q 'argmax_publish' "$B/gv_common.inc" &&
    grep -q 'gemv_stage_input' "$B/gv_common.inc" ||
    { echo "run_gemv.sh: the sed edits no longer match src/cuda/gemv.cu / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cc -std=c11 -O1 -Iinclude -Isrc -c src/util.c -o "$B/gv_util.o"
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -Iinclude -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/gemv_emu" tests/emu/gemv_emu.cpp "$B/gv_util.o" -lm
"$B/gemv_emu" "$@"
