#!/bin/sh
# tests/emu/run_lm_screen.sh — runs the LM head's int8 screen (src/cuda/lm_screen.cu: its register kernel and
# cuda_lm_quantize's kernel) on the CPU through the host emulation of tests/emu/emu.h against the full head's exact
# argmax done on the host in the kernel's own fp32 order (tests/emu/lm_screen_emu.cpp). The kernel file and the
# common.cuh helpers it uses are compiled unchanged except for mechanical edits (sed below: the includes, the
# dynamic shared-memory declaration, the launchers). The TMA ring kernel is not emulated (its mbarriers sit in static
# shared memory); its quantized rows and per-lane sums are. Needs nvcc's headers (cuda_runtime_api.h, for the vector types). Usage: run_lm_screen.sh [seed]
set -e
cd "$(dirname "$0")/../.."
B=build/emu
mkdir -p "$B"
{ sed -n '/^__device__ __forceinline__ float bf_lo/,/^__device__ __forceinline__ float bf16u/p' src/cuda/common.cuh
  sed -n '/^\/\* Dot product of 8 bf16/,/^static inline int ceil_div/p' src/cuda/common.cuh
  sed -n '/^\/\* The GEMV.s input row/,/^}/p' src/cuda/common.cuh
  sed -n '/^__host__ __device__ __forceinline__ size_t swz128_tile_off(/,/^}/p' src/cuda/mma.cuh; } > "$B/ls_common.inc"
sed -e '/^#include /d' \
    -e 's/extern __shared__ __align__(128) unsigned char smem\[\];/unsigned char *smem = emu_smem();/' \
    -e '/^extern "C" int cuda_lm_screen_ok/,$d' src/cuda/lm_screen.cu > "$B/lm_screen.inc"
grep -q 'gemv_stage_input' "$B/ls_common.inc" && grep -q 'swz128_tile_off' "$B/ls_common.inc" && grep -q 'emu_smem()' "$B/lm_screen.inc" &&
    grep -q 'lm_quantize_bf16' "$B/lm_screen.inc" ||
    { echo "run_lm_screen.sh: the sed edits no longer match src/cuda/lm_screen.cu / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-variable -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/lm_screen_emu" tests/emu/lm_screen_emu.cpp -lm
"$B/lm_screen_emu" "$@"
