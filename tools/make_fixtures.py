#!/usr/bin/env python3
"""make_fixtures.py: golden fixtures for qwen35 from the Hugging Face transformers reference.

Run it on the GPU machine (python3, torch, transformers 5.x with Qwen3.5 (written against 5.17), safetensors,
numpy; no network is needed or used):

    python3 tools/make_fixtures.py --quick                 # environment smoke test, writes nothing to the repo
    python3 tools/make_fixtures.py --out tests/fixtures    # the four tiny fixtures (default --out)
    python3 tools/make_fixtures.py --full DIR --steps 64   # full-size random Qwen3.5-0.8B + reference (1.5 GB)

Other flags: --only NAME[,NAME] (subset of fixtures), --seed N (default 1234), --device cuda|cpu (default cuda
when available), --hidden (also store per-layer residual streams), --allow-kernels (accept fla/causal_conv1d),
--full-f32-gdn (full mode: store A_log and linear_attn.norm.weight as F32, like the official file).

Tiny fixtures (vocab 512, hidden 64, intermediate 128, 4 layers, head_dim 32), one directory each under --out:
  qwen35_text   Qwen3_5ForCausalLM (model_type qwen3_5_text, flat config), tied embeddings, attention 4q/2kv heads,
                partial_rotary_factor 0.25, DeltaNet Hk = Hv = 4, dk = dv = 16, conv K 4,
                layer_types [linear, linear, full, linear].
  qwen35_vl     Qwen3_5ForConditionalGeneration (config with text_config + a tiny vision_config): tensors
                model.language_model.* and model.visual.*, plus fake mtp.* tensors the loader must skip;
                A_log and linear_attn.norm.weight stored F32 like the official checkpoint; layer_types
                [linear, linear, linear, full]; special token ids are V-4..V-1 and case ids avoid them.
  qwen35_gqa    Hk 2, Hv 4 (Hv = 2*Hk), dk 16, dv 24, attention 4q/1kv heads, partial_rotary_factor 0.5,
                UNTIED lm_head.weight, sharded save (model-0000k-of-0000n.safetensors + model.safetensors.index.json),
                layer_types [linear, full, linear, full].
  qwen3_dense   Qwen3ForCausalLM, 4 full-attention layers, 4q/2kv heads, tied, rope_theta 1e6.

Each directory holds the save_pretrained output (config.json, model.safetensors or shards + index,
generation_config.json without eos) and golden.safetensors with, for case c in 0..3 (lengths 1, 7, 65, 100,
random ids from a fixed seed):
  case{c}.ids              I32  [n]
  case{c}.logits_f32       F32  [n, V]   float32 model, one forward over all ids, logits at every position
  case{c}.logits_bf16      BF16 [n, V]   the same weights in bfloat16 (the HF bf16 logits as returned)
  case{c}.greedy_f32       I32  [G=8]    greedy continuation: argmax (lowest index on ties) of the prefill's last
  case{c}.greedy_bf16      I32  [G]      row, then one token per call with the returned cache; eos never stops it
  case{c}.step_logits_f32  F32  [G, V]   row g = the logits whose argmax is greedy[g] (row 0 = logits[n-1])
  case{c}.step_logits_bf16 BF16 [G, V]
  case{c}.hidden_f32/bf16  F32/BF16 [L, n, D]  only with --hidden: each decoder layer's output (residual stream)
__metadata__ (all strings): format "qwen35-golden", version "1", versions, device, dtype info, attn_implementation
"sdpa", the DeltaNet/conv code path and whether fla / causal_conv1d were importable, the seed, the fixture config,
and self-checks per case: an independent fp32 forward written from MODEL.md vs HF fp32 (spec_vs_hf_f32_rel_err),
HF bf16 vs f32, HF's cached prefill/decode vs one no-cache forward over the same tokens, two identical runs
(determinism), generate() vs the manual loop, greedy top-2 margins and ties. Relative errors are
max|a-b| / max|reference|.

Weights: every parameter is randomised (HF's init leaves norms, A_log and dt_bias trivial): linear weights
N(0,1)/sqrt(in), embeddings N(0,1), zero-centred norms (Qwen3.5 layer/final/q/k norms) N(0,0.2), plain-weight norms
(linear_attn.norm, all Qwen3 norms) 1+N(0,0.2), A_log = log U(1,16), dt_bias N(0,1), conv1d N(0,1)/sqrt(K), vision
tower generic. Then every value is rounded to bf16, so the float32 and bfloat16 runs use identical weights. Goldens
come from models reloaded with from_pretrained (exactly what the files say), checked bit-for-bit against the
weights that were written.

Full mode (--full DIR): a full-size random Qwen3.5-0.8B text model (Qwen3_5ForCausalLM, MODEL.md config), saved to
DIR in bf16, and DIR/reference.safetensors with:
  prompt.ids          I32  [16]       random ids
  decode.ids          I32  [steps]    HF bf16 greedy continuation (manual loop with past_key_values, eos disabled)
  decode.logits_bf16  BF16 [steps, V] row i = the logits that produced decode.ids[i] (row 0 = prefill last position)
  prefill.logits_f32  F32  [V]        the float32 model (same weights) at the last prompt position
  decode.logits_f32   F32  [steps, V] the float32 model over prompt + decode.ids[:-1]: row i at the position of row i above
"""

import argparse
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

# Before transformers is imported: never reach the network, never swap in kernels from the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

try:
    import numpy
    import safetensors
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as exc:  # the dev machine has none of these; the GPU machine must
    sys.exit(f"FATAL: {exc}. make_fixtures.py needs torch, transformers (>= 5, with Qwen3.5), safetensors, numpy.")

ATTN = "sdpa"
FORMAT = "qwen35-golden"
VERSION = "1"
CASE_LENGTHS = (1, 7, 65, 100)
GREEDY_STEPS = 8
LIN, FULL = "linear_attention", "full_attention"


