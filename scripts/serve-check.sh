#!/bin/bash
# serve-check.sh — issue 28's serving benchmarks (and, asked for, the soak), run ON the GPU machine from the
# repository root with build/ and .devlib/ carried along or packed into .devpack/pack.txz (as gpu-check.sh).
# Starts `build/qwen35 serve --dummy qwen3.5-0.8b --backend cuda --port 0` (no tokenizer: token-id prompts on
# /v1/completions, logprobs 0 so that every token is one SSE event), waits for /health, runs
# tools/bench_serve.py (idle TTFT of a 128-token prompt; throughput at concurrency 1 / 64 / 256; 64 streams with
# 1k-token prompts arriving) and with `soak SECONDS` tools/soak_serve.py, then stops the server with SIGINT and
# prints a compact summary. With `prefix`: issue 29's multi-turn prefix-cache benchmark (tools/bench_prefix.py: 64
# chats x 8 turns, a shared 1,500-token system prompt, 100-token user turns, 200-token replies, 16 in flight) against
# a fresh server with the prefix cache (default) and again with `--prefix-cache-memory 0`, then the two side by side;
# `prefix` alone runs only that step (name `bench` too for both). Logs and JSON under $OUT (default ./serve-out).
# Every step has a timeout; the default run takes about 4 minutes (every step is bounded; at most 6 after a normal
# start), `prefix` about 2 (at most 5: each run stops sending new turns after 75 s).
#   usage: scripts/serve-check.sh [bench] [soak SECONDS] [nobench] [prefix]
#   env:   QWEN35_BIN (build/qwen35, unpacked from .devpack; when set, nothing is unpacked), SERVE_MODEL_ARGS ("--dummy qwen3.5-0.8b --backend cuda"),
#          SERVE_ARGS ("--max-seqs 256 --ctx 8192"), PYTHON (python3), BENCH_LOGPROBS (0; "" for none),
#          BENCH_ARGS (more bench_serve.py flags for every run, e.g. "--temperature 1 --top-k 20"),
#          SMALL=1 (tiny sizes: to try the script against a CPU server), PREFIX_ARGS (more bench_prefix.py flags,
#          e.g. "--conversations 32": they override the defaults)
set -u
OUT=${OUT:-$PWD/serve-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devlib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
BIN=${QWEN35_BIN:-build/qwen35}
MODEL_ARGS=${SERVE_MODEL_ARGS:---dummy qwen3.5-0.8b --backend cuda}
SARGS=${SERVE_ARGS:---max-seqs 256 --ctx 8192}
PY=${PYTHON:-python3}
LP=${BENCH_LOGPROBS-0}
SMALL=${SMALL:-0}
t_start=$(date +%s)

bench=1 soak=0 prefix=0 bench_named=0
while [ $# -gt 0 ]; do
    case "$1" in
    bench) bench=1 bench_named=1 ;;
    nobench) bench=0 ;;
    soak) soak=${2:?soak needs SECONDS}; shift ;;
    prefix) prefix=1 ;;
    *) echo "serve-check: unknown argument '$1' (bench, nobench, soak SECONDS, prefix)"; exit 2 ;;
    esac
    shift
done
[ "$prefix" = 1 ] && [ "$bench_named" = 0 ] && bench=0

