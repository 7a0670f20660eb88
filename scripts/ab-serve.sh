#!/bin/bash
# Same-machine A/B of builds for short prefills and the batched step, run ON the GPU machine (unpacks
# .devpack/pack.txz / .tgz if present). Each round runs every build once, in the order given:
#   qwen35 bench --prefill-list P: prefill ms per length, eager and graph;
#   serve_step --prompt N: a lone N-token prompt's open + step + pick (the server's first step of a request);
#   serve_step --ctx 1024 B ...: batched greedy decode, tokens/s;
#   qwen35 serve + tools/bench_serve.py --mode ttft (-t N): an idle server's TTFT of 40 greedy N-token prompts
#     (prefix cache off): the server's medians of its logged ttft and step, the client's p50.
# Prints one line per run and measurement, then the median per build over the rounds.
#   usage: scripts/ab-serve.sh [-r ROUNDS] [-p PREFILL_LIST] [-n PROMPT] [-b "B ..."] [-t N] LABEL:DIR ...
#   DIR holds qwen35 and serve_step (DIR/serve_step, else DIR/bench/serve_step), e.g. base:build-base new:build
#   (defaults: -r 2 -p 16,128,2048 -n 128 -b "64 256" -t 0; -b "", -n 0 or -t 0 skips that part;
#   AB_SERVE_MODEL: the server's model arguments, default "--dummy qwen3.5-0.8b --backend cuda --ctx 8192";
#   AB_STEP_ARGS: more serve_step arguments for the batched part, e.g. "--weights fp8")
set -u
rounds=2 plist=16,128,2048 prompt=128 blist="64 256" ttft=0
model=${AB_SERVE_MODEL:---dummy qwen3.5-0.8b --backend cuda --ctx 8192}
while getopts "r:p:n:b:t:" o; do
    case $o in
    r) rounds=$OPTARG ;;
    p) plist=$OPTARG ;;
    n) prompt=$OPTARG ;;
    b) blist=$OPTARG ;;
    t) ttft=$OPTARG ;;
    *) sed -n '2,15p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -f .devpack/pack.txz ]; then tar xJf .devpack/pack.txz; elif [ -f .devpack/pack.tgz ]; then tar xzf .devpack/pack.tgz; fi
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
tsv="$OUT/ab-serve.tsv" run="$OUT/ab-serve-run.tsv"
: > "$tsv"
for r in $(seq 1 "$rounds"); do
    for v in "$@"; do
        label=${v%%:*} dir=${v#*:}
        ss="$dir/serve_step"
        [ -x "$ss" ] || ss="$dir/bench/serve_step"
        : > "$run"
        if [ -n "$plist" ]; then # rows "| tokens | ms | ... | graph ms |"
            timeout 180 "$dir/qwen35" bench --dummy qwen3.5-0.8b --backend cuda --ctx-list 128 --prefill-list "$plist" \
                > "$OUT/ab-serve-$label-$r.log" 2>&1 || echo "$label round $r: bench exit $?"
            awk -F'|' -v want="$plist" -v l="$label" '
                BEGIN { n = split(want, c, ","); for (i = 1; i <= n; i++) ok[c[i]] = 1 }
                /^\| tokens/ { on = 1 }
                on && /^\| [0-9]+ \| [0-9.]+ \|/ { k = $2 + 0; if ((k in ok) && !seen[k]++)
                    printf "%s\tprefill %d eager ms\t%s\n%s\tprefill %d graph ms\t%s\n", l, k, $3 + 0, l, k, $(NF - 1) + 0 }' \
                "$OUT/ab-serve-$label-$r.log" >> "$run"
        fi
        if [ "$prompt" != 0 ]; then
            t=$(timeout 120 "$ss" --dummy qwen3.5-0.8b --prompt "$prompt" --steps 30 --kv-memory 20 2>&1 |
                awk '/^prompt/ { for (i = 1; i <= NF; i++) if ($i == "step" && $(i - 1) != "+") print $(i + 1) }' | tail -n 1)
            [ -n "$t" ] && printf "%s\tprompt %s step ms\t%s\n" "$label" "$prompt" "$t" >> "$run"
        fi
        if [ -n "$blist" ]; then
            # shellcheck disable=SC2086 # several arguments
            timeout 300 "$ss" --dummy qwen3.5-0.8b --ctx 1024 --kv-memory 40 ${AB_STEP_ARGS:-} $blist 2>&1 |
                awk -v l="$label" '/^B / { for (i = 2; i <= NF; i++)
                    if ($i == "tokens/s") printf "%s\tB %d tokens/s\t%s\n", l, $2, $(i - 1) }' >> "$run"
        fi
        if [ "$ttft" != 0 ]; then # the server logs "... ttft X ms ... step Y ms" per request
            slog="$OUT/ab-serve-$label-$r-serve.log"
            # shellcheck disable=SC2086 # $model: several arguments
            "$dir/qwen35" serve $model --max-seqs 64 --port 8111 --prefix-cache-memory 0 > "$slog" 2>&1 &
            pid=$!
            for _ in $(seq 240); do
                python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8111/health', timeout=1)" \
                    2>/dev/null && break
                sleep 0.5
            done
            timeout 300 python3 tools/bench_serve.py --base-url http://127.0.0.1:8111 --mode ttft --input-len "$ttft" \
                --num-prompts 40 --warmup 5 > "$OUT/ab-serve-$label-$r-client.log" 2>&1 ||
                echo "$label round $r: bench_serve exit $?"
            kill -INT $pid
            wait $pid
            for m in ttft step; do
                v=$(grep -o " $m [0-9.]* ms" "$slog" | awk '{ print $2 }' | tail -n 40 | sort -g |
                    awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
                [ -n "$v" ] && printf "%s\tserver %s %s ms\t%s\n" "$label" "$ttft" "$m" "$v" >> "$run"
            done
            awk -v l="$label" -v n="$ttft" '/^TTFT/ { for (i = 1; i < NF; i++) if ($i == "p50")
                printf "%s\tserver %s client p50 ms\t%s\n", l, n, $(i + 1) }' "$OUT/ab-serve-$label-$r-client.log" >> "$run"
        fi
        echo "$label round $r: $(awk -F'\t' '{ s = s $2 " " $3 "; " } END { print s }' "$run")"
        cat "$run" >> "$tsv"
    done
done
echo "== median per build and measurement ($rounds rounds)"
sort -t "$(printf '\t')" -k2,2 -k1,1 -k3,3g "$tsv" | awk -F'\t' '
    function flush() { if (n) printf "%-28s %-10s %s (%d runs)\n", pm, pk, a[int((n + 1) / 2)], n }
    $1 != pk || $2 != pm { flush(); pk = $1; pm = $2; n = 0 }
    { a[++n] = $3 }
    END { flush() }'
