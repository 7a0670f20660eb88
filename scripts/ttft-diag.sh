#!/bin/bash
# TTFT breakdown on the GPU machine: the raw 128-token prefill, then a server (log lines on) with the prefix cache
# on and off: client-side and server-side TTFT of 128-token prompts on an idle server.
export LD_LIBRARY_PATH=$PWD/.devlib
B=build/qwen35
timeout 60 $B bench --dummy qwen3.5-0.8b --backend cuda --ctx-list 128 --prefill-list 128 2>&1 | grep -i "prefill\|decode" | head -4
for mode in on off; do
  flags=""; [ $mode = off ] && flags="--prefix-cache-memory 0"
  $B serve --dummy qwen3.5-0.8b --backend cuda --max-seqs 64 --ctx 8192 --port 8111 $flags > $OUT/diag-$mode.log 2>&1 & P=$!
  for i in $(seq 240); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8111/health', timeout=1)" 2>/dev/null && break; sleep 0.5; done
  timeout 60 python3 tools/bench_serve.py --base-url http://127.0.0.1:8111 --mode ttft --input-len 128 --num-prompts 40 --warmup 5 2>&1 | grep -i "ttft\|E2E" | sed "s/^/$mode: /"
  kill -INT $P; wait $P
  grep "ttft" $OUT/diag-$mode.log | tail -n 3 | sed "s/^/$mode: /"
done
