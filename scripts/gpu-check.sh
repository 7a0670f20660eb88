#!/bin/bash
# GPU check, run ON the GPU machine from the repository root, with build/ (made here by
# `make`) and .devlib/ (scripts/pack-devlib.sh) carried along, or both packed into
# .devpack/pack.txz (or .tgz) by scripts/devpack.sh (unpacked here first). Runs the GPU tests, the
# CUDA-vs-HF golden checks, the full-size comparison against HF bf16, compute-sanitizer, and
# the benchmark, writing logs to $OUT (or ./gpu-out) and printing a short table last.
#   usage: scripts/gpu-check.sh [tests] [full] [lengths] [sanitizer] [bench] [hf] [lab] [tok] [t:NAME ...]
#          [quickbench] [stage] [trace] [screen]
#   (default: tests full lengths sanitizer bench hf; lengths: prefill at T = 1 .. 8192 vs HF; t:NAME runs build/tests/gpu/test_NAME alone;
#   quickbench: decode at ctx 128/2048/16384 with --ops and one 2048-token prefill; screen: greedy ids with the LM
#   head screen's two kernels and without it, equal (dummy and an HF-saved random 0.8B);
#   stage: the staged fused MLP (QWEN35_MLP_STAGE=1|256|512, EXPERIMENTAL, measured slower): test_mlp,
#   test_decode with it at 128 threads, and an alternating same-machine A/B of the decode step (0, 1, 256); trace: the step trace (needs build-trace/qwen35 from
#   `make TRACE=1 BUILD=build-trace build-trace/qwen35`, packed by devpack.sh) -> tools/step_trace.py)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
steps="${*:-tests full lengths sanitizer bench hf}"
if [ -f .devpack/pack.txz ]; then tar xJf .devpack/pack.txz || { echo "gpu-check: cannot unpack .devpack/pack.txz (xz?)"; exit 1; }
elif [ -f .devpack/pack.tgz ]; then tar xzf .devpack/pack.tgz; fi
has() { case " $steps " in *" $1 "*) return 0;; esac; return 1; }
# variant VAR=VALUE TAG WHY TEST...: build/tests/gpu/TEST... under one setting, logged to $OUT/gpu-tests-TAG.log,
# one summary line
variant() {
    local set=$1 tag=$2 why=$3 t names="" paths=""
    shift 3
    for t in "$@"; do names="$names${names:+ + }$t" paths="$paths build/tests/gpu/$t"; done
    echo "== $names with $set ($why)"
    env "$set" sh tests/run.sh $paths 2>&1 | tee "$OUT/gpu-tests-$tag.log"
    summary+=("$names, $set: $(tail -n 1 "$OUT/gpu-tests-$tag.log")")
}
summary=()
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

