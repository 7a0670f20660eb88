#!/bin/bash
# GPU check, run ON the GPU machine from the repository root, with build/ (made here by
# `make`) and .devlib/ (scripts/pack-devlib.sh) carried along, or both packed into
# .devpack/pack.txz (or .tgz) by scripts/devpack.sh (unpacked here first). Runs the GPU tests, the
# CUDA-vs-HF golden checks, the full-size comparison against HF bf16, compute-sanitizer, and
# the benchmark, writing logs to $OUT (or ./gpu-out) and printing a short table last.
#   usage: scripts/gpu-check.sh [tests] [full] [lengths] [sanitizer] [bench] [hf] [lab] [tok] [t:NAME ...]
#          [quickbench] [trace] [identity] [serve]
#   (default: tests full lengths sanitizer bench hf; lengths: prefill at T = 1 .. 8192 vs HF; t:NAME runs build/tests/gpu/test_NAME alone;
#   quickbench: decode at ctx 128/2048/16384 with --ops and one 2048-token prefill; trace: the step trace (needs
#   build-trace/qwen35 from `make TRACE=1 BUILD=build-trace build-trace/qwen35`, packed by devpack.sh) ->
#   tools/step_trace.py; identity: scripts/identity.sh of build/qwen35 and, when present, build-base/qwen35
#   (bitwise comparison of two builds: deterministic logits and greedy ids), diffed; serve: the batched step's GPU
#   tests, bench/serve_step (default and --deterministic) and build/bench/skinny_lab --quick when built)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
steps="${*:-tests full lengths sanitizer bench hf}"
if [ -f .devpack/pack.txz ]; then tar xJf .devpack/pack.txz || { echo "gpu-check: cannot unpack .devpack/pack.txz (xz?)"; exit 1; }
elif [ -f .devpack/pack.tgz ]; then tar xzf .devpack/pack.tgz; fi
has() { case " $steps " in *" $1 "*) return 0;; esac; return 1; }
summary=()
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

if has tests; then
    echo "== GPU tests"
    sh tests/run.sh $(ls build/tests/gpu/test_* | grep -v "\.d$") 2>&1 | tee "$OUT/gpu-tests.log"
    summary+=("gpu tests: $(tail -n 1 "$OUT/gpu-tests.log")")
