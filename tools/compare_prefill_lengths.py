#!/usr/bin/env python3
"""Prefill at several prompt lengths on the GPU machine: qwen35 (CUDA) vs HF transformers, full-size random 0.8B.

Usage: python3 tools/compare_prefill_lengths.py DIR QWEN35_BINARY [--lengths 1,63,64,65,2048,8192] [--seed S]
DIR is a checkpoint written by `tools/make_fixtures.py --full DIR`. For each length T: T random ids (seeded),
one HF forward in bfloat16 and one in float32 (last position's logits only), and one
`qwen35 logits --mode prefill --last` (one prefill of T tokens, in pieces of 2048 when T > 2048). The rule
of issue 5: our last-row error vs HF float32 <= 2x HF bfloat16's own error vs HF float32. Also reports
whether the greedy ids agree. Exit 1 if a length is over the bound or qwen35 fails; the last line is a summary.
"""
import argparse, os, subprocess, sys, tempfile, time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (load_reference, FULL_08B: the checkpoint as make_fixtures wrote it)
from compare_full import rel  # noqa: E402  (relative L2 error)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("binary")
    ap.add_argument("--lengths", default="1,63,64,65,2048,8192")
    ap.add_argument("--seed", type=int, default=77)
    ap.add_argument("--extra", default="", help="extra flags for qwen35 logits")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    s = mf.FULL_08B
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(a.seed)
    prompts = {T: torch.randint(0, s.vocab, (T,), generator=g).tolist() for T in lengths}
    ref_rows, hf_s = {}, {}
    for dtype in (torch.bfloat16, torch.float32):
        model = mf.load_reference(s, a.dir, dtype, dev)
        with torch.no_grad():
            for T in lengths:
                ids = torch.tensor([prompts[T]], dtype=torch.long, device=dev)
                torch.cuda.synchronize()
                t = time.time()
                out = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
                torch.cuda.synchronize()
                hf_s[(T, dtype)] = time.time() - t
                ref_rows[(T, dtype)] = out
        del model
        torch.cuda.empty_cache()
    ok, worst, summary = True, 0.0, []
    for T in lengths:
        out = tempfile.mktemp(suffix=".f32")
        cmd = [a.binary, "logits", "--model", a.dir, "--backend", "cuda", "--mode", "prefill", "--last", "--ctx",
               str(T + 1), "--ids", ",".join(map(str, prompts[T])), "--out", out] + a.extra.split()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"T={T}: qwen35 failed: {r.stderr.strip()}")
            summary.append(f"T={T} FAILED")
            ok = False
            continue
        ours = torch.from_numpy(np.fromfile(out, dtype=np.float32))
        os.remove(out)
        f32, b16 = ref_rows[(T, torch.float32)], ref_rows[(T, torch.bfloat16)]
        if ours.numel() != f32.numel():
            print(f"T={T}: qwen35 wrote {ours.numel()} floats, want {f32.numel()}")
            summary.append(f"T={T} BAD SIZE")
            ok = False
            continue
        e, ehf = rel(ours, f32), rel(b16, f32)
        ratio = e / (2 * ehf)
        worst = max(worst, ratio)
        am, a16, a32 = int(torch.argmax(ours)), int(torch.argmax(b16)), int(torch.argmax(f32))
        print(f"T={T}: ours vs HF fp32 {e:.3e}, HF bf16 vs fp32 {ehf:.3e} (ratio to the 2x bound {ratio:.2f}); "
              f"argmax ours {am}, HF bf16 {a16}, HF fp32 {a32}; HF forward bf16 {hf_s[(T, torch.bfloat16)]:.2f} s")
        if e > 2 * ehf:
            ok = False
        summary.append(f"T={T} {'ok' if e <= 2 * ehf else 'OVER'} {ratio:.2f}")
    print(f"prefill lengths vs HF: {'; '.join(summary)}; worst ratio {worst:.2f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