if [ -n "${QWEN35_BIN:-}" ]; then :  # a binary of its own: leave the tree's build/ alone
elif [ -f .devpack/pack.txz ]; then tar xJf .devpack/pack.txz || { echo "serve-check: cannot unpack .devpack/pack.txz"; exit 1; }
elif [ -f .devpack/pack.tgz ]; then tar xzf .devpack/pack.tgz; fi
[ -x "$BIN" ] || { echo "serve-check: no $BIN"; exit 1; }
"$PY" -c "import aiohttp" 2>/dev/null || { echo "serve-check: $PY has no aiohttp"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$OUT/gpu.txt" 2>&1

summary=()
note() { summary+=("$*"); }

# ---- the server ----
# start_server LOG [FLAGS...]: $BIN serve $MODEL_ARGS $SARGS FLAGS on a free port, log to LOG; sets spid and base,
# returns 1 (the log's tail printed) when it does not start
spid='' base='' logs=()
start_server() {
    local log=$1 port=
    shift
    logs+=("$log")
    echo "== $BIN serve $MODEL_ARGS $SARGS $* --port 0"
    # shellcheck disable=SC2086 # the argument strings are lists of flags
    "$BIN" serve $MODEL_ARGS $SARGS "$@" --port 0 --quiet > "$log" 2>&1 &
    spid=$!
    for _ in $(seq 1 360); do # model fill + CUDA start: at most 180 s
        port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log" | head -n 1)
        [ -n "$port" ] && break
        kill -0 $spid 2>/dev/null || break
        sleep 0.5
    done
    if [ -z "$port" ]; then
        kill -KILL $spid 2>/dev/null
        wait $spid 2>/dev/null
        echo "serve-check: the server did not start (exit $?):"; tail -n 20 "$log"
        spid=
        return 1
    fi
    base=http://127.0.0.1:$port
    grep "qwen35 serve:\|qwen35: serve" "$log" | head -n 3
    for _ in $(seq 1 60); do
        "$PY" -c "import urllib.request as u; u.urlopen('$base/health', timeout=2)" 2>/dev/null && break
        sleep 0.5
    done
    echo "server pid $spid on $base"
}
stop_server() {
    [ -n "$spid" ] || return
    kill -0 $spid 2>/dev/null || return
    kill -INT $spid
    for _ in $(seq 1 60); do kill -0 $spid 2>/dev/null || break; sleep 0.5; done
    if kill -0 $spid 2>/dev/null; then
        kill -KILL $spid; note "server ${logs[-1]##*/}: did not exit within 30 s of SIGINT (killed)"
    else
        wait $spid; note "server ${logs[-1]##*/}: exit $? after SIGINT"
    fi
}
trap stop_server EXIT
if [ "$bench" = 1 ] || [ "$soak" != 0 ]; then
    start_server "$OUT/server.log" || { trap - EXIT; exit 1; }
fi

# run NAME TIMEOUT ARGS...: one bench_serve.py configuration, log and JSON under $OUT, its verdict lines kept
run() {
    local name=$1 t=$2; shift 2
    echo "== $name"
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
    timeout -k 10 "$t" "$PY" tools/bench_serve.py --base-url "$base" ${LP:+--logprobs $LP} --label "$name" \
        --json "$OUT/$name.json" ${BENCH_ARGS:-} "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    cat "$OUT/$name.log"
    [ $rc -eq 124 ] && note "$name: TIMED OUT after $t s"
    if ! kill -0 $spid 2>/dev/null; then note "$name: THE SERVER DIED"; return 1; fi
    return 0
}
line() { grep -m1 "$2" "$OUT/$1.log" 2>/dev/null | sed 's/  */ /g'; }

if [ "$bench" = 1 ]; then
    if [ "$SMALL" = 1 ]; then n1=5 nc=16 l_in=64 l_out=16 dur=20 st=4 inj=128; else n1=200 nc=1 l_in=1024 l_out=256 dur=30 st=12 inj=1024; fi
    run ttft128 60 --mode ttft --input-len 128 --num-prompts $n1 --warmup 10 --ttft-target-ms 1.5 --max-duration 40 &&
        note "ttft128: $(line ttft128 '^TTFT') | $(line ttft128 'PASS\|FAIL')"
    run c1 $((dur + 20)) --num-prompts 16 --max-concurrency 1 --input-len $l_in --output-len $l_out --ignore-eos \
        --max-duration $dur --workers 1 &&
        note "c1: $(line c1 'request throughput') | $(line c1 '^ITL')"
    run c64 $((dur + 20)) --num-prompts $((64 * 4 / nc)) --max-concurrency $((64 / nc)) --random-input-len $l_in \
        --random-output-len $l_out --random-range-ratio 0.5 --ignore-eos --max-duration $dur &&
        note "c64: $(line c64 'request throughput') | $(line c64 '^TTFT') | $(line c64 '^ITL')"
    run c256 $((dur + 20)) --num-prompts $((256 * 3 / nc)) --max-concurrency $((256 / nc)) --random-input-len $((l_in / 2)) \
        --random-output-len $l_out --random-range-ratio 0.5 --ignore-eos --max-duration $dur &&
        note "c256: $(line c256 'request throughput') | $(line c256 '^ITL')"
    run poisson $((dur + 20)) --num-prompts $((400 / nc)) --request-rate $((20 / nc)) --random-input-len $l_in \
        --random-output-len $l_out --random-range-ratio 0.9 --ignore-eos --max-duration $dur &&
        note "poisson $((20 / nc))/s: $(line poisson 'request throughput') | $(line poisson '^TTFT')"
    run interference $((5 + 2 * st + 50)) --mode interference --streams $((64 / nc)) --settle-s 5 --steady-s $st \
        --inject-s $st --inject-rate 4 --inject-input-len $inj --inject-output-len 16 --stream-output-len 2048 --request-timeout 30 &&
        note "interference: $(line interference "ITL steady") | $(line interference "ITL inject") | $(line interference 'PASS\|FAIL')"
fi

if [ "$soak" != 0 ]; then
    echo "== soak $soak s"
    if [ "$SMALL" = 1 ]; then sargs="--clients 8 --prompt-len 16:256 --output-len 1:32 --warmup-s 10 --sample-s 5"; else sargs="--warmup-s 60"; fi
    # shellcheck disable=SC2086
    timeout -k 10 $((soak + 240)) "$PY" tools/soak_serve.py --base-url "$base" --pid $spid --duration "$soak" \
        --drain-s 120 --json "$OUT/soak.json" $sargs > "$OUT/soak.log" 2>&1
    rc=$?
    cat "$OUT/soak.log"
    [ $rc -eq 124 ] && note "soak: TIMED OUT"
    note "soak: $(line soak '^requests')"
    note "soak: $(line soak '^tokens')"
    note "soak: $(line soak '^RSS') / $(line soak '^GPU')"
    note "soak: $(line soak '^SOAK')$(grep '^FAIL' "$OUT/soak.log" | sed 's/^/ | /' | tr -d '\n')"
fi

stop_server

# ---- issue 29: the multi-turn prefix-cache benchmark, cache on and off (a fresh server each) ----
if [ "$prefix" = 1 ]; then
    if [ "$SMALL" = 1 ]; then
        pargs="--conversations 4 --turns 3 --system 60 --user 10 --reply 8 --concurrency 2" pdur=40
    else
        pargs="" pdur=75 # the issue's workload: 64 x 8, system 1500, user 100, reply 200, 16 in flight
    fi
    rm -f "$OUT"/prefix-on.json "$OUT"/prefix-off.json
    for mode in on off; do
        flags=
        [ $mode = off ] && flags="--prefix-cache-memory 0"
        # shellcheck disable=SC2086
        if ! start_server "$OUT/server-prefix-$mode.log" $flags; then
            note "prefix-$mode: the server did not start"
            continue
        fi
        echo "== prefix-$mode"
        # shellcheck disable=SC2086 # flag lists
        timeout -k 10 $((pdur + 35)) "$PY" tools/bench_prefix.py --url "$base" --label "cache-$mode" \
            --max-duration $pdur --request-timeout 30 --out "$OUT/prefix-$mode.json" $pargs ${PREFIX_ARGS:-} \
            > "$OUT/prefix-$mode.log" 2>&1
        rc=$?
        cat "$OUT/prefix-$mode.log"
        [ $rc -eq 124 ] && note "prefix-$mode: TIMED OUT after $((pdur + 35)) s"
        kill -0 $spid 2>/dev/null || note "prefix-$mode: THE SERVER DIED"
        note "prefix-$mode: $(line prefix-$mode '^requests') | $(line prefix-$mode '^issue 29')"
        stop_server
    done
    if [ -f "$OUT/prefix-on.json" ] && [ -f "$OUT/prefix-off.json" ]; then
        while IFS= read -r l; do note "$l"; done < <("$PY" tools/bench_prefix.py --compare "$OUT/prefix-on.json" \
            "$OUT/prefix-off.json" 2>&1)
    fi
fi
trap - EXIT
# a client that closes mid-stream makes libmicrohttpd log "application error generating response": expected
for log in "${logs[@]}"; do
    grep -i "error\|fail\|abort\|segmentation\|assert" "$log"
done | grep -v " 40[0-9] \| 413 \| 429 \|application error" | head -n 5 > "$OUT/server-errors.txt"
[ -s "$OUT/server-errors.txt" ] && note "server log: $(wc -l < "$OUT/server-errors.txt") error lines, first: $(head -n 1 "$OUT/server-errors.txt")"
echo
echo "==== serve-check summary ($(($(date +%s) - t_start)) s; logs in $OUT) ===="
for s in "${summary[@]}"; do echo "$s"; done
