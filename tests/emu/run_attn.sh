#!/bin/sh
# tests/emu/run_attn.sh — runs the EXPERIMENTAL wgmma flash attention for prefill
# (src/cuda/attention_prefill_wg.cu: kernel AND its launcher cuda_attn_prefill_wg, head_dim 256) on the CPU
# through the host emulation of tests/emu/emu.h + emu_wgmma.h, against a double-precision reference
# (tests/emu/attn_emu.cpp). The file is compiled unchanged except for mechanical edits (sed below: the
# includes and the extern __shared__ declaration); wgmma_desc / wgmma_desc_mn come from mma.cuh,
# sigmoid_f from common.cuh by sed, and attention_softmax.cuh whole. The launcher's CUDA runtime calls (cudaGetDevice,
# cudaDeviceGetAttribute, cudaFuncSetAttribute, launch_ex) and cuda_tma_map_bf16_3d are attn_emu.cpp's /
# emu.h's. Needs nvcc's headers (cuda_runtime_api.h, for the vector types).
# Usage: tests/emu/run_attn.sh [seed]  (the seed of the random inputs, default the time).
# ATTN_EMU_SRC=dir takes attention_prefill_wg.cu, attention_softmax.cuh, mma.cuh, common.cuh from dir instead of src/cuda (a
# scratch copy with an experiment or an injected fault).
set -e
cd "$(dirname "$0")/../.."
B=build/emu
mkdir -p "$B"
D=${ATTN_EMU_SRC:-src/cuda}
{ sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc(/,/^}/p' "$D/mma.cuh"
  sed -n '/^__device__ __forceinline__ uint64_t wgmma_desc_mn(/,/^}/p' "$D/mma.cuh"
  grep '^__device__ __forceinline__ float sigmoid_f(' "$D/common.cuh"
  cat "$D/attention_softmax.cuh"; } > "$B/attn_helpers.inc"
sed -e '/#include "cuda\//d' \
    -e 's/extern __shared__ __align__(1024) uint8_t smem_raw\[\];/uint8_t *smem_raw = emu_smem();/' \
    "$D/attention_prefill_wg.cu" > "$B/attn_wg.inc"
[ "$(grep -c 'uint64_t wgmma_desc' "$B/attn_helpers.inc")" = 2 ] && grep -q 'float sigmoid_f' "$B/attn_helpers.inc" &&
    grep -q 'void attn_softmax_tile' "$B/attn_helpers.inc" &&
    [ "$(grep -c 'emu_smem()' "$B/attn_wg.inc")" = 1 ] && ! grep -q 'asm\|__shared__' "$B/attn_wg.inc" &&
    grep -q '^extern "C" int cuda_attn_prefill_wg' "$B/attn_wg.inc" ||
    { echo "run_attn.sh: the sed edits no longer match src/cuda/attention_prefill_wg.cu / mma.cuh / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/attn_emu" tests/emu/attn_emu.cpp -lm
"$B/attn_emu" "$@"