def die(msg):
    print(f"\nFATAL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def warn(msg):
    print(f"WARNING: {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Spec:
    name: str
    family: str                 # "qwen3_5" (hybrid, zero-centred norms) or "qwen3" (dense, plain norms)
    layout: str                 # "text" (*ForCausalLM, prefix model.) or "vl" (ForConditionalGeneration)
    vocab: int
    hidden: int
    inter: int
    layer_types: tuple
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rotary_factor: float = 1.0
    mrope_section: tuple = ()
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_k: int = 4
    tied: bool = True
    max_pos: int = 4096
    shards: int = 1             # > 1: save with a max_shard_size that gives about this many shards
    f32_gdn: bool = False       # store A_log and linear_attn.norm.weight as F32
    fake_mtp: bool = False      # add mtp.* tensors to the file
    seed_offset: int = 0

    @property
    def hybrid(self):
        return self.family == "qwen3_5"

    @property
    def prefix(self):
        return "model.language_model." if self.layout == "vl" else "model."

    @property
    def id_limit(self):  # VL: the last 4 ids are the image/video/vision special tokens
        return self.vocab - 4 if self.layout == "vl" else self.vocab


def _tiny(**kw):
    base = dict(vocab=512, hidden=64, inter=128, heads=4, kv_heads=2, head_dim=32)
    base.update(kw)
    return Spec(**base)


FIXTURES = [
    _tiny(name="qwen35_text", family="qwen3_5", layout="text", layer_types=(LIN, LIN, FULL, LIN), rope_theta=1e7,
          rotary_factor=0.25, mrope_section=(2, 1, 1), lin_k_heads=4, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16,
          seed_offset=0),
    _tiny(name="qwen35_vl", family="qwen3_5", layout="vl", layer_types=(LIN, LIN, LIN, FULL), rope_theta=1e7,
          rotary_factor=0.25, mrope_section=(2, 1, 1), lin_k_heads=4, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16,
          f32_gdn=True, fake_mtp=True, seed_offset=100),
    _tiny(name="qwen35_gqa", family="qwen3_5", layout="text", layer_types=(LIN, FULL, LIN, FULL), kv_heads=1,
          rope_theta=1e7, rotary_factor=0.5, mrope_section=(3, 3, 2), lin_k_heads=2, lin_v_heads=4, lin_k_dim=16,
          lin_v_dim=24, tied=False, shards=3, seed_offset=200),
    _tiny(name="qwen3_dense", family="qwen3", layout="text", layer_types=(FULL, FULL, FULL, FULL), rope_theta=1e6,
          seed_offset=300),
]

FULL_08B = Spec(name="qwen35_0.8b_random", family="qwen3_5", layout="text", vocab=248320, hidden=1024, inter=3584,
                layer_types=(LIN, LIN, LIN, FULL) * 6, heads=8, kv_heads=2, head_dim=256, rope_theta=1e7,
                rotary_factor=0.25, mrope_section=(11, 11, 10), lin_k_heads=16, lin_v_heads=16, lin_k_dim=128,
                lin_v_dim=128, conv_k=4, tied=True, max_pos=262144, seed_offset=1000)

TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)


# ----------------------------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------------------------

def hf_class(name):
    cls = getattr(transformers, name, None)
    if cls is None:
        die(f"transformers {transformers.__version__} has no {name}; need transformers >= 5 with Qwen3.5 support")
    return cls


def versions():
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": safetensors.__version__,
            "numpy": numpy.__version__, "torch_cuda": str(torch.version.cuda)}


