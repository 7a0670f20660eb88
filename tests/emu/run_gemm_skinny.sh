#!/bin/sh
# tests/emu/run_gemm_skinny.sh — runs the batched decode step's GEMM for few rows (src/cuda/gemm_skinny.cu: the
# split-K tensor-core kernel for bf16 and FP8 e4m3 weights, its split reduction and every epilogue) on the CPU
# through the host emulation of tests/emu/emu.h, against a double-precision reference (tests/emu/gemm_skinny_emu.cpp),
# with the batch-invariance check (a prefix of the rows alone gives bitwise the same rows), twice: the mma.sync path
# and the sm_90a wgmma path (tests/emu/emu_wgmma.h). The kernel and the
# swizzle / ldmatrix address helpers of src/cuda/mma.cuh are compiled unchanged except for the includes and the
# shared-memory declaration (sed below); common.cuh's e4m3x2_f32 in its host (software) form; src/util.c for the
# reference's e4m3 decoder. Needs nvcc's headers (cuda_runtime_api.h). Usage: tests/emu/run_gemm_skinny.sh [seed];
# B=DIR puts the objects there (default build/emu).
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
sed -n '/^#define SWZ_TMA16/,/^\/\* ---- Hopper wgmma/p' src/cuda/mma.cuh | sed '$d' > "$B/sk_mma.inc"
sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc(/,/^}/p' src/cuda/mma.cuh > "$B/sk_desc.inc"
{ sed -n '/^__device__ __forceinline__ float warp_sum(float v)/,/^}/p' src/cuda/common.cuh
  sed -n '/^__device__ __forceinline__ float norm_apply/,/^}/p' src/cuda/common.cuh
  sed -n '/^__device__ __forceinline__ float2 e4m3x2_f32/,/^}/p' src/cuda/common.cuh; } > "$B/sk_common.inc"
sed -e '/#include "cuda\//d' \
    -e 's/extern __shared__ __align__(1024) uint8_t smem\[\];/uint8_t *smem = emu_smem();/' \
    -e 's/^    __shared__ /    static /' \
    src/cuda/gemm_skinny.cu > "$B/sk_kernels.inc"
grep -q 'ldsm_addr_bt' "$B/sk_mma.inc" && grep -q 'norm_apply' "$B/sk_common.inc" &&
    grep -q 'e4m3x2_f32' "$B/sk_common.inc" && grep -q 'emu_smem()' "$B/sk_kernels.inc" &&
    grep -q 'uint64_t wgmma_desc' "$B/sk_desc.inc" &&
    ! grep -q 'asm' "$B/sk_kernels.inc" ||
    { echo "run_gemm_skinny.sh: the sed edits no longer match src/cuda/gemm_skinny.cu / mma.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cc -std=c11 -O1 -Iinclude -Isrc -c src/util.c -o "$B/sk_util.o"
for path in mma wgmma; do
    flags=""; [ $path = wgmma ] && flags="-D__CUDA_ARCH_FEAT_SM90_ALL"
    g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function $flags -Isrc -Iinclude -I"$B" -Itests/emu \
        -I"$CUDA_HOME/include" -o "$B/gemm_skinny_emu_$path" tests/emu/gemm_skinny_emu.cpp "$B/sk_util.o" -lm
done
"$B/gemm_skinny_emu_mma" "$@"
"$B/gemm_skinny_emu_wgmma" "$@"
