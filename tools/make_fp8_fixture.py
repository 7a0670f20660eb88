#!/usr/bin/env python3
"""make_fp8_fixture.py: a tiny random Qwen3.5 checkpoint in the official FP8 format, with golden logits.

Run it on the GPU machine (python3, torch, transformers 5.x with Qwen3.5 and FineGrainedFP8Config, safetensors,
numpy; accelerate and triton for HF's own FP8 path). No network is needed or used:

    python3 tools/make_fp8_fixture.py --out tests/fixtures/qwen35_fp8      # default --out
    python3 tools/make_fp8_fixture.py --writer manual                      # skip HF's quantizer

The format (docs/FP8.md): config.json carries quantization_config {quant_method "fp8", fmt "e4m3",
activation_scheme "dynamic", weight_block_size [128, 128], modules_to_not_convert [...]}; each converted Linear
weight is F8_E4M3 [out, in] beside "<module>.weight_scale_inv" [ceil(out/128), ceil(in/128)] (fp32 from HF's
quantizer; Qwen's own FP8 releases store it bf16), and the dequantized weight is fp8 * scale_inv per block.
Not converted, as in Qwen's FP8 releases: embed_tokens, lm_head, all norms, linear_attn.{conv1d, A_log, dt_bias,
in_proj_a, in_proj_b}.

Writers (--writer auto|hf|manual, default auto = hf, falling back to manual with the reason in the metadata):
  hf      random bf16 checkpoint (make_fixtures.py's randomisation), reloaded with
          from_pretrained(quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128),
          modules_to_not_convert=...)) on the GPU (HF quantizes at load: scale = 448 / amax per block,
          q = e4m3(clamp(w * scale)), weight_scale_inv = 1 / scale) and saved with save_pretrained.
  manual  the same bf16 weights quantized here by the same formula in float32, written with safetensors.
Both are checked before the goldens: every converted weight F8_E4M3 with its scale of the right shape, every other
tensor as in the bf16 file, quantization_config as above.

The model (Qwen3_5ForCausalLM, model.* names): vocab 512, hidden 128, intermediate 256, layer_types
[linear, full, linear, full], attention 2 q / 1 kv heads of head_dim 128, partial_rotary_factor 0.25, DeltaNet
Hk 1, Hv 2, dk = dv = 128, conv K 4, untied lm_head. Every converted matrix has dims that are multiples of 128
(HF's quantize-at-load requires it; the engine's own tests cover ragged shapes).

golden_fp8.safetensors in --out (not golden.safetensors: the bf16 golden tests walk every directory that has one,
and a backend without FP8 support would fail it; tests/test_fp8.c reads this file), for case c (lengths 1, 7, 33,
random ids from --seed):
  case{c}.ids            I32  [n]
  case{c}.logits_f32     F32  [n, V]  HF float32 model on the DEQUANTIZED weights (fp8 * scale_inv in fp32; IEEE
                                      fp32 matmuls), one forward over all ids: the CPU reference's target
  case{c}.logits_hf_fp8  F32  [n, V]  HF's own FP8 path (FP8Linear, activations quantized per token group of 128,
                                      bf16 elsewhere), when it loads (it needs the `kernels` package): the "HF's own
                                      error" of the FP8 rule
  case{c}.logits_hf_dequant_bf16  F32 [n, V]  HF's bf16 model from the FP8 file with FineGrainedFP8Config(
                                      dequantize=True): HF's error with bf16 activations on these weights
__metadata__ (strings): format "qwen35-golden-fp8", version "1", writer, fallback reason, scale dtype, versions,
device, the rel L2 of logits_hf_fp8 against logits_f32 per case, and of a bf16-weight fp32 forward (the weights
before quantization) against logits_f32: how far FP8 moves this random model.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (exits with a clear message when torch / transformers are missing)

torch, transformers = mf.torch, mf.transformers
from safetensors.torch import load_file, save_file  # noqa: E402

FORMAT = "qwen35-golden-fp8"
VERSION = "1"
BLOCK = 128
FP8_MAX = 448.0
CASE_LENGTHS = (1, 7, 33)
LIN, FULL = mf.LIN, mf.FULL

SPEC = mf.Spec(name="qwen35_fp8", family="qwen3_5", layout="text", vocab=512, hidden=128, inter=256,
               layer_types=(LIN, FULL, LIN, FULL), heads=2, kv_heads=1, head_dim=128, rope_theta=1e7,
               rotary_factor=0.25, mrope_section=(6, 5, 5), lin_k_heads=1, lin_v_heads=2, lin_k_dim=128,
               lin_v_dim=128, conv_k=4, tied=False, seed_offset=500)

# Converted: what Qwen's FP8 releases store as F8_E4M3 (module name tails).
CONVERTED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def converted(name):
    """name: a tensor name; True for the weight of a converted Linear."""
    return name.endswith(".weight") and name[: -len(".weight")].endswith(CONVERTED)


def not_converted_modules(s):
    """modules_to_not_convert as Qwen's configs spell it: the head, the embedding and the small DeltaNet
    projections by full module name (norms, conv1d, A_log, dt_bias are not Linear modules)."""
    out = ["lm_head", f"{s.prefix}embed_tokens"]
    for i, lt in enumerate(s.layer_types):
        if lt == LIN:
            out += [f"{s.prefix}layers.{i}.linear_attn.in_proj_a", f"{s.prefix}layers.{i}.linear_attn.in_proj_b"]
    return out


def quant_config_dict(s):
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK],
            "modules_to_not_convert": not_converted_modules(s)}


def quantize_blocks(w):
    """w [rows, cols] float32 -> (q float8_e4m3fn, scale_inv float32 [ceil(rows/128), ceil(cols/128)]): per
    block scale = 448 / amax (HF's formula; an all-zero block gets scale 1), q = e4m3(clamp(w * scale))."""
    rows, cols = w.shape
    nbr, nbc = -(-rows // BLOCK), -(-cols // BLOCK)
    pad = torch.zeros(nbr * BLOCK, nbc * BLOCK, dtype=torch.float32)
    pad[:rows, :cols] = w
    blocks = pad.reshape(nbr, BLOCK, nbc, BLOCK).permute(0, 2, 1, 3)
    amax = blocks.abs().amax(dim=(-1, -2))
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    q = torch.clamp(blocks * scale[..., None, None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.permute(0, 2, 1, 3).reshape(nbr * BLOCK, nbc * BLOCK)[:rows, :cols].contiguous()
    return q, scale.reciprocal().to(torch.float32)


def dequantize_blocks(q, scale_inv):
    rows, cols = q.shape
    s = scale_inv.to(torch.float32).repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.to(torch.float32) * s


def write_bf16(d, seed):
    """The random bf16 checkpoint (make_fixtures.py's rules); returns the fp32 master state dict."""
    model = mf.build_model(SPEC, seed)
    mf.randomize(model, SPEC, seed)
    master = mf.master_state(model)
    mf.save_checkpoint(model, SPEC, d)
    return master


def write_hf(src, dst, dev):
    cfg = transformers.FineGrainedFP8Config(weight_block_size=(BLOCK, BLOCK),
                                            modules_to_not_convert=not_converted_modules(SPEC))
    model = mf.hf_class(mf.model_class_name(SPEC)).from_pretrained(src, dtype=torch.bfloat16, quantization_config=cfg,
                                                                    device_map=str(dev), local_files_only=True)
    model.save_pretrained(dst)
    for f in ("generation_config.json",):
        if not os.path.exists(os.path.join(dst, f)):
            shutil.copy(os.path.join(src, f), dst)


def write_manual(src, dst):
    files, index = mf.checkpoint_files(src)
    if index:
        mf.die("the bf16 checkpoint is sharded; the manual writer expects one model.safetensors")
    out = {}
    for name, t in load_file(files[0]).items():
        if converted(name):
            q, si = quantize_blocks(t.to(torch.float32))
            out[name], out[name + "_scale_inv"] = q, si
        else:
            out[name] = t
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quant_config_dict(SPEC)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)


def check_fp8_dir(d, bf16_dir):
    """The written checkpoint is the official format: returns the scale dtype seen."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if not qc or qc.get("quant_method") != "fp8" or list(qc.get("weight_block_size") or []) != [BLOCK, BLOCK]:
        mf.die(f"{d}/config.json: quantization_config is {qc!r}, expected quant_method fp8, weight_block_size [128, 128]")
    if qc.get("fmt", "e4m3") != "e4m3" or qc.get("activation_scheme", "dynamic") != "dynamic":
        mf.die(f"{d}/config.json: quantization_config {qc!r} is not e4m3 / dynamic")
    files, _ = mf.checkpoint_files(d)
    got = {}
    for fn in files:
        got.update(load_file(fn))
    ref = load_file(mf.checkpoint_files(bf16_dir)[0][0])
    scale_dtypes = set()
    for name, t in ref.items():
        if name not in got:
            mf.die(f"{d}: tensor {name} missing")
        if converted(name):
            q, si = got[name], got.get(name + "_scale_inv")
            want = (-(-t.shape[0] // BLOCK), -(-t.shape[1] // BLOCK))
            if q.dtype != torch.float8_e4m3fn or si is None or tuple(si.shape) != want:
                mf.die(f"{d}: {name} is {q.dtype} with scale {None if si is None else tuple(si.shape)}, expected "
                       f"float8_e4m3fn with a {want} scale")
            scale_dtypes.add(str(si.dtype))
            # e4m3 rounding is at most 2^-4 of the block amax; HF's quantizer computes in the checkpoint's bf16
            # (scale and w * scale rounded to bf16 first), which adds a little: measured 0.067 of the amax
            err = (dequantize_blocks(q, si) - t.float()).abs().max() / t.float().abs().max()
            if err > 2 ** -3:
                mf.die(f"{d}: {name} dequantizes {err:.3g} (relative to its amax) away from the bf16 weight")
        elif got[name].dtype != t.dtype or not torch.equal(got[name], t):
            mf.die(f"{d}: {name} ({got[name].dtype}) differs from the bf16 checkpoint; only the converted Linear "
                   "weights may change")
    extra = sorted(set(got) - set(ref) - {n + "_scale_inv" for n in ref if converted(n)})
    if extra:
        mf.die(f"{d}: unexpected tensors {extra[:5]}")
    return ",".join(sorted(scale_dtypes))


def dequantized_state(d):
    files, _ = mf.checkpoint_files(d)
    raw = {}
    for fn in files:
        raw.update(load_file(fn))
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        out[name] = dequantize_blocks(t, raw[name + "_scale_inv"]) if t.dtype == torch.float8_e4m3fn else t.float()
    return out


@torch.no_grad()
def fp32_logits(state, dev, seed, cases):
    model = mf.build_model(SPEC, seed).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        mf.die(f"fp32 reference: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model = model.to(dev).eval()
    return [model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu() for ids in cases]


def rel_l2(a, ref):
    return float((a - ref).norm() / ref.norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/qwen35_fp8")
    ap.add_argument("--writer", choices=("auto", "hf", "manual"), default="auto")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    mf.check_versions()
    dev = mf.pick_device(a.device)
    fp32_state = mf.set_fp32_ieee()
    seed = a.seed + SPEC.seed_offset
    tmp = tempfile.mkdtemp(prefix="qwen35_fp8_")
    try:
        bf16_dir = os.path.join(tmp, "bf16")
        master = write_bf16(bf16_dir, seed)
        if os.path.exists(a.out):
            shutil.rmtree(a.out)
        writer, reason = a.writer, ""
        if writer in ("auto", "hf"):
            try:
                write_hf(bf16_dir, a.out, dev)
                check_fp8_dir(a.out, bf16_dir)
                writer = "hf"
            except (Exception, SystemExit) as exc:  # noqa: BLE001  (auto: any failure falls back, and says why)
                if a.writer == "hf":
                    raise
                reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
                print(f"HF FP8 writer failed ({reason}); writing the format by hand", flush=True)
                shutil.rmtree(a.out, ignore_errors=True)
                writer = "manual"
        if writer == "manual":
            write_manual(bf16_dir, a.out)
        scale_dtype = check_fp8_dir(a.out, bf16_dir)
        print(f"{a.out}: written by the {writer} writer, scales {scale_dtype}", flush=True)

        g = torch.Generator().manual_seed(seed + 1)
        cases = [torch.randint(0, SPEC.vocab, (n,), generator=g).tolist() for n in CASE_LENGTHS]
        ref = fp32_logits(dequantized_state(a.out), dev, seed, cases)
        pre = fp32_logits(master, dev, seed, cases)
        golden, meta = {}, {"format": FORMAT, "version": VERSION, "writer": writer, "hf_writer_failure": reason,
                            "scale_dtype": scale_dtype, "device": mf.device_desc(dev), "seed": str(a.seed),
                            "quantization_config": json.dumps(quant_config_dict(SPEC)), "fp32": json.dumps(fp32_state)}
        meta.update({f"version.{k}": v for k, v in mf.versions().items()})
        for c, ids in enumerate(cases):
            golden[f"case{c}.ids"] = torch.tensor(ids, dtype=torch.int32)
            golden[f"case{c}.logits_f32"] = ref[c].contiguous()
            meta[f"case{c}.bf16_weights_vs_fp8_rel_l2"] = f"{rel_l2(pre[c], ref[c]):.4e}"
        try:
            model = mf.hf_class(mf.model_class_name(SPEC)).from_pretrained(a.out, dtype=torch.bfloat16,
                                                                            device_map=str(dev), local_files_only=True)
            with torch.no_grad():
                for c, ids in enumerate(cases):
                    hl = model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu()
                    golden[f"case{c}.logits_hf_fp8"] = hl.contiguous()
                    meta[f"case{c}.hf_fp8_vs_f32_rel_l2"] = f"{rel_l2(hl, ref[c]):.4e}"
            meta["hf_fp8_path"] = type(model.model.layers[0].mlp.gate_proj).__name__
        except Exception as exc:  # noqa: BLE001  (the f32 golden does not depend on it)
            meta["hf_fp8_path"] = f"unavailable: {type(exc).__name__}: {exc}"[:400]
            print(f"HF's FP8 forward failed: {meta['hf_fp8_path']}", flush=True)
        try:  # HF's own load of the FP8 file dequantized to bf16 (FineGrainedFP8Config(dequantize=True))
            qc = transformers.FineGrainedFP8Config(weight_block_size=(BLOCK, BLOCK), dequantize=True)
            model = mf.hf_class(mf.model_class_name(SPEC)).from_pretrained(
                a.out, dtype=torch.bfloat16, quantization_config=qc, device_map=str(dev), local_files_only=True)
            with torch.no_grad():
                for c, ids in enumerate(cases):
                    hl = model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu()
                    golden[f"case{c}.logits_hf_dequant_bf16"] = hl.contiguous()
                    meta[f"case{c}.hf_dequant_bf16_vs_f32_rel_l2"] = f"{rel_l2(hl, ref[c]):.4e}"
        except Exception as exc:  # noqa: BLE001
            meta["hf_dequant_bf16"] = f"unavailable: {type(exc).__name__}: {exc}"[:400]
            print(f"HF's dequantized bf16 forward failed: {meta['hf_dequant_bf16']}", flush=True)
        save_file(golden, os.path.join(a.out, "golden_fp8.safetensors"), metadata=meta)
        for k in sorted(meta):
            if "rel_l2" in k or k in ("writer", "scale_dtype", "hf_fp8_path", "hf_writer_failure", "hf_dequant_bf16"):
                print(f"  {k}: {meta[k]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
