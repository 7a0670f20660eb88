#!/bin/bash
# Bitwise identity of a build's results, run ON the GPU machine: prints one "name md5" line per result.
# Two builds agree when their outputs are identical (diff the two files). Results: deterministic-mode
# logits of every golden fixture model (prefill and decode paths) and of --dummy qwen3.5-0.8b, and greedy
# ids over 256 steps (deterministic and default mode) on --dummy qwen3.5-0.8b and on an HF-saved random
# 0.8B (MODEL08, made by tools/make_fixtures.py --full).
#   usage: scripts/identity.sh BIN [MODEL08] > hashes.txt
set -u
BIN=$1
M08=${2:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
ids=$(seq -s, 1 3 120)
h() { if [ -s "$1" ]; then md5sum < "$1" | cut -c1-16; else echo "FAILED"; fi; }
for d in tests/fixtures/qwen35_text tests/fixtures/qwen35_gqa tests/fixtures/qwen35_vl tests/fixtures/qwen3_dense; do
    for mode in prefill decode; do
        "$BIN" logits --model "$d" --backend cuda --deterministic --ids "$ids" --mode $mode --out "$T/l" \
            > /dev/null 2> "$T/err" || cp /dev/null "$T/l"
        echo "logits $(basename $d) $mode $(h "$T/l")"
        rm -f "$T/l"
    done
done
for mode in prefill decode; do
    "$BIN" logits --dummy qwen3.5-0.8b --backend cuda --deterministic --ids "$ids" --mode $mode --last --out "$T/l" \
        > /dev/null 2> "$T/err" || cp /dev/null "$T/l"
    echo "logits dummy-0.8b $mode-last $(h "$T/l")"
    rm -f "$T/l"
done
models=("--dummy qwen3.5-0.8b")
[ -n "$M08" ] && models+=("--model $M08")
for m in "${models[@]}"; do
    for det in --deterministic ""; do
        $BIN run $m --backend cuda --ids 1,2,3 -n 256 --print-ids $det > "$T/ids" 2> "$T/err" || cp /dev/null "$T/ids"
        echo "ids256 $(echo "$m" | tr ' /' '__') ${det:-default} $(h "$T/ids")"
    done
done
