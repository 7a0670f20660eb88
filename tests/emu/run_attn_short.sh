#!/bin/sh
# tests/emu/run_attn_short.sh — runs the short-context attention + o_proj kernel (src/cuda/attention.cu:
# attn_short_oproj AND its launchers cuda_attn_short / cuda_attn_short_cap) on the CPU through the host
# emulation of tests/emu/emu.h, against a double-precision reference (tests/emu/attn_short_emu.cpp). The
# kernel, the helpers it shares with cuda_attn_decode (ld_bf16_row, wbf, head_norm_rope, attn_final) and the
# common.cuh helpers are compiled unchanged except for mechanical edits (sed below: the static and dynamic
# shared-memory declarations, the cp.async asm and bf16_bits, which attn_short_emu.cpp provides; the kernel's
# constant E, dims per lane, is renamed: emu.h's blockIdx names its state E). The kernel's attn_qs variant
# (the qkv GEMV inside, its blocks exchanging rows through tagged words) is compiled against stubs but not
# run: one CTA at a time cannot exchange; test_attn_qs checks it on the GPU.
# Needs nvcc's headers (cuda_runtime_api.h, for the vector types). Usage: tests/emu/run_attn_short.sh [seed].
set -e
cd "$(dirname "$0")/../.."
B=${B:-build/emu}
mkdir -p "$B"
S=src/cuda/attention.cu
{ sed -n '/^__device__ __forceinline__ float bf_lo/,/^__device__ __forceinline__ float bf16u/p' src/cuda/common.cuh
  sed -n '/^\/\* Dot product of 8 bf16/,/^static inline int ceil_div/p' src/cuda/common.cuh; } > "$B/as_common.inc"
sed -n '/^\/\* E bf16 values at p/,/^\/\* Ticket of a last-arriver/p' "$S" |
    sed -e '$d' -e '/^static __device__ __forceinline__ uint16_t bf16_bits/d' \
        -e '/^__device__ __forceinline__ void prefetch_l2/d' > "$B/as_helpers.inc"
sed -n '/^\/\* ---- short contexts: attention + o_proj/,/^Q35_TRACE_FETCH_FN(cuda_trace_fetch_attention)/p' "$S" |
    sed -e '/^static __device__ __forceinline__ void as_cp_async16/,/^}/d' \
        -e '/asm volatile("cp.async.commit_group;"/d' -e '/asm volatile("cp.async.wait_group 0;"/d' \
        -e 's/extern __shared__ __align__(16) unsigned char smem\[\];/unsigned char *smem = emu_smem();/' \
        -e 's/^    __shared__ /    static /' -e '/^Q35_TRACE_FETCH_FN/d' \
        -e 's/\bE\b/EPL/g' > "$B/as_kernel.inc"  # (E: emu.h's state, which blockIdx names)
grep -q 'void head_norm_rope' "$B/as_helpers.inc" && grep -q 'float attn_final' "$B/as_helpers.inc" &&
    grep -q 'emu_smem()' "$B/as_kernel.inc" && ! grep -q 'asm\|__shared__' "$B/as_kernel.inc" &&
    ! grep -q 'asm' "$B/as_helpers.inc" && grep -q '^extern "C" int cuda_attn_short(' "$B/as_kernel.inc" ||
    { echo "run_attn_short.sh: the sed edits no longer match src/cuda/attention.cu / common.cuh"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cc -std=c11 -O1 -Iinclude -Isrc -c src/util.c -o "$B/as_util.o"
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -Wno-unused-function -Isrc -Iinclude -I"$B" -Itests/emu \
    -I"$CUDA_HOME/include" -o "$B/attn_short_emu" tests/emu/attn_short_emu.cpp "$B/as_util.o" -lm
"$B/attn_short_emu" "$@"