def check_versions():
    v = versions()
    print("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()), flush=True)
    major_minor = transformers.__version__.split(".")[:2]
    try:
        major, minor = int(major_minor[0]), int(major_minor[1])
    except ValueError:
        major, minor = 0, 0
    if major < 5:
        die(f"transformers {transformers.__version__} is too old: this script uses the 5.x API (dtype=, "
            "rope_parameters, Qwen3_5*)")
    if (major, minor) != (5, 17):
        warn(f"written against transformers 5.17, running {transformers.__version__}: the self-checks below decide")
    return v


def _importable(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def deltanet_code_path():
    """Which implementation each DeltaNet/conv entry point of modeling_qwen3_5 resolved to.

    transformers wraps the torch functions with use_kernel_func_from_hub_with_fallback: the wrapper's closure holds
    is_new_implementation (True when it bound fla / causal_conv1d instead of the torch function)."""
    out = {}
    try:
        import transformers.models.qwen3_5.modeling_qwen3_5 as mq
    except Exception as exc:  # noqa: BLE001 - report any import failure
        return {"path.error": f"cannot import modeling_qwen3_5: {exc}"}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        fn = getattr(mq, name, None)
        if fn is None:
            out[f"path.{name}"] = "absent"
            continue
        try:
            nl = inspect.getclosurevars(fn).nonlocals
        except (TypeError, ValueError):
            nl = {}
        if "is_new_implementation" in nl:
            out[f"path.{name}"] = "external" if nl["is_new_implementation"] else "torch"
        else:
            out[f"path.{name}"] = "torch (no fallback wrapper)" if fn.__module__ == mq.__name__ else fn.__module__
    for flag in ("is_fast_path_available",):  # older 5.x releases kept a module flag
        if hasattr(mq, flag):
            out[f"path.{flag}"] = str(getattr(mq, flag))
    return out


def probe_env(allow_kernels):
    env = {f"{m}_importable": str(_importable(m)) for m in ("fla", "causal_conv1d", "kernels", "flash_attn")}
    env["USE_HUB_KERNELS"] = os.environ.get("USE_HUB_KERNELS", "")
    env.update(deltanet_code_path())
    for k, v in env.items():
        print(f"  {k}: {v}")
    if "path.error" in env:
        die(env["path.error"])
    bad = [k for k in ("fla_importable", "causal_conv1d_importable") if env[k] == "True"]
    bad += [k for k, v in env.items() if k.startswith("path.") and v not in ("torch", "torch (no fallback wrapper)",
                                                                              "absent", "False")]
    if bad and not allow_kernels:
        die(f"external DeltaNet/conv kernels would be used ({', '.join(bad)}); the goldens must come from the "
            "pure-torch path (MODEL.md 4.2). Uninstall them, or pass --allow-kernels and record it.")
    return env


def set_fp32_ieee():
    """Full fp32 for the float32 reference: no TF32 in matmul, conv or attention."""
    st = {}
    if hasattr(torch.backends, "fp32_precision"):
        targets = [("backends", torch.backends), ("cuda.matmul", torch.backends.cuda.matmul),
                   ("cudnn", torch.backends.cudnn), ("cudnn.conv", getattr(torch.backends.cudnn, "conv", None)),
                   ("cuda.math_sdp", getattr(torch.backends.cuda, "math_sdp", None))]
        for label, obj in targets:
            if obj is None or not hasattr(obj, "fp32_precision"):
                continue
            try:
                obj.fp32_precision = "ieee"
                st[f"fp32_precision.{label}"] = str(obj.fp32_precision)
            except Exception as exc:  # noqa: BLE001
                st[f"fp32_precision.{label}"] = f"error: {exc}"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        st["allow_tf32"] = "False (matmul, cudnn)"
    st["bf16_reduced_precision_reduction"] = str(
        getattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", "n/a"))
    return st


def pick_device(arg):
    if arg:
        return torch.device(arg)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_desc(dev):
    if dev.type == "cuda":
        return f"{dev} {torch.cuda.get_device_name(dev)}"
    return str(dev)


# ----------------------------------------------------------------------------------------------------------------
# Config and model construction
# ----------------------------------------------------------------------------------------------------------------

def model_class_name(s):
    if s.family == "qwen3":
        return "Qwen3ForCausalLM"
    return "Qwen3_5ForConditionalGeneration" if s.layout == "vl" else "Qwen3_5ForCausalLM"


def rope_parameters(s):
    rp = {"rope_type": "default", "rope_theta": float(s.rope_theta)}
    if s.hybrid:
        rp.update(partial_rotary_factor=float(s.rotary_factor), mrope_section=list(s.mrope_section),
                  mrope_interleaved=True)
    return rp


def text_config_kwargs(s):
    kw = dict(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.inter,
              num_hidden_layers=len(s.layer_types), num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
              head_dim=s.head_dim, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=s.max_pos,
              attention_bias=False, tie_word_embeddings=s.tied, rope_parameters=rope_parameters(s),
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if s.hybrid:
        # partial_rotary_factor also as a plain kwarg: Qwen3_5TextConfig.__post_init__ otherwise injects its own
        # default (0.25) as a stray top-level attribute that config.json would carry next to rope_parameters.
        kw.update(layer_types=list(s.layer_types), partial_rotary_factor=float(s.rotary_factor),
                  linear_num_key_heads=s.lin_k_heads,
                  linear_num_value_heads=s.lin_v_heads, linear_key_head_dim=s.lin_k_dim,
                  linear_value_head_dim=s.lin_v_dim, linear_conv_kernel_dim=s.conv_k)
    return kw


def make_config(s):
    if s.family == "qwen3":
        return hf_class("Qwen3Config")(**text_config_kwargs(s), attn_implementation=ATTN)
    if s.layout == "text":
        return hf_class("Qwen3_5TextConfig")(**text_config_kwargs(s), attn_implementation=ATTN)
    v = s.vocab
    vision = dict(TINY_VISION, out_hidden_size=s.hidden)
    return hf_class("Qwen3_5Config")(text_config=text_config_kwargs(s), vision_config=vision,
                                     vision_start_token_id=v - 4, vision_end_token_id=v - 3,
                                     image_token_id=v - 2, video_token_id=v - 1,
                                     tie_word_embeddings=s.tied, attn_implementation=ATTN)


def text_config_of(cfg):
    return cfg.text_config if hasattr(cfg, "text_config") and cfg.text_config is not None else cfg


def check_config(cfg, s):
    """The config object must say what the spec says; catches renamed or ignored arguments."""
    t = text_config_of(cfg)
    want = dict(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.inter,
                num_hidden_layers=len(s.layer_types), num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                head_dim=s.head_dim, tie_word_embeddings=s.tied)
    if s.hybrid:
        want.update(linear_num_key_heads=s.lin_k_heads, linear_num_value_heads=s.lin_v_heads,
                    linear_key_head_dim=s.lin_k_dim, linear_value_head_dim=s.lin_v_dim,
                    linear_conv_kernel_dim=s.conv_k)
    bad = [f"{k}={getattr(t, k, '<missing>')!r} (want {v!r})" for k, v in want.items() if getattr(t, k, None) != v]
    if s.hybrid and list(getattr(t, "layer_types", []) or []) != list(s.layer_types):
        bad.append(f"layer_types={getattr(t, 'layer_types', None)!r}")
    rp = getattr(t, "rope_parameters", None) or {}
    if float(rp.get("rope_theta", -1)) != float(s.rope_theta):
        bad.append(f"rope_parameters={rp!r} (rope_theta)")
    if s.hybrid and float(rp.get("partial_rotary_factor", -1)) != float(s.rotary_factor):
        bad.append(f"rope_parameters={rp!r} (partial_rotary_factor)")
    top = getattr(t, "partial_rotary_factor", None)
    if s.hybrid and top is not None and float(top) != float(s.rotary_factor):
        bad.append(f"top-level partial_rotary_factor={top!r}")
    if s.layout == "vl" and getattr(cfg, "tie_word_embeddings", None) != s.tied:
        bad.append(f"top-level tie_word_embeddings={getattr(cfg, 'tie_word_embeddings', None)!r}")
    if bad:
        die(f"{s.name}: the transformers config does not hold the requested values: " + "; ".join(bad))


def text_backbone(model):
    """The decoder stack (has .layers, .rotary_emb, .config)."""
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def check_attn(model, s):
    impl = getattr(text_backbone(model).config, "_attn_implementation", None)
    if impl != ATTN:
        die(f"{s.name}: attention implementation is {impl!r}, not {ATTN!r}")


def build_model(s, seed):
    torch.manual_seed(seed)
    cfg = make_config(s)
    check_config(cfg, s)
    model = hf_class(model_class_name(s))(cfg).eval()
    check_attn(model, s)
    return model


# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------

LINEAR_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv",
                  "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "lm_head"}


def param_rule(name, shape, s):
    """(kind, std, mean) for one parameter; kind is "normal" or "alog" (log U(1,16))."""
    if name.startswith("model.visual."):  # not computed by the engine: any well-scaled values
        if len(shape) >= 2:
            return "normal", 1.0 / math.sqrt(math.prod(shape[1:])), 0.0
        return ("normal", 0.02, 0.0) if name.endswith("bias") else ("normal", 0.2, 1.0)
    if name.endswith("embed_tokens.weight"):
        return "normal", 1.0, 0.0
    if name.endswith("linear_attn.A_log"):
        return "alog", 0.0, 0.0
    if name.endswith("linear_attn.dt_bias"):
        return "normal", 1.0, 0.0
    if name.endswith("linear_attn.conv1d.weight"):
        return "normal", 1.0 / math.sqrt(shape[-1]), 0.0
    if name.endswith("linear_attn.norm.weight"):  # gated norm: plain weight
        return "normal", 0.2, 1.0
    if name.endswith("norm.weight"):  # layer norms, final norm, q_norm, k_norm
        return ("normal", 0.2, 0.0) if s.hybrid else ("normal", 0.2, 1.0)
    parts = name.split(".")
    if len(shape) == 2 and parts[-1] == "weight" and len(parts) >= 2 and parts[-2] in LINEAR_MODULES:
        return "normal", 1.0 / math.sqrt(shape[1]), 0.0
    die(f"{s.name}: no randomisation rule for parameter {name} {tuple(shape)}; the model has a parameter this "
        "script does not know (transformers changed?)")
    return None


@torch.no_grad()
def randomize(model, s, seed):
    g = torch.Generator().manual_seed(seed)
    n = 0
    for name, p in model.named_parameters():  # tied parameters appear once
        kind, std, mean = param_rule(name, tuple(p.shape), s)
        if kind == "alog":
            v = torch.log(1.0 + 15.0 * torch.rand(tuple(p.shape), generator=g))
        else:
            v = torch.randn(tuple(p.shape), generator=g) * std + mean
        p.copy_(v.to(torch.bfloat16).to(p.dtype))  # bf16-representable: fp32 and bf16 runs share the weights
        n += p.numel()
    tied_now = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if tied_now != s.tied:
        die(f"{s.name}: lm_head tied={tied_now}, spec says {s.tied}")
    return n


def master_state(model):
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.state_dict().items()}


def gdn_f32_names(s):
    if not s.f32_gdn:
        return set()
    out = set()
    for i, lt in enumerate(s.layer_types):
        if lt == LIN:
            out |= {f"{s.prefix}layers.{i}.linear_attn.A_log", f"{s.prefix}layers.{i}.linear_attn.norm.weight"}
    return out


def fake_mtp_tensors(s, seed):
    g = torch.Generator().manual_seed(seed + 77)
    d, f = s.hidden, s.inter
    shapes = {"mtp.fc.weight": (d, 2 * d), "mtp.norm.weight": (d,), "mtp.pre_fc_norm_embedding.weight": (d,),
              "mtp.pre_fc_norm_hidden.weight": (d,), "mtp.layers.0.input_layernorm.weight": (d,),
              "mtp.layers.0.post_attention_layernorm.weight": (d,),
              "mtp.layers.0.self_attn.q_proj.weight": (2 * s.heads * s.head_dim, d),
              "mtp.layers.0.mlp.down_proj.weight": (d, f)}
    return {k: (torch.randn(v, generator=g) * 0.1).to(torch.bfloat16) for k, v in shapes.items()}


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint files
# ----------------------------------------------------------------------------------------------------------------

def read_header(path):
    """The safetensors header as the engine reads it: u64 LE length, then JSON."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            die(f"{path}: shorter than a safetensors header")
        n = struct.unpack("<Q", raw)[0]
        if n > 100_000_000:
            die(f"{path}: header length {n} is absurd")
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", {}) or {}
    return hdr, meta


def checkpoint_files(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f).get("weight_map")
        if not wm:
            die(f"{index}: no weight_map")
        return [os.path.join(d, fn) for fn in sorted(set(wm.values()))], index
    single = os.path.join(d, "model.safetensors")
    if not os.path.exists(single):
        die(f"{d}: neither model.safetensors nor model.safetensors.index.json was written; files: {os.listdir(d)}")
    return [single], None


def save_checkpoint(model, s, d):
    """Cast the model to bf16 IN PLACE and save_pretrained it; make sure config.json and generation_config.json
    exist. The caller keeps the fp32 values in its master state dict and drops the model afterwards."""
    m16 = model.to(torch.bfloat16)
    m16.generation_config = transformers.GenerationConfig(do_sample=False)  # no eos: nothing stops greedy early
    kw = {}
    if s.shards > 1:
        total = sum(p.numel() * 2 for p in {id(p): p for p in m16.parameters()}.values())
        kw["max_shard_size"] = max(1, total // s.shards)
    m16.save_pretrained(d, **kw)
    if not os.path.exists(os.path.join(d, "config.json")):
        warn(f"{s.name}: save_pretrained wrote no config.json; writing it from the config")
        m16.config.save_pretrained(d)
    if not os.path.exists(os.path.join(d, "generation_config.json")):
        m16.generation_config.save_pretrained(d)


def fix_checkpoint(d, s, seed):
    """Rewrite the files where needed: every tensor BF16 except the F32 ones the spec asks for; add fake mtp.*."""
    want_f32 = gdn_f32_names(s)
    files, index = checkpoint_files(d)
    changed = []
    mtp_names = []
    for k, path in enumerate(files):
        hdr, meta = read_header(path)
        wrong = [n for n, info in hdr.items() if info["dtype"] != ("F32" if n in want_f32 else "BF16")]
        add_mtp = s.fake_mtp and k == len(files) - 1
        if not wrong and not add_mtp:
            continue
        tensors = load_file(path)
        for n in wrong:
            tensors[n] = tensors[n].to(torch.float32 if n in want_f32 else torch.bfloat16).contiguous()
        if add_mtp:
            extra = fake_mtp_tensors(s, seed)
            tensors.update(extra)
            mtp_names = sorted(extra)
        meta = dict(meta)
        meta["format"] = "pt"
        save_file(tensors, path, metadata=meta)
        changed.append(f"{os.path.basename(path)}: {len(wrong)} dtype fixes" + (", mtp added" if add_mtp else ""))
    if index and changed:
        with open(index) as f:
            idx = json.load(f)
        for n in mtp_names:
            idx["weight_map"][n] = os.path.basename(files[-1])
        total = 0
        for path in files:
            hdr, _ = read_header(path)
            total += sum(i["data_offsets"][1] - i["data_offsets"][0] for i in hdr.values())
        idx.setdefault("metadata", {})["total_size"] = total
        with open(index, "w") as f:
            json.dump(idx, f, indent=2, sort_keys=True)
            f.write("\n")
    for c in changed:
        print(f"  rewrote {c}")
    return mtp_names


def expected_text_tensors(s):
    """name -> (shape, dtype) of the text decoder, from MODEL.md section 2 (independent of the HF model object)."""
    p, d, f, v, hd = s.prefix, s.hidden, s.inter, s.vocab, s.head_dim
    f32 = gdn_f32_names(s)
    e = {}

    def add(name, shape):
        e[name] = (list(shape), "F32" if name in f32 else "BF16")

    add(p + "embed_tokens.weight", (v, d))
    add(p + "norm.weight", (d,))
    if not s.tied:
        add("lm_head.weight", (v, d))
    for i, lt in enumerate(s.layer_types):
        lp = f"{p}layers.{i}."
        add(lp + "input_layernorm.weight", (d,))
        add(lp + "post_attention_layernorm.weight", (d,))
        add(lp + "mlp.gate_proj.weight", (f, d))
        add(lp + "mlp.up_proj.weight", (f, d))
        add(lp + "mlp.down_proj.weight", (d, f))
        if lt == FULL:
            add(lp + "self_attn.q_proj.weight", ((2 if s.hybrid else 1) * s.heads * hd, d))
            add(lp + "self_attn.k_proj.weight", (s.kv_heads * hd, d))
            add(lp + "self_attn.v_proj.weight", (s.kv_heads * hd, d))
            add(lp + "self_attn.o_proj.weight", (d, s.heads * hd))
            add(lp + "self_attn.q_norm.weight", (hd,))
            add(lp + "self_attn.k_norm.weight", (hd,))
        else:
            kd, vd, hv = s.lin_k_heads * s.lin_k_dim, s.lin_v_heads * s.lin_v_dim, s.lin_v_heads
            a = lp + "linear_attn."
            add(a + "in_proj_qkv.weight", (2 * kd + vd, d))
            add(a + "in_proj_z.weight", (vd, d))
            add(a + "in_proj_b.weight", (hv, d))
            add(a + "in_proj_a.weight", (hv, d))
            add(a + "conv1d.weight", (2 * kd + vd, 1, s.conv_k))
            add(a + "dt_bias", (hv,))
            add(a + "A_log", (hv,))
            add(a + "norm.weight", (s.lin_v_dim,))
            add(a + "out_proj.weight", (d, vd))
    return e


def check_checkpoint(d, s, master, mtp_names, check_values=True):
    """Every expected tensor present with the MODEL.md shape and the intended dtype; nothing unexplained; values
    equal to the randomised weights."""
    files, index = checkpoint_files(d)
    if s.shards > 1 and (index is None or len(files) < 2):
        die(f"{s.name}: expected a sharded save (2+ files and an index), got {[os.path.basename(x) for x in files]}")
    found = {}
    for path in files:
        hdr, meta = read_header(path)
        if meta.get("format") != "pt":
            warn(f"{path}: __metadata__ format is {meta.get('format')!r}, not 'pt'")
        for n, info in hdr.items():
            if n in found:
                die(f"{s.name}: tensor {n} appears in two files")
            found[n] = (info["shape"], info["dtype"], path)
    exp = expected_text_tensors(s)
    problems = []
    for n, (shape, dt) in exp.items():
        if n not in found:
            problems.append(f"missing {n}")
        elif found[n][0] != shape or found[n][1] != dt:
            problems.append(f"{n}: file has {found[n][1]} {found[n][0]}, expected {dt} {shape}")
    visual_master = {k for k in master if k.startswith("model.visual.")}
    visual_file = {n for n in found if n.startswith("model.visual.")}
    if visual_file != visual_master:
        problems.append(f"model.visual.* in file ({len(visual_file)}) differ from the model ({len(visual_master)})")
    if s.layout == "vl" and not visual_file:
        problems.append("no model.visual.* tensors in the VL checkpoint")
    for n in mtp_names:
        if n not in found:
            problems.append(f"fake {n} missing")
    lm_head_in_file = "lm_head.weight" in found
    for n in found:
        if n in exp or n in visual_file or n in mtp_names or (n == "lm_head.weight" and s.tied):
            continue
        problems.append(f"unexpected tensor {n} {found[n][1]} {found[n][0]}")
    if problems:
        die(f"{s.name}: checkpoint check failed:\n  " + "\n  ".join(problems))
    if check_values:
        for path in files:
            for n, t in load_file(path).items():
                if n in mtp_names:
                    continue
                if n not in master:
                    die(f"{s.name}: {n} is in the file but not in the model state dict")
                if not torch.equal(t.to(torch.float32), master[n]):
                    die(f"{s.name}: {n} in {os.path.basename(path)} differs from the randomised weights")
    n_f32 = sum(1 for v in found.values() if v[1] == "F32")
    print(f"  checkpoint ok: {len(found)} tensors in {len(files)} file(s), {n_f32} F32, "
          f"lm_head.weight {'present' if lm_head_in_file else 'absent'}", flush=True)
    return {"tensors": str(len(found)), "files": str(len(files)), "f32_tensors": str(n_f32),
            "lm_head_in_file": str(lm_head_in_file)}


def check_config_json(d, s):
    """Report which MODEL.md 1.2 keys config.json carries (text_config first, then top level). Missing keys are
    warnings: this is what HF writes, and the engine's loader has to cope with it."""
    with open(os.path.join(d, "config.json")) as f:
        top = json.load(f)
    text = dict(top, **top.get("text_config", {}))
    keys = ["model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "hidden_act", "rms_norm_eps",
            "vocab_size", "tie_word_embeddings", "num_attention_heads", "num_key_value_heads", "head_dim"]
    if s.hybrid:
        keys += ["layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim"]
    missing = [k for k in keys if k not in text]
    if "rope_parameters" not in text and "rope_theta" not in text:
        missing.append("rope_parameters/rope_theta")
    if missing:
        warn(f"{s.name}: config.json lacks {missing}")
    rope = {k: text[k] for k in ("rope_parameters", "rope_theta", "partial_rotary_factor", "rope_scaling")
            if k in text}
    print(f"  config.json: model_type {top.get('model_type')}, architectures {top.get('architectures')}, "
          f"dtype {text.get('dtype', text.get('torch_dtype'))}, rope {rope}", flush=True)
    return {"config_json_missing": ",".join(missing) or "none", "config_json_rope": json.dumps(rope, sort_keys=True)}


# ----------------------------------------------------------------------------------------------------------------
# Reference runs
# ----------------------------------------------------------------------------------------------------------------

def load_reference(s, d, dtype, dev):
    res = hf_class(model_class_name(s)).from_pretrained(d, dtype=dtype, attn_implementation=ATTN,
                                                        local_files_only=True, output_loading_info=True)
    model, info = res if isinstance(res, tuple) else (res, {})

    def field(key):  # loading info is a dict in 5.x; accept an object with attributes too
        v = info.get(key) if isinstance(info, dict) else getattr(info, key, None)
        return list(v or [])

    missing, mismatched, unexpected = field("missing_keys"), field("mismatched_keys"), field("unexpected_keys")
    if missing or mismatched:
        die(f"{s.name}: from_pretrained({dtype}) missing={missing} mismatched={mismatched}")
    odd = [k for k in unexpected if not k.startswith("mtp.")]
    if odd:
        die(f"{s.name}: from_pretrained({dtype}) found unexpected keys {odd}")
    model = model.to(dev).eval()
    check_attn(model, s)
    return model


def compare_loaded(model, master, dtype, s):
    """The reloaded model holds exactly the randomised weights; returns names of params not in `dtype`."""
    sd = model.state_dict()
    if set(sd) != set(master):
        die(f"{s.name}: reloaded state dict keys differ: only reloaded {sorted(set(sd) - set(master))[:5]}, "
            f"only written {sorted(set(master) - set(sd))[:5]}")
    other_dtype = []
    for n, t in sd.items():
        if t.dtype != dtype:
            other_dtype.append(f"{n}:{t.dtype}")
        if not torch.equal(t.detach().to("cpu", torch.float32), master[n]):
            die(f"{s.name}: reloaded {n} ({dtype}) differs from the written weights")
    if s.tied:
        if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
            die(f"{s.name}: reloaded model is not tied")
    return other_dtype


def check_rope(model, s):
    inv = text_backbone(model).rotary_emb.inv_freq
    r = int(s.head_dim * s.rotary_factor)
    want = 1.0 / (s.rope_theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))
    if inv.numel() != r // 2:
        die(f"{s.name}: rotary inv_freq has {inv.numel()} entries, expected R/2 = {r // 2} (partial_rotary_factor "
            "not applied?)")
    err = float(((inv.detach().float().cpu() - want).abs() / want).max())
    if err > 1e-6:
        warn(f"{s.name}: inv_freq differs from 1/theta^(2i/R) by {err:.2e} (dtype {inv.dtype})")
    return {"inv_freq_dtype": str(inv.dtype), "inv_freq_max_rel_err": f"{err:.3e}"}


def reset_rope_deltas(model):
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "rope_deltas"):
        inner.rope_deltas = None


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def run_case(model, ids, steps, dev, want_hidden=False, stats=None):
    """Prefill all ids (use_cache=True), then greedy decode one token per call with the returned cache.

    Returns logits [n,V] (cpu, dtype as HF returned it), greedy ids, step logits [steps,V], hidden [L,n,D] or None.
    Row g of the step logits is the one whose argmax is greedy id g; row 0 is the prefill's last row. `stats`, if
    given, receives prefill_s, decode_ms_per_token and cache_len_after_prefill."""
    reset_rope_deltas(model)
    hidden, handles = [], []
    if want_hidden:
        def hook(_mod, _inp, out):
            hidden.append((out[0] if isinstance(out, tuple) else out)[0].detach().cpu())
        handles = [layer.register_forward_hook(hook) for layer in text_backbone(model).layers]
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    sync(dev)
    t0 = time.time()
    out = model(input_ids=x, use_cache=True)
    sync(dev)
    t1 = time.time()
    for h in handles:
        h.remove()
    logits = out.logits[0]
    pkv = out.past_key_values
    if pkv is None:
        die("the model returned no past_key_values with use_cache=True")
    seen = pkv.get_seq_length() if hasattr(pkv, "get_seq_length") else -1
    if seen != len(ids):
        warn(f"the HF cache reports {seen} tokens after a prefill of {len(ids)}")
    rows = [logits[-1]]
    toks = [int(torch.argmax(rows[0].float().cpu()))]
    for _ in range(1, steps):
        out = model(input_ids=torch.tensor([[toks[-1]]], dtype=torch.long, device=dev), past_key_values=pkv,
                    use_cache=True)
        pkv = out.past_key_values
        rows.append(out.logits[0, -1])
        toks.append(int(torch.argmax(rows[-1].float().cpu())))
    sync(dev)
    if stats is not None:
        stats["prefill_s"] = t1 - t0
        stats["decode_ms_per_token"] = (time.time() - t1) * 1000 / max(1, steps - 1)
        stats["cache_len_after_prefill"] = seen
    reset_rope_deltas(model)
    hid = torch.stack(hidden) if want_hidden else None
    return logits.cpu(), toks, torch.stack(rows).cpu(), hid


@torch.no_grad()
def generate_check(model, ids, steps, toks, dev):
    """generate(do_sample=False) must give the same ids as the manual loop."""
    reset_rope_deltas(model)
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    try:
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=steps, do_sample=False,
                             num_beams=1)
    except Exception as exc:  # noqa: BLE001 - the manual loop is the golden; record and go on
        reset_rope_deltas(model)
        return f"generate() failed: {type(exc).__name__}: {exc}"[:300]
    reset_rope_deltas(model)
    gen = out[0, len(ids):].tolist()
    if gen == toks:
        return "ok"
    return f"MISMATCH generate={gen} manual={toks}"


