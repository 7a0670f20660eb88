#!/usr/bin/env python3
"""HF transformers reference timings on the GPU machine, for the comparison table of `qwen35 bench`.

Usage (on the GPU machine): python3 tools/hf_bench.py MODEL_DIR [--ctx 128] [--steps 32] [--prefill 2048] [--out F.json]

Loads MODEL_DIR in bfloat16 (eager attention: the reference path, ~2,000 launches per step), then measures
- decode ms/token at context --ctx (prefill ctx tokens, then --steps single-token steps with the cache, median),
- prefill time of --prefill tokens (logits for the last position only),
- the card's ceilings in the same run: device-to-device copy GB/s (bytes read + written) and bf16 GEMM TFLOP/s.
Prints one JSON object (and writes it to --out).
"""
import argparse, json, statistics, time

import torch


def ceilings():
    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); b.copy_(a); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    copy_gbs = 2 * n / statistics.median(ts) / 1e9
    del a, b
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); x @ y; e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    return copy_gbs, 2 * m**3 / statistics.median(ts) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--out")
    a = ap.parse_args()
    import transformers
    from transformers import AutoModelForCausalLM

    copy_gbs, gemm_tflops = ceilings()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    V = model.config.vocab_size if hasattr(model.config, "vocab_size") else model.config.text_config.vocab_size
    g = torch.Generator().manual_seed(0)
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "copy_GBs": copy_gbs,
           "gemm_bf16_TFLOPs": gemm_tflops}
    with torch.no_grad():
        ids = torch.randint(0, min(V, 200000), (1, a.ctx), generator=g).cuda()
        out = model(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        ts = []
        for _ in range(a.steps):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
        res["hf_eager_decode_ms"] = 1e3 * statistics.median(ts[2:] if len(ts) > 4 else ts)
        res["decode_ctx"] = a.ctx
        ids = torch.randint(0, min(V, 200000), (1, a.prefill), generator=g).cuda()
        model(ids[:, :64], use_cache=False, logits_to_keep=1)
        ts = []
        for _ in range(3):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            model(ids, use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
        res["hf_eager_prefill_ms"] = 1e3 * statistics.median(ts)
        res["prefill_tokens"] = a.prefill
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
