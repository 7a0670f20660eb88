#!/bin/bash
# GPU check, run ON the GPU machine from the repository root, with build/ (made here by
# `make`) and .devlib/ (scripts/pack-devlib.sh) carried along. Runs the GPU tests, the
# CUDA-vs-HF golden checks, the full-size comparison against HF bf16, compute-sanitizer, and
# the benchmark, writing logs to $OUT (or ./gpu-out) and printing a short table last.
#   usage: scripts/gpu-check.sh [tests] [full] [sanitizer] [bench] [hf]   (default: all)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
steps="${*:-tests full sanitizer bench hf}"
has() { case " $steps " in *" $1 "*) return 0;; esac; return 1; }
summary=()
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

if has tests; then
    echo "== GPU tests"
    sh tests/run.sh $(ls build/tests/gpu/test_* | grep -v "\.d$") 2>&1 | tee "$OUT/gpu-tests.log"
    summary+=("gpu tests: $(tail -n 1 "$OUT/gpu-tests.log")")
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
if has sanitizer; then
    echo "== compute-sanitizer memcheck, short decode"
    compute-sanitizer --tool memcheck --error-exitcode 9 build/qwen35 run --dummy qwen3.5-0.8b --backend cuda \
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
echo
echo "================ summary ================"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
for s in "${summary[@]}"; do echo "$s"; done