fi
for s in $steps; do
    case "$s" in t:*)
        n=${s#t:}
        echo "== GPU test $n"
        timeout 300 sh tests/run.sh "build/tests/gpu/test_$n" 2>&1 | tee "$OUT/gpu-test-$n.log"
        summary+=("test_$n: $(tail -n 1 "$OUT/gpu-test-$n.log")");;
    esac
done
if has quickbench; then
    echo "== quick bench"
    timeout 300 build/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --ops --prefill-list 2048 --json "$OUT/bench.json" \
        --md "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log"
    summary+=("quick bench: exit ${PIPESTATUS[0]}")
fi
if has trace; then
    echo "== step trace (build-trace/qwen35)"
    if [ -x build-trace/qwen35 ]; then
        rm -f "$OUT"/trace?.csv
        timeout 90 build-trace/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --ctx-list 128 --prefill-list 1 \
            --trace-csv "$OUT/trace0.csv" > "$OUT/trace0.log" 2>&1
        python3 tools/step_trace.py "$OUT/trace0.csv" 2>&1 | tee "$OUT/trace0.txt"
        python3 tools/step_trace.py "$OUT/trace0.csv" --detail > "$OUT/trace0-detail.txt" 2>&1
        summary+=("trace: see trace0.txt")
    else
        summary+=("trace: build-trace/qwen35 missing")
    fi
fi
if has full; then
    echo "== full-size random Qwen3.5-0.8B: HF bf16 vs qwen35 CUDA decode"
    if python3 tools/make_fixtures.py --full /tmp/full08 --steps 64 >"$OUT/full-make.log" 2>&1; then
        python3 tools/compare_full.py /tmp/full08 build/qwen35 2>&1 | tee "$OUT/full-compare.log"
        summary+=("full 0.8B vs HF: $(tail -n 1 "$OUT/full-compare.log")")
    else
        tail -n 20 "$OUT/full-make.log"; summary+=("full 0.8B: make_fixtures --full FAILED")
    fi
fi
if has lengths; then
    echo "== full-size random Qwen3.5-0.8B: prefill at T = 1, 63, 64, 65, 2048, 8192 vs HF bf16 / fp32"
    [ -d /tmp/full08 ] || python3 tools/make_fixtures.py --full /tmp/full08 --steps 4 >"$OUT/full-make.log" 2>&1
    python3 tools/compare_prefill_lengths.py /tmp/full08 build/qwen35 2>&1 | tee "$OUT/lengths.log"
    summary+=("$(tail -n 1 "$OUT/lengths.log")")
fi
if has identity; then
    echo "== bitwise identity: deterministic logits and greedy ids (scripts/identity.sh)"
    [ -d /tmp/full08 ] || python3 tools/make_fixtures.py --full /tmp/full08 --steps 4 >/dev/null 2>&1
    bash scripts/identity.sh build/qwen35 /tmp/full08 > "$OUT/identity-new.txt" 2>&1
    cat "$OUT/identity-new.txt"
    if [ -x build-base/qwen35 ]; then
        bash scripts/identity.sh build-base/qwen35 /tmp/full08 > "$OUT/identity-base.txt" 2>&1
        if diff "$OUT/identity-base.txt" "$OUT/identity-new.txt" > "$OUT/identity-diff.txt"; then r=identical
        else r="DIFFERENT: $(grep -c '^>' "$OUT/identity-diff.txt") lines"; cat "$OUT/identity-diff.txt"; fi
        summary+=("identity vs build-base: $r")
    fi
fi
if has sanitizer; then
    echo "== compute-sanitizer memcheck, short decode"
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/qwen35 run --dummy qwen3.5-0.8b --backend cuda \
        --ids 1,2,3,4 -n 4 --print-ids --ctx 64 >"$OUT/memcheck.log" 2>&1
    rc=$?; tail -n 5 "$OUT/memcheck.log"; summary+=("memcheck: exit $rc")
fi
if has bench; then
    echo "== bench"
    build/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --ops --json "$OUT/bench.json" --md "$OUT/bench.md" \
        2>&1 | tee "$OUT/bench.log"
    summary+=("bench: exit ${PIPESTATUS[0]}")
fi
if has hf; then
    echo "== HF transformers eager reference timings"
    [ -d /tmp/full08 ] || python3 tools/make_fixtures.py --full /tmp/full08 --steps 4 >/dev/null 2>&1
    python3 tools/hf_bench.py /tmp/full08 --out "$OUT/hf.json" 2>&1 | tail -n 3
    summary+=("hf: $(cat "$OUT/hf.json" 2>/dev/null | tr -d '\n ')")
fi
if has lab; then
    echo "== GEMV lab"
    build/bench/gemv_lab 2>&1 | tee "$OUT/gemv-lab.log" | tail -n 60
    summary+=("gemv lab: exit ${PIPESTATUS[0]}")
fi
if has serve; then
    echo "== batched step (issue 28) and prefix cache (issue 29): their GPU tests, serve_step in the default and the deterministic mode, the skinny lab"
    for t in serve_cuda prefix_cuda gemm fp8_gemv; do
        [ -x "build/tests/gpu/test_$t" ] || continue
        timeout 300 "build/tests/gpu/test_$t" > "$OUT/serve-test-$t.log" 2>&1
        summary+=("test_$t: $(tail -n 1 "$OUT/serve-test-$t.log")")
    done
    timeout 150 build/bench/serve_step --ctx 1024 --steps 20 1 8 32 64 128 256 2>&1 | tee "$OUT/serve-step.log"
    timeout 150 build/bench/serve_step --ctx 1024 --steps 20 --deterministic 1 64 2>&1 | tee "$OUT/serve-step-det.log"
    timeout 150 build/bench/serve_step --ctx 1024 --steps 20 --temperature 1 --top-p 0.95 --logprobs 0 1 64 2>&1 |
        tee "$OUT/serve-step-sampled.log"
    summary+=("serve_step B64: $(grep '^B   64' "$OUT/serve-step.log" | head -n 1)")
    summary+=("serve_step deterministic B64: $(grep '^B   64' "$OUT/serve-step-det.log" | head -n 1)")
    if [ -x build/bench/skinny_lab ]; then
        timeout 300 build/bench/skinny_lab --quick 2>&1 | tee "$OUT/skinny-lab.log"
        summary+=("skinny lab: $(tail -n 1 "$OUT/skinny-lab.log")")
    fi
fi
if has tok; then
    echo "== tokenizer: HF goldens regenerated with python tokenizers, and encode speed C vs HF on this CPU"
    mkdir -p "$OUT/tok"
    python3 tools/make_tokenizer_golden.py --tokenizer .cache/qwen3-tokenizer/tokenizer.json \
        --config .cache/qwen3-tokenizer/tokenizer_config.json --corpus tests/fixtures/tokenizer/corpus.jsonl \
        --chat tests/fixtures/tokenizer/chat_cases.jsonl --out "$OUT/tok" >"$OUT/tok/make.log" 2>&1
    rc=$?; tail -n 3 "$OUT/tok/make.log"
    for f in "$OUT"/tok/*.jsonl; do
        cmp -s "$f" "tests/fixtures/tokenizer/$(basename "$f")" && echo "same: $(basename "$f")" ||
            echo "DIFFERS: $(basename "$f")"
    done | tee "$OUT/tok/cmp.log"
    build/bench/bench_tokenizer --model .cache/qwen3-tokenizer --jsonl tests/fixtures/tokenizer/corpus.jsonl 2>&1 |
        tail -n 2 | tee "$OUT/tok/bench-c.log"
    python3 bench/bench_tokenizer_hf.py .cache/qwen3-tokenizer tests/fixtures/tokenizer/corpus.jsonl 2>&1 |
        tail -n 2 | tee "$OUT/tok/bench-hf.log"
    summary+=("tok goldens: exit $rc, $(grep -c DIFFERS "$OUT/tok/cmp.log") files differ; C: $(tail -n 1 "$OUT/tok/bench-c.log"); HF: $(tail -n 1 "$OUT/tok/bench-hf.log")")
fi
echo
echo "================ summary ================"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
for s in "${summary[@]}"; do echo "$s"; done
# everything in one archive: the device tool brings back at most 8 files
(cd "$OUT" && tar czf ../gpu-out.tgz . && rm -rf ./* && mv ../gpu-out.tgz all.tgz)