def margins(step_logits):
    top = torch.topk(step_logits.float(), 2, dim=-1).values
    m = (top[:, 0] - top[:, 1])
    return float(m.min()), int((m == 0).sum())


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# ----------------------------------------------------------------------------------------------------------------
# Independent fp32 forward from MODEL.md (a check of the spec against HF, and of HF's fp32 accuracy)
# ----------------------------------------------------------------------------------------------------------------

@torch.no_grad()
def spec_forward(sd, s, ids, dev):
    """Logits [n, V] in fp32 computed from MODEL.md sections 3 and 5 with the step recurrence (no chunking)."""
    p, eps = s.prefix, 1e-6
    hd, hq, hkv = s.head_dim, s.heads, s.kv_heads

    def w(name):
        return sd[name].to(dev, torch.float32)

    def rms(x, weight, plus_one):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * (1.0 + weight) if plus_one else y * weight

    t = len(ids)
    emb = w(p + "embed_tokens.weight")
    x = emb[torch.tensor(ids, device=dev)]
    r = int(hd * s.rotary_factor)
    inv = 1.0 / (s.rope_theta ** (torch.arange(0, r, 2, dtype=torch.int64).float().to(dev) / r))
    ang = torch.arange(t, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

    def rope(v):  # [t, H, hd]; pairs (i, i + R/2) on the first R dims
        a, b = v[..., : r // 2], v[..., r // 2: r]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, v[..., r:]], dim=-1)

    causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    for i, lt in enumerate(s.layer_types):
        lp = f"{p}layers.{i}."
        h = rms(x, w(lp + "input_layernorm.weight"), s.hybrid)
        if lt == FULL:
            a = lp + "self_attn."
            q = h @ w(a + "q_proj.weight").T
            if s.hybrid:
                q = q.view(t, hq, 2 * hd)
                q, gate = q[..., :hd], q[..., hd:]
            else:
                q, gate = q.view(t, hq, hd), None
            k = (h @ w(a + "k_proj.weight").T).view(t, hkv, hd)
            v = (h @ w(a + "v_proj.weight").T).view(t, hkv, hd)
            q = rope(rms(q, w(a + "q_norm.weight"), s.hybrid))
            k = rope(rms(k, w(a + "k_norm.weight"), s.hybrid))
            k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
            sc = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            pr = sc.masked_fill(~causal, float("-inf")).softmax(-1)
            o = torch.einsum("hts,shd->thd", pr, v)
            if gate is not None:
                o = o * torch.sigmoid(gate)
            mix = o.reshape(t, hq * hd) @ w(a + "o_proj.weight").T
        else:
            a = lp + "linear_attn."
            hk, hv, dk, dv, kk = s.lin_k_heads, s.lin_v_heads, s.lin_k_dim, s.lin_v_dim, s.conv_k
            kd = hk * dk
            m = h @ w(a + "in_proj_qkv.weight").T
            z = (h @ w(a + "in_proj_z.weight").T).view(t, hv, dv)
            b = h @ w(a + "in_proj_b.weight").T
            aa = h @ w(a + "in_proj_a.weight").T
            cw = w(a + "conv1d.weight").squeeze(1)  # [C, K]; tap K-1 multiplies the current token
            mp = torch.cat([torch.zeros(kk - 1, m.shape[1], device=dev), m], dim=0)
            c = F.silu(sum(cw[:, j] * mp[j: j + t] for j in range(kk)))
            q = c[:, :kd].reshape(t, hk, dk)
            k = c[:, kd: 2 * kd].reshape(t, hk, dk)
            v = c[:, 2 * kd:].reshape(t, hv, dv)
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            beta = torch.sigmoid(b)
            g = -torch.exp(w(a + "A_log")) * F.softplus(aa + w(a + "dt_bias"))
            rep = hv // hk
            st = torch.zeros(hv, dk, dv, device=dev)
            outs = []
            for j in range(t):
                qj, kj = q[j].repeat_interleave(rep, 0), k[j].repeat_interleave(rep, 0)
                st = st * torch.exp(g[j])[:, None, None]
                mem = torch.einsum("hkv,hk->hv", st, kj)
                delta = beta[j][:, None] * (v[j] - mem)
                st = st + kj[:, :, None] * delta[:, None, :]
                outs.append(torch.einsum("hkv,hk->hv", st, qj))
            o = torch.stack(outs)
            y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w(a + "norm.weight") * F.silu(z)
            mix = y.reshape(t, hv * dv) @ w(a + "out_proj.weight").T
        x = x + mix
        h = rms(x, w(lp + "post_attention_layernorm.weight"), s.hybrid)
        up = F.silu(h @ w(lp + "mlp.gate_proj.weight").T) * (h @ w(lp + "mlp.up_proj.weight").T)
        x = x + up @ w(lp + "mlp.down_proj.weight").T
    x = rms(x, w(p + "norm.weight"), s.hybrid)
    head = emb if s.tied else w("lm_head.weight")
    return (x @ head.T).cpu()


# ----------------------------------------------------------------------------------------------------------------
# Tiny fixtures
# ----------------------------------------------------------------------------------------------------------------

def case_ids(s, seed, lengths):
    out = []
    for c, n in enumerate(lengths):
        g = torch.Generator().manual_seed(seed * 7919 + 104729 * (c + 1))
        out.append(torch.randint(0, s.id_limit, (n,), generator=g).tolist())
    return out


def make_fixture(s, args, env, fp32st, vers, out_dir, lengths, steps):
    print(f"\n=== {s.name} ({model_class_name(s)}) ===", flush=True)
    dev = pick_device(args.device)
    d = os.path.join(out_dir, s.name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    seed = args.seed + s.seed_offset
    t0 = time.time()
    model = build_model(s, seed)
    nparam = randomize(model, s, seed)
    master = master_state(model)
    save_checkpoint(model, s, d)
    del model
    mtp = fix_checkpoint(d, s, seed)
    ck = check_checkpoint(d, s, master, mtp)
    ck.update(check_config_json(d, s))
    print(f"  {nparam} parameters, saved in {time.time() - t0:.1f}s", flush=True)

    cases = case_ids(s, seed, lengths)
    golden, meta = {}, {}
    logits_by = {}
    for tag, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        ref = load_reference(s, d, dtype, dev)
        other = compare_loaded(ref, master, dtype, s)
        meta[f"params_not_{tag}"] = ",".join(other) if other else "none"
        for k, v in check_rope(ref, s).items():
            meta[f"{k}_{tag}"] = v
        for c, ids in enumerate(cases):
            st = {}
            logits, toks, rows, hid = run_case(ref, ids, steps, dev, args.hidden, st)
            logits2, toks2, rows2, _ = run_case(ref, ids, steps, dev)
            same = torch.equal(logits, logits2) and toks == toks2 and torch.equal(rows, rows2)
            # The same tokens in one no-cache forward: checks HF's cached prefill and decode against itself.
            reset_rope_deltas(ref)
            n = len(ids)
            whole = ref(input_ids=torch.tensor([ids + toks[:-1]], device=dev), use_cache=False).logits[0].cpu()
            e_pre, e_dec = rel_err(logits, whole[:n]), rel_err(rows, whole[n - 1:])
            margin, ties = margins(rows)
            meta[f"case{c}.logits_dtype_{tag}"] = str(logits.dtype)
            meta[f"case{c}.deterministic_{tag}"] = str(same)
            meta[f"case{c}.cache_len_after_prefill_{tag}"] = str(st["cache_len_after_prefill"])
            meta[f"case{c}.prefill_vs_nocache_rel_err_{tag}"] = f"{e_pre:.3e}"
            meta[f"case{c}.decode_vs_nocache_rel_err_{tag}"] = f"{e_dec:.3e}"
            if tag == "f32" and max(e_pre, e_dec) > 1e-4:
                warn(f"{s.name} case{c}: HF cached run vs its own no-cache forward: prefill {e_pre:.2e}, "
                     f"decode {e_dec:.2e}")
            meta[f"case{c}.greedy_min_margin_{tag}"] = f"{margin:.4g}"
            meta[f"case{c}.greedy_ties_{tag}"] = str(ties)
            meta[f"case{c}.generate_check_{tag}"] = generate_check(ref, ids, steps, toks, dev)
            out_dtype = torch.float32 if tag == "f32" else torch.bfloat16
            golden[f"case{c}.ids"] = torch.tensor(ids, dtype=torch.int32)
            golden[f"case{c}.logits_{tag}"] = logits.to(out_dtype).contiguous()
            golden[f"case{c}.greedy_{tag}"] = torch.tensor(toks, dtype=torch.int32)
            golden[f"case{c}.step_logits_{tag}"] = rows.to(out_dtype).contiguous()
            if hid is not None:
                golden[f"case{c}.hidden_{tag}"] = hid.to(out_dtype).contiguous()
            logits_by[(c, tag)] = logits
            if not same:
                warn(f"{s.name} case{c} {tag}: two identical HF runs differ (nondeterministic kernels)")
            if meta[f"case{c}.generate_check_{tag}"] != "ok":
                warn(f"{s.name} case{c} {tag}: {meta[f'case{c}.generate_check_{tag}']}")
            print(f"  case{c} n={n:3d} {tag:4s} greedy={toks} min margin {margin:.3g} ties {ties}; cached vs "
                  f"no-cache: prefill {e_pre:.1e} decode {e_dec:.1e}", flush=True)
        del ref
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    for c, ids in enumerate(cases):
        spec = spec_forward(master, s, ids, dev)
        e_spec = rel_err(spec, logits_by[(c, "f32")])
        e_bf16 = rel_err(logits_by[(c, "bf16")], logits_by[(c, "f32")])
        agree = 0
        for a, b in zip(golden[f"case{c}.greedy_f32"].tolist(), golden[f"case{c}.greedy_bf16"].tolist()):
            if a != b:
                break
            agree += 1
        meta[f"case{c}.spec_vs_hf_f32_rel_err"] = f"{e_spec:.3e}"
        meta[f"case{c}.bf16_vs_f32_rel_err"] = f"{e_bf16:.3e}"
        meta[f"case{c}.greedy_f32_bf16_agree"] = str(agree)
        flag = "" if e_spec < 1e-4 else "   <-- MODEL.md forward disagrees with HF fp32"
        print(f"  case{c}: MODEL.md fp32 forward vs HF fp32 rel err {e_spec:.2e}; HF bf16 vs f32 {e_bf16:.2e}; "
              f"greedy f32/bf16 agree on {agree}/{steps}{flag}", flush=True)
        if e_spec >= 1e-4:
            warn(f"{s.name} case{c}: spec forward vs HF fp32 relative error {e_spec:.2e}")

    meta.update(base_meta(s, env, fp32st, vers, dev, seed))
    meta.update({f"checkpoint.{k}": v for k, v in ck.items()})
    meta["cases"] = ",".join(str(n) for n in lengths)
    meta["greedy_steps"] = str(steps)
    meta["fake_mtp"] = ",".join(mtp) if mtp else "none"
    meta["hidden_stored"] = str(bool(args.hidden))
    save_file(golden, os.path.join(d, "golden.safetensors"), metadata=meta)
    print(f"  wrote {d} in {time.time() - t0:.1f}s", flush=True)
    return d


def base_meta(s, env, fp32st, vers, dev, seed):
    m = {"format": FORMAT, "version": VERSION, "fixture": s.name, "model_class": model_class_name(s),
         "attn_implementation": ATTN, "device": device_desc(dev), "seed": str(seed),
         "config": json.dumps(asdict(s), sort_keys=True),
         "dtype_info": ("every weight bf16-representable; checkpoint BF16"
                        + (" except A_log and linear_attn.norm.weight F32" if s.f32_gdn else "")
                        + "; *_f32 from from_pretrained(dtype=float32), *_bf16 from from_pretrained(dtype=bfloat16),"
                        " both on the device above; fp32 matmul/conv/attention without TF32")}
    m.update({f"version.{k}": v for k, v in vers.items()})
    m.update({f"env.{k}": v for k, v in env.items()})
    m.update({f"fp32.{k}": v for k, v in fp32st.items()})
    return m


def report_sizes(dirs):
    total = 0
    for d in dirs:
        for fn in sorted(os.listdir(d)):
            sz = os.path.getsize(os.path.join(d, fn))
            total += sz
            print(f"  {os.path.join(d, fn):60s} {sz / 1024:9.1f} KiB")
    print(f"  total {total / 1e6:.2f} MB", flush=True)
    if total > 6e6:
        warn(f"fixtures total {total / 1e6:.2f} MB, over the ~6 MB budget")
    return total


# ----------------------------------------------------------------------------------------------------------------
# Full-size model
# ----------------------------------------------------------------------------------------------------------------

FULL_OUR_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                  "reference.safetensors")


def full_mode(args, env, fp32st, vers):
    s = Spec(**dict(asdict(FULL_08B), f32_gdn=args.full_f32_gdn))
    dev = pick_device(args.device)
    if dev.type != "cuda":
        warn("full mode on the CPU will be slow")
    d = args.full
    os.makedirs(d, exist_ok=True)
    foreign = [f for f in os.listdir(d) if f not in FULL_OUR_FILES and not f.startswith("model-")]
    if foreign:
        die(f"{d} holds files this script did not write ({foreign[:5]}); use an empty directory")
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    seed = args.seed + s.seed_offset
    timings = {}

    t = time.time()
    model = build_model(s, seed)
    timings["build_s"] = time.time() - t
    t = time.time()
    nparam = randomize(model, s, seed)
    master = master_state(model)
    timings["randomize_s"] = time.time() - t
    print(f"  {nparam} parameters (MODEL.md: 752,393,024)", flush=True)
    if nparam != 752_393_024:
        warn(f"parameter count {nparam} differs from MODEL.md's 752,393,024")
    t = time.time()
    save_checkpoint(model, s, d)
    del model
    fix_checkpoint(d, s, seed)
    ck = check_checkpoint(d, s, master, [])
    ck.update(check_config_json(d, s))
    timings["save_and_check_s"] = time.time() - t

    g = torch.Generator().manual_seed(seed + 5)
    prompt = torch.randint(0, s.vocab, (args.prompt_len,), generator=g).tolist()

    t = time.time()
    ref = load_reference(s, d, torch.bfloat16, dev)
    other = compare_loaded(ref, master, torch.bfloat16, s)
    rope = check_rope(ref, s)
    timings["load_bf16_s"] = time.time() - t
    run_case(ref, prompt[:4], 2, dev)  # warm-up, so the timings below are not first-call costs
    _, toks, dec_logits, _ = run_case(ref, prompt, args.steps, dev, stats=timings)
    logits_dtype = str(dec_logits.dtype)
    margin, ties = margins(dec_logits)
    del ref
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    t = time.time()
    ref = load_reference(s, d, torch.float32, dev)
    other32 = compare_loaded(ref, master, torch.float32, s)
    with torch.no_grad():
        # one float32 forward over prompt + the bf16 greedy ids: row P-1+i is the fp32 logits at the
        # position that produced decode.ids[i] (the tolerance baseline for every decode step)
        seq32 = torch.tensor([prompt + toks[:-1]], dtype=torch.long, device=dev)
        all32 = ref(input_ids=seq32, use_cache=False).logits[0].float().cpu()
        dec32 = all32[len(prompt) - 1:].contiguous()
        pre32 = dec32[0].clone()
        del all32
    timings["load_and_prefill_f32_s"] = time.time() - t
    del ref
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    t = time.time()
    spec_last = spec_forward(master, s, prompt, dev)[-1]
    e_spec = rel_err(spec_last, pre32)
    e_bf16 = rel_err(dec_logits[0], pre32)
    timings["spec_forward_s"] = time.time() - t

    meta = base_meta(s, env, fp32st, vers, dev, seed)
    meta["format"] = "qwen35-reference"
    meta.update({f"checkpoint.{k}": v for k, v in ck.items()})
    meta.update({f"{k}_bf16": v for k, v in rope.items()})
    meta.update({"steps": str(args.steps), "prompt_len": str(args.prompt_len), "decode.logits_dtype": logits_dtype,
                 "decode.min_margin": f"{margin:.4g}", "decode.ties": str(ties),
                 "params_not_bf16": ",".join(other) or "none", "params_not_f32": ",".join(other32) or "none",
                 "prefill.spec_vs_hf_f32_rel_err": f"{e_spec:.3e}",
                 "prefill.bf16_vs_f32_rel_err": f"{e_bf16:.3e}"})
    meta.update({f"timing.{k}": f"{v:.3f}" for k, v in timings.items()})
    ref_tensors = {"prompt.ids": torch.tensor(prompt, dtype=torch.int32),
                   "decode.ids": torch.tensor(toks, dtype=torch.int32),
                   "decode.logits_bf16": dec_logits.to(torch.bfloat16).contiguous(),
                   "prefill.logits_f32": pre32.contiguous(),
                   "decode.logits_f32": dec32}
    save_file(ref_tensors, os.path.join(d, "reference.safetensors"), metadata=meta)
    for k, v in timings.items():
        print(f"  {k}: {v:.3f}")
    print(f"  decode ids: {toks}")
    print(f"  greedy min top-2 margin {margin:.3g}, ties {ties}; MODEL.md fp32 forward vs HF fp32 (last prompt "
          f"position) rel err {e_spec:.2e}; HF bf16 vs f32 {e_bf16:.2e}")
    if e_spec >= 1e-4:
        warn(f"spec forward vs HF fp32 relative error {e_spec:.2e}")
    print(f"  wrote {d}", flush=True)


# ----------------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures", help="output directory for the tiny fixtures")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="", help="cuda, cuda:1, cpu (default: cuda when available)")
    ap.add_argument("--hidden", action="store_true", help="also store each decoder layer's output")
    ap.add_argument("--quick", action="store_true", help="environment smoke test in a temporary directory")
    ap.add_argument("--full", default="", metavar="DIR", help="full-size random Qwen3.5-0.8B + reference in DIR")
    ap.add_argument("--steps", type=int, default=64, help="full mode: greedy decode steps")
    ap.add_argument("--prompt-len", type=int, default=16, help="full mode: prompt length")
    ap.add_argument("--full-f32-gdn", action="store_true", help="full mode: A_log, linear_attn.norm.weight in F32")
    ap.add_argument("--allow-kernels", action="store_true", help="accept fla / causal_conv1d (recorded)")
    args = ap.parse_args()

    t_start = time.time()
    vers = check_versions()
    dev = pick_device(args.device)
    print(f"device: {device_desc(dev)}")
    print("environment:")
    env = probe_env(args.allow_kernels)
    fp32st = set_fp32_ieee()
    print("fp32 settings: " + ", ".join(f"{k}={v}" for k, v in fp32st.items()), flush=True)
    for name in ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "Qwen3_5ForConditionalGeneration", "Qwen3_5Config",
                 "Qwen3_5VisionConfig", "Qwen3ForCausalLM", "Qwen3Config", "GenerationConfig"):
        hf_class(name)
    print("classes: all present")
    torch.set_grad_enabled(False)

    if args.full:
        if args.steps < 1 or args.prompt_len < 1:
            die("--steps and --prompt-len must be >= 1")
        full_mode(args, env, fp32st, vers)
    elif args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            dirs = [make_fixture(s, args, env, fp32st, vers, tmp, (7, 65), 2) for s in FIXTURES]
            report_sizes(dirs)
        print("\nquick: OK (every fixture built, saved, reloaded and run in a temporary directory)")
    else:
        names = [n for n in args.only.split(",") if n]
        unknown = [n for n in names if n not in {s.name for s in FIXTURES}]
        if unknown:
            die(f"unknown fixture(s) {unknown}; known: {[s.name for s in FIXTURES]}")
        specs = [s for s in FIXTURES if not names or s.name in names]
        os.makedirs(args.out, exist_ok=True)
        dirs = [make_fixture(s, args, env, fp32st, vers, args.out, CASE_LENGTHS, GREEDY_STEPS) for s in specs]
        print("\nsizes:")
        report_sizes(dirs)
    print(f"done in {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    main()
