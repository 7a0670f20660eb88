#!/bin/sh
# tests/emu/run.sh — runs the DeltaNet prefill kernels (src/cuda/deltanet_prefill.cu) on the CPU
# through a host emulation of the CUDA features they use (tests/emu/emu.h), against the fp32 CPU
# reference (src/cpu/ops.c). For machines without a GPU: checks fragment layouts, indexing, scratch
# carving and the chunk algebra, not speed. The kernel file is compiled unchanged except for three
# mechanical edits (sed below: the cuda/ includes, the extern __shared__ declaration, the launcher).
# Needs nvcc's headers (cuda_runtime_api.h, for the vector types) and build/src/{cpu/ops,util}.o
# (any `make` build). Usage: tests/emu/run.sh [Hk Hv repeating scan_norms bf16]  (default 1 2 0 1 0; ~40 s per run;
# scan_norms 0: dn_scan<false> + dn_norm_out).
set -e
cd "$(dirname "$0")/../.."
B=build/emu
mkdir -p "$B"
make -s build/src/cpu/ops.o build/src/util.o
sed -n '/^#define SWZ_TMA16/,/^\/\* ---- Hopper wgmma/p' src/cuda/mma.cuh | sed '$d' > "$B/helpers.inc"
sed -e '/#include "cuda\//d' -e 's/extern __shared__ __align__(128) uint8_t smem\[\];/uint8_t *smem = emu_smem();/' \
    -e '/^\/\* ---- launcher/,$d' src/cuda/deltanet_prefill.cu > "$B/dn.inc"
sed -e '/#include "cuda\//d' -e 's/extern __shared__ __align__(1024) uint8_t smem_raw\[\];/uint8_t *smem_raw = emu_smem();/' src/cuda/deltanet_prefill_scan.cuh >> "$B/dn.inc" # kernel 2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -g -fopenmp -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/deltanet_prefill_emu" tests/emu/deltanet_prefill_emu.cpp build/src/cpu/ops.o \
    build/src/util.o -lm
"$B/deltanet_prefill_emu" "$@"
