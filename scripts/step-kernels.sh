#!/bin/bash
# Per-kernel GPU time of serve_step, run ON the GPU machine (after the dev pack is unpacked): ncu times every kernel
# (hardware clocks left alone, caches not flushed) and this prints, per kernel name, the total microseconds and the
# launches, the largest first, then the sum. Kernels run one at a time under ncu, so the sum has no overlap and no
# launch gaps: compare it with serve_step's step time. The prefill of the B sequences and the 3 warm-up steps are
# counted too (use a short --ctx). GRAPH=1: a graph launch is one result (--graph-profiling graph), so each decode
# step shows as one line. The raw CSV goes to $OUT/step-kernels.csv when OUT is set.
#   usage: [GRAPH=1] scripts/step-kernels.sh [serve_step arguments, e.g. --ctx 128 --temperature 1 64]
set -eu
S=${SERVE_STEP:-build/bench/serve_step}
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    $([ "${GRAPH:-0}" = 1 ] && echo --graph-profiling graph) "$S" --dummy qwen3.5-0.8b --steps 1 "$@" >"$csv" 2>/dev/null || true
[ -n "${OUT:-}" ] && cp "$csv" "$OUT/step-kernels.csv"
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if not rows:
    sys.exit("step-kernels: ncu wrote no results")
head = rows[0]
ki, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
tot, n = collections.Counter(), collections.Counter()
for r in rows[1:]:
    if len(r) <= vi or r[vi] == "":
        continue
    t = float(r[vi].replace(",", "")) * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3}.get(r[ui], 1)
    name = r[ki].split("(")[0]
    tot[name] += t
    n[name] += 1
for name, t in tot.most_common():
    print(f"{t:10.1f} us {n[name]:6d}  {name[:100]}")
print(f"{sum(tot.values()):10.1f} us total")
PY
