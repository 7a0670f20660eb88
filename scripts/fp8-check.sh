#!/bin/bash
# fp8-check.sh — issue 31's check in one device call, run ON the GPU machine from the repository root with the
# build packed by scripts/devpack.sh (carry .devpack): the GPU tests that cover FP8 (and the bf16 decode test beside
# them), then FP8 next to bf16 in the same run: `qwen35 bench` decode at ctx 128 / 2048 / 16384 and prefill at
# 512 / 2048 / 8192 (the FP8 one with --ops), bench/serve_step at B = 1 / 64 / 256, and bench/fp8_quality (FP8 vs
# bf16 logits; each CUDA engine vs the CPU on its weights). Logs under $OUT (default ./fp8-out); prints a summary.
set -u
tar xJf .devpack/pack.txz || { echo "fp8-check: cannot unpack .devpack/pack.txz"; exit 1; }
export LD_LIBRARY_PATH=$PWD/.devlib
O=${OUT:-$PWD/fp8-out}
mkdir -p "$O"
for t in fp8_gemv dn_layer mlp gemm golden_cuda serve_cuda decode; do
    timeout 200 build/tests/gpu/test_$t > "$O/t_$t.log" 2>&1
    echo "test_$t rc=$? $(tail -n 1 "$O/t_$t.log")"
done
D="--dummy qwen3.5-0.8b --backend cuda --ctx-list 128,2048,16384 --prefill-list 512,2048,8192"
timeout 120 build/qwen35 bench $D --weights fp8 --ops > "$O/bench_fp8.md" 2>&1
timeout 120 build/qwen35 bench $D > "$O/bench_bf16.md" 2>&1
for f in fp8 bf16; do
    echo "== $f"
    grep -A5 "^| ctx | ms/token" "$O/bench_$f.md" | head -n 6
    grep -A5 "^| tokens | ms" "$O/bench_$f.md" | head -n 6
done
grep -A10 "^| op | launches | us | % of step" "$O/bench_fp8.md" | head -n 12
timeout 150 build/bench/serve_step --weights fp8 1 64 256 > "$O/serve_fp8.txt" 2>&1
timeout 150 build/bench/serve_step 1 64 256 > "$O/serve_bf16.txt" 2>&1
tail -n 3 "$O/serve_fp8.txt" "$O/serve_bf16.txt"
timeout 200 build/bench/fp8_quality --steps 256 --cpu 6 > "$O/quality.txt" 2>&1
tail -n 4 "$O/quality.txt"
