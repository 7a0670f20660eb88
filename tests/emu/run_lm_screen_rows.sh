#!/bin/sh
# tests/emu/run_lm_screen_rows.sh — runs the LM head's argmax of up to 64 rows through the int8 screen
# (src/cuda/lm_screen_rows.cu: lsr_prep, the persistent lsr_screen with its bulk-copy ring and s8 wgmma, lsr_pick, and
# the launcher cuda_lm_rows) on the CPU through the host emulation of tests/emu/emu.h + emu_wgmma.h, with the int8
# tiles made by cuda_lm_quantize's kernel (lm_quantize_bf16 of src/cuda/lm_screen.cu), against a host model of the
# screen's bounds and the heads' exact argmax (tests/emu/lm_screen_rows_emu.cpp). The rescoring GEMM (cuda_gemm_skinny
# in its gather mode) is the test's host stand-in. The kernel file, the kernel taken from lm_screen.cu and the helpers
# of common.cuh / mma.cuh are compiled unchanged except for mechanical edits (sed below: the includes, the shared-memory
# declarations). Needs nvcc's headers (cuda_runtime_api.h, for the vector types). Usage: run_lm_screen_rows.sh [seed]
# (~30 s); B=DIR puts the objects there (default build/emu); LM_ROWS_EMU_SRC=file takes lm_screen_rows.cu from file
# instead (a scratch copy with an injected fault).
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
S=${LM_ROWS_EMU_SRC:-src/cuda/lm_screen_rows.cu}
{ grep '^__device__ __forceinline__ float bf16u(' src/cuda/common.cuh
  sed -n '/^\/\* ---- reductions/,/^\/\* ---- RMSNorm/p' src/cuda/common.cuh | sed '$d'; } > "$B/lsr_common.inc"
{ sed -n '/^__host__ __device__ __forceinline__ size_t swz128_tile_off(/,/^}/p' src/cuda/mma.cuh
  sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc(/,/^}/p' src/cuda/mma.cuh; } > "$B/lsr_mma.inc"
sed -n '/^__global__ void __launch_bounds__(256) lm_quantize_bf16(/,/^}/p' src/cuda/lm_screen.cu > "$B/lsr_quant.inc"
sed -e '/#include "cuda\//d' \
    -e 's/extern __shared__ __align__(1024) uint8_t smem\[\];/uint8_t *smem = emu_smem();/' \
    -e 's/^    __shared__ /    static /' "$S" > "$B/lsr_kernels.inc"
grep -q 'float bf16u' "$B/lsr_common.inc" && grep -q 'ArgMax warp_argmax' "$B/lsr_common.inc" &&
    grep -q 'float block_sum' "$B/lsr_common.inc" && grep -q 'unsigned ord_f32' "$B/lsr_common.inc" &&
    grep -q 'size_t swz128_tile_off' "$B/lsr_mma.inc" && grep -q 'uint64_t wgmma_desc' "$B/lsr_mma.inc" &&
    grep -q 'wt\[swz128_tile_off' "$B/lsr_quant.inc" && grep -q 'meta_rows)\[row\]' "$B/lsr_quant.inc" &&
    [ "$(grep -c 'emu_smem()' "$B/lsr_kernels.inc")" = 1 ] && ! grep -q '__shared__\|asm' "$B/lsr_kernels.inc" &&
    grep -q '^extern "C" int cuda_lm_rows(' "$B/lsr_kernels.inc" ||
    { echo "run_lm_screen_rows.sh: the sed edits no longer match $S / lm_screen.cu / mma.cuh / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -D__CUDA_ARCH_FEAT_SM90_ALL -Isrc -I"$B" \
    -Itests/emu -I"$CUDA_HOME/include" -o "$B/lm_screen_rows_emu" tests/emu/lm_screen_rows_emu.cpp -lm
"$B/lm_screen_rows_emu" "$@"