if has tests; then
    echo "== GPU tests"
    sh tests/run.sh $(ls build/tests/gpu/test_* | grep -v "\.d$") 2>&1 | tee "$OUT/gpu-tests.log"
    summary+=("gpu tests: $(tail -n 1 "$OUT/gpu-tests.log")")
    variant QWEN35_DN_GN=0 gn0 "the DeltaNet step's cluster kernel with its norm" test_decode test_golden_cuda
    variant QWEN35_DN_FUSED=0 dnf0 "DeltaNet in_proj, step, out_proj as three kernels; other head shapes" test_decode
    variant QWEN35_DN_ONEX=0 onex0 "the fused DeltaNet mixer with two exchanges per layer" test_decode
    variant QWEN35_DN_ONEX=1 onex1 "the one exchange through an arrival counter instead of tagged words" test_decode
    variant QWEN35_ATTN_SHORT=40 as40 "the short attention kernel up to kv_len 40: steps cross to the long graph" \
        test_decode
    variant QWEN35_ATTN_SHORT=0 as0 "attention and o_proj as two kernels at every context" test_decode test_golden_cuda
    variant QWEN35_L2_STATE=0 l2s0 "the DeltaNet state without its L2 persisting window" test_decode
    variant QWEN35_LM_SCREEN=0 ls0 "greedy steps with the full bf16 LM head instead of its int8 screen" test_decode
    variant QWEN35_ATTN_QS=1 qs "the EXPERIMENTAL qkv GEMV + attention + o_proj kernel at short contexts" test_decode
    variant QWEN35_ATTN_FUSED=1 af "the EXPERIMENTAL fused attention layer, attn_layer.cu; hd 256 heads" test_decode
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
if has stage; then
    echo "== staged fused MLP (QWEN35_MLP_STAGE=1 / 256): tests, then A/B"
    timeout 120 build/tests/gpu/test_mlp > "$OUT/stage-test_mlp.log" 2>&1; r1=$?
    QWEN35_MLP_STAGE=1 timeout 200 build/tests/gpu/test_decode > "$OUT/stage-test_decode.log" 2>&1; r2=$?
    echo "test_mlp rc=$r1 $(tail -n 1 "$OUT/stage-test_mlp.log"); staged test_decode rc=$r2 $(tail -n 1 "$OUT/stage-test_decode.log")"
    for s in 0 1 256 0 1 256; do
        QWEN35_MLP_STAGE=$s timeout 60 build/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --ctx-list 128,2048 \
            --prefill-list 1 --md "$OUT/stage$s.md" > "$OUT/stage$s.log" 2>&1
        echo "QWEN35_MLP_STAGE=$s: $(grep -E '^\| (128|2048) \|' "$OUT/stage$s.md" | cut -d'|' -f2,3 | tr '\n' ' ')" |
            tee -a "$OUT/stage.txt"
    done
    summary+=("staged MLP: test_mlp rc=$r1, test_decode rc=$r2; $(tr '\n' ';' < "$OUT/stage.txt")")
fi
if has trace; then
    echo "== step trace (build-trace/qwen35)"
    if [ -x build-trace/qwen35 ]; then
        rm -f "$OUT"/trace?.csv
        for s in 0 1; do
            QWEN35_MLP_STAGE=$s QWEN35_TRACE_CSV="$OUT/trace$s.csv" timeout 90 build-trace/qwen35 bench --dummy qwen3.5-0.8b \
                --backend cuda --ctx-list 128 --prefill-list 1 > "$OUT/trace$s.log" 2>&1
            echo "-- QWEN35_MLP_STAGE=$s"; python3 tools/step_trace.py "$OUT/trace$s.csv" 2>&1 | tee "$OUT/trace$s.txt"
        done
        python3 tools/step_trace.py "$OUT/trace0.csv" --detail > "$OUT/trace0-detail.txt" 2>&1
        summary+=("trace: see trace0.txt / trace1.txt")
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
if has screen; then
    echo "== greedy ids over 64 steps, deterministic: the LM head screen's ring kernel / its register kernel / the full head"
    [ -d /tmp/full08 ] || python3 tools/make_fixtures.py --full /tmp/full08 --steps 4 >/dev/null 2>&1
    for m in "--dummy qwen3.5-0.8b" "--model /tmp/full08"; do
        ids="" bad=0
        for ls in 1 2 0; do
            QWEN35_LM_SCREEN=$ls timeout 120 build/qwen35 run $m --backend cuda --ids 1,2,3 -n 64 --print-ids \
                --deterministic > "$OUT/screen-ids-$ls.txt" 2> "$OUT/screen-ids-$ls.err" || bad=1
            [ -s "$OUT/screen-ids-$ls.txt" ] || bad=1
            ids="$ids $(md5sum < "$OUT/screen-ids-$ls.txt" | cut -c1-12)"
        done
        set -- $ids
        r=$([ $bad = 0 ] && [ "$1" = "$2" ] && [ "$2" = "$3" ] && echo same || echo "DIFFERENT or FAILED")
        echo "$m: $ids -> $r" | tee -a "$OUT/screen-ids.txt"
        summary+=("screen ids ($m): $r")
    done
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
