#!/bin/sh
# tests/emu/run_gemm_fp8.sh — runs the FP8 (W8A8) prefill GEMM of the lab bench/kernels/gemm_fp8_lab.cu (e4m3 X and
# W with per-row, per-128-column scales, TMA + e4m3 wgmma, modes 0 / 1 / 5 / 6 with every epilogue, and the timing
# bounds 2 / 4) on the CPU through the host emulation of tests/emu/emu.h + emu_wgmma.h, against a double-precision
# reference (tests/emu/gemm_fp8_emu.cpp). The lab's GEMM section (its F8 configuration, f8_issue / f8_promote /
# f8_store8 and the kernel), wgmma_desc (mma.cuh) and gemm.cuh's tile order and epilogues are compiled unchanged except
# for the sed edits below (the includes, the extern __shared__ declaration); the e4m3 wgmma wrappers are
# emu_wgmma.h's. Usage: tests/emu/run_gemm_fp8.sh [seed]  (~15 s). GEMM_FP8_EMU_SRC=file takes the lab from file
# instead (a scratch copy with an injected fault).
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
L=${GEMM_FP8_EMU_SRC:-bench/kernels/gemm_fp8_lab.cu}
sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc/,/^}/p' src/cuda/mma.cuh > "$B/f8_desc.inc"
sed -e '/#include "cuda\//d' src/cuda/gemm.cuh > "$B/f8_gemm_cuh.inc"
sed -n '/^\/\* ---- GEMM ---/,/^\/\* ---- host: launch/p' "$L" | sed '$d' |
    sed -e 's/extern __shared__ __align__(1024) uint8_t smem\[\];/uint8_t *smem = emu_smem();/' > "$B/f8_kern.inc"
grep -q 'uint64_t wgmma_desc' "$B/f8_desc.inc" && [ "$(grep -c 'emu_smem()' "$B/f8_kern.inc")" = 1 ] &&
    grep -q 'gemm_fp8_tma' "$B/f8_kern.inc" && ! grep -q 'asm' "$B/f8_kern.inc" ||
    { echo "run_gemm_fp8.sh: the sed edits no longer match $L / mma.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/gemm_fp8_emu" tests/emu/gemm_fp8_emu.cpp -lm
"$B/gemm_fp8_emu" "$@"
