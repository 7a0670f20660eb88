#!/usr/bin/env python3
"""bench_tokenizer_hf.py — HF tokenizers (python) side of bench_tokenizer.c: encode MB/s, one string per
call (single-threaded), median of runs, on the same corpus. Usage (repo root):
  python3 bench/bench_tokenizer_hf.py [.cache/qwen3-tokenizer] [tests/fixtures/tokenizer/corpus.jsonl | TEXT] [MB] [runs]
"""
import json
import sys
import time

from tokenizers import Tokenizer

d = sys.argv[1] if len(sys.argv) > 1 else ".cache/qwen3-tokenizer"
corpus = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/tokenizer/corpus.jsonl"
mb = float(sys.argv[3]) if len(sys.argv) > 3 else 16
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
with open(corpus, encoding="utf-8", newline="") as f:  # .jsonl: a string per line; else the whole file
    lines = [json.loads(x) for x in f.read().split("\n") if x] if corpus.endswith(".jsonl") else [f.read()]
nbytes = sum(len(s.encode()) for s in lines)
reps = int(mb * 1e6 / nbytes) + 1
t0 = time.perf_counter()
tok = Tokenizer.from_file(d + "/tokenizer.json")
load = time.perf_counter() - t0
rates = []
for r in range(runs + 1):
    t0 = time.perf_counter()
    for _ in range(reps):
        for s in lines:
            tok.encode(s, add_special_tokens=False)
    dt = time.perf_counter() - t0
    if r:
        rates.append(nbytes * reps / dt / 1e6)
rates.sort()
print(f"input: {corpus}, {len(lines)} strings, {nbytes / 1e6:.2f} MB x {reps} per run")
print(f"hf-tokenizers-python: load {load:.3f} s; encode {rates[len(rates) // 2]:.2f} MB/s median "
      f"(min {rates[0]:.2f}, max {rates[-1]:.2f})")
print(f"csv,impl=hf-tokenizers-python,input={corpus},mb_per_s={rates[len(rates) // 2]:.2f},load_s={load:.3f}")
