#!/usr/bin/env python3
"""Full-size check on the GPU machine: qwen35 (CUDA) vs HF transformers on a random Qwen3.5-0.8B.

Usage: python3 tools/compare_full.py DIR QWEN35_BINARY [--backend cuda] [--modes decode,prefill]
DIR holds the checkpoint and reference.safetensors written by `tools/make_fixtures.py --full DIR`.
For each mode, runs `qwen35 logits --mode MODE` over prompt + decode.ids[:-1] and compares, at every decode
step i, our logits with HF float32's (decode.logits_f32): relative L2 error must be <= 2x HF bf16's own error
(decode.logits_bf16 vs decode.logits_f32) at that step. Also counts greedy agreement with HF bf16's ids.
Exit 1 if any step is over the bound. The last line is a one-line summary.
"""
import argparse, os, subprocess, sys, tempfile

import numpy as np
import torch
from safetensors.torch import load_file


def rel(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("binary")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--modes", default="decode,prefill")
    ap.add_argument("--extra", default="", help="extra flags for qwen35 logits, e.g. --deterministic")
    a = ap.parse_args()
    ref = load_file(os.path.join(a.dir, "reference.safetensors"))
    prompt = ref["prompt.ids"].tolist()
    toks = ref["decode.ids"].tolist()
    l16 = ref["decode.logits_bf16"].float()
    l32 = ref["decode.logits_f32"].float()
    steps, V = l32.shape
    seq = prompt + toks[:-1]
    P = len(prompt)
    summary, ok = [], True
    for mode in a.modes.split(","):
        out = tempfile.mktemp(suffix=".f32")
        cmd = [a.binary, "logits", "--model", a.dir, "--backend", a.backend, "--mode", mode, "--ctx", "1024",
               "--ids", ",".join(map(str, seq)), "--out", out] + a.extra.split()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{mode}: qwen35 failed: {r.stderr.strip()}")
            summary.append(f"{mode}: FAILED to run")
            ok = False
            continue
        ours = torch.from_numpy(np.fromfile(out, dtype=np.float32).reshape(len(seq), V))[P - 1:]
        os.remove(out)
        worst, n_over, agree, first_flip = 0.0, 0, 0, None
        for i in range(steps):
            e = rel(ours[i], l32[i])
            ehf = rel(l16[i], l32[i])
            worst = max(worst, e / (2 * ehf))
            if e > 2 * ehf:
                n_over += 1
                print(f"  {mode} step {i}: rel L2 {e:.3e} > 2 x HF bf16 {ehf:.3e}")
            am = int(torch.argmax(ours[i]))
            if am == toks[i] and first_flip is None:
                agree += 1
            elif first_flip is None:
                top2 = torch.topk(l16[i], 2).values
                first_flip = (i, am, toks[i], float(top2[0] - top2[1]))
        print(f"{mode}: {steps - n_over}/{steps} steps within 2x HF bf16 error (worst ratio {worst:.2f}); "
              f"greedy ids equal to HF bf16 for the first {agree} steps"
              + (f" (step {first_flip[0]}: ours {first_flip[1]}, HF {first_flip[2]}, HF top-2 margin "
                 f"{first_flip[3]:.3g})" if first_flip else ""))
        ok &= n_over == 0
        summary.append(f"{mode} {steps - n_over}/{steps} ok, worst ratio {worst:.2f}, greedy {agree}/{steps}")
    print("; ".join(summary))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
