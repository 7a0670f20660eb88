#!/bin/sh
# tests/emu/run_gemm.sh — runs the Hopper TMA + wgmma GEMM kernel (src/cuda/gemm_tma.cu, all four
# variants C128 / P128 / P256 / C64 and all epilogues) on the CPU through the host emulation of
# tests/emu/emu.h + emu_wgmma.h, against a double-precision reference (tests/emu/gemm_emu.cpp). The
# kernel, wgmma_desc (mma.cuh), gemm.cuh's epilogues and the launcher's variant table (tma_pick,
# tma_variant, gemm_tma_run) are compiled unchanged except for mechanical edits (sed below: the
# includes, the extern __shared__ declarations, the host code that calls the CUDA driver; regs_dec /
# regs_inc (setmaxnreg, async.cuh) are emu_wgmma.h's; tma_launch is gemm_emu.cpp's, on the emulated
# tensor maps of emu.h). Needs nvcc's headers (cuda_runtime_api.h, for the vector types). Usage: tests/emu/run_gemm.sh [seed]  (~10 s; the seed of the
# random inputs, default the time). GEMM_EMU_SRC=dir takes gemm_tma.cu, gemm.cuh, mma.cuh from dir instead of
# src/cuda (a scratch copy with an experiment or an injected fault).
set -e
cd "$(dirname "$0")/../.."
B=build/emu
mkdir -p "$B"
D=${GEMM_EMU_SRC:-src/cuda}
S='s/extern __shared__ __align__(1024) uint8_t smem\[\];/uint8_t *smem = emu_smem();/'
sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc/,/^}/p' "$D/mma.cuh" > "$B/gemm_desc.inc"
sed -e '/#include "cuda\//d' "$D/gemm.cuh" > "$B/gemm_cuh.inc"
sed -e '/#include "cuda\//d' -e '/#include <cuda.h>/d' -e '/#include <cudaTypedefs.h>/d' -e "$S" \
    -e '/^\/\* ---- host ----/,$d' "$D/gemm_tma.cu" > "$B/gemm_tma_kern.inc"
sed -n '/^static int tma_pick/,/^template <int DBG>/p' "$D/gemm_tma.cu" | sed '$d' > "$B/gemm_tma_host.inc"
grep -q 'uint64_t wgmma_desc' "$B/gemm_desc.inc" && [ "$(grep -c 'emu_smem()' "$B/gemm_tma_kern.inc")" = 2 ] &&
    grep -q 'regs_dec<' "$B/gemm_tma_kern.inc" && ! grep -q 'asm' "$B/gemm_tma_kern.inc" &&
    grep -q '^int gemm_tma_run' "$B/gemm_tma_host.inc" ||
    { echo "run_gemm.sh: the sed edits no longer match src/cuda/gemm_tma.cu / mma.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/gemm_emu" tests/emu/gemm_emu.cpp -lm
"$B/gemm_emu" "$@"
