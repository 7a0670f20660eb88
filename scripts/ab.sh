#!/bin/bash
# Same-machine A/B of decode builds and settings, run ON the GPU machine (docs/PERF_NOTES.md: every change is
# measured alternating with its base in one call). Unpacks .devpack/pack.txz / .tgz if present.
#   usage: scripts/ab.sh [-r ROUNDS] [-c CTX_LIST] LABEL:BINARY[:VAR=VALUE,...] ...
#   e.g.   scripts/ab.sh -r 3 -c 128,2048 base:build-base/qwen35 new:build/qwen35 \
#              counter:build/qwen35:QWEN35_DN_ONEX=1
# Each round runs every variant once (`qwen35 bench --dummy qwen3.5-0.8b --backend cuda`), in the order given;
# prints one line per run (ms/token per context) and, last, the median per variant and context.
set -u
rounds=3 ctx=128,2048
while getopts "r:c:" o; do
    case $o in
    r) rounds=$OPTARG ;;
    c) ctx=$OPTARG ;;
    *) sed -n '2,8p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,8p' "$0"; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -f .devpack/pack.txz ]; then tar xJf .devpack/pack.txz; elif [ -f .devpack/pack.tgz ]; then tar xzf .devpack/pack.tgz; fi
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
: > "$OUT/ab.tsv"
for r in $(seq 1 "$rounds"); do
    for v in "$@"; do
        label=${v%%:*} rest=${v#*:}
        bin=${rest%%:*} envs=""
        [ "$rest" != "$bin" ] && envs=${rest#*:}
        md="$OUT/ab-$label-$r.md"
        env $(echo "$envs" | tr ',' ' ') timeout 120 "$bin" bench --dummy qwen3.5-0.8b --backend cuda --ctx-list "$ctx" \
            --prefill-list 1 --md "$md" > "$OUT/ab-$label-$r.log" 2>&1 || echo "$label round $r: exit $?"
        line=$(awk -F'|' -v want="$ctx" 'BEGIN { n = split(want, c, ","); for (i = 1; i <= n; i++) ok[c[i]] = 1 }
                   /^\| [0-9]+ \| [0-9.]+ \|/ { k = $2 + 0; if ((k in ok) && !seen[k]++) printf "%s %s ", k, $3 }' \
               "$md" 2>/dev/null)
        echo "$label round $r: $line"
        echo "$label $line" | awk '{ for (i = 2; i < NF; i += 2) print $1 "\t" $i "\t" $(i + 1) }' >> "$OUT/ab.tsv"
    done
done
echo "== median ms/token per variant and context ($rounds rounds)"
sort -t "$(printf '\t')" -k1,1 -k2,2n -k3,3g "$OUT/ab.tsv" | awk -F'\t' '
    function flush() { if (n) printf "%s ctx %s: %.4f (%d runs)\n", pk, pc, a[int((n + 1) / 2)], n }
    $1 != pk || $2 != pc { flush(); pk = $1; pc = $2; n = 0 }
    { a[++n] = $3 }
    END { flush() }'
