#!/bin/sh
# soak.sh — a short form of issue 28's soak (tools/soak_serve.py) in `make test`: BUILD/qwen35 serve on the CPU
# backend over a real port, with the serve tests' model (.cache/serve-model, written by tests/serve/run.sh), under
# concurrent streaming clients, clients that disconnect mid-stream and malformed requests interleaved. Two servers:
#   1. --deterministic: then 4 finished requests are sent again one at a time and must give the same tokens and
#      logprobs (output mixed between sequences or state leaked between slots shows up there);
#   2. a KV pool of 1 MiB with sampling (temperature, top-k, top-p): sequences are preempted when the blocks run
#      out and recomputed later, and every stream must still end complete and consistent with its request.
# Each must print SOAK PASS (every request ends with its full output or a clean error, ids unique, /health 200 and
# nothing running, waiting or held in the KV pool afterwards, RSS flat); the server must exit 0 within 30 s of SIGINT,
# and every line of its log must carry its prefix. Needs python3 with aiohttp (Debian python3-aiohttp,
# scripts/deps.sh test): without it, one line, skipped.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-build}
PY=${PYTHON:-python3}
# a python3 earlier on PATH (pyenv, a venv) may lack the Debian package that /usr/bin/python3 has
"$PY" -c "import aiohttp" 2>/dev/null || PY=/usr/bin/python3
"$PY" -c "import aiohttp" 2>/dev/null || { echo "soak: SKIPPED (python3 has no aiohttp: apt-get install python3-aiohttp)"; exit 0; }
model="$root/.cache/serve-model"
[ -f "$model/tokenizer.json" ] || { echo "soak: FAILED: no $model (tests/serve/run.sh writes it)"; exit 1; }
log="$root/$B/soak"
mkdir -p "$log"
rc=0
# under AddressSanitizer freed memory waits in its quarantine (256 MiB by default), so RSS grows through the run
slack=64
ldd "$B/qwen35" 2>/dev/null | grep -q libasan && slack=1024
# soak NAME SERVER_FLAGS -- CLIENT_FLAGS: one server, one soak_serve.py run against it
soak() {
    name=$1
    shift
    sflags=""
    while [ "$1" != "--" ]; do sflags="$sflags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    "$B/qwen35" serve --model "$model" --port 0 --ctx 1024 --max-seqs 8 --max-body-kb 64 $sflags \
        >"$log/$name.server.log" 2>&1 &
    spid=$!
    port=""
    i=0
    while [ $i -lt 100 ] && [ -z "$port" ]; do
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log/$name.server.log")
        [ -n "$port" ] || { kill -0 $spid 2>/dev/null || break; sleep 0.1; }
        i=$((i + 1))
    done
    if [ -z "$port" ]; then
        echo "soak $name: FAILED: the server did not start: $(tail -n 1 "$log/$name.server.log")"
        kill $spid 2>/dev/null
        rc=1
        return
    fi
    timeout 300 "$PY" "$root/tools/soak_serve.py" --base-url "http://127.0.0.1:$port" --pid $spid --clients 8 \
        --prompt-len 16:300 --output-len 1:32 --warmup-s 5 --sample-s 2 --drain-s 60 --max-body-kb 64 --workers 1 \
        --malformed-rate 1 --rss-slack-mb $slack "$@" >"$log/$name.log" 2>&1
    kill -INT $spid 2>/dev/null
    i=0
    while kill -0 $spid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 $spid 2>/dev/null && { echo "soak $name: the server did not stop within 30 s of SIGINT"; kill -9 $spid; }
    wait $spid
    src=$?
    # the server's log: one prefixed line per request and event, nothing else (libmicrohttpd's own lines included)
    stray=$(grep -v '^qwen35 serve: ' "$log/$name.server.log" | head -n 3)
    if grep -q '^SOAK PASS' "$log/$name.log" && [ $src -eq 0 ] && [ -z "$stray" ]; then
        echo "soak $name: PASS ($(sed -n 's/^requests \([0-9]*\): ok \([0-9]*\), client disconnects \([0-9]*\).*/\1 requests, \2 served, \3 disconnects/p' "$log/$name.log"), $(grep -c ' preempted ' "$log/$name.server.log") preemptions)"
    else
        echo "soak $name: FAILED (server exit $src; $log/$name.log):"
        grep '^FAIL\|Error' "$log/$name.log" | head -n 10
        [ -z "$stray" ] || printf 'lines of the server log without its prefix:\n%s\n' "$stray"
        rc=1
    fi
}
soak deterministic --deterministic -- --duration 15 --replay 4
soak preempt --kv-memory 1M -- --duration 15 --output-len 64:400 --temperature 0.8 --top-k 40 --top-p 0.9
exit $rc
